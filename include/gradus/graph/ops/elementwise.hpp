#pragma once
// Elementwise ops: one node type per arity (unary/binary/ternary) over a functor, as in
// xtensor's xfunction. A functor has one generic call operator that works on a scalar
// and on a SIMD batch alike (math functions are called unqualified so a batch type's own
// overloads are found by ADL), which keeps this header free of any SIMD library.
#include <cmath>
#include <type_traits>

#include "gradus/core/device.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

namespace fn {

/// select for scalars; SIMD batches bring their own (found by ADL).
template <class T>
GRADUS_HD constexpr T select(bool c, T a, T b) {
  return c ? a : b;
}

/// A SIMD batch of doubles (xsimd::batch<double, A>): xsimd 8.1's exp, expm1 and tanh of those
/// convert x*log2(e) to int64 through a scalar cast, undefined behaviour (UBSan,
/// tests/graph/test_elementwise_limits.cpp) where it is out of range; batches of floats convert
/// with one instruction, and scalars go to std::exp.
template <class X>
concept double_batch = !std::is_arithmetic_v<X> && requires {
  typename X::value_type;
  requires std::is_same_v<typename X::value_type, double>;
};

/// x limited to [lo, hi] where X is a double_batch (NaN passed through: both comparisons are
/// false for it), else x itself: what those functions are given, so that they convert nothing
/// out of range. Only where needed: the two selects cost 6% of an exp pass over doubles in
/// cache, and would cost 11-17% over floats.
template <class X>
GRADUS_HD X in_range_for_simd(const X& x, X lo, X hi) {
  if constexpr (double_batch<X>) return select(x < lo, lo, select(x > hi, hi, x));
  else return x;
}

/// e^x: its argument limited to where e^x saturates (e^-746 is 0, e^710 is +inf), so the same
/// value bit for bit.
template <class X>
GRADUS_HD X saturating_exp(const X& x) {
  using std::exp;
  return exp(in_range_for_simd(x, X(-746), X(710)));
}

/// tanh(x) the same way: beyond |x| = 350 it is +-1 exactly (xsimd's e^2x there is finite and
/// 2/(e^2x + 1) below half an ulp of 1).
template <class X>
GRADUS_HD X saturating_tanh(const X& x) {
  using std::tanh;
  return tanh(in_range_for_simd(x, X(-350), X(350)));
}

/// Defines the functor struct NAME: EXPR of one argument x (a scalar or a SIMD batch);
/// LABEL is its op name in errors, traces and graph drawings. Undefined after its uses.
#define GRADUS_UNARY_FN(NAME, LABEL, EXPR)               \
  struct NAME {                                          \
    static constexpr const char* name = LABEL;           \
    template <class X>                                   \
    GRADUS_HD X operator()(const X& x) const {                     \
      using std::exp, std::log, std::log1p, std::sqrt, std::abs, std::tanh, std::max, std::expm1; \
      return EXPR;                                       \
    }                                                    \
    bool operator==(const NAME&) const = default;        \
  };

GRADUS_UNARY_FN(neg, "neg", -x)
GRADUS_UNARY_FN(exp_fn, "exp", saturating_exp(x))
GRADUS_UNARY_FN(log_fn, "log", log(x))
GRADUS_UNARY_FN(log1p_fn, "log1p", log1p(x))
GRADUS_UNARY_FN(sqrt_fn, "sqrt", sqrt(x))
GRADUS_UNARY_FN(rsqrt_fn, "rsqrt", X(1) / sqrt(x))
GRADUS_UNARY_FN(abs_fn, "abs", abs(x))
GRADUS_UNARY_FN(square_fn, "square", x* x)
GRADUS_UNARY_FN(tanh_fn, "tanh", saturating_tanh(x))
/// 1/(1+e^-x): for x -> -inf e^-x -> inf and the result -> 0, never NaN.
GRADUS_UNARY_FN(sigmoid_fn, "sigmoid", X(1) / (X(1) + saturating_exp(-x)))
GRADUS_UNARY_FN(relu_fn, "relu", max(x, X(0)))
/// softplus(x) = max(x,0) + log1p(e^-|x|): no overflow for large |x|.
GRADUS_UNARY_FN(softplus_fn, "softplus", max(x, X(0)) + log1p(saturating_exp(-abs(x))))
#undef GRADUS_UNARY_FN

template <class T>
struct leaky_relu_fn {
  static constexpr const char* name = "leaky_relu";
  T alpha;
  template <class X>
  GRADUS_HD X operator()(const X& x) const {
    return select(x > X(0), x, X(alpha) * x);
  }
  bool operator==(const leaky_relu_fn&) const = default;
};

template <class T>
struct elu_fn {
  static constexpr const char* name = "elu";
  T alpha;
  template <class X>
  GRADUS_HD X operator()(const X& x) const {
    using std::expm1, std::min;
    // expm1 of min(x,0): the unused branch stays finite; below -746 it is -1 already
    // (in_range_for_simd)
    return select(x > X(0), x, X(alpha) * expm1(in_range_for_simd(min(x, X(0)), X(-746), X(0))));
  }
  bool operator==(const elu_fn&) const = default;
};

template <class T>
struct clamp_fn {
  static constexpr const char* name = "clamp";
  T lo, hi;
  template <class X>
  GRADUS_HD X operator()(const X& x) const {
    using std::max, std::min;
    return min(max(x, X(lo)), X(hi));
  }
  bool operator==(const clamp_fn&) const = default;
};

/// Defines the functor struct NAME: EXPR of two arguments a and b, as GRADUS_UNARY_FN does.
#define GRADUS_BINARY_FN(NAME, LABEL, EXPR)              \
  struct NAME {                                          \
    static constexpr const char* name = LABEL;           \
    template <class X>                                   \
    GRADUS_HD X operator()(const X& a, const X& b) const {         \
      using std::max, std::min, std::pow;                \
      return EXPR;                                       \
    }                                                    \
    bool operator==(const NAME&) const = default;        \
  };

GRADUS_BINARY_FN(add, "add", a + b)
GRADUS_BINARY_FN(sub, "sub", a - b)
GRADUS_BINARY_FN(mul, "mul", a* b)
GRADUS_BINARY_FN(div, "div", a / b)
GRADUS_BINARY_FN(maximum, "maximum", max(a, b))
GRADUS_BINARY_FN(minimum, "minimum", min(a, b))
GRADUS_BINARY_FN(pow_fn, "pow", pow(a, b))
/// Comparisons give 1 or 0 in the operands' dtype, so a mask multiplies like any value.
GRADUS_BINARY_FN(less, "less", select(a < b, X(1), X(0)))
GRADUS_BINARY_FN(less_equal, "less_equal", select(a <= b, X(1), X(0)))
GRADUS_BINARY_FN(greater, "greater", select(a > b, X(1), X(0)))
GRADUS_BINARY_FN(greater_equal, "greater_equal", select(a >= b, X(1), X(0)))
GRADUS_BINARY_FN(equal, "equal", select(a == b, X(1), X(0)))
GRADUS_BINARY_FN(not_equal, "not_equal", select(a != b, X(1), X(0)))
#undef GRADUS_BINARY_FN

struct where_fn {
  static constexpr const char* name = "where";
  template <class X>
  GRADUS_HD X operator()(const X& c, const X& a, const X& b) const {
    return select(c != X(0), a, b);
  }
  bool operator==(const where_fn&) const = default;
};

}  // namespace fn

/// Shape rule of every elementwise op: NumPy broadcasting on trailing dimensions.
template <class F>
struct broadcast_op {
  static constexpr const char* name = F::name;  ///< the op's name, which a shape error shows
  /// Whether static shapes SA and SB broadcast (broadcast_result).
  template <class SA, class SB>
  static constexpr bool fits = broadcast_result<SA, SB>::ok;
  /// The dimensions that do not broadcast, counted from the front of each operand.
  template <class SA, class SB>
  using where = shape_mismatch::dimension_of_a_vs_b<
      static_cast<int>(SA::rank) - 1 - static_cast<int>(broadcast_result<SA, SB>::first_mismatch),
      static_cast<int>(SB::rank) - 1 - static_cast<int>(broadcast_result<SA, SB>::first_mismatch)>;
};

/// F applied to each element of a (what exp(), relu(), map<F>() ... build): a's dtype and
/// shape, evaluated inside its consumer's fused pass, never in a buffer of its own.
template <class F, class A>
struct unary : expr_base {
  using value_type = value_t<A>;                             ///< a's dtype
  using shape_type = shape_t<A>;                             ///< a's shape
  static constexpr node_kind kind = node_kind::elementwise;  ///< fused into its consumer's pass
  static constexpr const char* op_name = F::name;            ///< F's name, for errors, traces and graph drawings
  F f;                                                       ///< the functor, with its parameters (leaky_relu's alpha, ...)
  A a;                                                       ///< the operand
  /// The operand, as autodiff and the planner walk it.
  auto children() const { return std::tie(a); }
  /// Structural: equal functors and operands.
  bool operator==(const unary&) const = default;
};

/// F of a and b elementwise (what +, *, maximum(), less() ... build), broadcast as NumPy
/// does on trailing dimensions. Both operands have one dtype, and their static shapes must
/// broadcast: each is a compile error naming the op otherwise. a's dtype, the broadcast
/// shape; fused into its consumer's pass.
template <class F, class A, class B>
struct binary : expr_base {
  static_assert(check_dtypes<broadcast_op<F>, value_t<A>, value_t<B>>::value);
  static_assert(check_shapes<broadcast_op<F>, shape_t<A>, shape_t<B>>::value);
  using value_type = value_t<A>;                                 ///< the operands' dtype
  using shape_type = broadcast_shape_t<shape_t<A>, shape_t<B>>;  ///< the broadcast of their shapes
  static constexpr node_kind kind = node_kind::elementwise;      ///< fused into its consumer's pass
  static constexpr const char* op_name = F::name;                ///< F's name, for errors, traces and graph drawings
  F f;                                                           ///< the functor
  A a;                                                           ///< the left operand
  B b;                                                           ///< the right operand
  /// Both operands, as autodiff and the planner walk them.
  auto children() const { return std::tie(a, b); }
  /// Structural: equal functors and operands.
  bool operator==(const binary&) const = default;
};

/// F of three operands elementwise, all broadcast together; where(cond, a, b) is the one
/// such op (its node's a is the condition, b and c the values). One dtype for all three,
/// checked at compile time as binary's.
template <class F, class A, class B, class C>
struct ternary : expr_base {
  static_assert(check_dtypes<broadcast_op<F>, value_t<A>, value_t<B>>::value);
  static_assert(check_dtypes<broadcast_op<F>, value_t<B>, value_t<C>>::value);
  static_assert(check_shapes<broadcast_op<F>, shape_t<A>, shape_t<B>>::value);
  static_assert(check_shapes<broadcast_op<F>, broadcast_shape_t<shape_t<A>, shape_t<B>>, shape_t<C>>::value);
  using value_type = value_t<B>;  ///< the operands' dtype
  using shape_type = broadcast_shape_t<broadcast_shape_t<shape_t<A>, shape_t<B>>, shape_t<C>>;  ///< the broadcast of the three shapes
  static constexpr node_kind kind = node_kind::elementwise;  ///< fused into its consumer's pass
  static constexpr const char* op_name = F::name;            ///< F's name, for errors, traces and graph drawings
  F f;                                                       ///< the functor
  A a;                                                       ///< the first operand (where's condition)
  B b;                                                       ///< the second (where's value where the condition is not 0)
  C c;                                                       ///< the third (where's value elsewhere)
  /// The three operands, as autodiff and the planner walk them.
  auto children() const { return std::tie(a, b, c); }
  /// Structural: equal functors and operands.
  bool operator==(const ternary&) const = default;
};

// ---- builders --------------------------------------------------------------------------

/// A plain C++ number: next to an expression it becomes a scalar of the expression's dtype.
template <class X>
concept scalar_like = std::is_arithmetic_v<std::remove_cvref_t<X>>;

/// What the elementwise builders take: an expression or a plain number (at least one of
/// the operands must be an expression).
template <class X>
concept operand = expression<X> || scalar_like<X>;

namespace detail {
/// A plain number next to an expression becomes a scalar leaf of the expression's dtype.
template <class T, class X>
auto as_expr(const X& x) {
  if constexpr (expression<X>) return x;
  else return scalar<T>{{}, static_cast<T>(x)};
}
/// The dtype of the first expression among the operands (plain numbers adopt it).
template <class A, class... R>
struct first_dtype {
  using type = typename first_dtype<R...>::type;
};
template <class A, class... R>
  requires expression<A>
struct first_dtype<A, R...> {
  using type = value_t<A>;
};
template <class A, class B>
using common_dtype_t = typename first_dtype<A, B>::type;
template <class F, class A, class B>
auto make_binary(const A& a, const B& b, F f = {}) {
  using T = common_dtype_t<A, B>;
  auto ea = as_expr<T>(a);
  auto eb = as_expr<T>(b);
  return binary<F, decltype(ea), decltype(eb)>{{}, f, ea, eb};
}
}  // namespace detail

/// f applied to each element of a: a unary node of a's dtype and shape. F is a functor with
/// one generic call operator (a scalar or a SIMD batch in, the same out) and a static
/// `name`, as those in gradus::fn. Gradient: grad() needs a vjp overload for unary<F, A>; a
/// new F has none, and grad() of it does not compile.
template <class F, expression A>
auto map(const A& a, F f = {}) {
  return unary<F, A>{{}, f, a};
}

/// Defines the builder NAME(a) = map<fn::FN>(a): the elementwise neg, exp, log, log1p, sqrt,
/// rsqrt, abs, square, tanh, sigmoid, relu and softplus below (each with a's dtype and shape;
/// its formula and gradient are beside it). Undefined after its uses.
#define GRADUS_UNARY_BUILDER(NAME, FN) \
  template <expression A>               \
  auto NAME(const A& a) {               \
    return map<fn::FN>(a);              \
  }
// Each builder below is elementwise: its result has a's dtype and shape.
// neg(a), also -a: the negation. Gradient: -g.
GRADUS_UNARY_BUILDER(neg, neg)
// exp(a): e^a. Gradient: g e^a.
GRADUS_UNARY_BUILDER(exp, exp_fn)
// log(a): the natural logarithm (-inf at 0, NaN below). Gradient: g / a.
GRADUS_UNARY_BUILDER(log, log_fn)
// log1p(a): ln(1 + a), accurate for small a. Gradient: g / (1 + a).
GRADUS_UNARY_BUILDER(log1p, log1p_fn)
// sqrt(a): the square root. Gradient: g / (2 sqrt(a)).
GRADUS_UNARY_BUILDER(sqrt, sqrt_fn)
// rsqrt(a): 1 / sqrt(a). Gradient: -g rsqrt(a) / (2 a).
GRADUS_UNARY_BUILDER(rsqrt, rsqrt_fn)
// abs(a): |a|. Gradient: g sign(a), 0 at a = 0.
GRADUS_UNARY_BUILDER(abs, abs_fn)
// square(a): a a. Gradient: 2 a g.
GRADUS_UNARY_BUILDER(square, square_fn)
// tanh(a): the hyperbolic tangent. Gradient: g (1 - tanh(a)^2).
GRADUS_UNARY_BUILDER(tanh, tanh_fn)
// sigmoid(a): 1 / (1 + e^-a), never NaN for large |a|. Gradient: g s (1 - s), s = sigmoid(a).
GRADUS_UNARY_BUILDER(sigmoid, sigmoid_fn)
// relu(a): max(a, 0). Gradient: g where a > 0, else 0.
GRADUS_UNARY_BUILDER(relu, relu_fn)
// softplus(a): ln(1 + e^a), as max(a, 0) + log1p(e^-|a|) (no overflow). Gradient: g sigmoid(a).
GRADUS_UNARY_BUILDER(softplus, softplus_fn)
#undef GRADUS_UNARY_BUILDER

/// leaky_relu(a, alpha): a where a > 0, else alpha a (alpha converted to a's dtype); a's
/// dtype and shape. Gradient: g where a > 0, else alpha g.
template <expression A>
auto leaky_relu(const A& a, double alpha = 0.01) {
  return map(a, fn::leaky_relu_fn<value_t<A>>{static_cast<value_t<A>>(alpha)});
}
/// elu(a, alpha): a where a > 0, else alpha (e^a - 1); a's dtype and shape. Gradient: g
/// where a > 0, else g (elu(a) + alpha).
template <expression A>
auto elu(const A& a, double alpha = 1.0) {
  return map(a, fn::elu_fn<value_t<A>>{static_cast<value_t<A>>(alpha)});
}
/// clamp(a, lo, hi): min(max(a, lo), hi) elementwise; a's dtype and shape. Gradient: g
/// where lo <= a <= hi, else 0.
template <expression A>
auto clamp(const A& a, double lo, double hi) {
  return map(a, fn::clamp_fn<value_t<A>>{static_cast<value_t<A>>(lo), static_cast<value_t<A>>(hi)});
}

/// a + b elementwise. The shapes broadcast as NumPy's (trailing dimensions aligned, an
/// extent of 1 stretched), which the result has; both expressions have one dtype, and a
/// plain number takes the expression's. Gradient: g to each operand, summed over the axes
/// it was broadcast along (as for every binary op's gradient below).
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto operator+(const A& a, const B& b) { return detail::make_binary<fn::add>(a, b); }
/// a - b elementwise, broadcast as a + b. Gradient: g to a, -g to b.
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto operator-(const A& a, const B& b) { return detail::make_binary<fn::sub>(a, b); }
/// a * b elementwise, broadcast as a + b. Gradient: g b to a, g a to b.
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto operator*(const A& a, const B& b) { return detail::make_binary<fn::mul>(a, b); }
/// a / b elementwise, broadcast as a + b. Gradient: g / b to a, -g a / b^2 to b.
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto operator/(const A& a, const B& b) { return detail::make_binary<fn::div>(a, b); }
/// -a: neg(a).
template <expression A>
auto operator-(const A& a) { return neg(a); }

/// The larger of a and b elementwise, broadcast as a + b. Gradient: g to the larger operand;
/// at a tie each gets g / 2 (as PyTorch).
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto maximum(const A& a, const B& b) { return detail::make_binary<fn::maximum>(a, b); }
/// The smaller of a and b elementwise, broadcast as a + b. Gradient: g to the smaller
/// operand; at a tie each gets g / 2.
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto minimum(const A& a, const B& b) { return detail::make_binary<fn::minimum>(a, b); }
/// a to the power b elementwise, broadcast as a + b. Gradient: g b a^(b-1) to a, g ln(a) a^b
/// to b (NaN where a <= 0).
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto pow(const A& a, const B& b) { return detail::make_binary<fn::pow_fn>(a, b); }

/// Defines the comparison NAME(a, b) and its operator OP: less (<), less_equal (<=), greater
/// (>) and greater_equal (>=) below, each 1 where it holds and 0 elsewhere, in the operands'
/// dtype, broadcast as a + b, with no gradient. Undefined after its uses.
#define GRADUS_COMPARISON(NAME, FN, OP)                                              \
  template <operand A, operand B>                                                     \
    requires(expression<A> || expression<B>)                                          \
  auto NAME(const A& a, const B& b) { return detail::make_binary<fn::FN>(a, b); }     \
  template <operand A, operand B>                                                     \
    requires(expression<A> || expression<B>)                                          \
  auto operator OP(const A& a, const B& b) { return detail::make_binary<fn::FN>(a, b); }
// Each comparison gives 1 where it holds and 0 elsewhere, in the operands' dtype (a mask
// that multiplies like any value), broadcast as a + b. No gradient flows through it.
// less(a, b), also a < b.
GRADUS_COMPARISON(less, less, <)
// less_equal(a, b), also a <= b.
GRADUS_COMPARISON(less_equal, less_equal, <=)
// greater(a, b), also a > b.
GRADUS_COMPARISON(greater, greater, >)
// greater_equal(a, b), also a >= b.
GRADUS_COMPARISON(greater_equal, greater_equal, >=)
#undef GRADUS_COMPARISON
/// 1 where a == b, else 0, in the operands' dtype, broadcast as a + b; no gradient flows
/// through it. (== and != stay the structural equality of expressions; these are the
/// elementwise ones.)
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto equal(const A& a, const B& b) { return detail::make_binary<fn::equal>(a, b); }
/// 1 where a != b, else 0, as equal().
template <operand A, operand B>
  requires(expression<A> || expression<B>)
auto not_equal(const A& a, const B& b) { return detail::make_binary<fn::not_equal>(a, b); }

/// where(cond, a, b): a where cond != 0, else b (cond is a mask of 1/0, e.g. a comparison).
/// The three broadcast together; one dtype, which plain numbers take. Gradient: g to a where
/// cond != 0 and to b elsewhere (0 in the other's place), each summed over its broadcast
/// axes; none to cond.
template <operand C, operand A, operand B>
  requires(expression<C> || expression<A> || expression<B>)
auto where(const C& c, const A& a, const B& b) {
  using T = typename detail::first_dtype<A, B, C>::type;
  auto ec = detail::as_expr<T>(c);
  auto ea = detail::as_expr<T>(a);
  auto eb = detail::as_expr<T>(b);
  return ternary<fn::where_fn, decltype(ec), decltype(ea), decltype(eb)>{{}, {}, ec, ea, eb};
}

}  // namespace gradus
