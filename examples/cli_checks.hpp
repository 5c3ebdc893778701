#pragma once
// Option checks shared by the examples. CLI11's PositiveNumber writes DBL_MAX out in full
// (309 digits) in its error message; these say what was expected and what was given.
#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <system_error>

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
// A seed: an integer in [0, 2^64 - 1]. CLI11 reads a uint64 with strtoull, which takes "-1"
// as 2^64 - 1 and a number past 2^64 - 1 as 2^64 - 1 too; from_chars accepts neither.
inline const CLI::Validator seed_check(
    [](std::string& s) -> std::string {
      std::uint64_t v = 0;
      const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size())
        return "expected an integer in [0, " + std::to_string(std::numeric_limits<std::uint64_t>::max()) + "], got " + s;
      return {};
    },
    "UINT64");

}  // namespace gradus_examples
