#pragma once
// Derivative rules of the elementwise ops. `n` is the node itself (its forward value,
// recomputed inside the fused backward pass or read from its buffer), `g` its adjoint.
// Binary ops reduce their adjoint back over broadcast axes (ad::unbroadcast).
#include "gradus/autodiff/grad.hpp"

namespace gradus {

// ---- unary -------------------------------------------------------------------------------
/// neg: -g.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::neg, A>&, const G& g) { return -g; }
/// exp: g e^a, the node's own value.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::exp_fn, A>& n, const G& g) { return g * n; }
/// log: g / a.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::log_fn, A>& n, const G& g) { return g / n.a; }
/// log1p: g / (a + 1).
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::log1p_fn, A>& n, const G& g) { return g / (n.a + 1); }
/// sqrt: g / (2 sqrt(a)), from the node's own value.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::sqrt_fn, A>& n, const G& g) { return g * 0.5 / n; }
/// rsqrt: d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 * rsqrt(x) / x
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::rsqrt_fn, A>& n, const G& g) { return g * -0.5 * n / n.a; }
/// abs: g sign(a) (0 at a = 0).
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::abs_fn, A>& n, const G& g) { return g * (greater(n.a, 0) - less(n.a, 0)); }
/// square: 2 a g.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::square_fn, A>& n, const G& g) { return g * 2 * n.a; }
/// tanh: g (1 - y^2), y the node's own value.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::tanh_fn, A>& n, const G& g) { return g * (1 - square(n)); }
/// sigmoid: g y (1 - y), y the node's own value.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::sigmoid_fn, A>& n, const G& g) { return g * n * (1 - n); }
/// relu: g where a > 0, else 0.
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::relu_fn, A>& n, const G& g) { return g * greater(n.a, 0); }
/// softplus: g sigmoid(a).
template <std::size_t I, class A, class G>
auto vjp(const unary<fn::softplus_fn, A>& n, const G& g) { return g * sigmoid(n.a); }
/// leaky_relu: g where a > 0, else alpha g.
template <std::size_t I, class T, class A, class G>
auto vjp(const unary<fn::leaky_relu_fn<T>, A>& n, const G& g) { return g * where(greater(n.a, 0), 1, n.f.alpha); }
/// elu'(x) = 1 for x > 0, elu(x) + alpha otherwise
template <std::size_t I, class T, class A, class G>
auto vjp(const unary<fn::elu_fn<T>, A>& n, const G& g) { return g * where(greater(n.a, 0), 1, n + n.f.alpha); }
/// clamp: g where lo <= a <= hi, else 0.
template <std::size_t I, class T, class A, class G>
auto vjp(const unary<fn::clamp_fn<T>, A>& n, const G& g) {
  return g * greater_equal(n.a, n.f.lo) * less_equal(n.a, n.f.hi);
}

// ---- binary ------------------------------------------------------------------------------
/// a + b: g to each operand, reduced to its shape over the axes it was broadcast along
/// (ad::unbroadcast), as in every binary rule here.
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::add, A, B>&, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g);
  else return ad::unbroadcast<shape_t<B>>(g);
}
/// a - b: g to a, -g to b.
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::sub, A, B>&, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g);
  else return ad::unbroadcast<shape_t<B>>(-g);
}
/// a * b: g b to a, g a to b.
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::mul, A, B>& n, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g * n.b);
  else return ad::unbroadcast<shape_t<B>>(g * n.a);
}
/// a / b: g / b to a, -g (a / b) / b to b (from the node's own value).
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::div, A, B>& n, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g / n.b);
  else return ad::unbroadcast<shape_t<B>>(-(g * n) / n.b);  // -g a / b^2 = -g (a/b) / b
}
/// maximum/minimum: at a tie each operand gets half of g (PyTorch's rule; the central
/// difference of max(a, b) in a at a == b is 1/2 too). The mask recomputes both operands
/// in the same pass, so it is consistent with itself; the forward's evaluation of them
/// has the same bits (one SIMD code path for body and tail, no contraction).
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::maximum, A, B>& n, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g * (greater(n.a, n.b) + equal(n.a, n.b) * 0.5));
  else return ad::unbroadcast<shape_t<B>>(g * (less(n.a, n.b) + equal(n.a, n.b) * 0.5));
}
/// minimum: as maximum's, to the smaller operand.
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::minimum, A, B>& n, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g * (less(n.a, n.b) + equal(n.a, n.b) * 0.5));
  else return ad::unbroadcast<shape_t<B>>(g * (greater(n.a, n.b) + equal(n.a, n.b) * 0.5));
}
/// pow(a, b): g b a^(b-1) to a, g ln(a) a^b to b.
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::pow_fn, A, B>& n, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g * n.b * pow(n.a, n.b - 1));
  else return ad::unbroadcast<shape_t<B>>(g * log(n.a) * n);
}
/// Defines the rule of comparison FN: no gradient (comparisons are piecewise constant).
/// Undefined after its uses.
#define GRADUS_NO_GRAD_BINARY(FN)                        \
  template <std::size_t I, class A, class B, class G>    \
  no_grad vjp(const binary<fn::FN, A, B>&, const G&) {   \
    return {};                                           \
  }
GRADUS_NO_GRAD_BINARY(less)
GRADUS_NO_GRAD_BINARY(less_equal)
GRADUS_NO_GRAD_BINARY(greater)
GRADUS_NO_GRAD_BINARY(greater_equal)
GRADUS_NO_GRAD_BINARY(equal)
GRADUS_NO_GRAD_BINARY(not_equal)
#undef GRADUS_NO_GRAD_BINARY
/// broadcast_like(g, a) only lends a's shape.
template <std::size_t I, class A, class B, class G>
auto vjp(const binary<fn::left, A, B>&, const G& g) {
  if constexpr (I == 0) return ad::unbroadcast<shape_t<A>>(g);
  else return no_grad{};
}

// ---- where(c, a, b) ----------------------------------------------------------------------
/// where(c, a, b): g to a where c != 0 and to b elsewhere (each reduced to its shape), none
/// to c.
template <std::size_t I, class C, class A, class B, class G>
auto vjp(const ternary<fn::where_fn, C, A, B>& n, const G& g) {
  if constexpr (I == 0) return no_grad{};
  else if constexpr (I == 1) return ad::unbroadcast<shape_t<A>>(where(n.a, g, 0));
  else return ad::unbroadcast<shape_t<B>>(where(n.a, 0, g));
}

}  // namespace gradus
