#pragma once
// Numbers as text that reads back exactly: what run fingerprints compare and metrics
// files store.
#include <charconv>
#include <cmath>
#include <concepts>
#include <string>

namespace gradus {

/// The shortest text that reads back as the same value (0.05 -> "0.05"; a float loss
/// 2.4277287 reads "2.4277287", not its double's digits); "nan", "inf", "-inf" otherwise.
template <std::floating_point T>
std::string shortest_text(T v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace gradus
