#pragma once
// Recurrent layers over a whole sequence, fused as cuDNN and PyTorch fuse them: one
// kernel runs every time step, so the sequence length is a run-time extent and compile
// time does not grow with it.
//
//   lstm(xs [T,B,I], wx [I,4H], wh [H,4H], b [4H])              -> hs [T,B,H]
//   gru (xs [T,B,I], wx [I,3H], wh [H,3H], bx [3H], bh [3H])    -> hs [T,B,H]
//
// Time-major, zero initial state, PyTorch's gate order and equations:
//   lstm: i,f,g,o = σ,σ,tanh,σ(x Wx + h Wh + b);  c' = f c + i g;  h' = o tanh(c')
//   gru:  r,z = σ(x Wx_rz + bx_rz + h Wh_rz + bh_rz);
//         n = tanh(x Wx_n + bx_n + r (h Wh_n + bh_n));  h' = (1 - z) n + z h
//
// How it runs. The forward kernel (rnn_node) writes one packed buffer: hs, then what the
// backward needs (LSTM: cell states and activated gates; GRU: activated gates and the
// recurrent projections). Gates are stored gate-major, [G][T][B][H], so that every
// step's elementwise math is one flat pass (Backend::for_each over B*H elements) and
// every projection is one strided-batched GEMM over the G gates:
//   1. all steps' input projections at once: bias (a rank-1 GEMM with a column of ones),
//      then += X [T*B, I] Wx_k for each gate k — one batched GEMM;
//   2. per step t: gates_t += h_{t-1} Wh_k (batched GEMM), then the gate pass.
// The user's hs is a view of the buffer's first part (rnn_seq_node). Its vjp, for every
// operand, reads one backward kernel (rnn_grad_node) that runs backpropagation through
// time once and packs dWx | dWh | db... | dG (the pre-activation gradients,
// [G][T][B][H]) | carries; structurally equal, it is planned once however many
// gradients are asked for. Per step t, from T-1 down: the gate pass turns dh_t
// (upstream + carried) into dG_t, then dh_{t-1} = sum_k dG_{k,t} Wh_k^T. After the loop
// the weight gradients are single GEMMs over all steps (dWx_k = X^T dG_k, dWh_k =
// H_{0..T-2}^T dG_{k,1..T-1}) and the biases column sums of dG. dxs = sum_k dG_k Wx_k^T
// is its own kernel (rnn_input_grad_node), run only where xs's gradient is wanted.
//
// The cells (lstm_cell, gru_cell: their buffers' parts, gate rules and sequence loops) are
// graph/ops/rnn_cells.hpp's; this file holds what runs any cell, and is the entry point.
#include <array>
#include <cstddef>
#include <string>
#include <tuple>

#include "gradus/core/device.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/rnn_cells.hpp"
#include "gradus/graph/ops/reduce.hpp"
#include "gradus/graph/ops/select.hpp"
#include "gradus/graph/ops/shape_ops.hpp"

namespace gradus {

// ---- static shape check -----------------------------------------------------------------

namespace detail {
template <class... S>
struct rnn_weights {};
constexpr bool extent_eq(index_t a, index_t b) { return a == dyn || b == dyn || a == b; }
template <class Cell, class SX, class SWx, class SWh, class... SB>
constexpr bool rnn_fits(rnn_weights<SWx, SWh, SB...>*) {
  if constexpr (SX::rank != 3 || SWx::rank != 2 || SWh::rank != 2 || ((SB::rank != 1) || ...) ||
                sizeof...(SB) != Cell::biases) {
    return false;
  } else {
    const index_t h = SWh::extents[0], g = SWh::extents[1];
    return extent_eq(SWx::extents[0], SX::extents[2]) && extent_eq(SWx::extents[1], g) &&
           (h == dyn || g == dyn || g == Cell::gates * h) && (extent_eq(SB::extents[0], g) && ...);
  }
}
/// H from wh [H, G*H], else from wx [I, G*H].
template <class Cell, class SWx, class SWh>
constexpr index_t rnn_hidden() {
  if constexpr (SWh::rank != 2 || SWx::rank != 2) return dyn;  // NOLINT(bugprone-branch-clone): ordered tests, the last is the fallback
  else if constexpr (SWh::extents[0] != dyn) return SWh::extents[0];
  else if constexpr (SWh::extents[1] != dyn) return SWh::extents[1] / Cell::gates;
  else if constexpr (SWx::extents[1] != dyn) return SWx::extents[1] / Cell::gates;
  else return dyn;
}
template <class Cell, class SX, class SWx, class SWh>
struct rnn_fwd_extents {
  static constexpr std::array<index_t, 4> value{Cell::fwd_parts, SX::rank == 3 ? SX::extents[0] : dyn,
                                                SX::rank == 3 ? SX::extents[1] : dyn, rnn_hidden<Cell, SWx, SWh>()};
};
template <class S>
struct rnn_seq_extents {
  static constexpr std::array<index_t, 3> value{S::extents[1], S::extents[2], S::extents[3]};
};
}  // namespace detail

namespace op {
template <class Cell>
struct rnn {
  static constexpr const char* name = Cell::name;
  template <class SX, class Weights>
  static constexpr bool fits = detail::rnn_fits<Cell, SX>(static_cast<Weights*>(nullptr));
};
}  // namespace op

// ---- nodes ----------------------------------------------------------------------------

/// The forward kernel: the packed buffer [Cell::fwd_parts, T, B, H] (hs first).
template <class Cell, class X, class Wx, class Wh, class... Bs>
struct rnn_node : expr_base {
  using value_type = value_t<X>;
  static_assert(real_dtype<value_type>, "gradus: lstm/gru need float or double operands");
  static_assert(check_dtypes<op::rnn<Cell>, value_type, value_t<Wx>>::value &&
                check_dtypes<op::rnn<Cell>, value_type, value_t<Wh>>::value &&
                (check_dtypes<op::rnn<Cell>, value_type, value_t<Bs>>::value && ...));
  static_assert(check_shapes<op::rnn<Cell>, shape_t<X>,
                             detail::rnn_weights<shape_t<Wx>, shape_t<Wh>, shape_t<Bs>...>>::value);
  using shape_type = shape_of_array<detail::rnn_fwd_extents<Cell, shape_t<X>, shape_t<Wx>, shape_t<Wh>>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = Cell::name;
  static constexpr op_precision precision = op_precision::compute;  ///< the cell's GEMMs (core/precision.hpp)
  using cell = Cell;
  X xs;
  Wx wx;
  Wh wh;
  std::tuple<Bs...> bs;
  auto operands() const {
    return std::apply([&](const auto&... b) { return std::tie(xs, wx, wh, b...); }, bs);
  }
  auto children() const { return operands(); }

  /// The run's extents, or a shape_error naming the op and every operand's shape.
  template <class... D>
  static detail::rnn_extents extents(const dims& x, const dims& wx, const dims& wh, const D&... b) {
    bool ok = x.rank == 3 && wx.rank == 2 && wh.rank == 2 && ((b.rank == 1) && ...);
    const index_t h = wh.rank == 2 ? wh.d[0] : 0, g = Cell::gates * h;
    ok = ok && wx.d[0] == x.d[2] && wx.d[1] == g && wh.d[1] == g && ((b.d[0] == g) && ...);
    if (!ok) {
      std::string got = "xs " + to_string(x) + ", wx " + to_string(wx) + ", wh " + to_string(wh);
      std::size_t j = 0;
      ((got += std::string(", ") + Cell::bias_names[j++] + " " + to_string(b)), ...);
      throw shape_error(std::string("gradus: ") + Cell::name + ": operands of shapes " + got +
                        " do not fit (expected " + Cell::expected + ")");
    }
    return {x.d[0], x.d[1], x.d[2], h};
  }
  template <class... D>
  dims infer(const dims& x, const dims& wx, const dims& wh, const D&... b) const {
    const detail::rnn_extents e = extents(x, wx, wh, b...);
    return dims{Cell::fwd_parts, e.t, e.b, e.h};
  }
  template <class Backend, class... V>
  void compute(value_type* out, const dims&, tensor_view<const value_type> x, tensor_view<const value_type> wx,
               tensor_view<const value_type> wh, const V&... b) const {
    const detail::rnn_extents e = extents(x.shape(), wx.shape(), wh.shape(), b.shape()...);
    Cell::template forward<Backend>(out, e, x.data(), wx.data(), wh.data(), b.data()...);
  }
  bool operator==(const rnn_node&) const = default;
};

/// hs [T, B, H]: the first part of the forward buffer. Autodiff sees through it to the
/// forward's operands (its children), whose adjoints all come from one rnn_grad_node.
template <class Fwd>
struct rnn_seq_node : expr_base {
  using value_type = value_t<Fwd>;
  using shape_type = shape_of_array<detail::rnn_seq_extents<shape_t<Fwd>>>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = Fwd::cell::seq_name;
  Fwd fwd;
  auto operands() const { return std::tie(fwd); }
  auto children() const { return fwd.children(); }
  dims infer(const dims& f) const { return dims{f.d[1], f.d[2], f.d[3]}; }
  bool operator==(const rnn_seq_node&) const = default;
};

/// Backpropagation through time, once: dwx | dwh | db... | dG | carries (rank 1).
template <class Fwd, class G>
struct rnn_grad_node : expr_base {
  using value_type = value_t<Fwd>;
  using cell = typename Fwd::cell;
  static_assert(std::is_same_v<value_t<G>, value_type>, "gradus: lstm/gru backward: the adjoint's dtype differs");
  using shape_type = shape<dyn>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = cell::grad_name;
  static constexpr op_precision precision = op_precision::compute;  ///< core/precision.hpp
  Fwd fwd;
  G g;
  auto operands() const { return std::tie(fwd, g, fwd.xs, fwd.wh); }
  auto children() const { return std::tie(fwd, g); }
  static detail::rnn_extents extents(const dims& f, const dims& x) { return {f.d[1], f.d[2], x.d[2], f.d[3]}; }
  /// Where dG starts, in elements: after the weight and bias gradients.
  static index_t dg_offset(index_t i, index_t h) {
    return (i + h + static_cast<index_t>(cell::biases)) * cell::gates * h;
  }
  dims infer(const dims& f, const dims& gd, const dims& x, const dims&) const {
    const detail::rnn_extents e = extents(f, x);
    if (!(gd == dims{e.t, e.b, e.h}))
      throw shape_error(std::string("gradus: ") + cell::grad_name + ": the adjoint of hs has shape " + to_string(gd) +
                        ", expected " + to_string(dims{e.t, e.b, e.h}));
    return dims{std::array<index_t, 1>{dg_offset(e.i, e.h) + cell::grad_scratch(e)}};
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> f, tensor_view<const value_type> gd,
               tensor_view<const value_type> x, tensor_view<const value_type> wh) const {
    cell::template backward<Backend>(out, extents(f.shape(), x.shape()), x.data(), wh.data(), f.data(), gd.data());
  }
  bool operator==(const rnn_grad_node&) const = default;
};

/// The gradient of weight or bias operand K (1: wx, 2: wh, 3...: biases), a part of
/// the backward buffer.
template <std::size_t K, class Grad>
struct rnn_grad_part : expr_base {
  using cell = typename Grad::cell;  ///< the recurrent cell (lstm_cell, gru_cell)
  static_assert(K >= 1 && K < 3 + cell::biases);
  /// The type of forward operand K, whose shape the gradient has.
  using like = std::remove_cvref_t<std::tuple_element_t<K, decltype(std::declval<const Grad&>().fwd.operands())>>;
  using value_type = value_t<Grad>;                      ///< the forward's dtype
  using shape_type = shape_t<like>;                      ///< operand K's shape
  static constexpr node_kind kind = node_kind::view;     ///< a view of the backward buffer, no copy
  static constexpr const char* op_name = cell::grad_part_name;  ///< its label in errors, traces and graph drawings
  Grad grad;                                             ///< the backward kernel (rnn_grad_node)
  /// The buffers it reads: the backward buffer, then xs and operand K for their dims.
  auto operands() const { return std::tie(grad, grad.fwd.xs, std::get<K>(grad.fwd.operands())); }
  /// The backward kernel only: the values of xs and operand K are not read.
  auto children() const { return std::tie(grad); }
  /// Operand K's dims.
  dims infer(const dims&, const dims&, const dims& l) const { return l; }
  /// Where the gradient starts in the backward buffer, in elements: the buffer holds dwx
  /// `[I, G*H]`, then dwh `[H, G*H]`, then each bias `[G*H]` (G the cell's gate count).
  index_t offset(const dims&, const dims& x, const dims& l) const {
    const index_t i = x.d[2];
    if constexpr (K == 1) return 0;
    else if constexpr (K == 2) return i * l.d[1];
    else return (i + l.d[0] / cell::gates + static_cast<index_t>(K - 3)) * l.d[0];
  }
  /// Structural: the same backward kernel.
  bool operator==(const rnn_grad_part&) const = default;
};

/// dxs = sum_k dG_k Wx_k^T: its own kernel, so it runs only where xs's gradient is wanted.
template <class Grad>
struct rnn_input_grad_node : expr_base {
  using cell = typename Grad::cell;
  using value_type = value_t<Grad>;
  using shape_type = shape_t<decltype(std::declval<const Grad&>().fwd.xs)>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = cell::input_grad_name;
  static constexpr op_precision precision = op_precision::compute;  ///< core/precision.hpp
  Grad grad;
  auto operands() const { return std::tie(grad, grad.fwd.xs, grad.fwd.wx); }
  auto children() const { return std::tie(grad); }
  dims infer(const dims&, const dims& x, const dims&) const { return x; }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> gb, tensor_view<const value_type> x,
               tensor_view<const value_type> wx) const {
    const index_t rows = x.shape().d[0] * x.shape().d[1], i = x.shape().d[2], gh = wx.shape().d[1], h = gh / cell::gates;
    const value_type* dG = gb.data() + Grad::dg_offset(i, h);
    const index_t tbh = rows * h;
    for (index_t k = 0; k < cell::gates; ++k)
      Backend::gemm(false, true, rows, i, h, value_type(1), dG + k * tbh, h, 0, wx.data() + k * h, gh, 0,
                    value_type(k ? 1 : 0), out, i, 0, 1);
  }
  bool operator==(const rnn_input_grad_node&) const = default;
};

// ---- builders ---------------------------------------------------------------------------

/// lstm(xs [T,B,I], wx [I,4H], wh [H,4H], b [4H]) -> hs [T,B,H]: time-major, zero initial
/// state, PyTorch's gates (i, f, g, o) and equations (top of this file). float or double,
/// one dtype; shapes that do not fit are a compile error where static, else a shape_error.
/// Gradient: backpropagation through time, one backward kernel for every operand's
/// gradient (xs's only where it is asked for).
template <expression X, expression Wx, expression Wh, expression B>
auto lstm(const X& xs, const Wx& wx, const Wh& wh, const B& b) {
  using fwd = rnn_node<lstm_cell, X, Wx, Wh, B>;
  return rnn_seq_node<fwd>{{}, fwd{{}, xs, wx, wh, {b}}};
}

/// gru(xs [T,B,I], wx [I,3H], wh [H,3H], bx [3H], bh [3H]) -> hs [T,B,H]: as lstm(), with
/// PyTorch's GRU gates (r, z, n) and equations (top of this file). Gradient: as lstm's.
template <expression X, expression Wx, expression Wh, expression Bx, expression Bh>
auto gru(const X& xs, const Wx& wx, const Wh& wh, const Bx& bx, const Bh& bh) {
  using fwd = rnn_node<gru_cell, X, Wx, Wh, Bx, Bh>;
  return rnn_seq_node<fwd>{{}, fwd{{}, xs, wx, wh, {bx, bh}}};
}

/// last_step(hs [T, B, H]) -> hs[T-1] [B, H] (no copy): what a classifier reads. Gradient:
/// zeros of hs's shape with g at the last step (select's).
template <expression Hs>
auto last_step(const Hs& hs) {
  return select(hs, -1);
}

/// time_major<Steps, Features>(x [B, Steps*Features]) -> [Steps, B, Features]: a batch
/// of flattened sequences (e.g. MNIST rows as fed, [B, 784]) as an rnn's xs (a reshape,
/// then a permute: a copy). Gradient: g permuted and reshaped back to x's shape.
template <index_t Steps, index_t Features, expression X>
auto time_major(const X& x) {
  static_assert(rank_v<X> == 2, "gradus: time_major: expects [B, Steps*Features]");
  return permute<1, 0, 2>(reshape<dyn, Steps, Features>(x));
}

}  // namespace gradus
