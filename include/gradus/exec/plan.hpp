#pragma once
// Elementwise plans: what a fused elementwise subtree becomes at run time. A plan is a
// plain struct of pointers, strides and scalars (no allocation, no virtuals), so a
// backend can copy it into each thread, or by value into a GPU kernel. It is evaluated
// row by row: set_row(idx) positions every leaf on a row of the loop shape, then
// load<B>(j) gives elements [j, j + B::size) of that row as a SIMD batch B, load_tail<B>(j, n)
// the last n < B::size of them (the other lanes repeat element j + n - 1), and eval(j)
// element j as a scalar (per-element evaluation, e.g. one GPU thread per element), and
// eval_lanes<V>(j) elements [j, j + V) as V scalars (a GPU thread that loads and stores 16
// bytes at a time; lanes_ok says whether every row of every leaf allows it).
// The CPU backend evaluates every element through load or load_tail, never eval: a
// function's SIMD and scalar implementations can differ in the last bit (xsimd::tanh
// and std::tanh do), and an element must have the same value wherever it lands in a
// row — in a full batch or in the tail, in the forward pass or recomputed in the
// backward pass — or a rule that compares values (max, relu's mask) can disagree with
// the forward pass.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "gradus/core/device.hpp"
#include "gradus/core/shape.hpp"

namespace gradus {

/// Iteration space of a fused pass after merging dims: rows of the last extent.
struct loop_shape {
  std::size_t rank = 1;  ///< >= 1
  std::array<index_t, max_rank> d{};  ///< extents; the first rank are used
  /// Elements per row: the last used extent, d[rank - 1].
  GRADUS_HD index_t inner() const {  // d[rank - 1], by constant indices (row_index says why)
    index_t n = d[0];
    GRADUS_UNROLL
    for (std::size_t k = 1; k < max_rank; ++k)
      if (k + 1 == rank) n = d[k];
    return n;
  }
  /// Number of rows: the product of the extents before the last (1 at rank 1).
  GRADUS_HD index_t rows() const {
    index_t r = 1;
    for (std::size_t i = 0; i + 1 < rank; ++i) r *= d[i];
    return r;
  }
  /// Unravel a row number into the leading indices. The loop runs max_rank - 1 times with
  /// the rank as a condition, not as its bound: a constant trip count is unrolled, so every
  /// index into d and idx is a constant and a GPU thread keeps them in registers (a bound
  /// known only at run time puts the arrays, and the plan beside them, in local memory:
  /// the fused pass ran at 0.12x of a device copy's bandwidth on an H200 that way).
  /// The outermost index is what is left (row < rows()): no division for it, so a pass of
  /// rank 2 divides nothing here (a 64-bit division is a long software sequence on a GPU).
  GRADUS_HD void row_index(index_t row, index_t* idx) const {
    GRADUS_UNROLL
    for (std::size_t k = max_rank - 1; k-- > 1;) {
      if (k + 1 < rank) {
        const index_t q = row / d[k];
        idx[k] = row - q * d[k];
        row = q;
      }
    }
    idx[0] = row;
  }
};

/// V consecutive elements of a row, evaluated by one thread.
template <class T, int V>
struct lanes {
  T v[V];  ///< element j + k in v[k]
};

/// A plan's leaf: an input buffer of T, read through strides (so broadcast axes cost no
/// copy).
template <class T>
struct leaf_plan {
  const T* base;  ///< the buffer's first element
  std::array<index_t, max_rank> strides;  ///< in elements, 0 on broadcast axes
  const T* cur;   ///< the current row's first element (set_row)
  index_t inner;  ///< stride of the last loop axis: 1, or 0 when broadcast
  /// Positions cur on the row whose leading indices are idx[0, nlead).
  /// (A constant trip count, as loop_shape::row_index's: strides stays in registers.)
  GRADUS_HD void set_row(const index_t* idx, std::size_t nlead) {
    cur = base;
    inner = strides[0];
    GRADUS_UNROLL
    for (std::size_t k = 0; k < max_rank; ++k) {
      if (k < nlead) cur += idx[k] * strides[k];
      if (k == nlead) inner = strides[k];
    }
  }
  /// Element j of the current row.
  GRADUS_HD T eval(index_t j) const { return cur[j * inner]; }
  /// Elements [j, j + V) of the current row (one aligned vector load on a GPU: only where
  /// lanes_ok).
  template <int V>
  GRADUS_HD lanes<T, V> eval_lanes(index_t j) const {
    lanes<T, V> r{};
    if (!inner) {
      for (int k = 0; k < V; ++k) r.v[k] = *cur;
    } else {
#if defined(__CUDA_ARCH__)
      struct alignas(sizeof(T) * V) chunk {
        T v[V];
      };
      const chunk c = *reinterpret_cast<const chunk*>(cur + j);  // one 16-byte load (lanes_ok: aligned)
      for (int k = 0; k < V; ++k) r.v[k] = c.v[k];
#else
      for (int k = 0; k < V; ++k) r.v[k] = cur[j + k];
#endif
    }
    return r;
  }
  /// Rows contiguous (or broadcast) and every row's start aligned to V elements.
  bool lanes_ok(std::size_t rank, index_t V) const {
    const index_t last = strides[rank - 1];
    if (last == 0) return true;
    if (last != 1 || reinterpret_cast<std::uintptr_t>(base) % (sizeof(T) * static_cast<std::size_t>(V)) != 0) return false;
    for (std::size_t k = 0; k + 1 < rank; ++k)
      if (strides[k] % V != 0) return false;
    return true;
  }
  /// Elements [j, j + B::size) of the current row as a SIMD batch B (unaligned load, or the
  /// one element broadcast).
  template <class B>
  B load(index_t j) const {
    return inner ? B::load_unaligned(cur + j) : B(*cur);
  }
  /// Reads only [j, j + n); the padding lanes repeat the last element, so they hold no
  /// value (inf, NaN, a denormal) that the row itself does not.
  template <class B>
  B load_tail(index_t j, index_t n) const {
    if (!inner) return B(*cur);
    alignas(sizeof(B)) T lanes[B::size];
    for (std::size_t k = 0; k < B::size; ++k) lanes[k] = cur[j + std::min<index_t>(static_cast<index_t>(k), n - 1)];
    return B::load_aligned(lanes);
  }
  /// Calls f(strides), which collapse_loop reads and rewrites as it merges axes.
  template <class F>
  void for_each_leaf(F&& f) {
    f(strides);
  }
};

/// A plan's constant leaf: every element is v.
template <class T>
struct scalar_plan {
  T v;  ///< the value
  /// Nothing to position.
  GRADUS_HD void set_row(const index_t*, std::size_t) {}
  /// v, whatever j.
  GRADUS_HD T eval(index_t) const { return v; }
  /// V copies of v.
  template <int V>
  GRADUS_HD lanes<T, V> eval_lanes(index_t) const {
    lanes<T, V> r{};
    for (int k = 0; k < V; ++k) r.v[k] = v;
    return r;
  }
  /// Always true: a constant needs no alignment.
  bool lanes_ok(std::size_t, index_t) const { return true; }
  /// v in every lane.
  template <class B>
  B load(index_t) const {
    return B(v);
  }
  /// v in every lane.
  template <class B>
  B load_tail(index_t, index_t) const {
    return B(v);
  }
  /// No strides: f is not called.
  template <class F>
  void for_each_leaf(F&&) {}
};

/// f applied to one sub-plan's elements (an elementwise node of one operand: neg, exp, ...).
template <class F, class P>
struct unary_plan {
  F f;  ///< the node's functor, called on scalars and on SIMD batches
  P p;  ///< the operand's plan
  /// Positions the operand's leaves on a row (leaf_plan::set_row).
  GRADUS_HD void set_row(const index_t* idx, std::size_t n) { p.set_row(idx, n); }
  /// f of the operand's element j.
  GRADUS_HD auto eval(index_t j) const { return f(p.eval(j)); }
  /// f of each of the operand's elements [j, j + V).
  template <int V>
  GRADUS_HD auto eval_lanes(index_t j) const {
    const auto x = p.template eval_lanes<V>(j);
    lanes<decltype(f(x.v[0])), V> r{};
    for (int k = 0; k < V; ++k) r.v[k] = f(x.v[k]);
    return r;
  }
  /// Whether every leaf allows eval_lanes at V.
  bool lanes_ok(std::size_t rank, index_t V) const { return p.lanes_ok(rank, V); }
  /// f of the operand's batch at j.
  template <class B>
  B load(index_t j) const {
    return f(p.template load<B>(j));
  }
  /// f of the operand's padded batch of the last n elements from j.
  template <class B>
  B load_tail(index_t j, index_t n) const {
    return f(p.template load_tail<B>(j, n));
  }
  /// g(strides) of every leaf, left to right.
  template <class G>
  void for_each_leaf(G&& g) {
    p.for_each_leaf(g);
  }
};

/// f applied to two sub-plans' elements (add, mul, maximum, ...; broadcast by the leaves'
/// strides).
template <class F, class PA, class PB>
struct binary_plan {
  F f;   ///< the node's functor, called on scalars and on SIMD batches
  PA a;  ///< the first operand's plan
  PB b;  ///< the second operand's plan
  /// Positions both operands' leaves on a row.
  GRADUS_HD void set_row(const index_t* idx, std::size_t n) {
    a.set_row(idx, n);
    b.set_row(idx, n);
  }
  /// f of the operands' elements j.
  GRADUS_HD auto eval(index_t j) const { return f(a.eval(j), b.eval(j)); }
  /// f of the operands' elements [j, j + V), lane by lane.
  template <int V>
  GRADUS_HD auto eval_lanes(index_t j) const {
    const auto x = a.template eval_lanes<V>(j);
    const auto y = b.template eval_lanes<V>(j);
    lanes<decltype(f(x.v[0], y.v[0])), V> r{};
    for (int k = 0; k < V; ++k) r.v[k] = f(x.v[k], y.v[k]);
    return r;
  }
  /// Whether every leaf allows eval_lanes at V.
  bool lanes_ok(std::size_t rank, index_t V) const { return a.lanes_ok(rank, V) && b.lanes_ok(rank, V); }
  /// f of the operands' batches at j.
  template <class B>
  B load(index_t j) const {
    return f(a.template load<B>(j), b.template load<B>(j));
  }
  /// f of the operands' padded batches of the last n elements from j.
  template <class B>
  B load_tail(index_t j, index_t n) const {
    return f(a.template load_tail<B>(j, n), b.template load_tail<B>(j, n));
  }
  /// g(strides) of every leaf, left to right.
  template <class G>
  void for_each_leaf(G&& g) {
    a.for_each_leaf(g);
    b.for_each_leaf(g);
  }
};

/// f applied to three sub-plans' elements (where(cond, a, b)).
template <class F, class PA, class PB, class PC>
struct ternary_plan {
  F f;   ///< the node's functor, called on scalars and on SIMD batches
  PA a;  ///< the first operand's plan
  PB b;  ///< the second operand's plan
  PC c;  ///< the third operand's plan
  /// Positions the three operands' leaves on a row.
  GRADUS_HD void set_row(const index_t* idx, std::size_t n) {
    a.set_row(idx, n);
    b.set_row(idx, n);
    c.set_row(idx, n);
  }
  /// f of the operands' elements j.
  GRADUS_HD auto eval(index_t j) const { return f(a.eval(j), b.eval(j), c.eval(j)); }
  /// f of the operands' elements [j, j + V), lane by lane.
  template <int V>
  GRADUS_HD auto eval_lanes(index_t j) const {
    const auto x = a.template eval_lanes<V>(j);
    const auto y = b.template eval_lanes<V>(j);
    const auto z = c.template eval_lanes<V>(j);
    lanes<decltype(f(x.v[0], y.v[0], z.v[0])), V> r{};
    for (int k = 0; k < V; ++k) r.v[k] = f(x.v[k], y.v[k], z.v[k]);
    return r;
  }
  /// Whether every leaf allows eval_lanes at V.
  bool lanes_ok(std::size_t rank, index_t V) const {
    return a.lanes_ok(rank, V) && b.lanes_ok(rank, V) && c.lanes_ok(rank, V);
  }
  /// f of the operands' batches at j.
  template <class B>
  B load(index_t j) const {
    return f(a.template load<B>(j), b.template load<B>(j), c.template load<B>(j));
  }
  /// f of the operands' padded batches of the last n elements from j.
  template <class B>
  B load_tail(index_t j, index_t n) const {
    return f(a.template load_tail<B>(j, n), b.template load_tail<B>(j, n), c.template load_tail<B>(j, n));
  }
  /// g(strides) of every leaf, left to right.
  template <class G>
  void for_each_leaf(G&& g) {
    a.for_each_leaf(g);
    b.for_each_leaf(g);
    c.for_each_leaf(g);
  }
};

/// Merge adjacent loop axes wherever every leaf walks them as one (stride[k-1] ==
/// stride[k] * d[k]); a pass over same-shaped operands becomes one flat loop, a bias add
/// becomes rows of the last axis.
template <class Plan>
loop_shape collapse_loop(Plan& plan, const dims& out) {
  loop_shape ls;
  ls.rank = out.rank;
  for (std::size_t i = 0; i < out.rank; ++i) ls.d[i] = out.d[i];
  auto remove_axis = [&](std::size_t k) {
    plan.for_each_leaf([&](std::array<index_t, max_rank>& s) {
      for (std::size_t i = k; i + 1 < ls.rank; ++i) s[i] = s[i + 1];
    });
    for (std::size_t i = k; i + 1 < ls.rank; ++i) ls.d[i] = ls.d[i + 1];
    --ls.rank;
  };
  // Axes of extent 1 carry no iteration.
  for (std::size_t k = ls.rank; k-- > 0;)
    if (ls.d[k] == 1) remove_axis(k);
  if (ls.rank == 0) {
    ls.rank = 1;
    ls.d[0] = 1;
    plan.for_each_leaf([](std::array<index_t, max_rank>& s) { s[0] = 0; });
    return ls;
  }
  for (std::size_t k = ls.rank - 1; k >= 1; --k) {
    bool ok = true;
    plan.for_each_leaf([&](const std::array<index_t, max_rank>& s) {
      if (s[k - 1] != s[k] * ls.d[k]) ok = false;
    });
    if (!ok) continue;
    ls.d[k] *= ls.d[k - 1];
    remove_axis(k - 1);
  }
  return ls;
}

}  // namespace gradus
