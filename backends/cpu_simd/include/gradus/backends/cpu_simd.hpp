#pragma once
// gradus::cpu_simd — the CPU compute policy: xsimd for fused elementwise passes,
// reductions and softmax; OpenBLAS (CBLAS) for GEMM; OpenMP for threads; xtensor for
// interop. The interface every backend implements (named as concepts in exec/backend.hpp,
// asserted below the struct; a CUDA one follows the same shape):
//
//   memory   allocate(bytes) / deallocate(p)         64-byte aligned device buffers
//            copy_to_device(dst, src, bytes) / copy_to_host(dst, src, bytes)
//   fused    assign(out, loop_shape, plan)            one pass of an elementwise plan
//   reduce   reduce(kind, in, outer, n, inner, out)   over the middle of [outer, n, inner]
//            argmax(in, outer, n, inner, out_i32)
//   gemm     gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch)
//   rows     softmax(in, rows, cols, out, log), softmax_xent(logits, labels, rows, cols, loss)
//   index    one_hot(idx, n, depth, out), gather(table, rows, row_len, idx, n, out)
//            scatter_add(g, idx, n, row_len, out, rows), scatter_rows(src, idx, n, row_len, out, rows)
//   layout   permute(in, in_dims, perm, out)
//   conv     conv2d(x, w, n, c, h, w, o, kh, kw, stride, pad, y)           NCHW (*) OIHW -> NCHW
//            conv2d_backward_data(dy, w, ..., dx), conv2d_backward_weights(x, dy, ..., dw)
//   image    im2col(x, n, c, h, w, kh, kw, stride, pad, col), col2im(col, ..., x)
//            pool2d(max, x, planes, h, w, kh, kw, stride, pad, y), pool2d_grad(max, x, g, ..., dx)
//   update   for_each(n, rule, p...)                  an optimizer's rule, in place, one pass
//            sum_squares(x, n)                        host scalar (gradient clipping)
//            copy(dst, src, bytes)                    device to device
//   checks   first_nonfinite(x, n)                    host index of the first NaN/inf, or -1
//   random   dropout_mask(out, n, keep, seed, draw)   counter-based inverted-dropout mask
// CBLAS declarations: xtensor-blas's (xflens) rather than OpenBLAS's <cblas.h>, whose
// enum and integer types differ; one set of declarations lets a program include this
// header and <xtensor-blas/xlinalg.hpp> together. The library linked is OpenBLAS.
#include <xflens/cxxblas/drivers/cblas.h>
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
}
#include <omp.h>
#include <unistd.h>  // sysconf: the last-level cache's size

// g++ 12 reports its own AVX-512 intrinsics (_mm512_undefined_*) as maybe-uninitialized
// or uninitialized once inlined (e.g. in xsimd's exp/pow of doubles); the warning's
// location is the compiler's header, so silencing it before that header is first
// included keeps user code under -Werror clean.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#elif defined(__AVX__)
#include <immintrin.h>  // streaming stores
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <string>
#include <vector>
#include <xsimd/xsimd.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include "gradus/backends/cpu_simd/dnnl.hpp"
#include "gradus/backends/cpu_simd/threads.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/gradus.hpp"

namespace gradus {

struct cpu_simd {
  static constexpr const char* name = "cpu_simd";
  static constexpr std::size_t alignment = 64;
  // Below this many elements a pass runs on the calling thread: a parallel region
  // costs more than it saves.
  static constexpr index_t parallel_threshold = 1 << 15;
  static constexpr index_t chunk = 1 << 14;  // elements of one row piece handed to a thread

  // ---- threads (cpu_simd/threads.hpp) --------------------------------------------------------
  // threads(): the thread count of this calling thread's passes, which defines their results
  // (set_threads, else OMP_NUM_THREADS); team(): the threads a pass starts now, fewer while
  // other processes keep cores busy. set_threads sets both, for fused passes (OpenMP) and
  // GEMM (OpenBLAS).
  static int threads() { return cpu_threads::threads(); }
  static int team() { return cpu_threads::team(); }
  static void set_threads(int n) { cpu_threads::set_threads(n); }
  // The team follows the free cores (the default; GRADUS_ADAPTIVE_THREADS=0 or
  // set_adaptive_threads(false) keeps it at threads()) or is pinned (pin_team(n); 0
  // unpins). It never changes the results' bits (threads.hpp, gemm).
  static void set_adaptive_threads(bool on) { cpu_threads::governor::instance().set_adaptive(on); }
  static void pin_team(int n) { cpu_threads::governor::instance().pin(n); }
  // session::run calls it before every run: one clock read, a sample of /proc every 250 ms.
  static void before_run() { cpu_threads::before_run(); }

  // ---- memory --------------------------------------------------------------------------
  static void* allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    return ::operator new(rounded, std::align_val_t{alignment});
  }
  static void deallocate(void* p) noexcept { ::operator delete(p, std::align_val_t{alignment}); }
  static void copy_to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }

  // ---- fused elementwise pass ------------------------------------------------------------
  // Rows are cut into pieces of `chunk` elements and dealt out statically, so each thread
  // writes one contiguous range of the output. An output larger than the last-level
  // cache cannot still be in cache when its consumer reads it, so it is written with
  // streaming stores: they skip reading each output line before overwriting it, which
  // on a memory-bound pass is a quarter (three arrays) to a fifth (four) of the traffic.
  template <class T, class Plan>
  static void assign(T* out, const loop_shape& ls, const Plan& plan) {
    const index_t rows = ls.rows(), inner = ls.inner();
    const index_t pieces = (inner + chunk - 1) / chunk;
    const index_t tasks = rows * pieces;
    const std::size_t nlead = ls.rank - 1;
    const bool par = rows * inner >= parallel_threshold && tasks > 1;
    const bool stream =
        can_stream<T>() && static_cast<std::size_t>(rows * inner) * sizeof(T) >= stream_threshold_bytes();
#pragma omp parallel if (par)
    {
      Plan p = plan;
      index_t idx[max_rank] = {};
      index_t cur_row = -1;
#pragma omp for schedule(static) nowait
      for (index_t t = 0; t < tasks; ++t) {
        const index_t row = t / pieces, piece = t % pieces;
        if (row != cur_row) {
          ls.row_index(row, idx);
          p.set_row(idx, nlead);
          cur_row = row;
        }
        const index_t j0 = piece * chunk, j1 = std::min(inner, j0 + chunk);
        if constexpr (can_stream<T>()) {
          if (stream) {
            span_streaming(out + row * inner, p, j0, j1);
            continue;
          }
        }
        span(out + row * inner, p, j0, j1);
      }
      // Streaming stores are weakly ordered: make them visible before the region's
      // closing barrier lets anyone read the output.
      if (stream) store_fence();
    }
  }

  // ---- in-place update passes (optimizers) ------------------------------------------------
  // rule(x...) is called with one SIMD batch of every array, as lvalues; the arrays given
  // as non-const pointers are written back. All arrays have n elements of one dtype. A
  // chunk's last partial batch is padded (tail_batch), so every element goes through the
  // rule's SIMD code: the same bits wherever it lands (see exec/plan.hpp).
  template <class F, class P0, class... P>
  static void for_each(index_t n, const F& rule, P0* p0, P*... p) {
    using T = std::remove_const_t<P0>;
    static_assert((std::is_same_v<std::remove_const_t<P>, T> && ...), "gradus: for_each: arrays of one dtype");
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    const index_t pieces = (n + chunk - 1) / chunk;
    const bool par = n >= parallel_threshold && pieces > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t t = 0; t < pieces; ++t) {
      const index_t j0 = t * chunk, j1 = std::min(n, j0 + chunk);
      index_t j = j0;
      for (; j + W <= j1; j += W) {
        auto v = std::tuple{B::load_unaligned(p0 + j), B::load_unaligned(p + j)...};
        std::apply(rule, v);
        store_back(v, j, p0, p...);
      }
      if (j < j1) {
        const index_t m = j1 - j;
        auto v = std::tuple{tail_batch<B>(p0 + j, m), tail_batch<B>(p + j, m)...};
        std::apply(rule, v);
        store_tail(v, j, m, p0, p...);
      }
    }
  }

  // sum of x[i]^2, accumulated in double in a fixed order (deterministic).
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

  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }

  // The index of the first NaN or infinity among x[0, n), or -1 (check_numerics). Blocks
  // are screened with SIMD (x * 0 is 0 for a finite x, NaN otherwise), then searched.
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

  // ---- reductions ----------------------------------------------------------------------
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
    for (index_t oi = 0; oi < outer * inner; ++oi) {
      const index_t o = oi / inner, i = oi % inner;
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
      out[oi] = static_cast<std::int32_t>(best);
    }
  }

  // ---- GEMM (row-major; transposes are flags, never copies) ------------------------------
  // OpenBLAS runs on one thread (cpu_threads::blas_on_one_thread) and the backend splits the
  // work itself: the batch's items and each item's output into a grid of row x column blocks, cut
  // by threads() and the shape alone, every block one single-threaded OpenBLAS call, the
  // blocks shared among the team. So the bits follow threads() and nothing else: a team that
  // shrinks while other processes hold cores (threads.hpp) computes the same blocks, more of
  // them per thread. OpenBLAS's own threading cannot promise that: its multi-threaded driver
  // blocks K differently from its single-threaded one, so a [64,784] x [784,256] product
  // differed in 15,049 of 16,384 elements between 1 and 2 OpenBLAS threads. Below
  // gemm_split_work multiply-adds a product runs on the calling thread (a parallel region
  // costs more than it saves there; OpenBLAS's own cut-off is 262,144).
  template <class T>
  static void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                   index_t stride_a, const T* b, index_t ldb, index_t stride_b, T beta, T* c, index_t ldc,
                   index_t stride_c, index_t batch) {
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0) {
      for (index_t i = 0; i < batch; ++i)
        for (index_t r = 0; r < m; ++r)
          for (index_t q = 0; q < n; ++q) {
            T& x = c[i * stride_c + r * ldc + q];
            x = beta == T(0) ? T(0) : beta * x;
          }
      return;
    }
    if (batch == 1 && split_k(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) return;
    // Items that share an output (stride_c 0) accumulate in order: one thread.
    const int nt = omp_in_parallel() || (batch > 1 && stride_c == 0) ? 1 : threads();
    const gemm_grid g = gemm_plan(m, n, k, batch, nt);
    const index_t blocks = g.rows * g.cols, tasks = batch * blocks;
    const auto task = [&](index_t t) {
      const index_t i = t / blocks, r = t % blocks / g.cols, q = t % blocks % g.cols;
      const index_t m0 = gemm_cut(m, g.rows, r), m1 = gemm_cut(m, g.rows, r + 1);
      const index_t n0 = gemm_cut(n, g.cols, q), n1 = gemm_cut(n, g.cols, q + 1);
      if (m0 == m1 || n0 == n1) return;
      const T* ai = a + i * stride_a + (ta ? m0 : m0 * lda);  // A is [m, k] (or [k, m] transposed)
      const T* bi = b + i * stride_b + (tb ? n0 * ldb : n0);  // B is [k, n] (or [n, k] transposed)
      blas_gemm(ta, tb, m1 - m0, n1 - n0, k, alpha, ai, lda, bi, ldb, beta, c + i * stride_c + m0 * ldc + n0, ldc);
    };
    if (nt == 1 || tasks == 1 || m * n * k * batch < gemm_split_work) {
      for (index_t t = 0; t < tasks; ++t) task(t);
      return;
    }
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(std::min<index_t>(tasks, team())))
    for (index_t t = 0; t < tasks; ++t) task(t);
  }

  // How a product is cut: into rows x cols blocks of each batch item.
  struct gemm_grid {
    index_t rows = 1, cols = 1;
  };
  static constexpr index_t gemm_split_work = index_t(1) << 17;  // multiply-adds: below, one call
  static constexpr index_t gemm_align = 16;                     // block edges at multiples of 16

  // Blocks per item: enough that the batch's tasks divide evenly among `nt` threads
  // (nt / gcd(batch, nt): one item on 2 threads is cut in 2, 3 items in 2 each, 4 not at
  // all), each at least gemm_split_work / 2 multiply-adds and 16 rows and columns wide; of
  // the grids with that many blocks, the one with the least edge per block (rows / r +
  // cols / c: what every block packs of A and B).
  static gemm_grid gemm_plan(index_t m, index_t n, index_t k, index_t batch, int nt) {
    gemm_grid best;
    if (nt <= 1 || m * n * k * batch < gemm_split_work) return best;
    index_t parts = nt / std::gcd(batch, static_cast<index_t>(nt));
    parts = std::min<index_t>(parts, std::max<index_t>(1, 2 * m * n * k / gemm_split_work));
    for (; parts > 1; --parts) {
      double edge = 0;
      bool found = false;
      for (index_t r = 1; r <= parts; ++r) {
        if (parts % r) continue;
        const index_t q = parts / r;
        if ((r > 1 && m < r * gemm_align) || (q > 1 && n < q * gemm_align)) continue;
        const double e = static_cast<double>(m) / static_cast<double>(r) + static_cast<double>(n) / static_cast<double>(q);
        if (!found || e < edge) {
          edge = e;
          best = {r, q};
          found = true;
        }
      }
      if (found) return best;
    }
    return best;
  }
  // The j-th of `parts` edges of [0, len), rounded to gemm_align (the last is len).
  static index_t gemm_cut(index_t len, index_t parts, index_t j) {
    if (j >= parts) return len;
    return std::min(len, (len * j / parts + gemm_align / 2) / gemm_align * gemm_align);
  }
  template <class T>
  static void blas_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                        const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    const auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
    const auto ib = [](index_t v) { return static_cast<CBLAS_INT>(v); };
    cpu_threads::blas_on_one_thread([&] {
      if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, tra, trb, ib(m), ib(n), ib(k), alpha, a, ib(lda), b, ib(ldb), beta, c, ib(ldc));
      else
        cblas_dgemm(CblasRowMajor, tra, trb, ib(m), ib(n), ib(k), alpha, a, ib(lda), b, ib(ldb), beta, c, ib(ldc));
    });
  }

  // A small output over a long inner dimension (a convolution's weight gradient: [6, 25]
  // summed over 36,864 pixels) gives OpenBLAS's threads nothing to split, and with two it
  // runs slower than with one. Here each thread multiplies its own slice of k on its own
  // (OpenBLAS runs single-threaded inside a parallel region) and the partial products are
  // added in slice order. The slices are threads(), not the team: deterministic for a given
  // thread count however many cores are free (a team smaller than threads() takes several).
  template <class T>
  static bool split_k(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                      const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    const int nt = static_cast<int>(std::min<index_t>(threads(), k / split_k_min_slice));
    if (nt < 2 || omp_in_parallel() || m * n > split_k_max_output || k < 8 * std::max(m, n)) return false;
    thread_local std::vector<T> partial;
    partial.resize(static_cast<std::size_t>((nt - 1) * m * n));
    T* parts = partial.data();
#pragma omp parallel for schedule(static) num_threads(std::min(nt, team()))
    for (int ti = 0; ti < nt; ++ti) {
      const index_t t = ti, k0 = k * t / nt, k1 = k * (t + 1) / nt;
      const T* as = ta ? a + k0 * lda : a + k0;  // A is [m, k] (or [k, m] transposed)
      const T* bs = tb ? b + k0 : b + k0 * ldb;  // B is [k, n] (or [n, k] transposed)
      if (t == 0) blas_gemm(ta, tb, m, n, k1 - k0, alpha, as, lda, bs, ldb, beta, c, ldc);
      else blas_gemm(ta, tb, m, n, k1 - k0, alpha, as, lda, bs, ldb, T(0), parts + (t - 1) * m * n, n);
    }
    for (int t = 1; t < nt; ++t)
      for (index_t r = 0; r < m; ++r) zip_row(parts + ((t - 1) * m + r) * n, c + r * ldc, 0, n, add_op{});
    return true;
  }
  static constexpr index_t split_k_min_slice = 512;        // at least this much of k per thread
  static constexpr index_t split_k_max_output = 1 << 16;   // outputs up to 256 KiB of floats

  // ---- row-wise softmax family -----------------------------------------------------------
  template <class T>
  static void softmax(const T* in, index_t rows, index_t cols, T* out, bool log) {
    const bool par = rows * cols >= parallel_threshold && rows > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t r = 0; r < rows; ++r) {
      const T* x = in + r * cols;
      T* y = out + r * cols;
      const T mx = row_max(x, cols);
      if (log) {
        // (v - mx) is exact near the max; adding mx to log(sum) first would round the
        // result to mx's precision (log_softmax([1e30, 1e30]) would be 0, not -log 2).
        const T ls = std::log(row_sum_exp(x, cols, mx));
        map_row(x, y, cols, [mx, ls](auto v) { return (v - decltype(v)(mx)) - decltype(v)(ls); });
      } else {
        map_row(x, y, cols, [mx](auto v) {
          using std::exp;
          return exp(v - decltype(v)(mx));
        });
        const T inv = T(1) / row_sum(y, cols);
        map_row(y, y, cols, [inv](auto v) { return v * decltype(v)(inv); });
      }
    }
  }

  template <class T>
  static void softmax_xent(const T* logits, const std::int32_t* labels, index_t rows, index_t cols, T* loss) {
    check_indices("softmax_cross_entropy", "label", labels, rows, cols);
    const bool par = rows * cols >= parallel_threshold && rows > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t r = 0; r < rows; ++r) {
      const T* x = logits + r * cols;
      const T mx = row_max(x, cols);
      // -log softmax[label] = logsumexp(x) - x[label], with the max taken out first
      loss[r] = std::log(row_sum_exp(x, cols, mx)) - (x[labels[r]] - mx);
    }
  }

  // ---- index ops -------------------------------------------------------------------------
  template <class T>
  static void one_hot(const std::int32_t* idx, index_t n, index_t depth, T* out) {
    check_indices("one_hot", "index", idx, n, depth);
    std::fill(out, out + n * depth, T(0));
    for (index_t i = 0; i < n; ++i) out[i * depth + idx[i]] = T(1);
  }
  template <class T>
  static void gather(const T* table, index_t rows, index_t row_len, const std::int32_t* idx, index_t n, T* out) {
    check_indices("gather", "index", idx, n, rows);
    const bool par = n * row_len >= parallel_threshold && n > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t i = 0; i < n; ++i)
      std::memcpy(out + i * row_len, table + idx[i] * row_len, static_cast<std::size_t>(row_len) * sizeof(T));
  }
  // out[idx[i]] = src[i] for i = 0..n-1 (rows of row_len; the indices are distinct): the
  // write-back of rows a sparse update gathered.
  template <class T>
  static void scatter_rows(const T* src, const std::int32_t* idx, index_t n, index_t row_len, T* out, index_t rows) {
    check_indices("scatter_rows", "index", idx, n, rows);
    const bool par = n * row_len >= parallel_threshold && n > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t i = 0; i < n; ++i)
      std::memcpy(out + idx[i] * row_len, src + i * row_len, static_cast<std::size_t>(row_len) * sizeof(T));
  }
  // out (rows x row_len) = 0, then out[idx[i]] += g[i] for i = 0..n-1. Each output row is
  // summed by one thread in index order, so the result is the sequential one, bit for bit,
  // whatever the thread count: small inputs run that sequential loop; large ones sort the
  // positions by target row (stable counting sort), then deal out disjoint output rows.
  template <class T>
  static void scatter_add(const T* g, const std::int32_t* idx, index_t n, index_t row_len, T* out, index_t rows) {
    check_indices("scatter_add", "index", idx, n, rows);
    if (n * row_len < parallel_threshold || rows < 2) {
      std::fill(out, out + rows * row_len, T(0));
      for (index_t i = 0; i < n; ++i) zip_row(g + i * row_len, out + idx[i] * row_len, 0, row_len, add_op{});
      return;
    }
    std::vector<index_t> start(static_cast<std::size_t>(rows) + 1, 0), order(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) ++start[static_cast<std::size_t>(idx[i]) + 1];
    for (index_t r = 0; r < rows; ++r) start[static_cast<std::size_t>(r) + 1] += start[static_cast<std::size_t>(r)];
    {
      std::vector<index_t> next(start.begin(), start.end() - 1);
      for (index_t i = 0; i < n; ++i) order[static_cast<std::size_t>(next[static_cast<std::size_t>(idx[i])]++)] = i;
    }
    // dynamic: a row named by many positions (a padding index) would stall a static share
#pragma omp parallel for schedule(dynamic, 16)
    for (index_t r = 0; r < rows; ++r) {
      T* y = out + r * row_len;
      std::fill(y, y + row_len, T(0));
      for (index_t k = start[static_cast<std::size_t>(r)]; k < start[static_cast<std::size_t>(r) + 1]; ++k)
        zip_row(g + order[static_cast<std::size_t>(k)] * row_len, y, 0, row_len, add_op{});
    }
  }

  // ---- convolution (NCHW input and output, OIHW weights, dilation 1) --------------------
  // float: oneDNN where it was found (cpu_simd/dnnl.hpp). Otherwise im2col into columns
  // [C*KH*KW, N*OH*OW] and GEMMs: the forward is one batched GEMM whose items are the
  // images (W [O, C*KH*KW] times image n's columns, written straight into y's NCHW), the
  // data gradient the transposed GEMM and col2im, the weight gradient one GEMM over the
  // whole batch (dY permuted to [O, N*OH*OW], times the columns transposed; its long k is
  // cut by threads() in split_k). The columns live in a per-thread scratch buffer that
  // grows to the largest convolution the thread has run and is reused after.

  // OH * OW: the output pixels of one image and channel
  static index_t conv_pixels(index_t h, index_t w, index_t kh, index_t kw, index_t s, index_t p) {
    return ((h + 2 * p - kh) / s + 1) * ((w + 2 * p - kw) / s + 1);
  }
  template <class T>
  static void conv2d(const T* x, const T* wt, index_t n, index_t c, index_t h, index_t w, index_t o, index_t kh,
                     index_t kw, index_t s, index_t p, T* y) {
    if constexpr (std::is_same_v<T, float>)
      if (cpu_dnnl::conv(cpu_dnnl::conv_pass::forward, {n, c, h, w, o, kh, kw, s, p}, x, wt, y)) return;
    const index_t hw = conv_pixels(h, w, kh, kw, s, p), ckk = c * kh * kw;
    T* col = scratch<T>(0, ckk * n * hw);
    im2col(x, n, c, h, w, kh, kw, s, p, col);
    gemm(false, false, o, hw, ckk, T(1), wt, ckk, 0, col, n * hw, hw, T(0), y, hw, o * hw, n);
  }
  template <class T>
  static void conv2d_backward_data(const T* dy, const T* wt, index_t n, index_t c, index_t h, index_t w, index_t o,
                                   index_t kh, index_t kw, index_t s, index_t p, T* dx) {
    if constexpr (std::is_same_v<T, float>)
      if (cpu_dnnl::conv(cpu_dnnl::conv_pass::data, {n, c, h, w, o, kh, kw, s, p}, dy, wt, dx)) return;
    const index_t hw = conv_pixels(h, w, kh, kw, s, p), ckk = c * kh * kw;
    T* col = scratch<T>(0, ckk * n * hw);
    gemm(true, false, ckk, hw, o, T(1), wt, ckk, 0, dy, hw, o * hw, T(0), col, n * hw, hw, n);
    col2im(col, n, c, h, w, kh, kw, s, p, dx);
  }
  template <class T>
  static void conv2d_backward_weights(const T* x, const T* dy, index_t n, index_t c, index_t h, index_t w, index_t o,
                                      index_t kh, index_t kw, index_t s, index_t p, T* dw) {
    if constexpr (std::is_same_v<T, float>)
      if (cpu_dnnl::conv(cpu_dnnl::conv_pass::weights, {n, c, h, w, o, kh, kw, s, p}, x, dy, dw)) return;
    const index_t hw = conv_pixels(h, w, kh, kw, s, p), ckk = c * kh * kw;
    T* col = scratch<T>(0, ckk * n * hw);
    T* dyt = scratch<T>(1, o * n * hw);
    im2col(x, n, c, h, w, kh, kw, s, p, col);
    dims nohw;
    nohw.rank = 3, nohw.d[0] = n, nohw.d[1] = o, nohw.d[2] = hw;
    permute(dy, nohw, std::array<std::size_t, max_rank>{1, 0, 2}, dyt);
    gemm(false, true, o, ckk, n * hw, T(1), dyt, n * hw, 0, col, n * hw, 0, T(0), dw, ckk, 0, index_t(1));
  }

  // ---- images (NCHW, dilation 1) ---------------------------------------------------------
  // col [C*KH*KW, N*OH*OW]: row (c, i, j) holds pixel (oh*s - p + i, ow*s - p + j) of
  // channel c for every (n, oh, ow); zeros where that falls in the padding. One thread
  // per row block: each writes whole rows of col.
  template <class T>
  static void im2col(const T* x, index_t n, index_t c, index_t h, index_t w, index_t kh, index_t kw, index_t s,
                     index_t p, T* col) {
    const index_t oh = (h + 2 * p - kh) / s + 1, ow = (w + 2 * p - kw) / s + 1;
    const index_t rows = c * kh * kw, cols = n * oh * ow;
    const bool par = rows * cols >= parallel_threshold && rows > 1;
    if (p == 0 && s == 1) {  // no padding, unit stride: every row piece is a plain copy
#pragma omp parallel for schedule(static) if (par)
      for (index_t r = 0; r < rows; ++r) {
        const index_t ch = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
        T* out = col + r * cols;
        for (index_t b = 0; b < n; ++b) {
          const T* src = x + (b * c + ch) * h * w + i * w + j;
          for (index_t y = 0; y < oh; ++y, out += ow, src += w)
            for (index_t q = 0; q < ow; ++q) out[q] = src[q];
        }
      }
      return;
    }
#pragma omp parallel for schedule(static) if (par)
    for (index_t r = 0; r < rows; ++r) {
      const index_t ch = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
      // the output columns whose input column ow*s - p + j lies inside [0, w)
      const index_t ow0 = std::min(ow, p > j ? (p - j + s - 1) / s : 0);
      const index_t ow1 = std::max(ow0, std::min(ow, w + p - j > 0 ? (w + p - j + s - 1) / s : 0));
      T* out = col + r * cols;
      for (index_t b = 0; b < n; ++b) {
        const T* plane = x + (b * c + ch) * h * w;
        for (index_t y = 0; y < oh; ++y, out += ow) {
          const index_t iy = y * s - p + i;
          if (iy < 0 || iy >= h) {
            std::fill(out, out + ow, T(0));
            continue;
          }
          const T* src = plane + iy * w - p + j;
          std::fill(out, out + ow0, T(0));
          if (s == 1)  // rows are short (OW): a loop the compiler vectorises beats a memcpy call
            for (index_t q = ow0; q < ow1; ++q) out[q] = src[q];
          else
            for (index_t q = ow0; q < ow1; ++q) out[q] = src[q * s];
          std::fill(out + ow1, out + ow, T(0));
        }
      }
    }
  }
  // x [N,C,H,W] = 0, then every entry of col added back at the pixel im2col read it from.
  // One thread per (n, c) plane: planes are disjoint, the sum order within one is fixed.
  template <class T>
  static void col2im(const T* col, index_t n, index_t c, index_t h, index_t w, index_t kh, index_t kw, index_t s,
                     index_t p, T* x) {
    const index_t oh = (h + 2 * p - kh) / s + 1, ow = (w + 2 * p - kw) / s + 1;
    const index_t cols = n * oh * ow;
    const bool par = n * c * h * w * kh * kw >= parallel_threshold && n * c > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t pl = 0; pl < n * c; ++pl) {
      const index_t b = pl / c, ch = pl % c;
      T* plane = x + pl * h * w;
      std::fill(plane, plane + h * w, T(0));
      for (index_t i = 0; i < kh; ++i)
        for (index_t j = 0; j < kw; ++j) {
          const index_t ow0 = std::min(ow, p > j ? (p - j + s - 1) / s : 0);
          const index_t ow1 = std::max(ow0, std::min(ow, w + p - j > 0 ? (w + p - j + s - 1) / s : 0));
          const T* in = col + ((ch * kh + i) * kw + j) * cols + b * oh * ow;
          for (index_t y = 0; y < oh; ++y, in += ow) {
            const index_t iy = y * s - p + i;
            if (iy < 0 || iy >= h) continue;
            T* dst = plane + iy * w - p + j;
            for (index_t q = ow0; q < ow1; ++q) dst[q * s] += in[q];
          }
        }
    }
  }
  // max that propagates a NaN from either side (std::max keeps its first argument)
  template <class T>
  static T max_nan(T m, T e) {
    return (e > m || (e != e && m == m)) ? e : m;
  }
  // Pooling over `planes` independent [H, W] planes: max skips the padding (PyTorch's
  // -inf), avg counts it as zeros and divides by KH*KW (count_include_pad).
  template <class T>
  static void pool2d(bool is_max, const T* x, index_t planes, index_t h, index_t w, index_t kh, index_t kw, index_t s,
                     index_t p, T* y) {
    const index_t oh = (h + 2 * p - kh) / s + 1, ow = (w + 2 * p - kw) / s + 1;
    const T inv = T(1) / static_cast<T>(kh * kw);
    const bool par = planes * h * w >= parallel_threshold && planes > 1;
    if (kh == 2 && kw == 2 && s == 2 && p == 0) {  // LeNet's and VGG's pooling: no bounds, no padding
#pragma omp parallel for schedule(static) if (par)
      for (index_t pl = 0; pl < planes; ++pl)
        for (index_t a = 0; a < oh; ++a) {
          const T* r0 = x + pl * h * w + 2 * a * w;
          const T* r1 = r0 + w;
          T* out = y + (pl * oh + a) * ow;
          if (is_max)
            for (index_t b = 0; b < ow; ++b)
              out[b] = max_nan(max_nan(r0[2 * b], r0[2 * b + 1]), max_nan(r1[2 * b], r1[2 * b + 1]));
          else
            for (index_t b = 0; b < ow; ++b) out[b] = ((r0[2 * b] + r0[2 * b + 1]) + (r1[2 * b] + r1[2 * b + 1])) * inv;
        }
      return;
    }
#pragma omp parallel for schedule(static) if (par)
    for (index_t pl = 0; pl < planes; ++pl) {
      const T* in = x + pl * h * w;
      T* out = y + pl * oh * ow;
      for (index_t a = 0; a < oh; ++a)
        for (index_t b = 0; b < ow; ++b) {
          const index_t y0 = std::max<index_t>(a * s - p, 0), y1 = std::min(a * s - p + kh, h);
          const index_t x0 = std::max<index_t>(b * s - p, 0), x1 = std::min(b * s - p + kw, w);
          T acc = is_max ? -std::numeric_limits<T>::infinity() : T(0);
          for (index_t u = y0; u < y1; ++u)
            for (index_t v = x0; v < x1; ++v) {
              const T e = in[u * w + v];
              if (!is_max) acc += e;
              else acc = max_nan(acc, e);
            }
          out[a * ow + b] = is_max ? acc : acc * inv;
        }
    }
  }
  // dx = 0; max: each g goes to the first maximum of its window (scan order; a NaN wins,
  // as it does in the forward max); avg: g / (KH*KW) to every pixel of its window.
  template <class T>
  static void pool2d_grad(bool is_max, const T* x, const T* g, index_t planes, index_t h, index_t w, index_t kh,
                          index_t kw, index_t s, index_t p, T* dx) {
    const index_t oh = (h + 2 * p - kh) / s + 1, ow = (w + 2 * p - kw) / s + 1;
    const T inv = T(1) / static_cast<T>(kh * kw);
    const bool par = planes * h * w >= parallel_threshold && planes > 1;
    if (kh == 2 && kw == 2 && s == 2 && p == 0) {  // windows tile the plane: write each pixel once
#pragma omp parallel for schedule(static) if (par)
      for (index_t pl = 0; pl < planes; ++pl) {
        T* out = dx + pl * h * w;
        if (h % 2) std::fill(out + (h - 1) * w, out + h * w, T(0));
        for (index_t a = 0; a < oh; ++a) {
          const T* r0 = x + pl * h * w + 2 * a * w;
          const T* r1 = r0 + w;
          T* d0 = out + 2 * a * w;
          T* d1 = d0 + w;
          const T* gp = g + (pl * oh + a) * ow;
          if (w % 2) d0[w - 1] = d1[w - 1] = T(0);
          for (index_t b = 0; b < ow; ++b) {
            const T gv = is_max ? gp[b] : gp[b] * inv;
            if (!is_max) {
              d0[2 * b] = d0[2 * b + 1] = d1[2 * b] = d1[2 * b + 1] = gv;
              continue;
            }
            // the first maximum in scan order (a NaN counts as the maximum), as the general path
            const T v0 = r0[2 * b], v1 = r0[2 * b + 1], v2 = r1[2 * b], v3 = r1[2 * b + 1];
            int k = 0;
            T m = v0;
            if (v1 > m || (v1 != v1 && m == m)) k = 1, m = v1;
            if (v2 > m || (v2 != v2 && m == m)) k = 2, m = v2;
            if (v3 > m || (v3 != v3 && m == m)) k = 3;
            d0[2 * b] = k == 0 ? gv : T(0);
            d0[2 * b + 1] = k == 1 ? gv : T(0);
            d1[2 * b] = k == 2 ? gv : T(0);
            d1[2 * b + 1] = k == 3 ? gv : T(0);
          }
        }
      }
      return;
    }
#pragma omp parallel for schedule(static) if (par)
    for (index_t pl = 0; pl < planes; ++pl) {
      const T* in = x + pl * h * w;
      const T* gp = g + pl * oh * ow;
      T* out = dx + pl * h * w;
      std::fill(out, out + h * w, T(0));
      for (index_t a = 0; a < oh; ++a)
        for (index_t b = 0; b < ow; ++b) {
          const index_t y0 = std::max<index_t>(a * s - p, 0), y1 = std::min(a * s - p + kh, h);
          const index_t x0 = std::max<index_t>(b * s - p, 0), x1 = std::min(b * s - p + kw, w);
          const T gv = gp[a * ow + b];
          if (is_max) {
            index_t best = y0 * w + x0;
            for (index_t u = y0; u < y1; ++u)
              for (index_t v = x0; v < x1; ++v)
                if (in[u * w + v] > in[best] || (std::isnan(in[u * w + v]) && !std::isnan(in[best]))) best = u * w + v;
            out[best] += gv;
          } else {
            for (index_t u = y0; u < y1; ++u)
              for (index_t v = x0; v < x1; ++v) out[u * w + v] += gv * inv;
          }
        }
    }
  }

  // ---- random masks --------------------------------------------------------------------
  // out[i] = 1/keep if u(seed, draw, i) < keep else 0, u uniform in [0, 1) from a
  // splitmix64 hash of (seed, draw, i): the same mask for any thread count.
  template <class T>
  static void dropout_mask(T* out, index_t n, double keep, std::uint64_t seed, std::uint64_t draw) {
    const T scale = static_cast<T>(1 / keep);
    const std::uint64_t base = mix64(seed ^ mix64(draw + 0x632be59bd9b4e019ull));
    const bool par = n >= parallel_threshold;
#pragma omp parallel for schedule(static) if (par)
    for (index_t i = 0; i < n; ++i) {
      const double u = static_cast<double>(mix64(base + static_cast<std::uint64_t>(i)) >> 11) * 0x1.0p-53;
      out[i] = u < keep ? scale : T(0);
    }
  }

  // ---- layout --------------------------------------------------------------------------
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

 private:
  // The calling thread's scratch buffer `which` (0 or 1), at least `count` elements: grown
  // (never shrunk) to the largest request, freed when the thread ends.
  struct scratch_buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    scratch_buffer() = default;
    scratch_buffer(const scratch_buffer&) = delete;
    scratch_buffer& operator=(const scratch_buffer&) = delete;
    ~scratch_buffer() { deallocate(data); }
  };
  template <class T>
  static T* scratch(int which, index_t count) {
    thread_local scratch_buffer buf[2];
    scratch_buffer& b = buf[which];
    const std::size_t want = static_cast<std::size_t>(count) * sizeof(T);
    if (want > b.bytes) {
      void* p = allocate(want);
      deallocate(b.data);
      b.data = p, b.bytes = want;
    }
    return static_cast<T*>(b.data);
  }
  static constexpr std::uint64_t mix64(std::uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  template <class Tuple, class... P>
  static void store_back(const Tuple& v, index_t j, P*... p) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (store_one(std::get<I>(v), p + j), ...);
    }(std::index_sequence_for<P...>{});
  }
  template <class V, class T>
  static void store_one(const V& v, T* dst) {
    if constexpr (!std::is_const_v<T>) v.store_unaligned(dst);
  }
  template <class Tuple, class... P>
  static void store_tail(const Tuple& v, index_t j, index_t m, P*... p) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (store_first(std::get<I>(v), m, p + j), ...);
    }(std::index_sequence_for<P...>{});
  }
  // The first m lanes of v to dst (nothing for a read-only array).
  template <class B, class T>
  static void store_first(const B& v, index_t m, T* dst) {
    if constexpr (!std::is_const_v<T>) {
      alignas(sizeof(B)) T lanes[B::size];
      v.store_aligned(lanes);
      std::copy(lanes, lanes + m, dst);
    }
  }
  // The m < B::size elements at x as a batch; the other lanes repeat x[m - 1].
  template <class B, class T>
  static B tail_batch(const T* x, index_t m) {
    alignas(sizeof(B)) std::remove_const_t<T> lanes[B::size];
    for (std::size_t k = 0; k < B::size; ++k) lanes[k] = x[std::min<index_t>(static_cast<index_t>(k), m - 1)];
    return B::load_aligned(lanes);
  }

  // Elements [j0, j1) of a row as SIMD batches. The part after the last full batch is one
  // more batch: the batch ending at j1 where the row holds one (it overlaps the last full
  // batch, whose lanes it recomputes with the same bits), else a padded one (load_tail).
  // So every element, wherever it lies in its row, takes the SIMD code path.
  template <class T, class Plan>
  static void span(T* o, const Plan& p, index_t j0, index_t j1) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    index_t j = j0;
    for (; j + W <= j1; j += W) p.template load<B>(j).store_unaligned(o + j);
    if (j < j1) span_tail(o, p, j0, j, j1);
  }
  template <class T, class Plan>
  static void span_tail(T* o, const Plan& p, index_t j0, index_t j, index_t j1) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    if (j1 - j0 >= W) return p.template load<B>(j1 - W).store_unaligned(o + j1 - W);
    store_first(p.template load_tail<B>(j, j1 - j), j1 - j, o + j);
  }

  // Outputs of at least this many bytes are written with streaming stores: the size of the
  // last-level cache this process's first CPU sits behind, as Linux reports it
  // (/sys/devices/system/cpu/cpuN/cache), else the C library's figure, else 32 MiB. Not the C
  // library's first: on AMD EPYC glibc's _SC_LEVEL3_CACHE_SIZE adds up every CCX's L3 (320
  // MiB on the 2-vCPU machine of benchmarks/README.md, where a core sees 32 MiB), which kept
  // a 128 MiB output on cached stores and gradus at 0.76x of a plain OpenMP loop.
  static std::size_t stream_threshold_bytes() {
    static const std::size_t bytes = [] {
      std::size_t llc = cpu_threads::last_level_cache_bytes();
#if defined(_SC_LEVEL3_CACHE_SIZE)
      if (llc == 0) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
        if (v > 0) llc = static_cast<std::size_t>(v);
      }
#endif
      return llc > 0 ? llc : std::size_t{32} << 20;
    }();
    return bytes;
  }

  // span() with the batches stored by streaming stores, which need an aligned address.
  // Every element still takes the same path as in span() (a batch's lanes do not depend
  // on where the batch starts), so results are
  // bit-identical: a cached batch at j0 covers the unaligned head, streamed batches
  // follow from the first aligned element, and a cached batch ending at simd_end covers
  // what is left. Head and last batch may overlap streamed ones: the same values are
  // written twice, which is safe because a pass never writes a buffer it reads.
  template <class T, class Plan>
  static void span_streaming(T* o, const Plan& p, index_t j0, index_t j1) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    const index_t simd_end = j0 + (j1 - j0) / W * W;
    if (simd_end - j0 < 4 * W) return span(o, p, j0, j1);  // too short to pay for aligning
    const auto addr = reinterpret_cast<std::uintptr_t>(o + j0);
    index_t j = j0;
    if (addr % sizeof(B)) {
      p.template load<B>(j0).store_unaligned(o + j0);
      j = j0 + static_cast<index_t>((sizeof(B) - addr % sizeof(B)) / sizeof(T));
    }
    for (; j + W <= simd_end; j += W) stream_store(o + j, p.template load<B>(j));
    if (j < simd_end) p.template load<B>(simd_end - W).store_unaligned(o + simd_end - W);
    if (simd_end < j1) span_tail(o, p, j0, simd_end, j1);
  }

  // Non-temporal store of one batch (AVX-512 or AVX register; the address is aligned to
  // its size). can_stream<T>() says whether this target has one for T's batch.
  template <class T>
  static constexpr bool can_stream() {
    [[maybe_unused]] constexpr std::size_t bytes = sizeof(xsimd::batch<T>);
    if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double> && !std::is_same_v<T, std::int32_t>)
      return false;
#if defined(__AVX512F__)
    if (bytes == 64) return true;
#endif
#if defined(__AVX__)
    if (bytes == 32) return true;
#endif
    return false;
  }
  template <class T>
  static void stream_store([[maybe_unused]] T* o, [[maybe_unused]] const xsimd::batch<T>& v) {
    static_assert(can_stream<T>(), "gradus: cpu_simd: no streaming store for this batch type");
#if defined(__AVX512F__)
    if constexpr (sizeof(v) == 64) {
      if constexpr (std::is_same_v<T, float>) _mm512_stream_ps(o, v);
      else if constexpr (std::is_same_v<T, double>) _mm512_stream_pd(o, v);
      else _mm512_stream_si512(reinterpret_cast<__m512i*>(o), v);
      return;
    }
#endif
#if defined(__AVX__)
    if constexpr (sizeof(v) == 32) {
      if constexpr (std::is_same_v<T, float>) _mm256_stream_ps(o, v);
      else if constexpr (std::is_same_v<T, double>) _mm256_stream_pd(o, v);
      else _mm256_stream_si256(reinterpret_cast<__m256i*>(o), v);
    }
#endif
  }
  static void store_fence() {
#if defined(__AVX__)
    _mm_sfence();
#endif
  }

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

  // Reduce a contiguous run with SIMD: four independent accumulators, then a fixed
  // tree, so the order (and the result) depends only on n.
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
    for (; j + W <= n; j += W) acc += xsimd::exp(B::load_unaligned(x + j) - B(mx));
    T s = xsimd::hadd(acc);
    if (j < n) {  // the tail through the same xsimd::exp (exec/plan.hpp says why)
      alignas(sizeof(B)) T e[W];
      xsimd::exp(tail_batch<B>(x + j, n - j) - B(mx)).store_aligned(e);
      for (index_t k = 0; k < n - j; ++k) s += e[k];
    }
    return s;
  }
  // y = f(x) over a row (y may be x); the tail as a padded batch
  template <class T, class F>
  static void map_row(const T* x, T* y, index_t n, F f) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    index_t j = 0;
    for (; j + W <= n; j += W) f(B::load_unaligned(x + j)).store_unaligned(y + j);
    if (j < n) store_first(f(tail_batch<B>(x + j, n - j)), n - j, y + j);
  }

  static void check_indices(const char* op, const char* what, const std::int32_t* idx, index_t n, index_t bound) {
    for (index_t i = 0; i < n; ++i)
      if (idx[i] < 0 || idx[i] >= bound)
        throw index_error(std::string("gradus: ") + op + ": " + what + " " + std::to_string(idx[i]) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(bound) + ")");
  }
};
static_assert(backend<cpu_simd>, "gradus: cpu_simd does not implement the backend interface (exec/backend.hpp)");

// ---- xtensor interop ---------------------------------------------------------------------

// A copy of a result as an xt::xarray.
template <class T>
xt::xarray<std::remove_const_t<T>> to_xarray(const tensor_view<T>& v) {
  std::vector<std::size_t> shape(v.shape.d.begin(), v.shape.d.begin() + static_cast<std::ptrdiff_t>(v.shape.rank));
  xt::xarray<std::remove_const_t<T>> r(shape);
  std::copy(v.begin(), v.end(), r.begin());
  return r;
}

// A copy of a result as an xt::xtensor of rank R (the rank must match).
template <std::size_t R, class T>
xt::xtensor<std::remove_const_t<T>, R> to_xtensor(const tensor_view<T>& v) {
  if (v.shape.rank != R)
    throw shape_error("gradus: to_xtensor<" + std::to_string(R) + ">: the result has shape " + to_string(v.shape));
  std::array<std::size_t, R> shape{};
  for (std::size_t i = 0; i < R; ++i) shape[i] = static_cast<std::size_t>(v.shape.d[i]);
  xt::xtensor<std::remove_const_t<T>, R> r(shape);
  std::copy(v.begin(), v.end(), r.begin());
  return r;
}

// A zero-copy xtensor view of a result (valid until the buffer's next run).
template <class T>
auto adapt(const tensor_view<T>& v) {
  std::vector<std::size_t> shape(v.shape.d.begin(), v.shape.d.begin() + static_cast<std::ptrdiff_t>(v.shape.rank));
  return xt::adapt(v.data(), static_cast<std::size_t>(v.size()), xt::no_ownership(), shape);
}

}  // namespace gradus
