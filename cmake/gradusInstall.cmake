# cmake --install: headers, targets and a package config, so that a user project does
#   find_package(gradus CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE gradus::cpu_simd)
include(CMakePackageConfigHelpers)
install(DIRECTORY include/gradus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY backends/compute/cpu_simd/include/gradus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
foreach(comm net ring ps)
  install(DIRECTORY backends/comm/${comm}/include/gradus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS gradus_${comm} EXPORT gradusTargets)
endforeach()
install(TARGETS gradus gradus_cpu_simd gradus_io gradus_cluster EXPORT gradusTargets)
# gradus::mpi (where MPI was found) in its own export file: gradusConfig.cmake loads it only
# where MPI is found again, so a consumer without MPI still gets the other targets.
if(TARGET gradus_mpi)
  install(DIRECTORY backends/comm/mpi/include/gradus DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(TARGETS gradus_mpi EXPORT gradusMpiTargets)
endif()
if(TARGET gradus-run)
  install(TARGETS gradus-run RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
set(GRADUS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/gradus)
install(EXPORT gradusTargets NAMESPACE gradus:: DESTINATION ${GRADUS_CMAKE_DIR})
if(TARGET gradus_mpi)
  install(EXPORT gradusMpiTargets NAMESPACE gradus:: DESTINATION ${GRADUS_CMAKE_DIR})
endif()
configure_package_config_file(cmake/gradusConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/gradusConfig.cmake INSTALL_DESTINATION ${GRADUS_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/gradusConfigVersion.cmake
  COMPATIBILITY SameMinorVersion ARCH_INDEPENDENT)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/gradusConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/gradusConfigVersion.cmake
  cmake/gradusDependencies.cmake
  DESTINATION ${GRADUS_CMAKE_DIR})
