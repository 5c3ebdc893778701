#pragma once
// cpu_simd: packs the rows of a row-major matrix into a matmul's panel layout — what
// cpu_simd/dnnl_matmul.hpp's refill_weights does with a pipeline stage's held weights right
// after the stage's update wrote them, so that the next step's micro-batches find them packed.
//
// The layout is the one oneDNN's matmul picks for f32 weights B [k, n] on AVX-512 and AVX2
// (BA16a64b, BA8a24b, ...): n cut into panels of nb columns, each panel kp rows (k padded to
// the layout's block) of nb floats, so B(q, j) lies at (j / nb) * kp * nb + q * nb + j % nb;
// dnnl_matmul.hpp checks a layout against oneDNN's descriptor before it packs into it, and
// reorders with oneDNN where it differs. Padding is never written here: oneDNN's own reorder
// filled (and zeroed) the copy once when it was made.
//
// Why not oneDNN's reorder: per 512 x 512 in cache, its reorder of a transposed operand takes
// 83 us (its panels one reorder each: 86 us), the 8 x 8 AVX transposes below 43 us (a scalar
// blocked loop 185 us); and the copies are larger than L2, where streaming stores move half
// the bytes (kept for the copy that needs no transposing; for the other, measured, no
// faster). mnist_deep_mlp's update with both copies of every weight refilled, on an AMD EPYC
// (Zen 5): 1.5-1.9 ms a step against 2.3-2.7 ms with oneDNN's reorders
// (benchmarks/bench_microbatch_step, benchmarks/results/issue31_pack-*).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gradus/backends/cpu_simd/intrinsics.hpp"

namespace gradus::cpu_pack {

using dim = std::int64_t;

/// Built without AVX, pack_rows would move one float at a time: oneDNN's reorder packs then.
inline constexpr bool packs_fast =
#if defined(__AVX__)
    true;
#else
    false;
#endif

/// B [k, n] in panels of nb columns, each kp (>= k) rows of nb floats; nb == 0: not a panel layout.
struct panel_layout {
  dim nb = 0;  ///< columns a panel
  dim kp = 0;  ///< rows a panel: k padded to the layout's block
  /// A panel layout (not the empty one that says "reorder with oneDNN").
  explicit operator bool() const { return nb > 0; }
};

namespace detail {
#if defined(__AVX__)
/// out[c][i] = src[i * lds + c] for an 8 x 8 tile, in registers.
inline void transpose8(const float* src, dim lds, __m256 (&out)[8]) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * lds);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    out[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
    out[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
  }
}
#endif
}  // namespace detail

/// Packs memory rows [r0, r1) of `b` into `dst`, laid out as `l`. Not transposed, b holds B
/// [k, n] (memory row q is B's row q, n long); transposed, b holds B's transpose (memory row
/// j is B's column j, k long). ldb: b's leading dimension. Not transposed, where dst's
/// 64-byte lines line up and the copy is larger than L2, they are written with streaming
/// stores: a store that first reads each line it overwrites moves twice the bytes.
inline void pack_rows(const panel_layout& l, bool transposed, dim k, dim n, const float* b, dim ldb, dim r0, dim r1,
                      float* dst) {
  const dim nb = l.nb, panel = l.kp * l.nb;
  // streaming: a copy of 1 MiB or more (about L2: a smaller one may stay cached for the products)
  [[maybe_unused]] const bool lines = nb % 16 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 64 == 0 &&
                                      panel * ((n + nb - 1) / nb) * dim(sizeof(float)) >= dim(1) << 20;
  if (!transposed) {  // each row's pieces of nb columns to their panels
    for (dim q = r0; q < r1; ++q)
      for (dim j0 = 0; j0 < n; j0 += nb) {
        float* o = dst + j0 / nb * panel + q * nb;
        const float* i = b + q * ldb + j0;
        const dim len = std::min(nb, n - j0);
        dim c = 0;
#if defined(__AVX__)
        for (; lines && c + 8 <= len; c += 8) _mm256_stream_ps(o + c, _mm256_loadu_ps(i + c));
#endif
        std::memcpy(o + c, i + c, static_cast<std::size_t>(len - c) * sizeof(float));
      }
  } else {  // memory row j is panel j / nb's column j % nb: tiles of rows within one panel
    for (dim j = r0; j < r1;) {
      float* col = dst + j / nb * panel + j % nb;
      dim rows = 1, q = 0;
#if defined(__AVX__)
      if (j + 8 <= r1 && j % nb + 8 <= nb) {  // 8 x 8 tiles (streaming them, measured, was no faster)
        rows = 8;
        for (; q + 8 <= k; q += 8) {
          __m256 t[8];
          detail::transpose8(b + j * ldb + q, ldb, t);
          for (int i = 0; i < 8; ++i) _mm256_storeu_ps(col + (q + i) * nb, t[i]);
        }
      }
#endif
      for (; q < k; ++q)
        for (dim i = 0; i < rows; ++i) col[q * nb + i] = b[(j + i) * ldb + q];
      j += rows;
    }
  }
#if defined(__AVX__)
  _mm_sfence();  // streaming stores are weakly ordered: visible before any product reads them
#endif
}

}  // namespace gradus::cpu_pack
