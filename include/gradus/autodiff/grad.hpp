#pragma once
// grad(loss, v1, v2, ...): gradient expressions derived from the loss's type at compile
// time. No tape exists at run time: the gradients are ordinary expressions, planned and
// fused with the forward pass when run together, sharing its buffers.
//
// How: backprop(v, e, g) walks e's type from the root with the adjoint g of e. A child
// that cannot reach v (a type-level test) contributes nothing (`no_grad`, folded away);
// otherwise the op's rule vjp<I>(e, g) gives the adjoint of child I, and contributions
// from several children are summed. Equal adjoints built on the way to different
// variables have equal types and values, so the planner computes them once: an L-layer
// MLP's backward pass runs 2L-1 GEMMs, not one chain per variable.
#include <tuple>
#include <type_traits>
#include <utility>

#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/expand.hpp"
#include "gradus/graph/ops/matmul.hpp"
#include "gradus/graph/ops/placement.hpp"
#include "gradus/graph/ops/precision_scope.hpp"
#include "gradus/graph/ops/reduce.hpp"
#include "gradus/graph/ops/shape_ops.hpp"

namespace gradus {

/// The adjoint of a node that does not lead to the variable.
struct no_grad {};

/// A gradient as grad() returns it: a zero-cost view of the gradient expression that
/// also marks it, so grad() of something containing a gradient is refused at compile time.
template <class E>
struct gradient_node : expr_base {
  using value_type = value_t<E>;
  using shape_type = shape_t<E>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "gradient";
  using gradient_tag = void;
  E e;
  auto operands() const { return std::tie(e); }
  auto children() const { return std::tie(e); }
  dims infer(const dims& d) const { return d; }
  bool operator==(const gradient_node&) const = default;
};

/// The tuple of references E's children() returns: what autodiff walks below E.
template <class E>
using children_t = decltype(std::declval<const E&>().children());

/// Whether V occurs in E's tree (E itself or below it, through children()): a type-level
/// test, so a subexpression that cannot reach V gets no adjoint at all.
template <class V, class E>
constexpr bool depends_on() {
  if constexpr (std::is_same_v<V, E>) {
    return true;
  } else if constexpr (requires { std::declval<const E&>().children(); }) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (depends_on<V, std::remove_cvref_t<std::tuple_element_t<I, children_t<E>>>>() || ...);
    }(std::make_index_sequence<std::tuple_size_v<children_t<E>>>{});
  } else {
    return false;
  }
}
/// depends_on<V, E>(), as a variable.
template <class V, class E>
inline constexpr bool depends_on_v = depends_on<V, E>();

/// Whether E's tree holds a gradient grad() returned (a node with a `gradient_tag`): grad()
/// of such a loss, a gradient of a gradient, is refused at compile time.
template <class E>
constexpr bool contains_gradient() {
  if constexpr (requires { typename E::gradient_tag; }) {
    return true;
  } else if constexpr (requires { std::declval<const E&>().children(); }) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (contains_gradient<std::remove_cvref_t<std::tuple_element_t<I, children_t<E>>>>() || ...);
    }(std::make_index_sequence<std::tuple_size_v<children_t<E>>>{});
  } else {
    return false;
  }
}

namespace ad {

/// Sums and products that fold no_grad away.
template <class A, class B>
auto add(const A& a, const B& b) {
  if constexpr (std::is_same_v<A, no_grad>) return b;
  else if constexpr (std::is_same_v<B, no_grad>) return a;
  else return a + b;
}
inline no_grad sum_all() { return {}; }
template <class A, class... R>
auto sum_all(const A& a, const R&... r) {
  return add(a, sum_all(r...));
}

/// matrix_transpose with transpose(transpose(x)) -> x folded.
template <class X>
auto mt(const X& x) {
  if constexpr (requires { detail::gemm_operand<X>::trans; } && detail::gemm_operand<X>::trans)
    return detail::gemm_operand<X>::get(x);
  else
    return matrix_transpose(x);
}

/// permute<P...>(x), with a permutation that undoes x's own folded away.
template <class X>
struct permute_parts {
  static constexpr bool is_permute = false;
};
template <class A, std::size_t... Q>
struct permute_parts<permute_node<A, Q...>> {
  static constexpr bool is_permute = true;
  static constexpr std::array<std::size_t, sizeof...(Q)> q{Q...};
};
template <std::size_t... P, class X>
auto permute_folded(const X& x) {
  constexpr bool undoes = [] {
    if constexpr (!permute_parts<X>::is_permute) {
      return false;
    } else {
      constexpr std::array<std::size_t, sizeof...(P)> p{P...};
      for (std::size_t i = 0; i < p.size(); ++i)
        if (permute_parts<X>::q[p[i]] != i) return false;
      return true;
    }
  }();
  if constexpr (undoes) return x.a;
  else return permute<P...>(x);
}

/// Reduce an adjoint g of the broadcast shape down to a child's static shape S: sum the
/// leading axes the child lacks, and (keepdims) the axes where the child has extent 1.
template <class S, std::size_t I, class G>
auto reduce_unit_axes(const G& g) {
  if constexpr (I == S::rank) {
    return g;
  } else if constexpr (S::extents[I] == 1 && shape_t<G>::extents[I] != 1) {
    return reduce_unit_axes<S, I + 1>(gradus::sum<static_cast<int>(I), true>(g));
  } else {
    return reduce_unit_axes<S, I + 1>(g);
  }
}
template <class S, class G>
auto unbroadcast(const G& g) {
  if constexpr (std::is_same_v<G, no_grad>) return g;
  else if constexpr (rank_v<G> > S::rank) return unbroadcast<S>(gradus::sum<0>(g));
  else return reduce_unit_axes<S, 0>(g);
}

}  // namespace ad

/// vjp<I>(node, g): the adjoint of node's child I, given the node's adjoint g. One
/// overload set per op family, in autodiff/rules/.
template <std::size_t I, class E, class G>
auto vjp(const E&, const G&) {
  static_assert(sizeof(E) == 0, "gradus: grad: this op has no derivative rule (op named in the type above)");
  return no_grad{};
}

/// backprop_within<Cut>: with Cut >= 0, the gradient within pipeline stage Cut only — a node
/// placed on another stage (graph/ops/placement.hpp) is a constant there: that stage takes its
/// part of the gradient from the adjoint of its output (a variable read by two stages, tied
/// weights, gets one part from each). backprop is backprop_within<-1>. (No default template
/// argument: nvcc's front end repeats it on the definition, which g++ then refuses.)
template <int Cut, class V, class E, class G>
auto backprop_within(const V& v, const E& e, const G& g);

/// The contribution to d/dv through child I of e, given e's adjoint g: no_grad where that
/// child cannot reach v, else backprop_within of the child with adjoint vjp<I>(e, g).
template <int Cut, std::size_t I, class V, class E, class G>
auto backprop_child(const V& v, const E& e, const G& g) {
  using C = std::remove_cvref_t<std::tuple_element_t<I, children_t<E>>>;
  if constexpr (!depends_on_v<V, C>) return no_grad{};
  else return backprop_within<Cut>(v, std::get<I>(e.children()), vjp<I>(e, g));
}

template <int Cut, class V, class E, class G>
auto backprop_within(const V& v, const E& e, const G& g) {
  if constexpr (std::is_same_v<G, no_grad>) {  // NOLINT(bugprone-branch-clone): ordered tests, V == E must come before !depends_on
    return no_grad{};
  } else if constexpr (std::is_same_v<V, E>) {
    return g;
  } else if constexpr (!depends_on_v<V, E>) {
    return no_grad{};
  } else if constexpr (Cut >= 0 && [] {
                         if constexpr (is_stage_placed_v<E>) return E::placement::index != Cut;
                         else return false;
                       }()) {
    return no_grad{};
  } else if constexpr (is_precision_scope_v<E>) {
    // in_precision<C>(x) (graph/ops/precision_scope.hpp): the adjoints made below it in C, the
    // adjoint flowing in from above in the precision of where it came from
    const auto inner = backprop_within<Cut>(v, e.e, precision_scope_node<outer_precision, G>{{}, g});
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(inner)>, no_grad>) return no_grad{};
    else return precision_scope_node<typename E::compute, std::remove_cvref_t<decltype(inner)>>{{}, inner};
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return ad::sum_all(backprop_child<Cut, I>(v, e, g)...);
    }(std::make_index_sequence<std::tuple_size_v<children_t<E>>>{});
  }
}

/// The adjoint of v in e given e's adjoint g: an expression for d(loss)/dv when g is
/// d(loss)/de, or no_grad where e does not depend on v. grad() calls it with e the loss and
/// g = 1.
template <class V, class E, class G>
auto backprop(const V& v, const E& e, const G& g) {
  return backprop_within<-1>(v, e, g);
}

namespace detail {
template <class V, class G>
auto as_gradient(const V& v, const G& g) {
  if constexpr (std::is_same_v<G, no_grad>) {
    // no path from the loss: zeros of v's shape (never reads v)
    auto z = broadcast_like(scalar<value_t<V>>{{}, value_t<V>(0)}, v);
    return gradient_node<decltype(z)>{{}, z};
  } else {
    return gradient_node<G>{{}, g};
  }
}
}  // namespace detail

/// grad(loss, vs...): d loss / d v for each v (variables or placeholders), as a tuple of
/// expressions (one expression when one v is given). loss must be a scalar (rank 0).
template <expression L, expression... Vs>
auto grad(const L& loss, const Vs&... vs) {
  static_assert(rank_v<L> == 0, "gradus: grad: the loss must be a scalar (rank 0); reduce it with sum or mean");
  static_assert(real_dtype<value_t<L>>, "gradus: grad: the loss must be float or double");
  static_assert(!contains_gradient<L>(),
                "gradus: grad: the loss already contains a gradient; gradients of gradients are not supported");
  static_assert(sizeof...(Vs) > 0, "gradus: grad: name at least one variable or placeholder");
  const scalar<value_t<L>> seed{{}, value_t<L>(1)};
  if constexpr (sizeof...(Vs) == 1)
    return detail::as_gradient(vs..., backprop(vs..., loss, seed));
  else
    return std::tuple{detail::as_gradient(vs, backprop(vs, loss, seed))...};
}

}  // namespace gradus
