#pragma once
// Convolution and pooling over NCHW images (dilation 1).
//
//   conv2d<Stride, Pad>(x [N,C,H,W], w [O,C,KH,KW]) -> [N,O,OH,OW],  OH = (H + 2 Pad - KH) / Stride + 1
//   max_pool2d<K, Stride = K, Pad = 0>(x), avg_pool2d<K, Stride = K, Pad = 0>(x) -> [N,C,OH,OW]
//   flatten(x [N, ...]) -> [N, prod(...)]
//
// conv2d is a node of its own (conv2d_node), as are its two adjoints, the data gradient
// (conv2d_data_grad_node: dX from dY and W) and the weight gradient
// (conv2d_weight_grad_node: dW from X and dY). These are the three calls a convolution
// library offers (oneDNN's forward / backward-data / backward-weights primitives, cuDNN's
// cudnnConvolutionForward / BackwardData / BackwardFilter), so a backend implements them
// with whichever library it has: cpu_simd runs float convolutions through oneDNN where it
// was found, and otherwise (and for double) im2col + one GEMM over the whole batch, as
// Caffe and PyTorch's own CPU path do. (Until issue 15 conv2d was that composition in the
// graph — im2col node, matmul, permute — which tied every backend to im2col.)
// im2col and col2im stay as ops of their own. H and W must be static; N may be dynamic.
// Padding reads zeros (conv2d, avg_pool2d, which divides by K*K as PyTorch's default
// count_include_pad does) or is skipped (max_pool2d). Each node's type carries its window
// (window2d); at run time it hands the backend one conv_geometry (the input's extents, the
// filters, the window: ops/conv_geometry.hpp).
#include <string>
#include <tuple>

#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/conv_geometry.hpp"
#include "gradus/graph/ops/shape_ops.hpp"

namespace gradus {

namespace detail {
constexpr index_t mul_or_dyn(index_t a, index_t b) { return a == dyn || b == dyn ? dyn : a * b; }

template <class S, window2d Win>
struct im2col_extents {
  static constexpr std::array<index_t, 2> value{
      mul_or_dyn(S::extents[1], Win.kh * Win.kw),
      mul_or_dyn(S::extents[0], mul_or_dyn(Win.oh(S::extents[2]), Win.ow(S::extents[3])))};
};
template <class S, window2d Win>
struct pool_extents {
  static constexpr std::array<index_t, 4> value{S::extents[0], S::extents[1], Win.oh(S::extents[2]),
                                                Win.ow(S::extents[3])};
};
template <class S, window2d Win>
constexpr bool window_fits() {
  if constexpr (S::rank != 4) {
    return false;
  } else {
    constexpr index_t h = S::extents[2], w = S::extents[3];
    return Win.kh > 0 && Win.kw > 0 && Win.stride > 0 && Win.pad >= 0 && Win.pad < Win.kh && Win.pad < Win.kw &&
           (h == dyn || h + 2 * Win.pad >= Win.kh) && (w == dyn || w + 2 * Win.pad >= Win.kw);
  }
}
inline std::string window_string(const window2d& w) {
  return std::to_string(w.kh) + "x" + std::to_string(w.kw) + " window, stride " + std::to_string(w.stride) +
         ", padding " + std::to_string(w.pad);
}
/// The run-time check every windowed op makes: rank 4 and a window that fits.
inline void check_window(const char* op, const dims& x, const window2d& w) {
  if (x.rank != 4 || x.d[2] + 2 * w.pad < w.kh || x.d[3] + 2 * w.pad < w.kw)
    throw shape_error(std::string("gradus: ") + op + ": input of shape " + to_string(x) +
                      " does not fit a " + window_string(w) + " (expected [N, C, H, W] with H, W >= the window)");
}
}  // namespace detail

namespace op {
template <window2d Win>
struct window_op {
  static constexpr const char* name = "window2d";
  template <class S, class Unused>
  static constexpr bool fits = detail::window_fits<S, Win>();
};
}  // namespace op

/// col[(c*KH + i)*KW + j, (n*OH + oh)*OW + ow] = x[n, c, oh*S - P + i, ow*S - P + j] (0 outside).
template <class X, window2d Win>
struct im2col_node : expr_base {
  static_assert(check_shapes<op::window_op<Win>, shape_t<X>, shape<>>::value);
  using value_type = value_t<X>;
  using shape_type = shape_of_array<detail::im2col_extents<shape_t<X>, Win>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "im2col";
  static constexpr window2d window = Win;
  X x;
  auto operands() const { return std::tie(x); }
  auto children() const { return std::tie(x); }
  dims infer(const dims& in) const {
    detail::check_window(op_name, in, Win);
    return dims{std::array<index_t, 2>{in.d[1] * Win.kh * Win.kw, in.d[0] * Win.oh(in.d[2]) * Win.ow(in.d[3])}};
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> in) const {
    Backend::im2col(in.data(), geometry_of(in.shape(), Win), out);
  }
  bool operator==(const im2col_node&) const = default;
};

/// The adjoint of im2col: zeros shaped like `like` [N,C,H,W], each column's entries added
/// back at the pixels they were read from. `like` lends its dims only.
template <class Col, class Like, window2d Win>
struct col2im_node : expr_base {
  static_assert(rank_v<Col> == 2 && rank_v<Like> == 4, "gradus: col2im: needs a [C*KH*KW, N*OH*OW] matrix and an NCHW target");
  using value_type = value_t<Like>;
  using shape_type = shape_t<Like>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "col2im";
  Col col;
  Like like;
  auto operands() const { return std::tie(col, like); }
  auto children() const { return std::tie(col); }
  dims infer(const dims& c, const dims& t) const {
    detail::check_window(op_name, t, Win);
    const index_t rows = t.d[1] * Win.kh * Win.kw, cols = t.d[0] * Win.oh(t.d[2]) * Win.ow(t.d[3]);
    if (c.rank != 2 || c.d[0] != rows || c.d[1] != cols)
      throw shape_error("gradus: col2im: columns of shape " + to_string(c) + " do not fit an image of shape " +
                        to_string(t) + " with a " + detail::window_string(Win));
    return t;
  }
  template <class Backend>
  void compute(value_type* out, const dims& d, tensor_view<const value_type> c, tensor_view<const value_type>) const {
    Backend::col2im(c.data(), geometry_of(d, Win), out);
  }
  bool operator==(const col2im_node&) const = default;
};

/// im2col<Win>(x): x [N, C, H, W] unfolded into columns `[C*KH*KW, N*OH*OW]`, one per
/// output pixel, holding the window it reads (zeros in the padding; the layout is
/// im2col_node's). Gradient: col2im<Win>(g, x).
template <window2d Win, expression X>
auto im2col(const X& x) {
  return im2col_node<X, Win>{{}, x};
}
/// col2im<Win>(col, like): im2col's adjoint, zeros shaped like `like` [N, C, H, W] with each
/// entry of col `[C*KH*KW, N*OH*OW]` added back at the pixel it was read from (padding
/// dropped); like lends its dims only. Gradient: im2col<Win>(g).
template <window2d Win, expression Col, expression Like>
auto col2im(const Col& col, const Like& like) {
  return col2im_node<Col, Like, Win>{{}, col, like};
}

// ---- conv2d and its adjoints -------------------------------------------------------------
namespace detail {
/// The window of conv2d<Stride, Pad>(x, w): the weights' static kernel extents.
template <class SW, index_t Stride, index_t Pad>
constexpr window2d conv_window() {
  return window2d{SW::extents[2], SW::extents[3], Stride, Pad};
}
template <class SX, class SW, window2d Win>
struct conv_extents {
  static constexpr std::array<index_t, 4> value{SX::extents[0], SW::extents[0], Win.oh(SX::extents[2]),
                                                Win.ow(SX::extents[3])};
};
/// The run-time checks of the three conv nodes: x [N,C,H,W] against w [O,C,KH,KW].
inline void check_conv(const char* op, const dims& x, const dims& w, const window2d& win) {
  check_window(op, x, win);
  if (w.rank != 4 || w.d[1] != x.d[1] || w.d[2] != win.kh || w.d[3] != win.kw)
    throw shape_error(std::string("gradus: ") + op + ": weights of shape " + to_string(w) +
                      " do not fit an input of shape " + to_string(x) + " with a " + window_string(win));
}
inline dims conv_out(const dims& x, const dims& w, const window2d& win) {
  return dims{std::array<index_t, 4>{x.d[0], w.d[0], win.oh(x.d[2]), win.ow(x.d[3])}};
}
inline void check_conv_adjoint(const char* op, const dims& g, const dims& want) {
  if (!(g == want))
    throw shape_error(std::string("gradus: ") + op + ": adjoint of shape " + to_string(g) + " does not fit (expected " +
                      to_string(want) + ")");
}
}  // namespace detail

/// y [N,O,OH,OW] = sum over c, i, j of x[n, c, oh*S - P + i, ow*S - P + j] w[o, c, i, j]
/// (cross-correlation, as every framework's conv).
template <class X, class W, window2d Win>
struct conv2d_node : expr_base {
  static_assert(real_dtype<value_t<X>>, "gradus: conv2d needs float or double input");
  using value_type = value_t<X>;
  using shape_type = shape_of_array<detail::conv_extents<shape_t<X>, shape_t<W>, Win>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "conv2d";
  static constexpr op_precision precision = op_precision::compute;  ///< core/precision.hpp
  static constexpr window2d window = Win;
  X x;
  W w;
  auto operands() const { return std::tie(x, w); }
  auto children() const { return std::tie(x, w); }
  dims infer(const dims& xd, const dims& wd) const {
    detail::check_conv(op_name, xd, wd, Win);
    return detail::conv_out(xd, wd, Win);
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> xv, tensor_view<const value_type> wv) const {
    Backend::conv2d(xv.data(), wv.data(), geometry_of(xv.shape(), Win, wv.shape().d[0]), out);
  }
  bool operator==(const conv2d_node&) const = default;
};

/// dX [N,C,H,W] of y = conv2d(x, w), given the adjoint g [N,O,OH,OW]: the transposed
/// convolution of g with w. `like` (x) lends its dims only.
template <class G, class W, class Like, window2d Win>
struct conv2d_data_grad_node : expr_base {
  using value_type = value_t<G>;
  using shape_type = shape_t<Like>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "conv2d_data_grad";
  static constexpr op_precision precision = op_precision::compute;  ///< core/precision.hpp
  G g;
  W w;
  Like like;
  auto operands() const { return std::tie(g, w, like); }
  auto children() const { return std::tie(g, w); }
  dims infer(const dims& gd, const dims& wd, const dims& xd) const {
    detail::check_conv(op_name, xd, wd, Win);
    detail::check_conv_adjoint(op_name, gd, detail::conv_out(xd, wd, Win));
    return xd;
  }
  template <class Backend>
  void compute(value_type* out, const dims& d, tensor_view<const value_type> gv, tensor_view<const value_type> wv,
               tensor_view<const value_type>) const {
    Backend::conv2d_backward_data(gv.data(), wv.data(), geometry_of(d, Win, wv.shape().d[0]), out);
  }
  bool operator==(const conv2d_data_grad_node&) const = default;
};

/// dW [O,C,KH,KW] of y = conv2d(x, w), given the adjoint g [N,O,OH,OW]: summed over the
/// batch. `like` (w) lends its dims only.
template <class X, class G, class Like, window2d Win>
struct conv2d_weight_grad_node : expr_base {
  using value_type = value_t<X>;
  using shape_type = shape_t<Like>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "conv2d_weight_grad";
  static constexpr op_precision precision = op_precision::compute;  ///< core/precision.hpp
  X x;
  G g;
  Like like;
  auto operands() const { return std::tie(x, g, like); }
  auto children() const { return std::tie(x, g); }
  dims infer(const dims& xd, const dims& gd, const dims& wd) const {
    detail::check_conv(op_name, xd, wd, Win);
    detail::check_conv_adjoint(op_name, gd, detail::conv_out(xd, wd, Win));
    return wd;
  }
  template <class Backend>
  void compute(value_type* out, const dims& wd, tensor_view<const value_type> xv, tensor_view<const value_type> gv,
               tensor_view<const value_type>) const {
    Backend::conv2d_backward_weights(xv.data(), gv.data(), geometry_of(xv.shape(), Win, wd.d[0]), out);
  }
  bool operator==(const conv2d_weight_grad_node&) const = default;
};

/// conv2d<Stride, Pad>(x [N,C,H,W], w [O,C,KH,KW]) -> [N,O,OH,OW] (cross-correlation, as
/// every framework's conv). Add a bias with `+ reshape<1, O, 1, 1>(b)` (nn::conv2d does).
/// OH = (H + 2 Pad - KH) / Stride + 1, likewise OW. float or double, one dtype; w's shape
/// and x's H and W static, N may be `dyn`; a misfit is a compile error where static, else a
/// shape_error. Gradient: conv2d_data_grad(g, w) to x, conv2d_weight_grad(x, g) to w.
template <index_t Stride = 1, index_t Pad = 0, expression X, expression W>
auto conv2d(const X& x, const W& w) {
  using SX = shape_t<X>;
  using SW = shape_t<W>;
  static_assert(SX::rank == 4 && SW::rank == 4,
                "gradus: conv2d: needs an NCHW input [N, C, H, W] and weights [O, C, KH, KW]");
  static_assert(std::is_same_v<value_t<X>, value_t<W>>, "gradus: conv2d: the input and the weights have different dtypes");
  constexpr index_t o = SW::extents[0], c = SW::extents[1], kh = SW::extents[2], kw = SW::extents[3];
  static_assert(o != dyn && c != dyn && kh != dyn && kw != dyn, "gradus: conv2d: the weights' shape must be static");
  static_assert(SX::extents[1] == dyn || SX::extents[1] == c,
                "gradus: conv2d: the input's channels differ from the weights' second extent");
  static_assert(SX::extents[2] != dyn && SX::extents[3] != dyn,
                "gradus: conv2d: the input's height and width must be static");
  constexpr window2d win = detail::conv_window<SW, Stride, Pad>();
  static_assert(check_shapes<op::window_op<win>, SX, shape<>>::value);
  static_assert(win.oh(SX::extents[2]) > 0 && win.ow(SX::extents[3]) > 0,
                "gradus: conv2d: the kernel is larger than the padded input");
  return conv2d_node<X, W, win>{{}, x, w};
}
/// conv2d_data_grad<Win>(g, w, like): dX [N, C, H, W] of y = conv2d(x, w) given y's adjoint
/// g [N, O, OH, OW], the transposed convolution of g with w; like (x) lends its dims only.
/// What conv2d's derivative rule builds; it has none of its own.
template <window2d Win, expression G, expression W, expression Like>
auto conv2d_data_grad(const G& g, const W& w, const Like& like) {
  return conv2d_data_grad_node<G, W, Like, Win>{{}, g, w, like};
}
/// conv2d_weight_grad<Win>(x, g, like): dW [O, C, KH, KW] of y = conv2d(x, w) given y's
/// adjoint g [N, O, OH, OW], summed over the batch; like (w) lends its dims only. What
/// conv2d's derivative rule builds; it has none of its own.
template <window2d Win, expression X, expression G, expression Like>
auto conv2d_weight_grad(const X& x, const G& g, const Like& like) {
  return conv2d_weight_grad_node<X, G, Like, Win>{{}, x, g, like};
}

/// flatten(x [N, ...]) -> [N, prod(...)]: a view, no copy (a reshape). Gradient: g
/// reshaped back to x's dims.
template <expression X>
auto flatten(const X& x) {
  using S = shape_t<X>;
  static_assert(S::rank >= 2, "gradus: flatten: needs rank >= 2 (a batch axis and at least one more)");
  constexpr index_t rest = [] {
    index_t r = 1;
    for (std::size_t i = 1; i < S::rank; ++i) r = detail::mul_or_dyn(r, S::extents[i]);
    return r;
  }();
  static_assert(rest != dyn || S::extents[0] != dyn,
                "gradus: flatten: the batch extent or the other extents must be static");
  return reshape<S::extents[0], rest>(x);
}

// ---- pooling -------------------------------------------------------------------------------
/// Which pooling: the window's maximum or its average.
enum class pool_kind { max, avg };

template <pool_kind K, class X, window2d Win>
struct pool2d_node : expr_base {
  static_assert(check_shapes<op::window_op<Win>, shape_t<X>, shape<>>::value);
  static_assert(real_dtype<value_t<X>>, "gradus: pooling needs float or double input");
  using value_type = value_t<X>;
  using shape_type = shape_of_array<detail::pool_extents<shape_t<X>, Win>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = K == pool_kind::max ? "max_pool2d" : "avg_pool2d";
  static constexpr window2d window = Win;
  X x;
  auto operands() const { return std::tie(x); }
  auto children() const { return std::tie(x); }
  dims infer(const dims& in) const {
    detail::check_window(op_name, in, Win);
    return dims{std::array<index_t, 4>{in.d[0], in.d[1], Win.oh(in.d[2]), Win.ow(in.d[3])}};
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> in) const {
    Backend::pool2d(K == pool_kind::max, in.data(), geometry_of(in.shape(), Win), out);
  }
  bool operator==(const pool2d_node&) const = default;
};

/// The adjoint of pooling w.r.t. its input: max routes each output's adjoint to the first
/// maximum of its window (x is read again to find it), avg spreads it as g / (KH*KW).
template <pool_kind K, class X, class G, window2d Win>
struct pool2d_grad_node : expr_base {
  using value_type = value_t<X>;
  using shape_type = shape_t<X>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = K == pool_kind::max ? "max_pool2d_grad" : "avg_pool2d_grad";
  X x;
  G g;
  auto operands() const { return std::tie(x, g); }
  auto children() const { return std::tie(g); }
  dims infer(const dims& in, const dims& gd) const {
    detail::check_window(op_name, in, Win);
    const dims want{std::array<index_t, 4>{in.d[0], in.d[1], Win.oh(in.d[2]), Win.ow(in.d[3])}};
    if (!(gd == want))
      throw shape_error(std::string("gradus: ") + op_name + ": adjoint of shape " + to_string(gd) +
                        " does not fit an input of shape " + to_string(in) + " (expected " + to_string(want) + ")");
    return in;
  }
  template <class Backend>
  void compute(value_type* out, const dims& d, tensor_view<const value_type> in, tensor_view<const value_type> gv) const {
    Backend::pool2d_grad(K == pool_kind::max, in.data(), gv.data(), geometry_of(d, Win), out);
  }
  bool operator==(const pool2d_grad_node&) const = default;
};

/// max_pool2d<K, Stride = K, Pad = 0>(x [N, C, H, W]) -> [N, C, OH, OW]: the maximum of
/// each K x K window, OH = (H + 2 Pad - K) / Stride + 1, likewise OW; the padding is
/// skipped. float or double; Pad < K. Gradient: each output's g to the first maximum of its
/// window.
template <index_t K, index_t Stride = K, index_t Pad = 0, expression X>
auto max_pool2d(const X& x) {
  return pool2d_node<pool_kind::max, X, window2d{K, K, Stride, Pad}>{{}, x};
}
/// avg_pool2d<K, Stride = K, Pad = 0>(x [N, C, H, W]) -> [N, C, OH, OW]: the mean of each
/// K x K window, shaped as max_pool2d's; the padding counts as zeros (it divides by `K*K`,
/// as PyTorch's default count_include_pad). Gradient: `g / (K*K)` to each element of the
/// window.
template <index_t K, index_t Stride = K, index_t Pad = 0, expression X>
auto avg_pool2d(const X& x) {
  return pool2d_node<pool_kind::avg, X, window2d{K, K, Stride, Pad}>{{}, x};
}

}  // namespace gradus
