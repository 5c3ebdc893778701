# Finds what gradus::cpu_simd needs. Used by the build tree and by the installed package
# config (gradusConfig.cmake), so a consumer resolves the same dependencies.
include(CMakeFindDependencyMacro)
find_dependency(xtl CONFIG)
find_dependency(xsimd CONFIG)
find_dependency(xtensor CONFIG)
find_dependency(xtensor-blas CONFIG)
find_dependency(OpenMP)
# OpenBLAS ships a config that sets variables only; wrap them in a target. The OpenMP
# build of OpenBLAS is preferred: it shares gradus' OpenMP thread pool, where the pthread
# build's own spinning pool fights it for the cores (measured: a 50k-element fused pass
# right after a GEMM took 8 ms instead of 25 us on 2 cores).
find_dependency(OpenBLAS CONFIG
  HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/cmake/openblas)
if(NOT TARGET gradus_openblas)
  add_library(gradus_openblas INTERFACE IMPORTED)
  set_target_properties(gradus_openblas PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
endif()
