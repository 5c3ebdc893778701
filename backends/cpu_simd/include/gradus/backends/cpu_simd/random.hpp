#pragma once
// cpu_simd: random masks, counter-based (the same bits for any thread count and on every
// backend for a seed).
#include "gradus/backends/cpu_simd/images.hpp"

namespace gradus::cpu_simd_sections {

struct random_section : images_section {
  // ---- random masks --------------------------------------------------------------------
  // out[i] = 1/keep if u(seed, draw, i) < keep else 0, u uniform in [0, 1) from a
  // splitmix64 hash of (seed, draw, i): the same mask for any thread count.
  template <class T>
  static void dropout_mask(T* out, index_t n, double keep, std::uint64_t seed, std::uint64_t draw) {
    const T scale = static_cast<T>(1 / keep);
    const std::uint64_t base = mix64(seed ^ mix64(draw + 0x632be59bd9b4e019ull));
    const bool par = n >= parallel_threshold;
#pragma omp parallel for schedule(static) if (par)
    for (index_t i = 0; i < n; ++i) {
      const double u = static_cast<double>(mix64(base + static_cast<std::uint64_t>(i)) >> 11) * 0x1.0p-53;
      out[i] = u < keep ? scale : T(0);
    }
  }

 protected:
  static constexpr std::uint64_t mix64(std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

}  // namespace gradus::cpu_simd_sections
