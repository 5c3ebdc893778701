#pragma once
// argmax_at: what argmax (ops/reduce.hpp) answers at one output position, written once for
// every backend. The operand is seen as [outer, n, inner] and reduced over n; output
// position oi = o * inner + i gets the index k in [0, n) of the largest in[o, k, i]. Ties go
// to the first; a NaN never wins over a number (a row of NaNs answers 0). GRADUS_HD: cpu_simd
// calls it from its OpenMP loop, the cuda backend from a kernel, so both give the same
// indices.
#include <cstdint>

#include "gradus/core/device.hpp"
#include "gradus/core/shape.hpp"

namespace gradus {

/// The index k in [0, n) of the largest in[o, k, i], for output position oi = o * inner + i
/// of an operand seen as [outer, n, inner]: ties go to the first, a NaN never wins over a
/// number (a row of NaNs answers 0). n >= 1, not checked here (argmax refuses to reduce zero
/// elements).
template <class T>
GRADUS_HD std::int32_t argmax_at(const T* in, index_t n, index_t inner, index_t oi) {
  const index_t o = oi / inner, i = oi - o * inner;
  const T* p = in + o * n * inner + i;
  index_t best = 0;
  T bv = p[0];
  for (index_t k = 1; k < n; ++k) {
    const T v = p[k * inner];
    if (v > bv || (bv != bv && v == v)) {  // NaN never wins over a number
      bv = v;
      best = k;
    }
  }
  return static_cast<std::int32_t>(best);
}

}  // namespace gradus
