# cmake -P run_consumer.cmake: builds and runs tests/cmake/consumer the way a user would.
#   MODE=install  configure gradus' source tree (no tests, no examples), install it into
#                 WORK/prefix, then build the consumer with find_package(gradus) from there
#                 (and check that the gradus it found is that one)
#   MODE=subdir   build the consumer with add_subdirectory(GRADUS_SOURCE_DIR)
# Also: GRADUS_SOURCE_DIR, CONSUMER_DIR, WORK (a scratch directory, emptied first),
#       CXX (compiler), GENERATOR, BUILD_TYPE, CXX_FLAGS (optional).
cmake_minimum_required(VERSION 3.20)
foreach(var MODE GRADUS_SOURCE_DIR CONSUMER_DIR WORK CXX GENERATOR BUILD_TYPE)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

function(step what)
  message(STATUS "${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit status ${rc})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
set(common -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
           "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}"
           # Only what this test installs may be found, never a user's or system's gradus.
           -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)

if(MODE STREQUAL "install")
  set(prefix "${WORK}/prefix")
  step("configure gradus" ${CMAKE_COMMAND} -S "${GRADUS_SOURCE_DIR}" -B "${WORK}/gradus-build" ${common}
       -DGRADUS_BUILD_TESTS=OFF -DGRADUS_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX=${prefix})
  step("build gradus" ${CMAKE_COMMAND} --build "${WORK}/gradus-build" --config ${BUILD_TYPE})
  step("install gradus" ${CMAKE_COMMAND} --install "${WORK}/gradus-build" --config ${BUILD_TYPE})
  foreach(f include/gradus/gradus.hpp include/gradus/backends/cpu_simd.hpp)
    if(NOT EXISTS "${prefix}/${f}")
      message(FATAL_ERROR "cmake --install did not install ${f}")
    endif()
  endforeach()
  step("configure consumer (find_package)" ${CMAKE_COMMAND} -S "${CONSUMER_DIR}" -B "${WORK}/consumer-build"
       ${common} -DCMAKE_PREFIX_PATH=${prefix})
  # The gradus the consumer found must be the one just installed.
  file(STRINGS "${WORK}/consumer-build/CMakeCache.txt" found REGEX "^gradus_DIR:")
  string(FIND "${found}" "${prefix}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "the consumer found a gradus outside ${prefix}: ${found}")
  endif()
  message(STATUS "consumer found ${found}")
elseif(MODE STREQUAL "subdir")
  step("configure consumer (add_subdirectory)" ${CMAKE_COMMAND} -S "${CONSUMER_DIR}" -B "${WORK}/consumer-build"
       ${common} -DGRADUS_SOURCE_DIR=${GRADUS_SOURCE_DIR})
else()
  message(FATAL_ERROR "run_consumer.cmake: MODE must be install or subdir, not '${MODE}'")
endif()

step("build consumer" ${CMAKE_COMMAND} --build "${WORK}/consumer-build" --config ${BUILD_TYPE})
file(GLOB_RECURSE exe "${WORK}/consumer-build/consumer" "${WORK}/consumer-build/consumer.exe")
if(NOT exe)
  message(FATAL_ERROR "no consumer executable under ${WORK}/consumer-build")
endif()
list(GET exe 0 exe)
step("run consumer" ${exe})
