# cmake -P check_compile.cmake: compiles one file (syntax only) and checks the outcome.
#   CXX        the compiler (the project's CMAKE_CXX_COMPILER)
#   CXX_ID     its CMAKE_CXX_COMPILER_ID (GNU or Clang: picks the caret-suppression flag)
#   SOURCE     the .cpp file
#   INCLUDES   include directories (a CMake list)
#   EXPECT     FAIL: the compile must fail, and each string in NEEDLES (a CMake list) must
#                    appear in the first LINES lines of the diagnostic, after the include
#                    stack, with " >" spelled ">" (g++ writes "shape<5, 4> >"), and an
#                    error line must carry gradus' static_assert text ("gradus: ...");
#              PASS: the compile must succeed (the harness' control).
cmake_minimum_required(VERSION 3.20)
foreach(var CXX CXX_ID SOURCE EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_compile.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT DEFINED LINES)
  set(LINES 3)
endif()

set(flags -std=c++20 -fsyntax-only -fdiagnostics-color=never)
if(CXX_ID MATCHES "Clang")
  list(APPEND flags -fno-caret-diagnostics)
else()
  list(APPEND flags -fno-diagnostics-show-caret)
endif()
foreach(dir IN LISTS INCLUDES)
  list(APPEND flags "-I${dir}")
endforeach()

execute_process(COMMAND ${CXX} ${flags} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REPLACE ";" "," out "${out}")  # keep CMake's list splitting off the compiler's text

if(EXPECT STREQUAL "PASS")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "expected ${SOURCE} to compile, but it failed:\n${out}")
  endif()
  message(STATUS "compiled, as expected: ${SOURCE}")
  return()
endif()

if(rc EQUAL 0)
  message(FATAL_ERROR "expected ${SOURCE} NOT to compile, but it compiled")
endif()

# The first LINES lines after the include stack ("In file included from", "  from ...").
string(REPLACE "\n" ";" all_lines "${out}")
set(head "")
set(n 0)
foreach(line IN LISTS all_lines)
  if(line MATCHES "^In file included from" OR line MATCHES "^[ \t]+from " OR line STREQUAL "")
    continue()
  endif()
  string(APPEND head "${line}\n")
  math(EXPR n "${n} + 1")
  if(n EQUAL LINES)
    break()
  endif()
endforeach()
string(REPLACE " >" ">" head_norm "${head}")

set(missing "")
foreach(needle IN LISTS NEEDLES)
  string(REPLACE " >" ">" needle_norm "${needle}")
  string(FIND "${head_norm}" "${needle_norm}" pos)
  if(pos EQUAL -1)
    list(APPEND missing "${needle}")
  endif()
endforeach()
if(NOT out MATCHES "error: [^\n]*gradus: ")
  list(APPEND missing "an error line with gradus' static_assert text (\"gradus: ...\")")
endif()
if(missing)
  list(JOIN missing "\n  " missing_text)
  message(FATAL_ERROR "${SOURCE} failed to compile, but the first ${LINES} lines of the diagnostic lack:\n"
                      "  ${missing_text}\nfirst lines:\n${head}\nfull output:\n${out}")
endif()
message(STATUS "failed to compile, as expected, and the diagnostic names the op and operands:\n${head}")
