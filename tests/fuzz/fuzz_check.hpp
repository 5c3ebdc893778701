#pragma once
// FUZZ_CHECK(cond): a promise the reader under test makes; a broken one is
// __builtin_trap(), after a line naming the file, the line and the condition, so that
// libFuzzer (or replay_main) stops on that input.
#include <cstdio>

#define FUZZ_CHECK(cond)                                                                              \
  do {                                                                                                \
    if (!(cond)) {                                                                                    \
      std::fprintf(stderr, "%s:%d: broken promise: %s\n", __FILE__, __LINE__, #cond);                 \
      __builtin_trap();                                                                               \
    }                                                                                                 \
  } while (0)
