#pragma once
// cuda: layout. permute() writes each output element from its source element (one thread
// per output element: writes coalesce, reads gather).
#include <array>

#include "gradus/backends/cuda/index.hpp"

namespace gradus {

namespace cuda_kernels {

template <class T>
struct permute_fn {
  const T* in;
  index_t rank;
  index_t out_dims[max_rank];
  index_t src_stride[max_rank];
  T* out;
  GRADUS_HD void operator()(index_t e) const {
    index_t rem = e, off = 0;
    // a constant trip count with the rank as a condition: the arrays stay in registers
    // (exec/plan.hpp's loop_shape::row_index says why)
    GRADUS_UNROLL
    for (index_t k = static_cast<index_t>(max_rank); k-- > 0;) {
      if (k < rank) {
        const index_t q = rem / out_dims[k];
        off += (rem - q * out_dims[k]) * src_stride[k];
        rem = q;
      }
    }
    out[e] = in[off];
  }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct layout_section : index_section {
  template <class T>
  static void permute(const T* in, const dims& in_dims, const std::array<std::size_t, max_rank>& perm, T* out) {
    const std::size_t r = in_dims.rank;
    cuda_kernels::permute_fn<T> f{in, static_cast<index_t>(r), {}, {}, out};
    index_t s = 1;
    std::array<index_t, max_rank> in_strides{};
    for (std::size_t i = r; i-- > 0;) {
      in_strides[i] = s;
      s *= in_dims.d[i];
    }
    for (std::size_t i = 0; i < r; ++i) {
      f.out_dims[i] = in_dims.d[perm[i]];
      f.src_stride[i] = in_strides[perm[i]];
    }
    for_n(in_dims.numel(), f);
  }
};

}  // namespace cuda_sections
}  // namespace gradus
