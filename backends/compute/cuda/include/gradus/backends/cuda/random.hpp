#pragma once
// cuda: random masks from core/counter_hash.hpp, the function cpu_simd calls: the same
// mask, bit for bit, on both backends for a seed and draw.
#include "gradus/backends/cuda/images.hpp"
#include "gradus/core/counter_hash.hpp"

namespace gradus {

namespace cuda_kernels {

template <class T>
struct dropout_fn {
  T* out;
  std::uint64_t base;
  double keep;
  T scale;
  GRADUS_HD void operator()(index_t i) const {
    out[i] = counter_hash::dropout_value(base, static_cast<std::uint64_t>(i), keep, scale);
  }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct random_section : images_section {
  template <class T>
  static void dropout_mask(T* out, index_t n, double keep, std::uint64_t seed, std::uint64_t draw) {
    for_n(n, cuda_kernels::dropout_fn<T>{out, counter_hash::stream(seed, draw), keep, static_cast<T>(1 / keep)});
  }
};

}  // namespace cuda_sections
}  // namespace gradus
