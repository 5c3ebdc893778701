#pragma once
// cpu_simd: layout (permute of up to max_rank axes).
#include "gradus/backends/cpu_simd/index.hpp"

namespace gradus::cpu_simd_sections {

struct layout_section : index_section {
  /// ---- layout --------------------------------------------------------------------------
  template <class T>
  static void permute(const T* in, const dims& in_dims, const std::array<std::size_t, max_rank>& perm, T* out) {
    const std::size_t r = in_dims.rank;
    std::array<index_t, max_rank> in_strides{}, out_dims{}, src_stride{};
    index_t s = 1;
    for (std::size_t i = r; i-- > 0;) {
      in_strides[i] = s;
      s *= in_dims.d[i];
    }
    for (std::size_t i = 0; i < r; ++i) {
      out_dims[i] = in_dims.d[perm[i]];
      src_stride[i] = in_strides[perm[i]];
    }
    const index_t total = in_dims.numel();
    if (r == 0) {
      if (total) out[0] = in[0];
      return;
    }
    const index_t inner = out_dims[r - 1], rows = inner ? total / inner : 0;
    const bool par = total >= parallel_threshold && rows > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t row = 0; row < rows; ++row) {
      index_t rem = row, off = 0;
      for (std::size_t k = r - 1; k-- > 0;) {
        off += (rem % out_dims[k]) * src_stride[k];
        rem /= out_dims[k];
      }
      T* o = out + row * inner;
      const index_t st = src_stride[r - 1];
      for (index_t j = 0; j < inner; ++j) o[j] = in[off + j * st];
    }
  }
};

}  // namespace gradus::cpu_simd_sections
