#pragma once
// Broadcast helpers that the backward pass is made of: expand_dims (a view inserting an
// axis of extent 1), broadcast_like (a value spread over another expression's shape, in
// the fused pass), and inv_count (1/n for a reduction's n, read from a buffer's dims at
// run time, so `mean` over a `dyn` axis differentiates without a static count).
#include <tuple>

#include "gradus/core/device.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/reduce.hpp"

namespace gradus {

namespace detail {
template <class S, std::size_t Axis>
struct inserted_extents {
  static constexpr std::array<index_t, S::rank + 1> value = [] {
    std::array<index_t, S::rank + 1> r{};
    for (std::size_t i = 0, j = 0; i <= S::rank; ++i) r[i] = i == Axis ? 1 : S::extents[j++];
    return r;
  }();
};
}  // namespace detail

template <std::size_t Axis, class A>
struct expand_dims_node : expr_base {
  static_assert(Axis <= rank_v<A>, "gradus: expand_dims: axis above the operand's rank");
  using value_type = value_t<A>;
  using shape_type = shape_of_array<detail::inserted_extents<shape_t<A>, Axis>>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "expand_dims";
  A a;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tie(a); }
  dims infer(const dims& in) const {
    dims r;
    r.rank = in.rank + 1;
    for (std::size_t i = 0, j = 0; i < r.rank; ++i) r.d[i] = i == Axis ? 1 : in.d[j++];
    return r;
  }
  bool operator==(const expand_dims_node&) const = default;
};

/// expand_dims<Axis>(a): a with a new axis of extent 1 at Axis (0 to a's rank; a view, no
/// copy). Gradient: g reshaped back to a's dims.
template <std::size_t Axis, expression A>
auto expand_dims(const A& a) {
  return expand_dims_node<Axis, A>{{}, a};
}

/// reshape_like(g, a): g's elements with a's run-time dims (no copy); a lends its dims.
template <class G, class A>
struct reshape_like_node : expr_base {
  using value_type = value_t<G>;
  using shape_type = shape_t<A>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "reshape_like";
  G g;
  A a;
  auto operands() const { return std::tie(g, a); }
  auto children() const { return std::tie(g); }
  dims infer(const dims& gd, const dims& ad) const {
    if (gd.numel() != ad.numel())
      throw shape_error("gradus: reshape_like: cannot view " + to_string(gd) + " as " + to_string(ad));
    return ad;
  }
  bool operator==(const reshape_like_node&) const = default;
};
/// reshape_like(g, a): g's elements seen with a's dims (a view, no copy): a's static shape,
/// g's dtype; a lends its dims only. A shape_error at run time where the element counts
/// differ. Built by derivative rules; it has none of its own.
template <expression G, expression A>
auto reshape_like(const G& g, const A& a) {
  return reshape_like_node<G, A>{{}, g, a};
}

namespace fn {
struct left {
  static constexpr const char* name = "broadcast_like";
  template <class X>
  GRADUS_HD X operator()(const X& a, const X&) const {
    return a;
  }
  bool operator==(const left&) const = default;
};
}  // namespace fn

/// broadcast_like(g, a): g's values over the broadcast of g's and a's shapes. The fused
/// pass never loads a's elements (the functor ignores them); a only lends its shape.
/// Gradient: g summed back over the axes it was broadcast along; none to a.
template <expression G, expression A>
auto broadcast_like(const G& g, const A& a) {
  return binary<fn::left, G, A>{{}, {}, g, a};
}

/// 1/n, n the count a reduction over Axis (or all_axes) of `a` combines, from a's dims.
template <class T, int Axis, class A>
struct inv_count_node : expr_base {
  using value_type = T;
  using shape_type = shape<>;
  static constexpr node_kind kind = node_kind::shape_scalar;
  static constexpr const char* op_name = "inv_count";
  A a;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tuple<>{}; }  // depends on a's shape, not its values
  T value(const dims& d) const {
    const index_t n = detail::reduce_split(d, Axis).n;
    return n ? T(1) / static_cast<T>(n) : T(0);
  }
  bool operator==(const inv_count_node&) const = default;
};

/// inv_count<T, Axis>(a): a rank-0 T, 1/n for the n elements a reduction of a over axis Axis
/// (>= 0) or all_axes combines, read from a's dims at run time (0 where n is 0). It reads
/// a's shape, not its values: no gradient flows through it.
template <class T, int Axis, expression A>
auto inv_count(const A& a) {
  return inv_count_node<T, Axis, A>{{}, a};
}

}  // namespace gradus
