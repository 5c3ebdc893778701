#pragma once
// cpu_simd: register-blocked float GEMM kernels for the products OpenBLAS does poorly — few
// rows (a batch of 64 or fewer, a pipeline's micro-batch), or a right operand small enough
// to stay in L2 (a weight gradient over a batch's rows) — on the operands as they are
// stored, row-major: no packed copy of the weights to make, keep or refill.
//
// Why not OpenBLAS or oneDNN: OpenBLAS 0.3.21 packs both operands on every call and its
// kernels are tuned for large blocks; oneDNN's matmul reaches these kernels' speed only on
// its own weight layout, a second copy of every weight matrix that must be refilled after
// every update (cpu_simd/dnnl_matmul.hpp did that for pipelines: 0.9 ms of an 8 ms step, and
// twice the weights' bytes in cache). One thread of an AMD EPYC Zen 5, [m, 512] x [512, 512]
// over eight distinct weight matrices (8 MB, out of L2), GFLOP/s, OpenBLAS / oneDNN on its
// packed layout / these kernels, g++ 12 -O3 -march=native (benchmarks/bench_gemm_kernels):
//   m =  8: 50 / 154 / 158 (B transposed: 47 / 160 / 171)
//   m = 64: 151 / 200 / 177 (B transposed: 135 / 191 / 151)
// (benchmarks/results/issue31_kernels-*.md has the whole table.) On an Intel Xeon whose L3
// gives one core ~25 GB/s (a fifth of its L2's), the same sweep reads B late: A B prefetches
// the rows it needs next (rows_times_block), 8 x 512 x 512 forward 64-75 against 57-62 GFLOP/s
// without, 64 rows 117-139 against 115-120 (issue31_intel-*.md).
//
// The kernels (C = alpha op(A) op(B) + beta C, every matrix row-major with a leading
// dimension):
//   - A B and A^T B: rows_times_matrix. A's rows come in tiles of `tile_rows`, copied into a
//     small buffer column by column (tile_rows floats per k, zero rows past m), and each tile
//     sweeps B once in blocks of `block_vecs` vectors of columns: per k, the block's vectors of
//     B are loaded once and each row's A(i, k), broadcast, multiplies them into the tile's
//     tile_rows x block_vecs accumulators, which stay in registers over the whole of k.
//   - A B^T: rows_dot_rows. Each C(i, j) is the dot product of A's row i and B's row j, both
//     contiguous: A's tile is interleaved in vectors (a vector of row 0, then of row 1, ...),
//     and each block of `dot_cols` rows of B is swept once along k against the tile, the
//     accumulators summed across their lanes at the end (16 at a time by a tree of shuffles,
//     in the order a lone sum uses too). The next block's rows are prefetched (each block of B
//     is a few short streams that the hardware prefetcher alone finds late).
//   - A^T B^T is left to OpenBLAS (nothing in gradus asks for it).
// Each C(i, j) sums its k products in the same order whatever m, the tile and the thread
// count: a micro-batch's rows come out with the bits of the whole batch's. A B and A^T B with
// alpha = beta = 1 go on from C's values (the accumulators start from C, not from zero): a
// product over k's first rows, then one over the rest, gives the bits of one product over all
// of them (a pipeline stage begins its weight gradients before the last micro-batch's rows
// arrive: parallel/pipeline/pipeline_stage.hpp).
//
// g++ 12 folds a vector that feeds several multiply-adds back into each of them as a memory
// operand (three loads of one A vector instead of one, enough to bind on the load ports):
// `keep_in_register` stops that.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gradus/core/intrinsics.hpp"

namespace gradus::cpu_gemm {

using index_t = std::int64_t;

#if defined(__AVX512F__)
inline constexpr bool available = true;
struct vec {
  using reg = __m512;
  static constexpr index_t width = 16;
  static reg zero() { return _mm512_setzero_ps(); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static reg load_first(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store(float* p, reg v) { _mm512_storeu_ps(p, v); }
  static void store_first(float* p, reg v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static reg broadcast(float x) { return _mm512_set1_ps(x); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  /// The lanes' sum, in sums()'s order: within each 128-bit quarter (e0 + e2) + (e1 + e3),
  /// then (q0 + q1) + (q2 + q3).
  static float sum(reg v) {
    alignas(64) float e[16];
    _mm512_store_ps(e, v);
    float q[4];
    for (index_t l = 0; l < 4; ++l) q[l] = (e[4 * l] + e[4 * l + 2]) + (e[4 * l + 1] + e[4 * l + 3]);
    return (q[0] + q[1]) + (q[2] + q[3]);
  }
  /// out[i] = sum(v[i]) for 16 vectors at once: a tree of shuffles and adds (45 instructions
  /// where 16 separate sums take about 130).
  static void sums(const reg (&v)[16], float* out) {
    reg t[8], u[4], w[2];
    _Pragma("GCC unroll 8") for (index_t i = 0; i < 8; ++i)  // quarters: (e0 + e2, f0 + f2, e1 + e3, f1 + f3)
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    _Pragma("GCC unroll 4") for (index_t i = 0; i < 4; ++i)  // quarters: each of 4 vectors' quarter sum
        u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44), _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xEE));
    _Pragma("GCC unroll 2") for (index_t i = 0; i < 2; ++i)  // (q0 + q1, q2 + q3) of two u's
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88), _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xDD)));
  }
  static void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
};
// 32 vector registers: 8 x 3 accumulators, 3 of B and 1 of A; 8 x 2 dot products (16 sums
// reduced together)
inline constexpr index_t tile_rows = 8, block_vecs = 3, dot_cols = 2;
#elif defined(__AVX2__) && defined(__FMA__)
inline constexpr bool available = true;
struct vec {
  using reg = __m256;
  static constexpr index_t width = 8;
  static reg zero() { return _mm256_setzero_ps(); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg load_first(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  static void store(float* p, reg v) { _mm256_storeu_ps(p, v); }
  static void store_first(float* p, reg v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  static reg broadcast(float x) { return _mm256_set1_ps(x); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(reg v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
  }
  static void sums(const reg (&v)[16], float* out) {
    for (index_t i = 0; i < 16; ++i) out[i] = sum(v[i]);
  }
  static void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
  static __m256i mask(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
};
// 16 vector registers: 4 x 3 accumulators, 3 of B and 1 of A
inline constexpr index_t tile_rows = 4, block_vecs = 3, dot_cols = 3;
#else
inline constexpr bool available = false;  // OpenBLAS takes every product
struct vec {
  static constexpr index_t width = 1;
};
inline constexpr index_t tile_rows = 1, block_vecs = 1, dot_cols = 1;
#endif

/// Products these kernels take: float, not both operands transposed, at most `few_rows` rows
/// or a right operand of at most `small_operand` bytes (swept once per tile of rows, from L2),
/// and wide enough for whole register blocks: with B as stored, at least a block of columns;
/// with B transposed, at least `min_dot` values in each dot product. Anything else is
/// OpenBLAS's (which is faster there: [64, 512] x [512, 10] at half these kernels' time).
inline constexpr index_t few_rows = 64;
inline constexpr index_t small_operand = index_t(256) * 1024;
inline constexpr index_t min_dot = 64;
inline bool takes(bool ta, bool tb, index_t m, index_t n, index_t k) {
  if constexpr (!available) return false;
  if ((ta && tb) || m <= 0 || (tb ? k < min_dot || n < dot_cols : n < block_vecs * vec::width)) return false;
  return m <= few_rows || k * n * static_cast<index_t>(sizeof(float)) <= small_operand;
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
namespace detail {
/// See the top of this file: the register is an asm operand, so its load is not folded.
inline void keep_in_register(vec::reg& r) {
#if defined(__GNUC__) && !defined(__clang__)
  __asm__("" : "+v"(r));
#else
  (void)r;
#endif
}

/// The calling thread's buffer for one tile of A (grown, never shrunk).
inline float* tile_buffer(std::size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

/// C's rows [0, rows) of a tile, from `acc` (tile_rows rows, each `cols` values apart).
inline void store_rows(const float* acc, index_t stride, index_t rows, index_t cols, float alpha, float beta, float* c,
                       index_t ldc) {
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      float& out = c[i * ldc + j];
      out = beta == 0.0f ? alpha * acc[i * stride + j] : alpha * acc[i * stride + j] + beta * out;
    }
}

/// How many rows of B ahead rows_times_block prefetches (4-16 measured alike, 8 best).
inline constexpr index_t ahead = 8;

/// One tile: C[0:rows, j0:j0 + V vectors (the last `last` wide where Partial)] from the tile
/// `at` (at[p * ats + i] = A(i, p): a packed tile, or A^T's rows as stored) and B's rows.
/// The block's row `ahead` rows on is prefetched, then the first rows of `next` (the block
/// swept after this one, V vectors wide, k rows): a block is a few lines per row of B, one
/// row apart, which the hardware prefetchers follow late (one thread of an Intel Xeon, 8 rows,
/// B out of L2: 73 against 57 GFLOP/s; from L2 155 against 136).
template <int V, bool Partial>
inline void rows_times_block(index_t k, const float* at, index_t ats, const float* b, index_t ldb, const float* next,
                             int last, index_t rows, float alpha, float beta, float* c, index_t ldc) {
  vec::reg acc[tile_rows][V];
  // alpha = beta = 1: the sums go on from C's values (a product over k's first rows, then one
  // over the rest, gives the bits of one product over all of them)
  const bool chain = alpha == 1.0f && beta == 1.0f;
  _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i)
      _Pragma("GCC unroll 16") for (index_t v = 0; v < V; ++v) {
    const float* ci = c + i * ldc + v * vec::width;
    acc[i][v] = !chain || i >= rows ? vec::zero() : Partial && v == V - 1 ? vec::load_first(ci, last) : vec::load(ci);
  }
  if (chain) beta = 0.0f;
  const float* pf = k > ahead ? b + ahead * ldb : next;
  for (index_t p = 0, left = k - ahead; p < k; ++p, b += ldb, at += ats) {
    vec::reg bv[V];
    _Pragma("GCC unroll 16") for (index_t v = 0; v < V; ++v) bv[v] = Partial && v == V - 1 ? vec::load_first(b + v * vec::width, last)
                                                                                : vec::load(b + v * vec::width);
    if constexpr (!Partial) {  // (a partial block's last vector may end past B: not prefetched)
      _Pragma("GCC unroll 16") for (index_t v = 0; v < V; ++v) vec::prefetch(pf + v * vec::width);
      pf = --left == 0 ? next : pf + ldb;
    }
    _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i) {
      vec::reg a = vec::broadcast(at[i]);
      keep_in_register(a);
      _Pragma("GCC unroll 16") for (index_t v = 0; v < V; ++v) acc[i][v] = vec::fma(a, bv[v], acc[i][v]);
    }
  }
  const index_t cols = (V - 1) * vec::width + (Partial ? last : vec::width);
  if (!Partial && rows == tile_rows && beta == 0.0f && alpha == 1.0f) {
    _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i)
        _Pragma("GCC unroll 16") for (index_t v = 0; v < V; ++v) vec::store(c + i * ldc + v * vec::width, acc[i][v]);
    return;
  }
  alignas(64) float out[tile_rows * V * vec::width];
  _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i)
      _Pragma("GCC unroll 16") for (index_t v = 0; v < V; ++v) vec::store(out + (i * V + v) * vec::width, acc[i][v]);
  store_rows(out, V * vec::width, rows, cols, alpha, beta, c, ldc);
}

/// One tile of dot products: C[0:rows, 0:J] for B's rows 0..J-1 against the interleaved
/// tile `at` (at[(p / width) * tile_rows * width + i * width + p % width] = A(i, p), zero past
/// k); `next` is the next block's first row of B (prefetched: a prefetch never faults).
template <int J>
inline void rows_dot_block(index_t k, const float* at, const float* b, index_t ldb, const float* next, index_t rows,
                           float alpha, float beta, float* c, index_t ldc) {
  vec::reg acc[tile_rows][J];
  _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i)
      _Pragma("GCC unroll 16") for (index_t j = 0; j < J; ++j) acc[i][j] = vec::zero();
  const index_t kf = k / vec::width * vec::width;
  const auto step = [&](const vec::reg (&bv)[J]) {
    _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i) {
      vec::reg a = vec::load(at + i * vec::width);
      keep_in_register(a);
      _Pragma("GCC unroll 16") for (index_t j = 0; j < J; ++j) acc[i][j] = vec::fma(a, bv[j], acc[i][j]);
    }
  };
  for (index_t p = 0; p < kf; p += vec::width, at += tile_rows * vec::width) {
    vec::reg bv[J];
    _Pragma("GCC unroll 16") for (index_t j = 0; j < J; ++j) bv[j] = vec::load(b + j * ldb + p);
    _Pragma("GCC unroll 16") for (index_t j = 0; j < J; ++j) vec::prefetch(next + j * ldb + p);
    step(bv);
  }
  if (kf < k) {
    vec::reg bv[J];
    _Pragma("GCC unroll 16") for (index_t j = 0; j < J; ++j) bv[j] = vec::load_first(b + j * ldb + kf, static_cast<int>(k - kf));
    step(bv);
  }
  alignas(64) float out[tile_rows * J];
  if constexpr (tile_rows * J == 16) {
    vec::reg all[16];
    _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i)
        _Pragma("GCC unroll 16") for (index_t j = 0; j < J; ++j) all[i * J + j] = acc[i][j];
    vec::sums(all, out);
  } else {
    _Pragma("GCC unroll 16") for (index_t i = 0; i < tile_rows; ++i)
        _Pragma("GCC unroll 16") for (index_t j = 0; j < J; ++j) out[i * J + j] = vec::sum(acc[i][j]);
  }
  store_rows(out, J, rows, J, alpha, beta, c, ldc);
}
/// A's rows [i0, i0 + rows) as a tile, column by column: at[p * tile_rows + i] = A(i0 + i, p),
/// zero rows past `rows` (A row-major [m, k]).
inline void pack_rows(index_t k, const float* a, index_t lda, index_t rows, float* at) {
  constexpr index_t R = tile_rows;
  index_t p = 0;
#if defined(__AVX512F__)
  if (rows == R)  // 8 x 8 blocks transposed in registers
    for (; p + 8 <= k; p += 8) {
      __m256 r[8];
      _Pragma("GCC unroll 8") for (index_t i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(a + i * lda + p);
      const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
      const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
      const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
      const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      float* o = at + p * R;
      _mm256_storeu_ps(o + 0 * R, _mm256_permute2f128_ps(u0, u4, 0x20));
      _mm256_storeu_ps(o + 1 * R, _mm256_permute2f128_ps(u1, u5, 0x20));
      _mm256_storeu_ps(o + 2 * R, _mm256_permute2f128_ps(u2, u6, 0x20));
      _mm256_storeu_ps(o + 3 * R, _mm256_permute2f128_ps(u3, u7, 0x20));
      _mm256_storeu_ps(o + 4 * R, _mm256_permute2f128_ps(u0, u4, 0x31));
      _mm256_storeu_ps(o + 5 * R, _mm256_permute2f128_ps(u1, u5, 0x31));
      _mm256_storeu_ps(o + 6 * R, _mm256_permute2f128_ps(u2, u6, 0x31));
      _mm256_storeu_ps(o + 7 * R, _mm256_permute2f128_ps(u3, u7, 0x31));
    }
#endif
  for (; p < k; ++p)
    for (index_t i = 0; i < R; ++i) at[p * R + i] = i < rows ? a[i * lda + p] : 0.0f;
}
/// The part of B that every tile sweeps before the next part: about `panel_bytes` of it, so
/// that it stays in L2 from the first tile's sweep to the last's while each tile's A stays in
/// L1; in whole blocks of `unit` columns (or rows) of `k` floats each, at least one.
inline constexpr index_t panel_bytes = index_t(128) * 1024;
inline index_t panel_units(index_t k, index_t unit) {
  return std::max<index_t>(1, panel_bytes / (k * unit * static_cast<index_t>(sizeof(float))));
}
}  // namespace detail

/// C[m, n] = alpha op(A) B + beta C, op(A) = A [m, k] (ta false) or the transpose of A [k, m];
/// B [k, n]. beta == 0 writes C without reading it. Every tile of op(A) is packed first
/// (A^T's whole tiles are read where they lie); then, panel by panel of B's columns, each
/// tile sweeps the panel's blocks.
inline void rows_times_matrix(bool ta, index_t m, index_t n, index_t k, float alpha, const float* a, index_t lda,
                              const float* b, index_t ldb, float beta, float* c, index_t ldc) {
  constexpr index_t R = tile_rows, W = vec::width, block = block_vecs * W;
  const index_t tiles = (m + R - 1) / R;
  float* buf = detail::tile_buffer(static_cast<std::size_t>(tiles * k * R));
  for (index_t t = 0; t < tiles; ++t) {
    const index_t i0 = t * R, rows = std::min(R, m - i0);
    float* at = buf + t * k * R;
    if (ta && rows < R) {
      for (index_t p = 0; p < k; ++p)
        for (index_t i = 0; i < R; ++i) at[p * R + i] = i < rows ? a[p * lda + i0 + i] : 0.0f;
    } else if (!ta) {
      detail::pack_rows(k, a + i0 * lda, lda, rows, at);
    }
  }
  const index_t step = detail::panel_units(k, block) * block;
  for (index_t j0 = 0; j0 < n; j0 += step) {
    const index_t j1 = std::min(n, j0 + step);
    for (index_t t = 0; t < tiles; ++t) {
      const index_t i0 = t * R, rows = std::min(R, m - i0);
      const bool in_place = ta && rows == R;  // A^T's rows hold the tile's columns already
      const float* at = in_place ? a + i0 : buf + t * k * R;
      const index_t ats = in_place ? lda : R;
      float* ci = c + i0 * ldc;
      // the block after j, whole (a narrower one prefetches the panel's first block again)
      const auto next = [&](index_t j) { return b + (j + 2 * block <= j1 ? j + block : j0); };
      index_t j = j0;
      for (; j + block <= j1; j += block)
        detail::rows_times_block<block_vecs, false>(k, at, ats, b + j, ldb, next(j), W, rows, alpha, beta, ci + j, ldc);
      if (block_vecs > 2 && j + 2 * W <= j1) {
        detail::rows_times_block<2, false>(k, at, ats, b + j, ldb, b + j0, W, rows, alpha, beta, ci + j, ldc);
        j += 2 * W;
      }
      for (; j + W <= j1; j += W)
        detail::rows_times_block<1, false>(k, at, ats, b + j, ldb, b + j0, W, rows, alpha, beta, ci + j, ldc);
      if (j < j1)
        detail::rows_times_block<1, true>(k, at, ats, b + j, ldb, b + j0, static_cast<int>(j1 - j), rows, alpha, beta, ci + j,
                                          ldc);
    }
  }
}

/// C[m, n] = alpha A B^T + beta C, A [m, k], B [n, k]. beta == 0 writes C without reading it.
/// Every tile of A is interleaved first; then, panel by panel of B's rows, each tile sweeps
/// the panel's blocks.
inline void rows_dot_rows(index_t m, index_t n, index_t k, float alpha, const float* a, index_t lda, const float* b,
                          index_t ldb, float beta, float* c, index_t ldc) {
  constexpr index_t R = tile_rows, W = vec::width, J = dot_cols;
  const index_t chunks = (k + W - 1) / W, tiles = (m + R - 1) / R, tile = chunks * R * W;
  float* buf = detail::tile_buffer(static_cast<std::size_t>(tiles * tile));
  for (index_t t = 0; t < tiles; ++t) {
    const index_t i0 = t * R, rows = std::min(R, m - i0);
    for (index_t q = 0; q < chunks; ++q)  // interleaved: a vector of each row in turn
      for (index_t i = 0; i < R; ++i) {
        float* dst = buf + t * tile + (q * R + i) * W;
        const index_t p0 = q * W, w = std::min(W, k - p0);
        vec::store(dst, i < rows ? vec::load_first(a + (i0 + i) * lda + p0, static_cast<int>(w)) : vec::zero());
      }
  }
  const index_t step = detail::panel_units(k, J) * J;
  for (index_t j0 = 0; j0 < n; j0 += step) {
    const index_t j1 = std::min(n, j0 + step);
    for (index_t t = 0; t < tiles; ++t) {
      const index_t i0 = t * R, rows = std::min(R, m - i0);
      const float* at = buf + t * tile;
      float* ci = c + i0 * ldc;
      index_t j = j0;
      for (; j + J <= j1; j += J)
        detail::rows_dot_block<dot_cols>(k, at, b + j * ldb, ldb, b + (j + 2 * J <= j1 ? j + J : j) * ldb, rows, alpha, beta,
                                         ci + j, ldc);
      for (; j < j1; ++j) detail::rows_dot_block<1>(k, at, b + j * ldb, ldb, b + j * ldb, rows, alpha, beta, ci + j, ldc);
    }
  }
}

/// C = alpha op(A) op(B) + beta C where takes(ta, tb, m, n, k); see the top of this file.
inline void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const float* a, index_t lda, const float* b,
                 index_t ldb, float beta, float* c, index_t ldc) {
  if (tb) rows_dot_rows(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else rows_times_matrix(ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
#else
inline void gemm(bool, bool, index_t, index_t, index_t, float, const float*, index_t, const float*, index_t, float, float*,
                 index_t) {}
#endif

}  // namespace gradus::cpu_gemm
