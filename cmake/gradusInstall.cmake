# cmake --install: what README.md and docs/guide.md promise a project that installs gradus:
#   include/gradus/...            every header: the DSL, every backend's (cpu_simd, cuda, net,
#                                 ring, ps, mpi), and the generated <gradus/version.hpp>
#   lib/cmake/gradus/             the CMake package: find_package(gradus [version] COMPONENTS ...)
#   share/pkgconfig/gradus*.pc    pkg-config: gradus (the DSL and cpu_simd), gradus-<component>
#   bin/gradus-run, gradus-keygen the launcher and the CURVE key tool (GRADUS_BUILD_TOOLS)
# tests/cmake (label packaging) installs it and builds projects against what it installed.
include(CMakePackageConfigHelpers)
install(DIRECTORY include/gradus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/gradus/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/gradus)
# Every backend's headers, whether or not this build could make its target: they are text,
# and the package decides on the consumer's machine which targets it can offer.
foreach(backend compute/cpu_simd compute/cuda comm/net comm/ring comm/ps comm/mpi)
  install(DIRECTORY backends/${backend}/include/gradus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
endforeach()
install(TARGETS gradus gradus_cpu_simd gradus_io gradus_cluster gradus_net gradus_ring gradus_ps EXPORT gradusTargets)
# gradus::mpi and gradus::cuda (where this build found MPI, nvcc and cuDNN) in export files of
# their own: gradusConfig.cmake loads each only where its libraries are found again, so a
# consumer without them still gets the other targets.
set(gradus_optional_exports "")
if(TARGET gradus_mpi)
  install(TARGETS gradus_mpi EXPORT gradusMpiTargets)
  list(APPEND gradus_optional_exports gradusMpiTargets)
endif()
if(TARGET gradus_cuda)
  install(TARGETS gradus_cuda EXPORT gradusCudaTargets)
  list(APPEND gradus_optional_exports gradusCudaTargets)
endif()
if(GRADUS_BUILD_TOOLS)
  install(TARGETS gradus-run gradus-keygen RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(GRADUS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gradus)
foreach(export gradusTargets ${gradus_optional_exports})
  install(EXPORT ${export} NAMESPACE gradus:: DESTINATION ${GRADUS_CMAKE_DIR})
endforeach()
configure_package_config_file(cmake/gradusConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/gradusConfig.cmake INSTALL_DESTINATION ${GRADUS_CMAKE_DIR})
# Before 1.0 a minor version may change the API (0.2 drops what 0.1 kept under old names):
# find_package(gradus 0.1) accepts 0.1.x only. Headers alone: any architecture.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gradusConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/gradusConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/gradusConfigVersion.cmake
  cmake/gradusDependencies.cmake
  cmake/gradusCudaLibraries.cmake
  DESTINATION ${GRADUS_CMAKE_DIR})

include(gradusPkgConfig)
