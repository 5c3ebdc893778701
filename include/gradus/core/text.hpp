#pragma once
// Numbers as text that reads back exactly: what run fingerprints compare and metrics
// files store.
#include <charconv>
#include <cmath>
#include <string>

namespace gradus {

// The shortest text that reads back as the same double (0.05 -> "0.05"); "nan", "inf",
// "-inf" otherwise.
inline std::string shortest_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// The same for a float (a float loss 2.4277287 reads "2.4277287", not its double's digits).
inline std::string shortest_text(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace gradus
