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

enum class node_kind { placeholder, variable, constant, scalar, elementwise, kernel, view, shape_scalar };

/// Tag: every node derives from it, so operators find expressions only.
struct expr_base {
  constexpr bool operator==(const expr_base&) const { return true; }
};

template <class E>
concept expression = std::is_base_of_v<expr_base, std::remove_cvref_t<E>> && requires {
  typename std::remove_cvref_t<E>::value_type;
  typename std::remove_cvref_t<E>::shape_type;
};

template <class E>
using value_t = typename std::remove_cvref_t<E>::value_type;
template <class E>
using shape_t = typename std::remove_cvref_t<E>::shape_type;
template <class E>
inline constexpr std::size_t rank_v = shape_t<E>::rank;
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
  static constexpr bool value = true;
};

template <class Op, class A, class B>
struct check_dtypes {
  static_assert(std::is_same_v<A, B>,
                "gradus: operands of this op have different dtypes (op and dtypes above); cast one first");
  static constexpr bool value = true;
};

}  // namespace gradus
