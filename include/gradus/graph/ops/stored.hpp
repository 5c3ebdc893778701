#pragma once
// stored(e): e's value as it lies in its buffer — a view, never a recomputation. A fused
// pass recomputes the elementwise subexpressions it reads; wrapped in stored(), e is
// materialised instead (once: a node equal to it, e.g. a reduction's operand, shares its
// buffer) and read from there. Derivative rules that compare an operand with a stored
// result (max, min) use it, so they see the very bits the forward kernel saw.
#include <tuple>

#include "gradus/graph/node.hpp"

namespace gradus {

template <class A>
struct stored_node : expr_base {
  using value_type = value_t<A>;
  using shape_type = shape_t<A>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "stored";
  A a;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tie(a); }
  dims infer(const dims& in) const { return in; }
  bool operator==(const stored_node&) const = default;
};

/// stored(a): a's value as it lies in a buffer, the same dtype and shape: a itself where a
/// has a buffer already (a leaf, kernel or view), else a view of a materialised once.
/// Gradient: g passes through unchanged.
template <expression A>
auto stored(const A& a) {
  if constexpr (has_storage_v<A>) return a;  // a leaf, kernel or view is read from its buffer already
  else return stored_node<A>{{}, a};
}

}  // namespace gradus
