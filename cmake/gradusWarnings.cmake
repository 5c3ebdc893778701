# gradus_target_defaults(tgt): warnings (errors with GRADUS_WERROR) and -march=native for
# gradus' own tests, examples and benchmarks. Consumers choose their own flags.
function(gradus_target_defaults tgt)
  target_compile_options(${tgt} PRIVATE -Wall -Wextra -Wpedantic)
  if(GRADUS_WERROR)
    target_compile_options(${tgt} PRIVATE -Werror)
  endif()
  if(GRADUS_NATIVE)
    target_compile_options(${tgt} PRIVATE -march=native)
  endif()
endfunction()
