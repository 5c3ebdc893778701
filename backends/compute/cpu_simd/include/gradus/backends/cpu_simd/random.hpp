#pragma once
// cpu_simd: random masks, counter-based (core/counter_hash.hpp: the same bits for any
// thread count and on every backend for a seed).
#include "gradus/backends/cpu_simd/images.hpp"
#include "gradus/core/counter_hash.hpp"

namespace gradus::cpu_simd_sections {

struct random_section : images_section {
  /// ---- random masks --------------------------------------------------------------------
  /// out[i] = 1/keep if u(seed, draw, i) < keep else 0, u uniform in [0, 1) from a
  /// splitmix64 hash of (seed, draw, i): the same mask for any thread count.
  template <class T>
  static void dropout_mask(T* out, index_t n, double keep, std::uint64_t seed, std::uint64_t draw) {
    const T scale = static_cast<T>(1 / keep);
    const std::uint64_t base = counter_hash::stream(seed, draw);
    const bool par = n >= parallel_threshold;
#pragma omp parallel for schedule(static) if (par)
    for (index_t i = 0; i < n; ++i) out[i] = counter_hash::dropout_value(base, static_cast<std::uint64_t>(i), keep, scale);
  }
};

}  // namespace gradus::cpu_simd_sections
