# gradus_target_defaults(tgt): warnings (errors with GRADUS_WERROR), -march=native and the
# GRADUS_SANITIZE sanitizers for gradus' own tests, examples and benchmarks. Consumers choose
# their own flags.
function(gradus_target_defaults tgt)
  target_compile_options(${tgt} PRIVATE -Wall -Wextra -Wpedantic)
  if(GRADUS_WERROR)
    target_compile_options(${tgt} PRIVATE -Werror)
  endif()
  if(GRADUS_NATIVE)
    target_compile_options(${tgt} PRIVATE -march=native)
  endif()
  if(GRADUS_SANITIZE)  # e.g. address,undefined (the asan preset); a finding stops the program
    target_compile_options(${tgt} PRIVATE -fsanitize=${GRADUS_SANITIZE} -fno-sanitize-recover=all -fno-omit-frame-pointer)
    if(GRADUS_SANITIZE_SKIP)  # e.g. vptr,null,... (the ci-asan preset: what CI's budget leaves out)
      target_compile_options(${tgt} PRIVATE -fno-sanitize=${GRADUS_SANITIZE_SKIP})
    endif()
    if(GRADUS_SANITIZE MATCHES "undefined" AND CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      # third-party code UBSan leaves alone (Thrust's null-pointer dispatch), the file says why
      target_compile_options(${tgt} PRIVATE -fsanitize-ignorelist=${PROJECT_SOURCE_DIR}/tests/sanitizers/ubsan.ignore)
    endif()
    target_link_options(${tgt} PRIVATE -fsanitize=${GRADUS_SANITIZE})
  endif()
endfunction()

# gradus_cuda_target_defaults(tgt): the same for nvcc-compiled targets: every nvcc warning
# an error with GRADUS_WERROR, and the host compiler's -Wall -Wextra on the host code.
function(gradus_cuda_target_defaults tgt)
  target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(GRADUS_WERROR)
    target_compile_options(${tgt} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Werror>)
  endif()
endfunction()
