#pragma once
// What every node of an expression is. An expression's type is its computation graph:
// nodes hold their operands by value (an expression can never dangle), and a node's
// kind tells the planner how to evaluate it:
//   placeholder / variable / constant  leaves with storage (fed, owned by a session, or held)
//   scalar                             a value broadcast everywhere, folded into fused passes
//   elementwise                        fused into its consumer's single pass
//   kernel                             materialised into a buffer (matmul, reductions, ...)
//   view                               a buffer seen with other dims (reshape), no copy
//   shape_scalar                       a number derived from a buffer's dims (e.g. 1/n)
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "gradus/core/dtype.hpp"
#include "gradus/core/shape.hpp"

namespace gradus {

/// How the planner evaluates a node (a node's `kind`, read with kind_v): leaves with storage
/// (placeholder, variable, constant), a scalar folded into fused passes, an elementwise node
/// fused into its consumer's pass, a kernel materialised into a buffer (matmul, reductions,
/// ...), a view of a buffer with other dims (no copy), or a shape_scalar derived from a
/// buffer's dims (such as 1/n).
enum class node_kind { placeholder, variable, constant, scalar, elementwise, kernel, view, shape_scalar };

/// Tag: every node derives from it, so operators find expressions only.
struct expr_base {
  /// Always equal: the base adds nothing to a node's defaulted ==, which compares the
  /// node's operands and parameters (structural equality of expressions).
  constexpr bool operator==(const expr_base&) const { return true; }
};

/// A node of an expression: derives from expr_base and names its dtype (`value_type`) and
/// its static shape (`shape_type`, a shape).
template <class E>
concept expression = std::is_base_of_v<expr_base, std::remove_cvref_t<E>> && requires {
  typename std::remove_cvref_t<E>::value_type;
  typename std::remove_cvref_t<E>::shape_type;
};

/// E's dtype (float, double or int32).
template <class E>
using value_t = typename std::remove_cvref_t<E>::value_type;
/// E's static shape (a shape; `dyn` where an extent is bound at run time).
template <class E>
using shape_t = typename std::remove_cvref_t<E>::shape_type;
/// E's rank.
template <class E>
inline constexpr std::size_t rank_v = shape_t<E>::rank;
/// How the planner evaluates E (its node_kind).
template <class E>
inline constexpr node_kind kind_v = std::remove_cvref_t<E>::kind;

/// Nodes whose value lives in a buffer the planner gives them (or that they bring).
template <class E>
inline constexpr bool has_storage_v =
    kind_v<E> != node_kind::scalar && kind_v<E> != node_kind::elementwise && kind_v<E> != node_kind::shape_scalar;

/// Static shape checks. `check_shapes<Op, SA, SB>` fails with Op and both shapes in the
/// first line of the compiler's diagnostic (g++: "In instantiation of ..."; clang++:
/// "static_assert failed due to requirement 'op::fits<shape<..>, shape<..>>'").
template <class Op, class SA, class SB>
struct check_shapes {
  static_assert(Op::template fits<SA, SB>,
                "gradus: the static shapes of this op's operands do not fit (op and shapes above)");
  static constexpr bool value = true;  ///< true once the check passed: static_assert(check_shapes<...>::value) runs it
};

/// Static dtype check: `check_dtypes<Op, A, B>` fails unless dtypes A and B are the same
/// (gradus converts no operand implicitly), with Op and both dtypes in the first line of the
/// compiler's diagnostic.
template <class Op, class A, class B>
struct check_dtypes {
  static_assert(std::is_same_v<A, B>,
                "gradus: operands of this op have different dtypes (op and dtypes above); cast one first");
  static constexpr bool value = true;  ///< true once the check passed: static_assert(check_dtypes<...>::value) runs it
};

}  // namespace gradus
