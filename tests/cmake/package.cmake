# cmake -P package.cmake: the fixture of the packaging tests (packaging.install). Configures
# gradus' source tree as a user would (no tests, no examples), builds it (gradus-run and
# gradus-keygen), installs it into WORK/prefix, and makes the .deb and the source tarball
# (cpack) into WORK; checks what each holds that the other tests do not use.
#   GRADUS_SOURCE_DIR, WORK (emptied first), CXX, GENERATOR, BUILD_TYPE, CXX_FLAGS (optional),
#   VERSION (the version gradus must report)
cmake_minimum_required(VERSION 3.20)
foreach(var GRADUS_SOURCE_DIR WORK CXX GENERATOR BUILD_TYPE VERSION)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "package.cmake: -D${var}=... is required")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/packaging_steps.cmake)

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(build "${WORK}/gradus-build")
set(prefix "${WORK}/prefix")
step("configure gradus" ${CMAKE_COMMAND} -S "${GRADUS_SOURCE_DIR}" -B "${build}" -G "${GENERATOR}"
     -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
     -DGRADUS_BUILD_TESTS=OFF -DGRADUS_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${prefix})
step("build gradus" ${CMAKE_COMMAND} --build "${build}" --config ${BUILD_TYPE})
step("install gradus" ${CMAKE_COMMAND} --install "${build}" --config ${BUILD_TYPE})

# What README.md and docs/guide.md promise an install holds (gradusInstall.cmake)
foreach(f include/gradus/gradus.hpp include/gradus/version.hpp include/gradus/backends/cpu_simd.hpp
          include/gradus/backends/cuda.hpp include/gradus/comm/ring.hpp include/gradus/comm/ps.hpp
          include/gradus/comm/mpi.hpp include/gradus/comm/net/curve.hpp
          lib/cmake/gradus/gradusConfig.cmake lib/cmake/gradus/gradusConfigVersion.cmake
          share/pkgconfig/gradus.pc share/pkgconfig/gradus-io.pc share/pkgconfig/gradus-ps.pc
          bin/gradus-run bin/gradus-keygen)
  if(NOT EXISTS "${prefix}/${f}")
    message(FATAL_ERROR "cmake --install did not install ${f} (into ${prefix})")
  endif()
endforeach()
file(STRINGS "${prefix}/include/gradus/version.hpp" version_line REGEX "define GRADUS_VERSION \"")
expect_in("the installed <gradus/version.hpp>" "${version_line}" "\"${VERSION}\"")
foreach(tool gradus-run gradus-keygen)
  step_output("${tool} --help" out "${prefix}/bin/${tool}" --help)
  expect_in("${tool} --help" "${out}" "Usage:" "${tool}")
endforeach()

step("cpack -G DEB" ${CMAKE_COMMAND} -E chdir "${build}" cpack -G DEB -B "${WORK}")
step("cpack the sources" ${CMAKE_COMMAND} -E chdir "${build}" cpack -G TGZ --config CPackSourceConfig.cmake -B "${WORK}")
set(tarball "${WORK}/gradus-${VERSION}-src.tar.gz")
if(NOT EXISTS "${tarball}")
  message(FATAL_ERROR "cpack made no ${tarball}")
endif()
# The source tarball: gradus' sources without the build trees, the data sets and git's files
# (a folder named data/ elsewhere, include/gradus/data/, stays); packaging.fetchcontent builds it.
step_output("list the source tarball" listing tar tzf "${tarball}")
expect_in("the source tarball" "${listing}" "gradus-${VERSION}-src/CMakeLists.txt\n"
          "gradus-${VERSION}-src/include/gradus/data/dataset.hpp\n" "gradus-${VERSION}-src/CHANGELOG.md\n")
if(listing MATCHES "(^|\n)gradus-${VERSION}-src/(build|data|\\.git)(/|\n)")
  message(FATAL_ERROR "the source tarball holds ${CMAKE_MATCH_2} (CPACK_SOURCE_IGNORE_FILES, cmake/gradusPackage.cmake)")
endif()
