#pragma once
// A pipeline stage's deferred weight gradients (stage_graph.hpp defers X^T G of a matmul's
// weight): the rows of X and of G of each micro-batch's backward pass, stashed one
// micro-batch after another, and the products over them — computed ahead, piece by piece,
// while the stage waits for a gradient (the zero-bubble schedules' W pass, Qi et al. 2023),
// and finished at the update over the rows that came after.
//
// The bits: a piece computed ahead over the stash's first k1 rows and finished over the rest
// gives the bits of one product over every row (and so of the unsplit model) only where the
// backend's product goes on from C's values for that shape: cpu_simd's register-blocked
// kernels on float (gemm_continues_sums). Elsewhere nothing is computed ahead, and a piece
// whose continuation would not continue is summed again from its first row.
//
// Under a low-precision policy (core/precision.hpp) the products run on the policy's compute
// kernels, as the matmuls they stand for would (exec/compute_kernels.hpp): a matmul inside an
// in_precision scope is never deferred (its gradient is the scope's node, not a bare X^T G).
#include <algorithm>
#include <array>
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/shape.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/exec/compute_kernels.hpp"

namespace gradus::parallel::detail {

template <class T>
struct scale_rule {  // x = a * y
  T a;
  template <class V>
  GRADUS_HD void operator()(V& x, const V& y) const {
    x = V(a) * y;
  }
};

/// The deferred weight gradients of one stage's nv variables (deferred[i]: variable i's
/// gradient is X^T G over stashed rows). Pieces of rows of each gradient are the update's
/// (piece(n): about 128 KiB), so that a piece is computed, finished and applied while in cache.
template <class T, class Backend, std::size_t nv>
class deferred_gradients {
 public:
  explicit deferred_gradients(const std::array<bool, nv>& deferred) : deferred_(deferred) {}

  /// A new step: nothing stashed, nothing computed ahead.
  void begin_step() {
    rows_ = 0;
    cursor_ = 0;
    for (auto& d : done_) std::fill(d.begin(), d.end(), index_t(0));
  }
  /// Appends one micro-batch's rows of variable i's X ([rows, xc]) and G ([rows, gc]), G
  /// scaled by w; rows_added(rows) once every variable's are in.
  void append(std::size_t i, const T* x, const T* g, index_t rows, std::size_t xc, std::size_t gc, T w) {
    cols_[i] = {static_cast<index_t>(xc), static_cast<index_t>(gc)};
    const auto at = static_cast<std::size_t>(rows_), r = static_cast<std::size_t>(rows);
    T* xs = static_cast<T*>(x_[i].grow((at + r) * xc * sizeof(T)));
    T* gs = static_cast<T*>(g_[i].grow((at + r) * gc * sizeof(T)));
    Backend::copy(xs + at * xc, x, r * xc * sizeof(T));
    if (w == T(1)) Backend::copy(gs + at * gc, g, r * gc * sizeof(T));
    else Backend::for_each(static_cast<index_t>(r * gc), scale_rule<T>{w}, gs + at * gc, g);
    done_[i].resize(static_cast<std::size_t>((xc + static_cast<std::size_t>(piece(cols_[i].second)) - 1) /
                                             static_cast<std::size_t>(piece(cols_[i].second))),
                    index_t(0));
  }
  void rows_added(index_t rows) { rows_ += rows; }
  /// The rows stashed this step.
  index_t rows() const { return rows_; }
  /// The bytes the stash holds now.
  std::size_t bytes() const {
    std::size_t held = 0;
    for (std::size_t i = 0; i < nv; ++i)
      held += static_cast<std::size_t>(rows_) * static_cast<std::size_t>(cols_[i].first + cols_[i].second) * sizeof(T);
    return held;
  }
  /// The gradients this step began ahead of the update (any piece of them).
  int begun() const {
    int n = 0;
    for (const auto& d : done_) n += std::any_of(d.begin(), d.end(), [](index_t k) { return k > 0; }) ? 1 : 0;
    return n;
  }

  /// Computes ahead: brings pieces of the gradients (acc[i]: variable i's) up to the rows
  /// stashed now, one piece at a time in turn over every variable, until stop() says to (it
  /// is asked before each piece) or every piece is up to date. Only where the backend's
  /// products continue (above).
  template <class Stop>
  void work_ahead(const std::array<T*, nv>& acc, Stop&& stop) {
    const index_t k = rows_;
    if (k == 0) return;
    std::size_t total = 0;
    for (std::size_t i = 0; i < nv; ++i) total += deferred_[i] ? done_[i].size() : 0;
    for (std::size_t tried = 0; tried < total; ++tried, cursor_ = (cursor_ + 1) % total) {
      const auto [i, p] = locate(cursor_);
      index_t& kd = done_[i][p];
      const auto [m, n] = cols_[i];
      const index_t r0 = static_cast<index_t>(p) * piece(n), r = std::min(piece(n), m - r0);
      if (kd >= k || !continues_sums(r, n, k - kd)) continue;
      if (stop()) return;  // (this piece is the next call's first)
      product(i, r0, r, kd, k, acc[i]);
      kd = k;
    }
  }
  /// Rows [r0, r0 + rows) of variable i's gradient over every stashed row, into acc (r0 on a
  /// piece's first row): what work_ahead summed goes on from there, the rest is summed whole.
  /// rows() must not be 0.
  void finish(std::size_t i, index_t r0, index_t rows, T* acc) {
    const auto [m, n] = cols_[i];
    const index_t P = piece(n), k = rows_;
    for (index_t a = r0; a < r0 + rows; a += P) {
      const auto p = static_cast<std::size_t>(a / P);
      const index_t r = std::min({P, m - a, r0 + rows - a});
      const index_t kd = a % P == 0 && r == std::min(P, m - a) ? done_[i][p] : 0;  // (a whole piece)
      if (kd == k) continue;
      product(i, a, r, kd > 0 && continues_sums(r, n, k - kd) ? kd : 0, k, acc);
    }
  }
  /// The update's pieces of a gradient with n columns: rows of about 128 KiB.
  static index_t piece(index_t n) { return std::max<index_t>(16, (index_t(32) * 1024 / std::max<index_t>(n, 1)) / 16 * 16); }
  /// Variable i's gradient's columns (its X's, its G's).
  std::pair<index_t, index_t> cols(std::size_t i) const { return cols_[i]; }

 private:
  using compute_t = typename precision_of_backend_t<Backend>::compute;
  /// The products' kernels: the policy's compute precision (Backend's own for fp32).
  using kernels = std::conditional_t<std::is_same_v<compute_t, float>, Backend, compute_kernels<Backend, compute_t>>;
  /// acc's rows [r0, r0 + r) += X[from:to, r0:r0+r]^T G[from:to, :] (from 0: =).
  void product(std::size_t i, index_t r0, index_t r, index_t from, index_t to, T* acc) const {
    const auto [m, n] = cols_[i];
    kernels::gemm(true, false, r, n, to - from, T(1), static_cast<const T*>(x_[i].data) + from * m + r0, m, 0,
                  static_cast<const T*>(g_[i].data) + from * n, n, 0, from > 0 ? T(1) : T(0), acc + r0 * n, n, r * n, 1);
  }
  /// Whether the backend's X^T G of this shape goes on from C's values (cpu_simd's fp32 kernels;
  /// never the low-precision ones, whose products are not summed in place).
  static bool continues_sums(index_t m, index_t n, index_t k) {
    if constexpr (std::is_same_v<kernels, Backend> && requires { Backend::template gemm_continues_sums<T>(true, false, m, n, k); })
      return Backend::template gemm_continues_sums<T>(true, false, m, n, k);
    else
      return false;
  }
  /// The (variable, piece) of work_ahead's turn c.
  std::pair<std::size_t, std::size_t> locate(std::size_t c) const {
    for (std::size_t i = 0; i < nv; ++i) {
      if (!deferred_[i]) continue;
      if (c < done_[i].size()) return {i, c};
      c -= done_[i].size();
    }
    return {0, 0};  // (not reached: c < the pieces' count)
  }
  std::array<bool, nv> deferred_;
  std::array<device_buffer<Backend>, nv> x_, g_;  ///< the stash: rows of X and of G
  std::array<std::pair<index_t, index_t>, nv> cols_{};
  index_t rows_ = 0;
  std::array<std::vector<index_t>, nv> done_;  ///< per piece: its first rows summed ahead (0: none)
  std::size_t cursor_ = 0;                     ///< work_ahead's next turn
};

}  // namespace gradus::parallel::detail
