#pragma once
// cpu_simd: packs rows of a row-major matrix into a matmul's panel layout, a few rows at a
// time — what cpu_simd/dnnl_matmul.hpp's refill_weights does with each piece of a pipeline
// stage's weights right after the stage's update wrote it, while the piece is in cache.
//
// The layout is the one oneDNN's matmul picks for f32 weights B [k, n] on AVX-512 and AVX2
// (BA16a64b, BA8a24b, ...): n cut into panels of nb columns, each panel kp rows (k padded to
// the layout's block) of nb floats, so B(q, j) lies at (j / nb) * kp * nb + q * nb + j % nb;
// dnnl_matmul.hpp checks a layout against oneDNN's descriptor before it packs into it, and
// reorders with oneDNN where it differs. Padding is never written here: oneDNN's own reorder
// filled (and zeroed) the copy once when it was made.
//
// Why not oneDNN's reorder: it packs a whole matrix, so a stage could only refill a variable
// after the whole update, when the variable has left L2; on an AMD EPYC (Zen 5) that cost
// 1.8 ms of an 11 ms micro-batched step of mnist_deep_mlp (benchmarks/results/issue31_*).
// Per 512 x 512, warm: oneDNN's reorder of the transposed operand 83 us (its panels one
// reorder each: 86 us), the 8 x 8 AVX transposes below 43 us, a scalar blocked loop 185 us.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "gradus/backends/cpu_simd/intrinsics.hpp"

namespace gradus::cpu_pack {

using dim = std::int64_t;

/// B [k, n] in panels of nb columns, each kp (>= k) rows of nb floats; nb == 0: not a panel layout.
struct panel_layout {
  dim nb = 0, kp = 0;
  explicit operator bool() const { return nb > 0; }
};

namespace detail {
/// dst[c * ldd + r] = src[r * lds + c] for an 8 x 8 tile.
inline void transpose8(const float* src, dim lds, float* dst, dim ldd) {
#if defined(__AVX__)
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
    _mm256_storeu_ps(dst + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(dst + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
#else
  for (int c = 0; c < 8; ++c)
    for (int i = 0; i < 8; ++i) dst[c * ldd + i] = src[i * lds + c];
#endif
}
}  // namespace detail

/// Packs memory rows [r0, r1) of `b` into `dst`, laid out as `l`. Not transposed, b holds B
/// [k, n] (memory row q is B's row q, n long); transposed, b holds B's transpose (memory row
/// j is B's column j, k long). ldb: b's leading dimension.
inline void pack_rows(const panel_layout& l, bool transposed, dim k, dim n, const float* b, dim ldb, dim r0, dim r1,
                      float* dst) {
  const dim nb = l.nb, panel = l.kp * l.nb;
  if (!transposed) {  // each row's pieces of nb columns to their panels
    for (dim q = r0; q < r1; ++q)
      for (dim j0 = 0; j0 < n; j0 += nb)
        std::memcpy(dst + j0 / nb * panel + q * nb, b + q * ldb + j0, static_cast<std::size_t>(std::min(nb, n - j0)) * sizeof(float));
    return;
  }
  // memory row j is panel j / nb's column j % nb: 8 x 8 tiles of rows within one panel
  for (dim j = r0; j < r1;) {
    float* col = dst + j / nb * panel + j % nb;
    if (j + 8 <= r1 && j % nb + 8 <= nb) {
      dim q = 0;
      for (; q + 8 <= k; q += 8) detail::transpose8(b + j * ldb + q, ldb, col + q * nb, nb);
      for (; q < k; ++q)
        for (dim i = 0; i < 8; ++i) col[q * nb + i] = b[(j + i) * ldb + q];
      j += 8;
    } else {
      for (dim q = 0; q < k; ++q) col[q * nb] = b[j * ldb + q];
      ++j;
    }
  }
}

}  // namespace gradus::cpu_pack
