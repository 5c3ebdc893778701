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
#include "gradus/core/precision.hpp"
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

/// How a static shape mismatch reads in the compiler's diagnostic: the first lines name
/// `gradus::shape_mismatch::in<Op, a<...>, b<...>, dimension_of_a_vs_b<i, j>, false>` — the op,
/// both operands' shapes with a run-time extent spelled `dyn`, and the dimension of each
/// operand that disagrees (where the op names one: elementwise broadcasting, matmul).
namespace shape_mismatch {
/// The type the diagnostic shows a run-time extent in: its one named value, `dyn`.
enum extent : index_t { dyn = -1 };  ///< an extent bound at run time, as the diagnostic spells it
/// The first operand's static shape.
template <auto... E>
struct a {};
/// The second operand's static shape.
template <auto... E>
struct b {};
/// Dimension `A` of the first operand against dimension `B` of the second.
template <int A, int B>
struct dimension_of_a_vs_b {};
/// The op does not name a dimension (its rule is not a per-dimension one: see its header).
struct dimensions_not_named {};
/// An extent as shown: `dyn` by name, else its value (an `int`: no `L` suffix in clang's text).
template <index_t E>
inline constexpr auto shown = [] {
  if constexpr (E == -1) return dyn;
  else if constexpr (E >= -2147483647 && E <= 2147483647) return static_cast<int>(E);
  else return E;
}();
/// An operand description that is not one shape (an RNN's weights): shown as it is.
template <class S, template <auto...> class As>
struct show {
  using type = S;  ///< the description itself
};
/// `show<shape<E...>, a>::type`: a static shape as the diagnostic prints it as `As<shown<E>...>`.
template <index_t... E, template <auto...> class As>
struct show<shape<E...>, As> {
  using type = As<shown<E>...>;  ///< the shape as shown
};
/// Whether the op names the dimensions that disagree (`Op::where<SA, SB>`).
template <class Op, class SA, class SB>
concept names_dimensions = requires { typename Op::template where<SA, SB>; };
/// The dimensions the op names for shapes SA and SB (`Op::where`), else dimensions_not_named.
template <class Op, class SA, class SB>
struct where {
  using type = dimensions_not_named;  ///< the op names none
};
/// An op that names the dimensions: its `where<SA, SB>`.
template <class Op, class SA, class SB>
  requires names_dimensions<Op, SA, SB>
struct where<Op, SA, SB> {
  using type = typename Op::template where<SA, SB>;  ///< the op's dimension_of_a_vs_b
};
/// Fails to instantiate when the shapes do not fit: its own name is the diagnostic.
template <class Op, class A, class B, class Where, bool Fit>
struct in {
  static_assert(Fit, "gradus: the static shapes of this op's operands do not fit: the op, both shapes (dyn: an "
                     "extent bound at run time) and dimension_of_a_vs_b<i, j> (a's dimension i against b's "
                     "dimension j) are in the gradus::shape_mismatch::in<...> this error instantiates");
  static constexpr bool value = true;  ///< true: the shapes fit
};
}  // namespace shape_mismatch

/// Static shape checks: `check_shapes<Op, SA, SB>::value`, true, or a compile error whose first
/// line is shape_mismatch::in<...>'s (above).
template <class Op, class SA, class SB>
struct check_shapes {
  /// true once the check passed: static_assert(check_shapes<...>::value) runs it
  static constexpr bool value =
      shape_mismatch::in<Op, typename shape_mismatch::show<SA, shape_mismatch::a>::type,
                      typename shape_mismatch::show<SB, shape_mismatch::b>::type,
                      typename shape_mismatch::where<Op, SA, SB>::type, Op::template fits<SA, SB>>::value;
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
