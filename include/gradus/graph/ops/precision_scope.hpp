#pragma once
// Per-subexpression precision: in_precision<C>(e) runs the compute-precision ops of e (matmul,
// the convolutions, the RNN cells: core/precision.hpp's rule), and the GEMMs of their
// gradients, in C (float, g::bf16 or g::f16) whatever the session's policy:
//
//   g::session<g::cpu_simd, g::mixed_bf16> s;
//   const auto logits = g::in_precision<float>(g::matmul(h, w_out));   // the last layer in fp32
//
// The node is an identity (a view of e's buffer); what it changes is the kernels the planner
// picks under it (exec/graph_engine.hpp keeps a stack of the scopes it is inside, and a node
// planned under two different scopes is two steps). Its gradient: backprop wraps the adjoints
// made inside e in the same scope, with the adjoint that flows in from above marked
// precision_scope_node<outer_precision, G>: that part keeps the precision of where it came from.
// Ops kept in fp32 stay fp32 under any scope, and a scope of f16 needs a session whose policy
// scales the loss (session::run and minimize refuse it otherwise, as g::precision<g::f16>
// without a scaler does not compile), and a loss cannot be put in a low-precision scope.
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gradus/core/half.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

/// The scope marker of an adjoint flowing into a scope from outside it: the precision of the
/// scope around the precision_scope_node it entered (exec/graph_engine.hpp pops one scope).
struct outer_precision {};

template <class C, class E>
struct precision_scope_node : expr_base {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, bf16> || std::is_same_v<C, f16> ||
                    std::is_same_v<C, outer_precision>,
                "gradus: in_precision<C>(e): C is float, g::bf16 or g::f16");
  using value_type = value_t<E>;
  using shape_type = shape_t<E>;
  using compute = C;  ///< what e's compute-precision ops run in
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "in_precision";
  E e;
  auto operands() const { return std::tie(e); }
  auto children() const { return std::tie(e); }
  dims infer(const dims& d) const { return d; }
  bool operator==(const precision_scope_node&) const = default;
};

/// Whether N is a precision_scope_node (what in_precision returns).
template <class N>
inline constexpr bool is_precision_scope_v = false;
/// (precision_scope_node<C, E>: true)
template <class C, class E>
inline constexpr bool is_precision_scope_v<precision_scope_node<C, E>> = true;

/// Whether N is a scope of bf16 or f16 (a loss cannot be one: train/train_step.hpp).
template <class N>
inline constexpr bool is_low_precision_scope_v = false;
/// (precision_scope_node<C, E>: C is bf16 or f16)
template <class C, class E>
inline constexpr bool is_low_precision_scope_v<precision_scope_node<C, E>> = std::is_same_v<C, bf16> || std::is_same_v<C, f16>;

/// Whether E's tree holds a scope of fp16 (in_precision<g::f16>): a session whose policy
/// does not scale the loss refuses to run it (exec/session.hpp, train/train_step.hpp).
template <class E>
constexpr bool has_f16_scope() {
  if constexpr (requires { typename E::compute; } && is_precision_scope_v<E>) {
    if constexpr (std::is_same_v<typename E::compute, f16>) return true;
  }
  if constexpr (requires { std::declval<const E&>().children(); }) {
    using C = decltype(std::declval<const E&>().children());
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (has_f16_scope<std::remove_cvref_t<std::tuple_element_t<I, C>>>() || ...);
    }(std::make_index_sequence<std::tuple_size_v<C>>{});
  } else {
    return false;
  }
}

/// in_precision<C>(e): e with its matmuls, convolutions and RNN cells (and their gradients'
/// GEMMs) in C: float, g::bf16 or g::f16 (the top of this file). The same value, dtype and
/// shape as e, within C's rounding.
template <class C, expression E>
auto in_precision(const E& e) {
  static_assert(std::is_same_v<C, float> || std::is_same_v<C, bf16> || std::is_same_v<C, f16>,
                "gradus: in_precision<C>(e): C is float, g::bf16 or g::f16");
  static_assert(std::is_same_v<value_t<E>, float>,
                "gradus: in_precision<C>(e): a precision applies to float expressions (e's dtype is above)");
  return precision_scope_node<C, std::remove_cvref_t<E>>{{}, e};
}

}  // namespace gradus
