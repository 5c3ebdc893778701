#pragma once
// cuda: index ops. Every index is checked on the device first (thrust::find_if) and the
// first bad one thrown with its position, as cpu_simd does. scatter_add (gather's adjoint)
// takes no atomics: positions are sorted by target row (a stable sort, so positions keep
// their order within a row), then each output element sums its row's positions in that
// order — cpu_simd's order, so the sums have the same bits on both backends.
#include <thrust/copy.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>

#include "gradus/backends/cuda/rows.hpp"

namespace gradus {

namespace cuda_kernels {

template <class T>
struct one_hot_fn {
  const std::int32_t* idx;
  index_t depth;
  T* out;
  GRADUS_HD void operator()(index_t e) const {
    const index_t i = e / depth, d = e - i * depth;
    out[e] = idx[i] == d ? T(1) : T(0);
  }
};
template <class T>
struct gather_fn {  // out[i, j] = table[idx[i], j]
  const T* table;
  const std::int32_t* idx;
  index_t row_len;
  T* out;
  GRADUS_HD void operator()(index_t e) const {
    const index_t i = e / row_len, j = e - i * row_len;
    out[e] = table[idx[i] * row_len + j];
  }
};
template <class T>
struct scatter_rows_fn {  // out[idx[i], j] = src[i, j]
  const T* src;
  const std::int32_t* idx;
  index_t row_len;
  T* out;
  GRADUS_HD void operator()(index_t e) const {
    const index_t i = e / row_len, j = e - i * row_len;
    out[idx[i] * row_len + j] = src[e];
  }
};
/// out[r, j] = sum of g[order[k], j] over the k whose sorted key is r, in k order
template <class T>
struct scatter_add_fn {
  const T* g;
  const std::int32_t* keys;  ///< idx sorted (stably)
  const index_t* order;      ///< the positions, in that order
  index_t n, row_len;
  T* out;
  GRADUS_HD void operator()(index_t e) const {
    const index_t r = e / row_len, j = e - r * row_len;
    index_t lo = 0, hi = n;  // the first key >= r
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (keys[mid] < r) lo = mid + 1;
      else hi = mid;
    }
    T acc = T(0);
    for (index_t k = lo; k < n && keys[k] == r; ++k) acc += g[order[k] * row_len + j];
    out[e] = acc;
  }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct index_section : rows_section {
  template <class T>
  static void one_hot(const std::int32_t* idx, index_t n, index_t depth, T* out) {
    check_indices("one_hot", "index", idx, n, depth);
    for_n(n * depth, cuda_kernels::one_hot_fn<T>{idx, depth, out});
  }
  template <class T>
  static void gather(const T* table, index_t rows, index_t row_len, const std::int32_t* idx, index_t n, T* out) {
    check_indices("gather", "index", idx, n, rows);
    for_n(n * row_len, cuda_kernels::gather_fn<T>{table, idx, row_len, out});
  }
  /// out[idx[i]] = src[i] (distinct indices: a sparse update's write-back)
  template <class T>
  static void scatter_rows(const T* src, const std::int32_t* idx, index_t n, index_t row_len, T* out, index_t rows) {
    check_indices("scatter_rows", "index", idx, n, rows);
    for_n(n * row_len, cuda_kernels::scatter_rows_fn<T>{src, idx, row_len, out});
  }
  template <class T>
  static void scatter_add(const T* g, const std::int32_t* idx, index_t n, index_t row_len, T* out, index_t rows) {
    check_indices("scatter_add", "index", idx, n, rows);
    const std::size_t m = static_cast<std::size_t>(n > 0 ? n : 1);
    cuda_detail::device_scratch<std::int32_t> keys(m);
    cuda_detail::device_scratch<index_t> order(m);
    if (n > 0) {
      thrust::copy(policy(), idx, idx + n, keys.get());
      thrust::sequence(policy(), order.get(), order.get() + n);
      thrust::stable_sort_by_key(policy(), keys.get(), keys.get() + n, order.get());
    }
    for_n(rows * row_len, cuda_kernels::scatter_add_fn<T>{g, keys.get(), order.get(), n, row_len, out});
  }
};

}  // namespace cuda_sections
}  // namespace gradus
