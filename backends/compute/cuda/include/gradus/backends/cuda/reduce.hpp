#pragma once
// cuda: reductions over the middle axis of [outer, n, inner] (one thread per output,
// walking n in order: the reads of neighbouring threads are neighbours in memory), one
// parallel tree (thrust::reduce) when everything reduces to one value, argmax (graph/ops/
// argmax_at.hpp's rule, one output position a thread), the sum of squares in double, and
// the non-finite screen.
#include <limits>

#include <thrust/reduce.h>
#include <thrust/transform_reduce.h>

#include "gradus/backends/cuda/fused.hpp"
#include "gradus/graph/ops/argmax_at.hpp"
#include "gradus/graph/ops/reduce.hpp"

namespace gradus {

namespace cuda_kernels {

template <class T>
struct fold {
  reduce_kind kind;
  GRADUS_HD T identity() const {
    return kind == reduce_kind::max   ? -std::numeric_limits<T>::infinity()
           : kind == reduce_kind::min ? std::numeric_limits<T>::infinity()
                                      : T(0);
  }
  /// max / min propagate a NaN (a NaN never compares greater, so it is kept explicitly)
  GRADUS_HD T operator()(T a, T b) const {
    if (kind == reduce_kind::max) return (b > a || b != b) ? b : a;
    if (kind == reduce_kind::min) return (b < a || b != b) ? b : a;
    return a + b;
  }
};

template <class T>
struct reduce_fn {
  const T* in;
  index_t n, inner;
  T* out;
  fold<T> op;
  GRADUS_HD void operator()(index_t oi) const {
    const index_t o = oi / inner, i = oi - o * inner;
    const T* p = in + o * n * inner + i;
    T acc = op.identity();
    for (index_t k = 0; k < n; ++k) acc = op(acc, p[k * inner]);
    if (op.kind == reduce_kind::mean) acc = n ? acc / static_cast<T>(n) : std::numeric_limits<T>::quiet_NaN();
    out[oi] = acc;
  }
};

template <class T>
struct argmax_fn {
  const T* in;
  index_t n, inner;
  std::int32_t* out;
  GRADUS_HD void operator()(index_t oi) const { out[oi] = argmax_at(in, n, inner, oi); }
};

template <class T>
struct store_one {
  T* out;
  T v;
  GRADUS_HD void operator()(index_t) const { *out = v; }
};

template <class T>
struct square_d {
  GRADUS_HD double operator()(T v) const { return static_cast<double>(v) * static_cast<double>(v); }
};
template <class T>
struct nonfinite {
  const T* x;
  GRADUS_HD bool operator()(index_t i) const { return !(x[i] - x[i] == T(0)); }  // inf - inf and NaN are NaN
};
struct plus_d {
  GRADUS_HD double operator()(double a, double b) const { return a + b; }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct reduce_section : fused_section {
  template <class T>
  static void reduce(reduce_kind k, const T* in, index_t outer, index_t n, index_t inner, T* out) {
    const cuda_kernels::fold<T> op{k};
    if (outer * inner == 1 && n >= (1 << 14)) {  // one output: a parallel tree
      const T r = thrust::reduce(policy(), in, in + n, op.identity(), op);
      const T v = k == reduce_kind::mean ? r / static_cast<T>(n) : r;
      for_n(1, cuda_kernels::store_one<T>{out, v});
      return;
    }
    for_n(outer * inner, cuda_kernels::reduce_fn<T>{in, n, inner, out, op});
  }

  template <class T>
  static void argmax(const T* in, index_t outer, index_t n, index_t inner, std::int32_t* out) {
    for_n(outer * inner, cuda_kernels::argmax_fn<T>{in, n, inner, out});
  }

  template <class T>
  static T sum_squares(const T* x, index_t n) {
    if (n <= 0) return T(0);
    return static_cast<T>(thrust::transform_reduce(policy(), x, x + n, cuda_kernels::square_d<T>{}, 0.0,
                                                   cuda_kernels::plus_d{}));
  }

  template <class T>
  static index_t first_nonfinite(const T* x, index_t n) {
    if (n <= 0) return -1;
    const auto first = thrust::counting_iterator<index_t>(0);
    const auto it = thrust::find_if(policy(), first, first + n, cuda_kernels::nonfinite<T>{x});
    return it == first + n ? -1 : static_cast<index_t>(it - first);
  }
};

}  // namespace cuda_sections
}  // namespace gradus
