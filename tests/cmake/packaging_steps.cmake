# The steps the packaging scripts (package.cmake, run_consumer.cmake, missing_dependency.cmake)
# share: include()d by them, run under cmake -P.

# step(<what> <command...>): run a command; stop with <what> named if it fails
function(step what)
  message(STATUS "${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit status ${rc})")
  endif()
endfunction()

# step_output(<what> <variable> <command...>): step(), its standard output and error in <variable>
function(step_output what var)
  message(STATUS "${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (exit status ${rc})")
  endif()
  set(${var} "${out}" PARENT_SCOPE)
endfunction()

# expect_in(<what> <text> <needle>...): every needle occurs in text
function(expect_in what text)
  foreach(needle IN LISTS ARGN)
    string(FIND "${text}" "${needle}" at)
    if(at EQUAL -1)
      message(FATAL_ERROR "${what} does not contain '${needle}'")
    endif()
  endforeach()
endfunction()

# run_consumer_in(<build dir> <include dir>): run <build dir>/consumer (built from
# tests/cmake/consumer), check that it prints the expected gradus version (VERSION) and that it
# was compiled against <include dir>'s gradus: the compiler's dependency records name
# <include dir>/gradus/gradus.hpp, after resolving ".." and symbolic links, and no other one.
# The records are the dependency files (*.d) a Makefile build keeps, or what Ninja read from
# them into its own log (`ninja -t deps`; Ninja deletes the files).
function(run_consumer_in build_dir include_dir)
  set(deps "")
  if(EXISTS "${build_dir}/build.ninja")
    find_program(ninja NAMES ninja ninja-build REQUIRED)
    execute_process(COMMAND ${ninja} -C "${build_dir}" -t deps OUTPUT_VARIABLE deps RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      set(deps "")
    endif()
  else()
    file(GLOB_RECURSE depfiles "${build_dir}/*.d")
    foreach(depfile IN LISTS depfiles)
      file(READ "${depfile}" d)
      string(APPEND deps "${d}\n")
    endforeach()
  endif()
  if(deps STREQUAL "")
    message(FATAL_ERROR "no dependency records (*.d files, or Ninja's log) under ${build_dir}: cannot tell which gradus was compiled")
  endif()
  file(REAL_PATH "${include_dir}/gradus/gradus.hpp" want)
  set(seen "")
  string(REGEX MATCHALL "[^ \t\r\n\\\\:]*/gradus/gradus\\.hpp" used "${deps}")
  foreach(header IN LISTS used)
    file(REAL_PATH "${header}" header BASE_DIRECTORY "${build_dir}")
    list(APPEND seen "${header}")
  endforeach()
  list(REMOVE_DUPLICATES seen)
  if(NOT seen STREQUAL want)
    message(FATAL_ERROR "the consumer was compiled against gradus.hpp at '${seen}', not ${want}")
  endif()
  step_output("run consumer" out "${build_dir}/consumer")
  expect_in("the consumer's output" "${out}" "consumer: gradus ${VERSION}\n")
endfunction()
