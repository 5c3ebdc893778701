#pragma once
// Option checks shared by the examples. CLI11's PositiveNumber writes DBL_MAX out in full
// (309 digits) in its error message; these say what was expected and what was given.
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gradus_examples {

inline CLI::Validator number_check(bool allow_zero) {
  return CLI::Validator(
      [allow_zero](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || (!allow_zero && v == 0))
          return std::string("expected a number ") + (allow_zero ? ">= 0" : "> 0") + ", got " + s;
        return {};
      },
      allow_zero ? "NONNEGATIVE" : "POSITIVE");
}
// A finite number in [lo, hi]: CLI11's Range lets NaN through (every comparison with it is
// false), so `--comm-timeout nan` became -9223372036854775808 ms and `--max-loss-ratio nan`
// turned the divergence stop off without a word.
inline CLI::Validator finite_range(double lo, double hi) {
  char range[64];
  std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
  return CLI::Validator(
      [lo, hi, text = std::string(range)](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
          return "expected a finite number in " + text + ", got " + s;
        return {};
      },
      "FLOAT in " + std::string(range));
}
inline const CLI::Validator positive = number_check(false);
inline const CLI::Validator non_negative = number_check(true);

}  // namespace gradus_examples
