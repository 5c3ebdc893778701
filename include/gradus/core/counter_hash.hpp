#pragma once
// The counter-based random numbers every backend draws dropout masks from: element i of
// draw `draw` under seed `seed` is a pure function of the three (splitmix64's finaliser),
// so a mask has the same bits on any thread count, block size or device. cpu_simd and
// cuda both call these; a backend that computed its own could only agree by accident.
#include <cstdint>

#include "gradus/core/device.hpp"

namespace gradus::counter_hash {

GRADUS_HD constexpr std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The stream of one draw: elements are mix64(base + i).
GRADUS_HD constexpr std::uint64_t stream(std::uint64_t seed, std::uint64_t draw) {
  return mix64(seed ^ mix64(draw + 0x632be59bd9b4e019ull));
}

/// Element i of a stream as a double uniform in [0, 1) (53 random bits).
GRADUS_HD constexpr double uniform(std::uint64_t base, std::uint64_t i) {
  return static_cast<double>(mix64(base + i) >> 11) * 0x1.0p-53;
}

/// Inverted dropout: 1/keep where the element is kept, else 0.
template <class T>
GRADUS_HD constexpr T dropout_value(std::uint64_t base, std::uint64_t i, double keep, T scale) {
  return uniform(base, i) < keep ? scale : T(0);
}

}  // namespace gradus::counter_hash
