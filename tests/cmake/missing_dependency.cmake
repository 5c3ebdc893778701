# cmake -P missing_dependency.cmake: find_package(gradus COMPONENTS ...) against the install
# of package.cmake (PACKAGE/prefix), configure-only (find_components/):
#   - every component this machine has the libraries for is found (cuda where HAVE_CUDA),
#     and gradus_VERSION is VERSION;
#   - the next minor version is refused (SameMinorVersion: 0.1.x answers 0.1 only);
#   - a component whose dependency is hidden (CMAKE_DISABLE_FIND_PACKAGE_<dependency>, or
#     for libzip an empty PKG_CONFIG_LIBDIR) fails,
#     with a message naming the Debian package that provides it.
#   Also: WORK (emptied first), CXX, GENERATOR, VERSION, HAVE_CUDA (ON/OFF).
cmake_minimum_required(VERSION 3.20)
foreach(var PACKAGE WORK CXX GENERATOR VERSION HAVE_CUDA)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "missing_dependency.cmake: -D${var}=... is required")
  endif()
endforeach()
include(${CMAKE_CURRENT_LIST_DIR}/packaging_steps.cmake)
file(REMOVE_RECURSE "${WORK}")

# find_components(<name> <expect: PASS|FAIL> <needle> <version> <components> <environment>
# [-D...]): configure find_components/ in WORK/<name> (<environment>: VAR=value assignments
# for `cmake -E env`, or ""); FAIL: it must fail and its output contain <needle>
function(find_components name expect needle version components environment)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env ${environment} ${CMAKE_COMMAND} -S "${CMAKE_CURRENT_LIST_DIR}/find_components" -B "${WORK}/${name}"
                    -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
                    -DCMAKE_PREFIX_PATH=${PACKAGE}/prefix "-DWANT_VERSION=${version}" "-DWANT_COMPONENTS=${components}" ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${out}")  # CMake wraps long messages
  if(expect STREQUAL "PASS" AND NOT rc EQUAL 0)
    message(FATAL_ERROR "find_package(gradus ${version} COMPONENTS ${components}) failed:\n${out}")
  elseif(expect STREQUAL "FAIL" AND rc EQUAL 0)
    message(FATAL_ERROR "find_package(gradus ${version} COMPONENTS ${components}) ${ARGN} succeeded; it must fail:\n${out}")
  endif()
  string(FIND "${flat}" "${needle}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "find_package(gradus ${version} COMPONENTS ${components}) ${ARGN}: the output does not name '${needle}':\n${out}")
  endif()
  message(STATUS "${name}: ${expect} as expected, naming '${needle}'")
endfunction()

set(all io cluster net ring ps)
if(HAVE_CUDA)
  list(APPEND all cuda)
endif()
find_components(all PASS "found gradus ${VERSION}" "${VERSION}" "${all}" "")
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" major_minor "${VERSION}")
math(EXPR next_minor "${CMAKE_MATCH_2} + 1")
find_components(next_minor FAIL "${VERSION}" "${CMAKE_MATCH_1}.${next_minor}" "" "")
# libzip through pkg-config: a pkg-config that finds no module at all
find_components(io FAIL "libzip-dev" "" io PKG_CONFIG_LIBDIR=${WORK}/no-modules)
find_components(cluster FAIL "nlohmann-json3-dev" "" cluster "" -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON)
find_components(ring FAIL "cppzmq-dev libzmq3-dev" "" ring "" -DCMAKE_DISABLE_FIND_PACKAGE_cppzmq=ON)
if(HAVE_CUDA)
  find_components(cuda FAIL "nvidia-cuda-toolkit nvidia-cudnn" "" cuda "" -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
else()  # the package has no gradus::cuda to offer, and says how to get one
  find_components(cuda FAIL "-DGRADUS_CUDA=ON" "" cuda "")
endif()
