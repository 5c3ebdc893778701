# cmake -P run_consumer.cmake: builds and runs tests/cmake/consumer the way a user would, and
# checks that it compiled against the gradus MODE names (packaging_steps.cmake: run_consumer_in).
#   MODE=find_package      find_package(gradus) from PACKAGE/prefix (package.cmake's install)
#   MODE=pkg_config        no CMake: the compiler with `pkg-config --cflags --libs gradus ...`
#                          from PACKAGE/prefix/share/pkgconfig
#   MODE=deb               the .deb in PACKAGE: its Depends and contents (dpkg-deb --info,
#                          --contents), unpacked (dpkg-deb -x, never installed) into WORK/root,
#                          its gradus-run run, and find_package(gradus) from WORK/root/usr
#   MODE=fetchcontent      FetchContent from PACKAGE's source tarball (URL file://)
#   MODE=add_subdirectory  add_subdirectory(GRADUS_SOURCE_DIR)
# Also: CONSUMER_DIR, WORK (a scratch directory, emptied first), CXX, GENERATOR, BUILD_TYPE,
#       CXX_FLAGS (optional), VERSION (the version gradus must report), CONSUMER_FULL (ON:
#       every component, OFF: cpu_simd alone).
cmake_minimum_required(VERSION 3.20)
foreach(var MODE GRADUS_SOURCE_DIR CONSUMER_DIR WORK PACKAGE CXX GENERATOR BUILD_TYPE VERSION CONSUMER_FULL)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/packaging_steps.cmake)

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(build "${WORK}/consumer-build")
set(prefix "${PACKAGE}/prefix")
# Only what MODE names may be found, never a user's or the system's gradus.
set(configure ${CMAKE_COMMAND} -S "${CONSUMER_DIR}" -B "${build}" -G "${GENERATOR}"
    -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCONSUMER_FULL=${CONSUMER_FULL})

# find_package from <root>: the gradus found must be <root>'s
function(consumer_from_prefix root)
  step("configure consumer (find_package)" ${configure} -DCMAKE_PREFIX_PATH=${root})
  file(STRINGS "${build}/CMakeCache.txt" found REGEX "^gradus_DIR:")
  string(FIND "${found}" "=${root}/" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the consumer found a gradus outside ${root}: ${found}")
  endif()
  step("build consumer" ${CMAKE_COMMAND} --build "${build}" --config ${BUILD_TYPE})
  run_consumer_in("${build}" "${root}/include")
endfunction()

if(MODE STREQUAL "find_package")
  consumer_from_prefix("${prefix}")
elseif(MODE STREQUAL "pkg_config")
  set(modules gradus)
  set(sources small.cpp cpu_simd.cpp)
  if(CONSUMER_FULL)
    set(modules gradus gradus-io gradus-cluster gradus-ring gradus-ps)
    set(sources main.cpp cpu_simd.cpp comm.cpp)
  endif()
  set(pkg_config ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${prefix}/share/pkgconfig pkg-config)
  step_output("pkg-config --modversion" found ${pkg_config} --modversion gradus)
  expect_in("pkg-config --modversion gradus" "${found}" "${VERSION}")
  step_output("pkg-config --cflags" cflags ${pkg_config} --cflags ${modules})
  step_output("pkg-config --libs" libs ${pkg_config} --libs ${modules})
  expect_in("pkg-config --cflags ${modules}" "${cflags}" "-std=c++20" "-fopenmp" "${prefix}/share/pkgconfig/../../include")
  expect_in("pkg-config --libs ${modules}" "${libs}" "-lopenblas" "-fopenmp")
  if(CONSUMER_FULL)
    expect_in("pkg-config --libs ${modules}" "${libs}" "-lzip" "-lzmq")
  endif()
  separate_arguments(cflags UNIX_COMMAND "${cflags}")
  separate_arguments(libs UNIX_COMMAND "${libs}")
  separate_arguments(flags UNIX_COMMAND "${CXX_FLAGS}")
  file(MAKE_DIRECTORY "${build}")
  set(objects "")
  foreach(src IN LISTS sources)
    step("compile ${src}" ${CXX} ${flags} -O2 ${cflags} -MD -c "${CONSUMER_DIR}/${src}" -o "${build}/${src}.o")
    list(APPEND objects "${build}/${src}.o")
  endforeach()
  step("link consumer" ${CXX} ${objects} -o "${build}/consumer" ${libs})
  run_consumer_in("${build}" "${prefix}/include")
elseif(MODE STREQUAL "deb")
  file(GLOB deb "${PACKAGE}/libgradus-dev_${VERSION}_*.deb")
  if(NOT deb)
    message(FATAL_ERROR "no libgradus-dev_${VERSION}_*.deb in ${PACKAGE} (packaging.install makes it)")
  endif()
  step_output("dpkg-deb --info" info dpkg-deb --info "${deb}")
  string(REGEX MATCH "\n Depends: [^\n]*" depends "${info}")
  expect_in("the .deb's Depends" "${depends}" libxtensor-dev libxsimd-dev libxtensor-blas-dev libopenblas-dev
            nlohmann-json3-dev libzip-dev libzmq3-dev cppzmq-dev)
  expect_in("the .deb's control file" "${info}" "Package: libgradus-dev\n" "Version: ${VERSION}\n")
  step_output("dpkg-deb --contents" contents dpkg-deb --contents "${deb}")
  expect_in("the .deb" "${contents}" ./usr/include/gradus/gradus.hpp ./usr/include/gradus/version.hpp
            ./usr/include/gradus/backends/cpu_simd.hpp /cmake/gradus/gradusConfig.cmake
            /cmake/gradus/gradusConfigVersion.cmake ./usr/share/pkgconfig/gradus.pc
            ./usr/bin/gradus-run ./usr/bin/gradus-keygen)
  step("unpack the .deb" dpkg-deb -x "${deb}" "${WORK}/root")
  step_output("the .deb's gradus-run --help" out "${WORK}/root/usr/bin/gradus-run" --help)
  expect_in("the .deb's gradus-run --help" "${out}" "Usage: gradus-run")
  consumer_from_prefix("${WORK}/root/usr")
elseif(MODE STREQUAL "fetchcontent")
  set(tarball "${PACKAGE}/gradus-${VERSION}-src.tar.gz")
  step("configure consumer (FetchContent)" ${configure} -DGRADUS_FETCH_URL=file://${tarball})
  step("build consumer" ${CMAKE_COMMAND} --build "${build}" --config ${BUILD_TYPE})
  run_consumer_in("${build}" "${build}/_deps/gradus-src/include")
elseif(MODE STREQUAL "add_subdirectory")
  step("configure consumer (add_subdirectory)" ${configure} -DGRADUS_SOURCE_DIR=${GRADUS_SOURCE_DIR})
  step("build consumer" ${CMAKE_COMMAND} --build "${build}" --config ${BUILD_TYPE})
  run_consumer_in("${build}" "${GRADUS_SOURCE_DIR}/include")
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be find_package, pkg_config, deb, fetchcontent or add_subdirectory, not '${MODE}'")
endif()
