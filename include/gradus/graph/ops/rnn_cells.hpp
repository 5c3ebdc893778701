#pragma once
// The cells of the fused recurrent kernels (graph/ops/rnn.hpp): for LSTM and GRU, the gate
// count and biases, the parts of the forward buffer, the backward scratch, the per-element
// gate rules, and the forward and backward sequence loops (per step a batched GEMM over
// the gates, then one gate pass), written against the backend interface. Apart from
// rnn.hpp because the cells are the recurrence's arithmetic while rnn.hpp's nodes, shape
// check and builders run any cell: a new cell is one struct here and nothing there.
#include <array>
#include <cstddef>

#include "gradus/core/device.hpp"
#include "gradus/core/held_operand.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/reduce.hpp"
#include "gradus/graph/ops/select.hpp"

namespace gradus {

namespace detail {
template <class T>
using rnn_set = fill_rule<T>;  ///< graph/ops/select.hpp
template <class X>
GRADUS_HD X rnn_sigmoid(const X& x) {
  return fn::sigmoid_fn{}(x);
}
template <class X>
GRADUS_HD X rnn_tanh(const X& x) {
  return fn::tanh_fn{}(x);
}
/// The extents of one run: T steps, B rows, I inputs, H hidden.
struct rnn_extents {
  index_t t, b, i, h;
  index_t tbh() const { return t * b * h; }
  index_t bh() const { return b * h; }
};
}  // namespace detail

namespace detail {
/// Bias into every row (a column of ones [T*B, 1] times b_k [1, H]), then += X Wx_k: every
/// step's input projection, all gates, in two batched GEMMs. `ones` has T*B entries.
template <class Backend, class T>
void rnn_input_projection(T* gates, T* ones, const rnn_extents& e, const T* x, const T* wx, const T* b, index_t ng) {
  const index_t rows = e.t * e.b, G = ng * e.h, TBH = e.tbh();
  Backend::for_each(rows, rnn_set<T>{T(1)}, ones);
  Backend::gemm(false, false, rows, e.h, 1, T(1), ones, 1, 0, b, G, e.h, T(0), gates, e.h, TBH, ng);
  Backend::gemm(false, false, rows, e.h, e.i, T(1), x, e.i, 0, wx, G, e.h, T(1), gates, e.h, TBH, ng);
}
/// dW_k (columns k*H.. of a [K, ng*H] matrix) = A^T D_k over `rows` rows, for ng gate
/// blocks of D spaced TBH apart.
template <class Backend, class T>
void rnn_weight_grad(T* dw, const T* a, index_t a_cols, const T* d, index_t rows, const rnn_extents& e, index_t ng,
                     index_t G) {
  Backend::gemm(true, false, a_cols, e.h, rows, T(1), a, a_cols, 0, d, e.h, e.tbh(), T(0), dw, G, e.h, ng);
}
}  // namespace detail

// ---- cells -----------------------------------------------------------------------------
// A cell: its gate count and biases, the parts of its forward buffer, its backward
// scratch, and the two sequence loops.

/// The LSTM cell of lstm(): gates i, f, g, o (PyTorch's order) and one bias; per step
/// c = f c_prev + i g and h = o tanh(c).
struct lstm_cell {
  static constexpr const char* name = "lstm";                           ///< the forward kernel's op name
  static constexpr const char* seq_name = "lstm_hs";                    ///< the op name of hs, the forward buffer's first part
  static constexpr const char* grad_name = "lstm_backward";             ///< the op name of the backward kernel
  static constexpr const char* grad_part_name = "lstm_backward_part";   ///< the op name of one weight's or bias's gradient
  static constexpr const char* input_grad_name = "lstm_backward_input"; ///< the op name of xs's gradient kernel
  static constexpr const char* expected = "xs [T, B, I], wx [I, 4H], wh [H, 4H], b [4H]";  ///< the shapes a shape_error expects
  static constexpr std::array<const char*, 1> bias_names{"b"};  ///< the bias operands' names, for a shape_error
  static constexpr index_t gates = 4;                           ///< gates per step
  static constexpr std::size_t biases = 1;                      ///< bias operands
  /// forward buffer, in parts of T*B*H: hs | cs | gates [4][T][B][H] | ones (T*B used)
  static constexpr index_t fwd_parts = 7;
  /// backward buffer after dwx | dwh | db: dG [4][T][B][H] | dh carry | dc carry
  static index_t grad_scratch(const detail::rnn_extents& e) { return 4 * e.tbh() + 2 * e.bh(); }

  /// The gate pass of a step after the first: the gates' pre-activations in place to their
  /// activations, then c and h from them and cp, the previous step's cell state.
  struct step_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(X& i, X& f, X& g, X& o, const X& cp, X& c, X& h) const {
      i = detail::rnn_sigmoid(i);
      f = detail::rnn_sigmoid(f);
      g = detail::rnn_tanh(g);
      o = detail::rnn_sigmoid(o);
      c = f * cp + i * g;
      h = o * detail::rnn_tanh(c);
    }
  };
  /// The first step's gate pass: step_rule's with a previous cell state of 0 (c = i g).
  struct first_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(X& i, X& f, X& g, X& o, X& c, X& h) const {
      i = detail::rnn_sigmoid(i);
      f = detail::rnn_sigmoid(f);
      g = detail::rnn_tanh(g);
      o = detail::rnn_sigmoid(o);
      c = i * g;
      h = o * detail::rnn_tanh(c);
    }
  };
  /// dh = upstream + carried; dc = carried + dh o (1 - tanh(c)^2); the pre-activation
  /// gradients out; dc becomes the carry into step t-1, dc f.
  /// (No named locals of type X in the rules: core/device.hpp says why.)
  template <class X>
  GRADUS_HD static void grad_common(const X& dh, X& dc, const X& i, const X& g, const X& o, const X& c, X& di, X& dg,
                          X& dout) {
    grad_given_tanh(dh, dc, i, g, o, detail::rnn_tanh(c), di, dg, dout);
  }
  /// grad_common's arithmetic, given tc = tanh(c).
  template <class X>
  GRADUS_HD static void grad_given_tanh(const X& dh, X& dc, const X& i, const X& g, const X& o, const X& tc, X& di,
                                        X& dg, X& dout) {
    dc = dc + dh * o * (X(1) - tc * tc);
    dout = dh * tc * o * (X(1) - o);
    di = dc * g * i * (X(1) - i);
    dg = dc * i * (X(1) - g * g);
  }
  /// The backward gate pass of a step after the first: from dh = dhs + carry, the four
  /// pre-activation gradients; dc becomes dc f, the cell-state carry into the step before.
  struct grad_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(const X& dhs, const X& carry, X& dc, const X& i, const X& f, const X& g, const X& o, const X& c,
                    const X& cp, X& di, X& df, X& dg, X& dout) const {
      grad_common(dhs + carry, dc, i, g, o, c, di, dg, dout);
      df = dc * cp * f * (X(1) - f);
      dc = dc * f;
    }
  };
  /// The first step's backward gate pass: the previous cell state is 0, so f gets no
  /// gradient (df = 0).
  struct first_grad_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(const X& dhs, const X& carry, X& dc, const X& i, const X& g, const X& o, const X& c, X& di,
                    X& df, X& dg, X& dout) const {
      grad_common(dhs + carry, dc, i, g, o, c, di, dg, dout);
      df = X(0);
    }
  };

  /// The forward loop: the forward buffer `out` from xs, wx, wh and b (every step's input
  /// projection first, then per step a batched GEMM over the gates and a gate pass).
  template <class Backend, class T>
  static void forward(T* out, const detail::rnn_extents& e, const T* x, const T* wx, const T* wh, const T* b) {
    const index_t G = 4 * e.h, n = e.bh(), TBH = e.tbh();
    T* hs = out;
    T* cs = out + TBH;
    T* gates = out + 2 * TBH;
    detail::rnn_input_projection<Backend>(gates, out + 6 * TBH, e, x, wx, b, 4);
    [[maybe_unused]] const auto held = hold_operand<Backend>(wh, static_cast<std::size_t>(e.h * G));
    for (index_t t = 0; t < e.t; ++t) {
      T* a = gates + t * n;
      if (t == 0) {
        Backend::for_each(n, first_rule{}, a, a + TBH, a + 2 * TBH, a + 3 * TBH, cs, hs);
      } else {
        Backend::gemm(false, false, e.b, e.h, e.h, T(1), hs + (t - 1) * n, e.h, 0, wh, G, e.h, T(1), a, e.h, TBH, 4);
        Backend::for_each(n, step_rule{}, a, a + TBH, a + 2 * TBH, a + 3 * TBH,
                          static_cast<const T*>(cs + (t - 1) * n), cs + t * n, hs + t * n);
      }
    }
  }

  /// out: dwx | dwh | db | dG | dh carry | dc carry
  template <class Backend, class T>
  static void backward(T* out, const detail::rnn_extents& e, const T* x, const T* wh, const T* fwd, const T* dhs) {
    const index_t G = 4 * e.h, n = e.bh(), TBH = e.tbh();
    T* dwx = out;
    T* dwh = dwx + e.i * G;
    T* db = dwh + e.h * G;
    T* dG = db + G;
    T* carry = dG + 4 * TBH;
    T* dc = carry + n;
    const T* hs = fwd;
    const T* cs = fwd + TBH;
    const T* gates = fwd + 2 * TBH;
    Backend::for_each(2 * n, detail::rnn_set<T>{T(0)}, carry);
    [[maybe_unused]] const auto held = hold_operand<Backend>(wh, static_cast<std::size_t>(e.h * G));
    for (index_t t = e.t - 1; t >= 0; --t) {
      const T* a = gates + t * n;
      T* d = dG + t * n;
      if (t > 0) {
        Backend::for_each(n, grad_rule{}, dhs + t * n, static_cast<const T*>(carry), dc, a, a + TBH, a + 2 * TBH,
                          a + 3 * TBH, cs + t * n, cs + (t - 1) * n, d, d + TBH, d + 2 * TBH, d + 3 * TBH);
        for (index_t k = 0; k < 4; ++k)  // dh_{t-1} = sum_k dG_{k,t} Wh_k^T
          Backend::gemm(false, true, e.b, e.h, e.h, T(1), d + k * TBH, e.h, 0, wh + k * e.h, G, 0, T(k ? 1 : 0),
                        carry, e.h, 0, 1);
      } else {
        Backend::for_each(n, first_grad_rule{}, dhs, static_cast<const T*>(carry), dc, a, a + 2 * TBH, a + 3 * TBH,
                          cs, d, d + TBH, d + 2 * TBH, d + 3 * TBH);
      }
    }
    const index_t rows = e.t * e.b, prev = e.t > 0 ? (e.t - 1) * e.b : 0;
    detail::rnn_weight_grad<Backend>(dwx, x, e.i, dG, rows, e, 4, G);
    detail::rnn_weight_grad<Backend>(dwh, hs, e.h, dG + n, prev, e, 4, G);
    Backend::reduce(reduce_kind::sum, static_cast<const T*>(dG), 4, rows, e.h, db);
  }
};

/// The GRU cell of gru(): gates r, z, n (PyTorch's order) and two biases, bx on the input
/// side and bh on the recurrent one; per step h = (1 - z) n + z h_prev.
struct gru_cell {
  static constexpr const char* name = "gru";                            ///< the forward kernel's op name
  static constexpr const char* seq_name = "gru_hs";                     ///< the op name of hs, the forward buffer's first part
  static constexpr const char* grad_name = "gru_backward";              ///< the op name of the backward kernel
  static constexpr const char* grad_part_name = "gru_backward_part";    ///< the op name of one weight's or bias's gradient
  static constexpr const char* input_grad_name = "gru_backward_input";  ///< the op name of xs's gradient kernel
  static constexpr const char* expected = "xs [T, B, I], wx [I, 3H], wh [H, 3H], bx [3H], bh [3H]";  ///< the shapes a shape_error expects
  static constexpr std::array<const char*, 2> bias_names{"bx", "bh"};  ///< the bias operands' names, for a shape_error
  static constexpr index_t gates = 3;                                  ///< gates per step
  static constexpr std::size_t biases = 2;                             ///< bias operands
  /// forward buffer, in parts of T*B*H: hs | gates r,z,n [3][T][B][H] (activated) |
  /// recurrent projections h Wh_k + bh_k [3][T][B][H] | ones (T*B used)
  static constexpr index_t fwd_parts = 8;
  /// backward buffer after dwx | dwh | dbx | dbh: dG [4][T][B][H] (r, z, n on the input
  /// side, n on the recurrent side: r*dn) | dh carry
  static index_t grad_scratch(const detail::rnn_extents& e) { return 4 * e.tbh() + e.bh(); }

  /// The gate pass of a step after the first: r, z and n hold the input projections (x Wx +
  /// bx) and become the activated gates, hr, hz and hn are the recurrent projections (h_prev
  /// Wh + bh), hp is h_prev; h is written.
  struct step_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(X& r, X& z, X& n, const X& hr, const X& hz, const X& hn, const X& hp, X& h) const {
      r = detail::rnn_sigmoid(r + hr);
      z = detail::rnn_sigmoid(z + hz);
      n = detail::rnn_tanh(n + r * hn);
      h = n + z * (hp - n);
    }
  };
  /// The first step's gate pass: step_rule's with h_prev = 0 (h = (1 - z) n).
  struct first_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(X& r, X& z, X& n, const X& hr, const X& hz, const X& hn, X& h) const {
      r = detail::rnn_sigmoid(r + hr);
      z = detail::rnn_sigmoid(z + hz);
      n = detail::rnn_tanh(n + r * hn);
      h = n - z * n;
    }
  };
  /// dh = upstream + carried; the carry into step t-1 starts as dh z (the GEMMs add the rest).
  /// (No named locals of type X in the rules: core/device.hpp says why. dh and dan arrive as
  /// parameters bound to temporaries: computed before carry is overwritten.)
  template <class X>
  GRADUS_HD static void grad_common(const X& dh, const X& dz, X& carry, const X& r, const X& z, const X& n, const X& hn,
                          X& dr, X& daz, X& dnx, X& dnh) {
    grad_given_dan(dh, dh * (X(1) - z) * (X(1) - n * n), dz, carry, r, z, hn, dr, daz, dnx, dnh);
  }
  /// grad_common's arithmetic, given dan, the gradient of n's pre-activation: writes the
  /// carry's start dh z, and the pre-activation gradients of r and z and of n on the input
  /// (dnx) and recurrent (dnh) sides.
  template <class X>
  GRADUS_HD static void grad_given_dan(const X& dh, const X& dan, const X& dz, X& carry, const X& r, const X& z,
                                       const X& hn, X& dr, X& daz, X& dnx, X& dnh) {
    carry = dh * z;
    dnx = dan;
    dnh = dan * r;
    dr = dan * hn * r * (X(1) - r);
    daz = dz * z * (X(1) - z);
  }
  /// The backward gate pass of a step after the first, from dh = dhs + carry.
  struct grad_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(const X& dhs, X& carry, const X& r, const X& z, const X& n, const X& hn, const X& hp, X& dr,
                    X& dz, X& dnx, X& dnh) const {
      given_dh(dhs + carry, carry, r, z, n, hn, hp, dr, dz, dnx, dnh);
    }
    /// The same given dh: z's gradient is dh (hp - n).
    template <class X>
    GRADUS_HD static void given_dh(const X& dh, X& carry, const X& r, const X& z, const X& n, const X& hn, const X& hp,
                                   X& dr, X& dz, X& dnx, X& dnh) {
      grad_common(dh, dh * (hp - n), carry, r, z, n, hn, dr, dz, dnx, dnh);
    }
  };
  /// The first step's backward gate pass (h_prev = 0).
  struct first_grad_rule {
    /// One element (or one SIMD batch of elements).
    template <class X>
    GRADUS_HD void operator()(const X& dhs, X& carry, const X& r, const X& z, const X& n, const X& hn, X& dr, X& dz, X& dnx,
                    X& dnh) const {
      given_dh(dhs + carry, carry, r, z, n, hn, dr, dz, dnx, dnh);
    }
    /// The same given dh: z's gradient is -dh n.
    template <class X>
    GRADUS_HD static void given_dh(const X& dh, X& carry, const X& r, const X& z, const X& n, const X& hn, X& dr, X& dz,
                                   X& dnx, X& dnh) {
      grad_common(dh, -(dh * n), carry, r, z, n, hn, dr, dz, dnx, dnh);
    }
  };

  /// The forward loop: the forward buffer `out` from xs, wx, wh, bx and bh (every step's
  /// input and bh projections first, then per step a batched GEMM over the gates and a gate
  /// pass).
  template <class Backend, class T>
  static void forward(T* out, const detail::rnn_extents& e, const T* x, const T* wx, const T* wh, const T* bx,
                      const T* bh) {
    const index_t G = 3 * e.h, n = e.bh(), TBH = e.tbh(), rows = e.t * e.b;
    T* hs = out;
    T* gates = out + TBH;
    T* hp = out + 4 * TBH;
    T* ones = out + 7 * TBH;
    detail::rnn_input_projection<Backend>(gates, ones, e, x, wx, bx, 3);
    Backend::gemm(false, false, rows, e.h, 1, T(1), ones, 1, 0, bh, G, e.h, T(0), hp, e.h, TBH, 3);
    [[maybe_unused]] const auto held = hold_operand<Backend>(wh, static_cast<std::size_t>(e.h * G));
    for (index_t t = 0; t < e.t; ++t) {
      T* a = gates + t * n;
      T* p = hp + t * n;
      if (t == 0) {
        Backend::for_each(n, first_rule{}, a, a + TBH, a + 2 * TBH, static_cast<const T*>(p),
                          static_cast<const T*>(p + TBH), static_cast<const T*>(p + 2 * TBH), hs);
      } else {
        Backend::gemm(false, false, e.b, e.h, e.h, T(1), hs + (t - 1) * n, e.h, 0, wh, G, e.h, T(1), p, e.h, TBH, 3);
        Backend::for_each(n, step_rule{}, a, a + TBH, a + 2 * TBH, static_cast<const T*>(p),
                          static_cast<const T*>(p + TBH), static_cast<const T*>(p + 2 * TBH),
                          static_cast<const T*>(hs + (t - 1) * n), hs + t * n);
      }
    }
  }

  /// out: dwx | dwh | dbx | dbh | dG (r, z, n_x, n_h) | dh carry
  template <class Backend, class T>
  static void backward(T* out, const detail::rnn_extents& e, const T* x, const T* wh, const T* fwd, const T* dhs) {
    const index_t G = 3 * e.h, n = e.bh(), TBH = e.tbh();
    T* dwx = out;
    T* dwh = dwx + e.i * G;
    T* dbx = dwh + e.h * G;
    T* dbh = dbx + G;
    T* dG = dbh + G;
    T* carry = dG + 4 * TBH;
    const T* hs = fwd;
    const T* gates = fwd + TBH;
    const T* hpn = fwd + 6 * TBH;  // h Wh_n + bh_n
    Backend::for_each(n, detail::rnn_set<T>{T(0)}, carry);
    [[maybe_unused]] const auto held = hold_operand<Backend>(wh, static_cast<std::size_t>(e.h * G));
    for (index_t t = e.t - 1; t >= 0; --t) {
      const T* a = gates + t * n;
      T* d = dG + t * n;
      if (t > 0) {
        Backend::for_each(n, grad_rule{}, dhs + t * n, carry, a, a + TBH, a + 2 * TBH, hpn + t * n, hs + (t - 1) * n,
                          d, d + TBH, d + 2 * TBH, d + 3 * TBH);
        // dh_{t-1} += dG_r Wh_r^T + dG_z Wh_z^T + dG_nh Wh_n^T
        for (index_t k = 0; k < 3; ++k)
          Backend::gemm(false, true, e.b, e.h, e.h, T(1), d + (k == 2 ? 3 : k) * TBH, e.h, 0, wh + k * e.h, G, 0, T(1),
                        carry, e.h, 0, 1);
      } else {
        Backend::for_each(n, first_grad_rule{}, dhs, carry, a, a + TBH, a + 2 * TBH, hpn, d, d + TBH, d + 2 * TBH,
                          d + 3 * TBH);
      }
    }
    const index_t rows = e.t * e.b, prev = e.t > 0 ? (e.t - 1) * e.b : 0;
    detail::rnn_weight_grad<Backend>(dwx, x, e.i, dG, rows, e, 3, G);
    detail::rnn_weight_grad<Backend>(dwh, hs, e.h, dG + n, prev, e, 2, G);
    detail::rnn_weight_grad<Backend>(dwh + 2 * e.h, hs, e.h, dG + 3 * TBH + n, prev, e, 1, G);
    Backend::reduce(reduce_kind::sum, static_cast<const T*>(dG), 3, rows, e.h, dbx);
    Backend::reduce(reduce_kind::sum, static_cast<const T*>(dG), 2, rows, e.h, dbh);
    Backend::reduce(reduce_kind::sum, static_cast<const T*>(dG + 3 * TBH), 1, rows, e.h, dbh + 2 * e.h);
  }
};

}  // namespace gradus
