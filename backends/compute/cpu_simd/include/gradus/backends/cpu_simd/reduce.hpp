#pragma once
// cpu_simd: reductions (over the middle axis of [outer, n, inner]), argmax (graph/ops/
// argmax_at.hpp's rule, one output position a thread), the sum of squares and the
// non-finite screen, and the row helpers (a fixed summation order, so a result depends on
// n only) that the later sections share.
#include "gradus/backends/cpu_simd/fused.hpp"
#include "gradus/graph/ops/argmax_at.hpp"
#include "gradus/graph/ops/elementwise.hpp"  // fn::saturating_exp

namespace gradus::cpu_simd_sections {

struct reduce_section : fused_section {
  /// sum of x[i]^2, accumulated in double in a fixed order (deterministic).
  template <class T>
  static T sum_squares(const T* x, index_t n) {
    double s = 0;
    constexpr index_t block = 1 << 12;
    for (index_t i = 0; i < n; i += block) {
      const index_t m = std::min(block, n - i);
      using B = xsimd::batch<T>;
      constexpr index_t W = static_cast<index_t>(B::size);
      B acc(T(0));
      index_t j = 0;
      for (; j + W <= m; j += W) {
        const B v = B::load_unaligned(x + i + j);
        acc += v * v;
      }
      double part = static_cast<double>(xsimd::hadd(acc));
      for (; j < m; ++j) part += static_cast<double>(x[i + j]) * static_cast<double>(x[i + j]);
      s += part;
    }
    return static_cast<T>(s);
  }

  /// The index of the first NaN or infinity among x[0, n), or -1 (check_numerics). Blocks
  /// are screened with SIMD (x * 0 is 0 for a finite x, NaN otherwise), then searched.
  template <class T>
  static index_t first_nonfinite(const T* x, index_t n) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size), block = 1 << 12;
    for (index_t i = 0; i < n; i += block) {
      const index_t m = std::min(block, n - i);
      B acc(T(0));
      index_t j = 0;
      for (; j + W <= m; j += W) acc += B::load_unaligned(x + i + j) * B(T(0));
      if (j < m) acc += tail_batch<B>(x + i + j, m - j) * B(T(0));
      if (xsimd::hadd(acc) == T(0)) continue;
      for (j = 0; j < m; ++j)
        if (!std::isfinite(x[i + j])) return i + j;
    }
    return -1;
  }

  /// ---- reductions ----------------------------------------------------------------------
  template <class T>
  static void reduce(reduce_kind k, const T* in, index_t outer, index_t n, index_t inner, T* out) {
    switch (k) {
      case reduce_kind::sum: reduce_impl<T>(in, outer, n, inner, out, add_op{}); break;
      case reduce_kind::mean: {
        reduce_impl<T>(in, outer, n, inner, out, add_op{});
        const T s = T(1) / static_cast<T>(n);  // n == 0: NaN, as NumPy
        for (index_t i = 0; i < outer * inner; ++i) out[i] = n ? out[i] * s : std::numeric_limits<T>::quiet_NaN();
        break;
      }
      case reduce_kind::max: reduce_impl<T>(in, outer, n, inner, out, max_op{}); break;
      case reduce_kind::min: reduce_impl<T>(in, outer, n, inner, out, min_op{}); break;
    }
  }

  template <class T>
  static void argmax(const T* in, index_t outer, index_t n, index_t inner, std::int32_t* out) {
    const bool par = outer * n * inner >= parallel_threshold && outer * inner > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t oi = 0; oi < outer * inner; ++oi) out[oi] = argmax_at(in, n, inner, oi);
  }

 protected:
  struct add_op {
    template <class X>
    X operator()(const X& a, const X& b) const { return a + b; }
    template <class T>
    static constexpr T identity() { return T(0); }
  };
  struct max_op {
    template <class X>
    X operator()(const X& a, const X& b) const { using std::max; return max(a, b); }
    template <class T>
    static constexpr T identity() { return -std::numeric_limits<T>::infinity(); }
  };
  struct min_op {
    template <class X>
    X operator()(const X& a, const X& b) const { using std::min; return min(a, b); }
    template <class T>
    static constexpr T identity() { return std::numeric_limits<T>::infinity(); }
  };

  /// Reduce a contiguous run with SIMD: four independent accumulators, then a fixed
  /// tree, so the order (and the result) depends only on n.
  template <class T, class Op>
  static T reduce_run(const T* x, index_t n, Op op) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    index_t j = 0;
    T r = Op::template identity<T>();
    if (n >= 4 * W) {
      B a0 = B::load_unaligned(x), a1 = B::load_unaligned(x + W), a2 = B::load_unaligned(x + 2 * W),
        a3 = B::load_unaligned(x + 3 * W);
      for (j = 4 * W; j + 4 * W <= n; j += 4 * W) {
        a0 = op(a0, B::load_unaligned(x + j));
        a1 = op(a1, B::load_unaligned(x + j + W));
        a2 = op(a2, B::load_unaligned(x + j + 2 * W));
        a3 = op(a3, B::load_unaligned(x + j + 3 * W));
      }
      const B acc = op(op(a0, a1), op(a2, a3));
      alignas(alignment) T lanes[W];
      acc.store_aligned(lanes);
      r = lanes[0];
      for (index_t l = 1; l < W; ++l) r = op(r, lanes[l]);
    }
    for (; j < n; ++j) r = op(r, x[j]);
    return r;
  }

  template <class T, class Op>
  static void reduce_impl(const T* in, index_t outer, index_t n, index_t inner, T* out, Op op) {
    if (inner == 1) {
      if (outer == 1 && n >= 2 * parallel_threshold) {
        // One long run: fixed blocks (independent of the thread count) reduced in
        // parallel, then combined in block order — deterministic across runs and threads.
        constexpr index_t max_blocks = 64;
        const index_t blocks = std::min<index_t>(max_blocks, n / parallel_threshold);
        const index_t bs = (n + blocks - 1) / blocks;
        T partial[max_blocks];
#pragma omp parallel for schedule(static)
        for (index_t b = 0; b < blocks; ++b) {
          const index_t lo = b * bs, hi = std::min(n, lo + bs);
          partial[b] = reduce_run(in + lo, hi - lo, op);
        }
        T r = partial[0];
        for (index_t b = 1; b < blocks; ++b) r = op(r, partial[b]);
        out[0] = r;
        return;
      }
      const bool par = outer * n >= parallel_threshold && outer > 1;
#pragma omp parallel for schedule(static) if (par)
      for (index_t o = 0; o < outer; ++o) out[o] = reduce_run(in + o * n, n, op);
      return;
    }
    // Reduce across rows of length `inner`: vectorised along the row.
    const index_t pieces = (inner + chunk - 1) / chunk;
    const bool par = outer * n * inner >= parallel_threshold && outer * pieces > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t t = 0; t < outer * pieces; ++t) {
      const index_t o = t / pieces, j0 = (t % pieces) * chunk, j1 = std::min(inner, j0 + chunk);
      T* y = out + o * inner;
      const T* base = in + o * n * inner;
      if (n == 0) {
        std::fill(y + j0, y + j1, Op::template identity<T>());
        continue;
      }
      std::copy(base + j0, base + j1, y + j0);
      for (index_t k = 1; k < n; ++k) zip_row(base + k * inner, y, j0, j1, op);
    }
  }

  template <class T, class Op>
  static void zip_row(const T* x, T* y, index_t j0, index_t j1, Op op) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    index_t j = j0;
    for (; j + W <= j1; j += W) op(B::load_unaligned(y + j), B::load_unaligned(x + j)).store_unaligned(y + j);
    for (; j < j1; ++j) y[j] = op(y[j], x[j]);
  }

  template <class T>
  static T row_max(const T* x, index_t n) {
    return reduce_run(x, n, max_op{});
  }
  template <class T>
  static T row_sum(const T* x, index_t n) {
    return reduce_run(x, n, add_op{});
  }
  template <class T>
  static T row_sum_exp(const T* x, index_t n, T mx) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    B acc(T(0));
    index_t j = 0;
    for (; j + W <= n; j += W) acc += fn::saturating_exp(B::load_unaligned(x + j) - B(mx));
    T s = xsimd::hadd(acc);
    if (j < n) {  // the tail through the same xsimd::exp (exec/plan.hpp says why)
      alignas(sizeof(B)) T e[W];
      fn::saturating_exp(tail_batch<B>(x + j, n - j) - B(mx)).store_aligned(e);
      for (index_t k = 0; k < n - j; ++k) s += e[k];
    }
    return s;
  }
  /// y = f(x) over a row (y may be x); the tail as a padded batch
  template <class T, class F>
  static void map_row(const T* x, T* y, index_t n, F f) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    index_t j = 0;
    for (; j + W <= n; j += W) f(B::load_unaligned(x + j)).store_unaligned(y + j);
    if (j < n) store_first(f(tail_batch<B>(x + j, n - j)), n - j, y + j);
  }
};

}  // namespace gradus::cpu_simd_sections
