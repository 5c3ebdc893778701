#pragma once
// cpu_simd: GEMM. One thread per block, the blocks cut by threads() and the shape only; a
// long inner dimension cut into slices (split_k). A block of float of few rows, or against a
// small right operand, runs on cpu_simd's register-blocked kernels (cpu_simd/gemm_kernels.hpp:
// 1.1-4x OpenBLAS's speed there, on the operands as stored); every other block on OpenBLAS.
// The cut is protected: the interface is gemm().
// CBLAS declarations: xtensor-blas's (xflens) rather than OpenBLAS's <cblas.h>, whose
// enum and integer types differ; one set of declarations lets a program include this
// header and <xtensor-blas/xlinalg.hpp> together. The library linked is OpenBLAS.
#include <xflens/cxxblas/drivers/cblas.h>
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char* openblas_get_config(void);
}
#include <numeric>

#include "gradus/backends/cpu_simd/gemm_kernels.hpp"
#include "gradus/backends/cpu_simd/reduce.hpp"

namespace gradus::cpu_simd_sections {

struct gemm_section : reduce_section {
  /// ---- GEMM (row-major; transposes are flags, never copies) ------------------------------
  /// OpenBLAS runs on one thread (cpu_threads::blas_on_one_thread) and the backend splits the
  /// work itself: the batch's items and each item's output into a grid of row x column blocks, cut
  /// by threads() and the shape alone, every block one single-threaded OpenBLAS call, the
  /// blocks shared among the team. So the bits follow threads() and nothing else: a team that
  /// shrinks while other processes hold cores (threads.hpp) computes the same blocks, more of
  /// them per thread. OpenBLAS's own threading cannot promise that: its multi-threaded driver
  /// blocks K differently from its single-threaded one, so a [64,784] x [784,256] product
  /// differed in 15,049 of 16,384 elements between 1 and 2 OpenBLAS threads. Below
  /// gemm_split_work multiply-adds a product runs on the calling thread (a parallel region
  /// costs more than it saves there; OpenBLAS's own cut-off is 262,144).
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

  /// Whether gemm() of T with alpha = beta = 1 goes on from C's values for this shape (one
  /// item): every block of it runs on the register-blocked kernels (gemm_kernels.hpp: float,
  /// A B or A^T B, few rows or a small right operand) and k is not cut into slices. Then a
  /// product over k's first rows (beta 0) and one over the rest (beta 1) give the bits of one
  /// product over all of them; elsewhere the second adds its own sums to C's.
  template <class T>
  static bool gemm_continues_sums(bool ta, bool tb, index_t m, index_t n, index_t k) {
    if constexpr (!std::is_same_v<T, float>) {
      return false;
    } else {
      if (tb || m <= 0 || n <= 0 || k <= 0 || split_k_slices(m, n, k) > 1) return false;
      const gemm_grid g = gemm_plan(m, n, k, 1, omp_in_parallel() ? 1 : threads());
      for (index_t r = 0; r < g.rows; ++r)
        for (index_t q = 0; q < g.cols; ++q) {
          const index_t rows = gemm_cut(m, g.rows, r + 1) - gemm_cut(m, g.rows, r);
          const index_t cols = gemm_cut(n, g.cols, q + 1) - gemm_cut(n, g.cols, q);
          if (rows > 0 && cols > 0 && !cpu_gemm::takes(ta, tb, rows, cols, k)) return false;
        }
      return true;
    }
  }

 protected:
  /// How a product is cut: into rows x cols blocks of each batch item.
  struct gemm_grid {
    index_t rows = 1, cols = 1;
  };
  static constexpr index_t gemm_split_work = index_t(1) << 17;  ///< multiply-adds: below, one call
  static constexpr index_t gemm_align = 16;                     ///< block edges at multiples of 16

  /// Blocks per item: enough that the batch's tasks divide evenly among `nt` threads
  /// (nt / gcd(batch, nt): one item on 2 threads is cut in 2, 3 items in 2 each, 4 not at
  /// all), each at least gemm_split_work / 2 multiply-adds and 16 rows and columns wide; of
  /// the grids with that many blocks, the one with the least edge per block (rows / r +
  /// cols / c: what every block packs of A and B).
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
  /// The j-th of `parts` edges of [0, len), rounded to gemm_align (the last is len).
  static index_t gemm_cut(index_t len, index_t parts, index_t j) {
    if (j >= parts) return len;
    return std::min(len, (len * j / parts + gemm_align / 2) / gemm_align * gemm_align);
  }
  template <class T>
  static void blas_gemm(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                        const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    if constexpr (std::is_same_v<T, float>)  // few rows, or a small right operand (cpu_simd/gemm_kernels.hpp)
      if (cpu_gemm::takes(ta, tb, m, n, k)) return cpu_gemm::gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    const auto tra = ta ? CblasTrans : CblasNoTrans, trb = tb ? CblasTrans : CblasNoTrans;
    const auto ib = [](index_t v) { return static_cast<CBLAS_INT>(v); };
    cpu_threads::blas_on_one_thread([&] {
      if constexpr (std::is_same_v<T, float>)
        cblas_sgemm(CblasRowMajor, tra, trb, ib(m), ib(n), ib(k), alpha, a, ib(lda), b, ib(ldb), beta, c, ib(ldc));
      else
        cblas_dgemm(CblasRowMajor, tra, trb, ib(m), ib(n), ib(k), alpha, a, ib(lda), b, ib(ldb), beta, c, ib(ldc));
    });
  }

  /// A small output over a long inner dimension (a convolution's weight gradient: [6, 25]
  /// summed over 36,864 pixels) gives OpenBLAS's threads nothing to split, and with two it
  /// runs slower than with one. Here each thread multiplies its own slice of k on its own
  /// (OpenBLAS runs single-threaded inside a parallel region) and the partial products are
  /// added in slice order. The slices are threads(), not the team: deterministic for a given
  /// thread count however many cores are free (a team smaller than threads() takes several).
  template <class T>
  static bool split_k(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                      const T* b, index_t ldb, T beta, T* c, index_t ldc) {
    const int nt = split_k_slices(m, n, k);
    if (nt < 2) return false;
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
  /// How many slices split_k cuts k into (1: none).
  static int split_k_slices(index_t m, index_t n, index_t k) {
    const int nt = static_cast<int>(std::min<index_t>(threads(), k / split_k_min_slice));
    return nt < 2 || omp_in_parallel() || m * n > split_k_max_output || k < 8 * std::max(m, n) ? 1 : nt;
  }
  static constexpr index_t split_k_min_slice = 512;        ///< at least this much of k per thread
  static constexpr index_t split_k_max_output = 1 << 16;   ///< outputs up to 256 KiB of floats
};

}  // namespace gradus::cpu_simd_sections
