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
#include <string>
#include <tuple>

#include "gradus/core/device.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/reduce.hpp"
#include "gradus/graph/ops/select.hpp"
#include "gradus/graph/ops/shape_ops.hpp"

namespace gradus {

namespace detail {
template <class T>
using rnn_set = fill_rule<T>;  // graph/ops/select.hpp
template <class X>
GRADUS_HD X rnn_sigmoid(const X& x) {
  return fn::sigmoid_fn{}(x);
}
template <class X>
GRADUS_HD X rnn_tanh(const X& x) {
  return fn::tanh_fn{}(x);
}
// The extents of one run: T steps, B rows, I inputs, H hidden.
struct rnn_extents {
  index_t t, b, i, h;
  index_t tbh() const { return t * b * h; }
  index_t bh() const { return b * h; }
};
}  // namespace detail


namespace detail {
// Bias into every row (a column of ones [T*B, 1] times b_k [1, H]), then += X Wx_k: every
// step's input projection, all gates, in two batched GEMMs. `ones` has T*B entries.
template <class Backend, class T>
void rnn_input_projection(T* gates, T* ones, const rnn_extents& e, const T* x, const T* wx, const T* b, index_t ng) {
  const index_t rows = e.t * e.b, G = ng * e.h, TBH = e.tbh();
  Backend::for_each(rows, rnn_set<T>{T(1)}, ones);
  Backend::gemm(false, false, rows, e.h, 1, T(1), ones, 1, 0, b, G, e.h, T(0), gates, e.h, TBH, ng);
  Backend::gemm(false, false, rows, e.h, e.i, T(1), x, e.i, 0, wx, G, e.h, T(1), gates, e.h, TBH, ng);
}
// dW_k (columns k*H.. of a [K, ng*H] matrix) = A^T D_k over `rows` rows, for ng gate
// blocks of D spaced TBH apart.
template <class Backend, class T>
void rnn_weight_grad(T* dw, const T* a, index_t a_cols, const T* d, index_t rows, const rnn_extents& e, index_t ng,
                     index_t G) {
  Backend::gemm(true, false, a_cols, e.h, rows, T(1), a, a_cols, 0, d, e.h, e.tbh(), T(0), dw, G, e.h, ng);
}
}  // namespace detail

// ---- cells -----------------------------------------------------------------------------
// A cell: its gate count and biases, the parts of its forward buffer, its backward
// scratch, and the two sequence loops.

struct lstm_cell {
  static constexpr const char* name = "lstm";
  static constexpr const char* seq_name = "lstm_hs";
  static constexpr const char* grad_name = "lstm_backward";
  static constexpr const char* grad_part_name = "lstm_backward_part";
  static constexpr const char* input_grad_name = "lstm_backward_input";
  static constexpr const char* expected = "xs [T, B, I], wx [I, 4H], wh [H, 4H], b [4H]";
  static constexpr std::array<const char*, 1> bias_names{"b"};
  static constexpr index_t gates = 4;
  static constexpr std::size_t biases = 1;
  // forward buffer, in parts of T*B*H: hs | cs | gates [4][T][B][H] | ones (T*B used)
  static constexpr index_t fwd_parts = 7;
  // backward buffer after dwx | dwh | db: dG [4][T][B][H] | dh carry | dc carry
  static index_t grad_scratch(const detail::rnn_extents& e) { return 4 * e.tbh() + 2 * e.bh(); }

  struct step_rule {  // gates in place -> activated; c, h out
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
  struct first_rule {  // c_{-1} = 0
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
  // dh = upstream + carried; dc = carried + dh o (1 - tanh(c)^2); the pre-activation
  // gradients out; dc becomes the carry into step t-1, dc f.
  // (No named locals of type X in the rules: core/device.hpp says why.)
  template <class X>
  GRADUS_HD static void grad_common(const X& dh, X& dc, const X& i, const X& g, const X& o, const X& c, X& di, X& dg,
                          X& dout) {
    grad_given_tanh(dh, dc, i, g, o, detail::rnn_tanh(c), di, dg, dout);
  }
  template <class X>
  GRADUS_HD static void grad_given_tanh(const X& dh, X& dc, const X& i, const X& g, const X& o, const X& tc, X& di,
                                        X& dg, X& dout) {
    dc = dc + dh * o * (X(1) - tc * tc);
    dout = dh * tc * o * (X(1) - o);
    di = dc * g * i * (X(1) - i);
    dg = dc * i * (X(1) - g * g);
  }
  struct grad_rule {
    template <class X>
    GRADUS_HD void operator()(const X& dhs, const X& carry, X& dc, const X& i, const X& f, const X& g, const X& o, const X& c,
                    const X& cp, X& di, X& df, X& dg, X& dout) const {
      grad_common(dhs + carry, dc, i, g, o, c, di, dg, dout);
      df = dc * cp * f * (X(1) - f);
      dc = dc * f;
    }
  };
  struct first_grad_rule {  // c_{-1} = 0: f has no gradient
    template <class X>
    GRADUS_HD void operator()(const X& dhs, const X& carry, X& dc, const X& i, const X& g, const X& o, const X& c, X& di,
                    X& df, X& dg, X& dout) const {
      grad_common(dhs + carry, dc, i, g, o, c, di, dg, dout);
      df = X(0);
    }
  };

  template <class Backend, class T>
  static void forward(T* out, const detail::rnn_extents& e, const T* x, const T* wx, const T* wh, const T* b) {
    const index_t G = 4 * e.h, n = e.bh(), TBH = e.tbh();
    T* hs = out;
    T* cs = out + TBH;
    T* gates = out + 2 * TBH;
    detail::rnn_input_projection<Backend>(gates, out + 6 * TBH, e, x, wx, b, 4);
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

  // out: dwx | dwh | db | dG | dh carry | dc carry
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

struct gru_cell {
  static constexpr const char* name = "gru";
  static constexpr const char* seq_name = "gru_hs";
  static constexpr const char* grad_name = "gru_backward";
  static constexpr const char* grad_part_name = "gru_backward_part";
  static constexpr const char* input_grad_name = "gru_backward_input";
  static constexpr const char* expected = "xs [T, B, I], wx [I, 3H], wh [H, 3H], bx [3H], bh [3H]";
  static constexpr std::array<const char*, 2> bias_names{"bx", "bh"};
  static constexpr index_t gates = 3;
  static constexpr std::size_t biases = 2;
  // forward buffer, in parts of T*B*H: hs | gates r,z,n [3][T][B][H] (activated) |
  // recurrent projections h Wh_k + bh_k [3][T][B][H] | ones (T*B used)
  static constexpr index_t fwd_parts = 8;
  // backward buffer after dwx | dwh | dbx | dbh: dG [4][T][B][H] (r, z, n on the input
  // side, n on the recurrent side: r*dn) | dh carry
  static index_t grad_scratch(const detail::rnn_extents& e) { return 4 * e.tbh() + e.bh(); }

  struct step_rule {
    template <class X>
    GRADUS_HD void operator()(X& r, X& z, X& n, const X& hr, const X& hz, const X& hn, const X& hp, X& h) const {
      r = detail::rnn_sigmoid(r + hr);
      z = detail::rnn_sigmoid(z + hz);
      n = detail::rnn_tanh(n + r * hn);
      h = n + z * (hp - n);
    }
  };
  struct first_rule {  // h_{-1} = 0
    template <class X>
    GRADUS_HD void operator()(X& r, X& z, X& n, const X& hr, const X& hz, const X& hn, X& h) const {
      r = detail::rnn_sigmoid(r + hr);
      z = detail::rnn_sigmoid(z + hz);
      n = detail::rnn_tanh(n + r * hn);
      h = n - z * n;
    }
  };
  // dh = upstream + carried; the carry into step t-1 starts as dh z (the GEMMs add the rest).
  // (No named locals of type X in the rules: core/device.hpp says why. dh and dan arrive as
  // parameters bound to temporaries: computed before carry is overwritten.)
  template <class X>
  GRADUS_HD static void grad_common(const X& dh, const X& dz, X& carry, const X& r, const X& z, const X& n, const X& hn,
                          X& dr, X& daz, X& dnx, X& dnh) {
    grad_given_dan(dh, dh * (X(1) - z) * (X(1) - n * n), dz, carry, r, z, hn, dr, daz, dnx, dnh);
  }
  template <class X>
  GRADUS_HD static void grad_given_dan(const X& dh, const X& dan, const X& dz, X& carry, const X& r, const X& z,
                                       const X& hn, X& dr, X& daz, X& dnx, X& dnh) {
    carry = dh * z;
    dnx = dan;
    dnh = dan * r;
    dr = dan * hn * r * (X(1) - r);
    daz = dz * z * (X(1) - z);
  }
  struct grad_rule {
    template <class X>
    GRADUS_HD void operator()(const X& dhs, X& carry, const X& r, const X& z, const X& n, const X& hn, const X& hp, X& dr,
                    X& dz, X& dnx, X& dnh) const {
      given_dh(dhs + carry, carry, r, z, n, hn, hp, dr, dz, dnx, dnh);
    }
    template <class X>
    GRADUS_HD static void given_dh(const X& dh, X& carry, const X& r, const X& z, const X& n, const X& hn, const X& hp,
                                   X& dr, X& dz, X& dnx, X& dnh) {
      grad_common(dh, dh * (hp - n), carry, r, z, n, hn, dr, dz, dnx, dnh);
    }
  };
  struct first_grad_rule {
    template <class X>
    GRADUS_HD void operator()(const X& dhs, X& carry, const X& r, const X& z, const X& n, const X& hn, X& dr, X& dz, X& dnx,
                    X& dnh) const {
      given_dh(dhs + carry, carry, r, z, n, hn, dr, dz, dnx, dnh);
    }
    template <class X>
    GRADUS_HD static void given_dh(const X& dh, X& carry, const X& r, const X& z, const X& n, const X& hn, X& dr, X& dz,
                                   X& dnx, X& dnh) {
      grad_common(dh, -(dh * n), carry, r, z, n, hn, dr, dz, dnx, dnh);
    }
  };

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

  // out: dwx | dwh | dbx | dbh | dG (r, z, n_x, n_h) | dh carry
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
// H from wh [H, G*H], else from wx [I, G*H].
template <class Cell, class SWx, class SWh>
constexpr index_t rnn_hidden() {
  if constexpr (SWh::rank != 2 || SWx::rank != 2) return dyn;
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

// The forward kernel: the packed buffer [Cell::fwd_parts, T, B, H] (hs first).
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
  using cell = Cell;
  X xs;
  Wx wx;
  Wh wh;
  std::tuple<Bs...> bs;
  auto operands() const {
    return std::apply([&](const auto&... b) { return std::tie(xs, wx, wh, b...); }, bs);
  }
  auto children() const { return operands(); }

  // The run's extents, or a shape_error naming the op and every operand's shape.
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
    const detail::rnn_extents e = extents(x.shape, wx.shape, wh.shape, b.shape...);
    Cell::template forward<Backend>(out, e, x.data(), wx.data(), wh.data(), b.data()...);
  }
  bool operator==(const rnn_node&) const = default;
};

// hs [T, B, H]: the first part of the forward buffer. Autodiff sees through it to the
// forward's operands (its children), whose adjoints all come from one rnn_grad_node.
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

// Backpropagation through time, once: dwx | dwh | db... | dG | carries (rank 1).
template <class Fwd, class G>
struct rnn_grad_node : expr_base {
  using value_type = value_t<Fwd>;
  using cell = typename Fwd::cell;
  static_assert(std::is_same_v<value_t<G>, value_type>, "gradus: lstm/gru backward: the adjoint's dtype differs");
  using shape_type = shape<dyn>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = cell::grad_name;
  Fwd fwd;
  G g;
  auto operands() const { return std::tie(fwd, g, fwd.xs, fwd.wh); }
  auto children() const { return std::tie(fwd, g); }
  static detail::rnn_extents extents(const dims& f, const dims& x) { return {f.d[1], f.d[2], x.d[2], f.d[3]}; }
  // Where dG starts, in elements: after the weight and bias gradients.
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
    cell::template backward<Backend>(out, extents(f.shape, x.shape), x.data(), wh.data(), f.data(), gd.data());
  }
  bool operator==(const rnn_grad_node&) const = default;
};

// The gradient of weight or bias operand K (1: wx, 2: wh, 3...: biases), a part of
// the backward buffer.
template <std::size_t K, class Grad>
struct rnn_grad_part : expr_base {
  using cell = typename Grad::cell;
  static_assert(K >= 1 && K < 3 + cell::biases);
  using like = std::remove_cvref_t<std::tuple_element_t<K, decltype(std::declval<const Grad&>().fwd.operands())>>;
  using value_type = value_t<Grad>;
  using shape_type = shape_t<like>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = cell::grad_part_name;
  Grad grad;
  auto operands() const { return std::tie(grad, grad.fwd.xs, std::get<K>(grad.fwd.operands())); }
  auto children() const { return std::tie(grad); }
  dims infer(const dims&, const dims&, const dims& l) const { return l; }
  index_t offset(const dims&, const dims& x, const dims& l) const {
    const index_t i = x.d[2];
    if constexpr (K == 1) return 0;
    else if constexpr (K == 2) return i * l.d[1];
    else return (i + l.d[0] / cell::gates + static_cast<index_t>(K - 3)) * l.d[0];
  }
  bool operator==(const rnn_grad_part&) const = default;
};

// dxs = sum_k dG_k Wx_k^T: its own kernel, so it runs only where xs's gradient is wanted.
template <class Grad>
struct rnn_input_grad_node : expr_base {
  using cell = typename Grad::cell;
  using value_type = value_t<Grad>;
  using shape_type = shape_t<decltype(std::declval<const Grad&>().fwd.xs)>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = cell::input_grad_name;
  Grad grad;
  auto operands() const { return std::tie(grad, grad.fwd.xs, grad.fwd.wx); }
  auto children() const { return std::tie(grad); }
  dims infer(const dims&, const dims& x, const dims&) const { return x; }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> gb, tensor_view<const value_type> x,
               tensor_view<const value_type> wx) const {
    const index_t rows = x.shape.d[0] * x.shape.d[1], i = x.shape.d[2], gh = wx.shape.d[1], h = gh / cell::gates;
    const value_type* dG = gb.data() + Grad::dg_offset(i, h);
    const index_t tbh = rows * h;
    for (index_t k = 0; k < cell::gates; ++k)
      Backend::gemm(false, true, rows, i, h, value_type(1), dG + k * tbh, h, 0, wx.data() + k * h, gh, 0,
                    value_type(k ? 1 : 0), out, i, 0, 1);
  }
  bool operator==(const rnn_input_grad_node&) const = default;
};

// ---- builders ---------------------------------------------------------------------------

// lstm(xs [T,B,I], wx [I,4H], wh [H,4H], b [4H]) -> hs [T,B,H]
template <expression X, expression Wx, expression Wh, expression B>
auto lstm(const X& xs, const Wx& wx, const Wh& wh, const B& b) {
  using fwd = rnn_node<lstm_cell, X, Wx, Wh, B>;
  return rnn_seq_node<fwd>{{}, fwd{{}, xs, wx, wh, {b}}};
}

// gru(xs [T,B,I], wx [I,3H], wh [H,3H], bx [3H], bh [3H]) -> hs [T,B,H]
template <expression X, expression Wx, expression Wh, expression Bx, expression Bh>
auto gru(const X& xs, const Wx& wx, const Wh& wh, const Bx& bx, const Bh& bh) {
  using fwd = rnn_node<gru_cell, X, Wx, Wh, Bx, Bh>;
  return rnn_seq_node<fwd>{{}, fwd{{}, xs, wx, wh, {bx, bh}}};
}

// last_step(hs [T, B, H]) -> hs[T-1] [B, H] (no copy): what a classifier reads.
template <expression Hs>
auto last_step(const Hs& hs) {
  return select(hs, -1);
}

// time_major<Steps, Features>(x [B, Steps*Features]) -> [Steps, B, Features]: a batch
// of flattened sequences (e.g. MNIST rows as fed, [B, 784]) as an rnn's xs.
template <index_t Steps, index_t Features, expression X>
auto time_major(const X& x) {
  static_assert(rank_v<X> == 2, "gradus: time_major: expects [B, Steps*Features]");
  return permute<1, 0, 2>(reshape<dyn, Steps, Features>(x));
}

}  // namespace gradus
