# Finds what gradus::cpu_simd, gradus::io and gradus::cluster need. Used by the build tree
# (top level or add_subdirectory) and by the installed package config (gradusConfig.cmake),
# so a consumer resolves the same dependencies.
#
# find_dependency() is meant for package configs only: elsewhere a missing dependency would
# return() silently from this file and surface later as a confusing "target not found".
# In the build tree every dependency is therefore REQUIRED, with CMake's own message.
include(CMakeFindDependencyMacro)
macro(gradus_find_dependency)
  if(CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
    find_dependency(${ARGV})
  else()
    find_package(${ARGV} REQUIRED)
  endif()
endmacro()

gradus_find_dependency(xtl CONFIG)
gradus_find_dependency(xsimd CONFIG)
gradus_find_dependency(xtensor CONFIG)
gradus_find_dependency(xtensor-blas CONFIG)
gradus_find_dependency(OpenMP COMPONENTS CXX)
# OpenBLAS ships a config that sets variables only; wrap them in a target. The OpenMP
# build of OpenBLAS is preferred: it shares gradus' OpenMP thread pool, where the pthread
# build's own spinning pool fights it for the cores (measured: a 50k-element fused pass
# right after a GEMM took 8 ms instead of 25 us on 2 cores). Debian installs each build's
# config under its own directory; the HINTS win over the system-wide alternative.
gradus_find_dependency(OpenBLAS CONFIG
  HINTS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/cmake/openblas)
# GRADUS_BLAS_LIBRARY, when set, is linked instead: another CBLAS (cpu_simd calls cblas_sgemm
# and cblas_dgemm alone). tools/gpu-bundle.sh links Debian's reference BLAS (libblas3, 0.4 MB)
# into the GPU suite, whose cpu_simd references are small products, rather than carry
# OpenBLAS's 36 MB to the GPU machine.
if(NOT TARGET gradus_openblas)
  add_library(gradus_openblas INTERFACE IMPORTED)
  if(GRADUS_BLAS_LIBRARY)
    set_target_properties(gradus_openblas PROPERTIES INTERFACE_LINK_LIBRARIES "${GRADUS_BLAS_LIBRARY}")
  else()
    set_target_properties(gradus_openblas PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${OpenBLAS_INCLUDE_DIRS}"
      INTERFACE_LINK_LIBRARIES "${OpenBLAS_LIBRARIES}")
  endif()
endif()

# oneDNN, for gradus::cpu_simd's float convolutions (cpu_simd/dnnl.hpp; Debian: libdnnl-dev).
# Optional in the build tree and for a consumer alike: GRADUS_DNNL = AUTO (the default: use it
# where it is found), ON (required) or OFF. Found, the target defines GRADUS_HAVE_DNNL=1 and
# links libdnnl; not found, it is empty and convolutions take cpu_simd's im2col + GEMM path.
# The headers are gradus' own, so each build (ours, a consumer's) decides by what it finds.
# Through find_path / find_library: Debian's dnnl-config.cmake also looks for OpenCL.
if(NOT TARGET gradus_dnnl)
  add_library(gradus_dnnl INTERFACE IMPORTED)
  set(gradus_dnnl_mode AUTO)
  if(DEFINED GRADUS_DNNL)
    string(TOUPPER "${GRADUS_DNNL}" gradus_dnnl_mode)
  endif()
  if(NOT gradus_dnnl_mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "GRADUS_DNNL = '${GRADUS_DNNL}': expected AUTO, ON or OFF")
  endif()
  if(NOT gradus_dnnl_mode STREQUAL "OFF")
    find_path(GRADUS_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
    find_library(GRADUS_DNNL_LIBRARY dnnl)
    if(GRADUS_DNNL_INCLUDE_DIR AND GRADUS_DNNL_LIBRARY)
      set_target_properties(gradus_dnnl PROPERTIES
        INTERFACE_INCLUDE_DIRECTORIES "${GRADUS_DNNL_INCLUDE_DIR}"
        INTERFACE_LINK_LIBRARIES "${GRADUS_DNNL_LIBRARY}"
        INTERFACE_COMPILE_DEFINITIONS "GRADUS_HAVE_DNNL=1")
      if(NOT CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
        message(STATUS "gradus: cpu_simd's float convolutions through oneDNN (${GRADUS_DNNL_LIBRARY})")
      endif()
    elseif(gradus_dnnl_mode STREQUAL "ON")
      message(FATAL_ERROR "GRADUS_DNNL=ON, but oneDNN was not found (Debian: apt-get install libdnnl-dev)")
    elseif(NOT CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
      message(STATUS "gradus: oneDNN not found; convolutions through im2col + GEMM (Debian: libdnnl-dev)")
    endif()
  endif()
endif()

# libzip, for gradus::io (.npz checkpoints). Through pkg-config: Debian's libzip CMake config
# also imports the zipcmp, zipmerge and ziptool programs (packaged apart, in zipcmp etc.)
# and fails when they are absent, which they are with libzip-dev alone. The prefix is
# gradus' own so that a consumer's PkgConfig::LIBZIP or LIBZIP_* variables do not clash.
# The build tree requires it; the installed package reports it as component io, so that
# a user of gradus::cpu_simd alone is not stopped by a missing libzip, while
# find_package(gradus COMPONENTS io) is.
if(NOT TARGET PkgConfig::gradus_libzip)
  if(CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
    find_package(PkgConfig QUIET)
    if(PKG_CONFIG_FOUND)
      pkg_check_modules(gradus_libzip QUIET IMPORTED_TARGET libzip)
    endif()
  else()
    find_package(PkgConfig REQUIRED)
    pkg_check_modules(gradus_libzip REQUIRED IMPORTED_TARGET libzip)
  endif()
endif()
if(TARGET PkgConfig::gradus_libzip)
  set(gradus_io_FOUND TRUE)
else()
  set(gradus_io_FOUND FALSE)
  set(gradus_NOT_FOUND_MESSAGE "gradus::io needs libzip (pkg-config module libzip; Debian: libzip-dev)")
endif()

# nlohmann_json, for gradus::cluster (cluster specs: TF_CONFIG, gradus JSON files) and
# gradus::io (.safetensors headers). Like libzip: required by the build tree, components
# cluster and io of the installed package.
if(NOT TARGET nlohmann_json::nlohmann_json)
  if(CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
    find_package(nlohmann_json 3 CONFIG QUIET)
  else()
    find_package(nlohmann_json 3 CONFIG REQUIRED)
  endif()
endif()
if(TARGET nlohmann_json::nlohmann_json)
  set(gradus_cluster_FOUND TRUE)
else()
  set(gradus_cluster_FOUND FALSE)
  set(gradus_io_FOUND FALSE)  # .safetensors headers are JSON (gradus/io/safetensors.hpp)
  if(gradus_NOT_FOUND_MESSAGE)
    string(APPEND gradus_NOT_FOUND_MESSAGE "; ")
  endif()
  string(APPEND gradus_NOT_FOUND_MESSAGE "gradus::cluster and gradus::io need nlohmann_json (Debian: nlohmann-json3-dev)")
endif()

# cppzmq (and libzmq through it), for the ZeroMQ communicators (gradus::net, gradus::ring,
# gradus::ps). Debian's cppzmq-dev ships a CMake config (target cppzmq) that finds libzmq by
# pkg-config. Like libzip: required by the build tree, components net, ring and ps of the
# installed package (ring_allreduce and zmq_ps: their old names, for one release).
if(NOT TARGET cppzmq)
  if(CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
    find_package(cppzmq CONFIG QUIET)
  else()
    find_package(cppzmq CONFIG REQUIRED)
  endif()
endif()
if(TARGET cppzmq)
  set(gradus_net_FOUND TRUE)
  set(gradus_ring_FOUND TRUE)
  set(gradus_ps_FOUND ${gradus_cluster_FOUND})
else()
  set(gradus_net_FOUND FALSE)
  set(gradus_ring_FOUND FALSE)
  set(gradus_ps_FOUND FALSE)
  if(gradus_NOT_FOUND_MESSAGE)
    string(APPEND gradus_NOT_FOUND_MESSAGE "; ")
  endif()
  string(APPEND gradus_NOT_FOUND_MESSAGE "gradus::net, gradus::ring and gradus::ps need cppzmq and libzmq (Debian: cppzmq-dev libzmq3-dev)")
endif()
set(gradus_ring_allreduce_FOUND ${gradus_ring_FOUND})
set(gradus_zmq_ps_FOUND ${gradus_ps_FOUND})

# MPI, for gradus::mpi. Optional everywhere: the build tree follows GRADUS_MPI (AUTO: when
# found, ON: required, OFF: never looked for); the installed package reports it as component
# mpi (its targets are in gradusMpiTargets.cmake, loaded only when MPI is found here too).
# MPI's C API only (MPI_CXX_SKIP_MPICXX: no MPI-2 C++ bindings); the CXX component, else C
# where the project enabled C. gradus_mpi_library: the imported target to link.
set(gradus_mpi_FOUND FALSE)
set(gradus_mpi_mode AUTO)
if(NOT CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus" AND DEFINED GRADUS_MPI)
  string(TOUPPER "${GRADUS_MPI}" gradus_mpi_mode)
  if(NOT gradus_mpi_mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "GRADUS_MPI = '${GRADUS_MPI}': expected AUTO, ON or OFF")
  endif()
endif()
if(NOT gradus_mpi_mode STREQUAL "OFF")
  if(NOT TARGET MPI::MPI_CXX AND NOT TARGET MPI::MPI_C)
    set(MPI_CXX_SKIP_MPICXX ON)
    find_package(MPI QUIET COMPONENTS CXX)
    if(NOT MPI_CXX_FOUND AND CMAKE_C_COMPILER_LOADED)
      find_package(MPI QUIET COMPONENTS C)
    endif()
  endif()
  if(TARGET MPI::MPI_CXX)
    set(gradus_mpi_library MPI::MPI_CXX)
    set(gradus_mpi_FOUND TRUE)
  elseif(TARGET MPI::MPI_C)
    set(gradus_mpi_library MPI::MPI_C)
    set(gradus_mpi_FOUND TRUE)
  elseif(gradus_mpi_mode STREQUAL "ON")
    message(FATAL_ERROR "GRADUS_MPI=ON, but find_package(MPI) found no MPI (Debian: apt-get install libopenmpi-dev "
                        "openmpi-bin; or configure with -DGRADUS_MPI=AUTO or OFF)")
  elseif(NOT CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
    message(STATUS "gradus: no MPI found (Debian: libopenmpi-dev openmpi-bin): gradus::mpi, its tests and --comm mpi are not built")
  endif()
endif()
# How gradus' tests and examples start an MPI job of N processes on this host:
# ${gradus_mpirun} -np N program. Open MPI's mpirun (gradus_openmpi) refuses to run as root
# (CI) without --allow-run-as-root and more processes than cores without --oversubscribe;
# the tests also use its --timeout (it ends a hung job itself) and --tag-output.
if(gradus_mpi_FOUND AND NOT CMAKE_FIND_PACKAGE_NAME STREQUAL "gradus")
  set(gradus_mpirun ${MPIEXEC_EXECUTABLE})
  set(gradus_openmpi FALSE)
  execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE gradus_mpiexec_version ERROR_QUIET TIMEOUT 20)
  if(gradus_mpiexec_version MATCHES "Open MPI|OpenRTE")
    set(gradus_openmpi TRUE)
    list(APPEND gradus_mpirun --allow-run-as-root --oversubscribe)
  endif()
endif()
