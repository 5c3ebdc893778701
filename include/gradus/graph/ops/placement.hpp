#pragma once
// Placement in the type: on<P>(e) says where the subexpression e runs.
//
//   g::on<g::stage<1>>(e)   e is pipeline stage 1's work (a rank of its own: parallel/pipeline/)
//
// The node is an identity (a view of e's buffer, gradient passed through unchanged), so a
// placed expression computes exactly what the unplaced one does; what the placement changes
// is where the planner cuts the graph. A pipeline stage's graph (compiled_graph with a cut
// stage) plans the nodes of its own stage and sees every other stage's placed node as a leaf
// fed from outside (the activations received from the previous stage): the cut edges are
// the placed nodes, known from the type.
//
// Which stage a node belongs to: the nearest placed node above it (on<P>(e) places every
// unplaced node of e, as TensorFlow's `with tf.device(...)` places what the block builds);
// a node above every placement inherits the latest stage among its inputs (so a pipeline's
// loss is written on<stage<S - 1>>(...) or sits above stage S - 1's output). Stages only
// read earlier stages: on<stage<K>>(e) with a stage-J node inside e, J > K, is a compile-time
// error naming both.
//
// Devices in one process (on<device::cpu>, on<device::cuda<N>>, with host/device copies the
// planner inserts) are the next step of this design (docs/pipelines.md); they are not types
// yet, so naming one does not compile.
#include <algorithm>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gradus/graph/node.hpp"

namespace gradus {

// Pipeline stage K (0-based): one rank (or one group of data-parallel replicas) each.
template <int K>
struct stage {
  static_assert(K >= 0, "gradus: stage<K>: the stage index must be >= 0");
  static constexpr int index = K;
};

template <class P>
inline constexpr bool is_stage_v = false;
template <int K>
inline constexpr bool is_stage_v<stage<K>> = true;

template <class P, class E>
struct placed_node : expr_base {
  using value_type = value_t<E>;
  using shape_type = shape_t<E>;
  using placement = P;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "placed";
  E e;
  auto operands() const { return std::tie(e); }
  auto children() const { return std::tie(e); }
  dims infer(const dims& d) const { return d; }
  bool operator==(const placed_node&) const = default;
};

template <class N>
inline constexpr bool is_placed_v = false;
template <class P, class E>
inline constexpr bool is_placed_v<placed_node<P, E>> = true;

template <class N>
inline constexpr bool is_stage_placed_v = false;
template <int K, class E>
inline constexpr bool is_stage_placed_v<placed_node<stage<K>, E>> = true;

namespace detail {
// The latest stage of a placed node in E's tree, stopping at each placed node (its own
// stage counts, not what is under it), or -1 where E holds none.
template <class E>
constexpr int latest_stage_below() {
  if constexpr (is_stage_placed_v<E>) {
    return E::placement::index;
  } else if constexpr (requires { std::declval<const E&>().children(); }) {
    using C = decltype(std::declval<const E&>().children());
    return []<std::size_t... I>(std::index_sequence<I...>) {
      int m = -1;
      ((m = std::max(m, latest_stage_below<std::remove_cvref_t<std::tuple_element_t<I, C>>>())), ...);
      return m;
    }(std::make_index_sequence<std::tuple_size_v<C>>{});
  } else {
    return -1;
  }
}
// The latest stage under E's own placement, looking through E when it is placed itself.
template <class E>
constexpr int latest_stage_inside() {
  if constexpr (is_stage_placed_v<E>) return latest_stage_below<std::remove_cvref_t<decltype(std::declval<const E&>().e)>>();
  else return latest_stage_below<E>();
}
}  // namespace detail

// The stage E's root runs on: its own placement, else the latest among its inputs (0 when
// nothing is placed: an unplaced graph is a one-stage pipeline).
template <class E>
inline constexpr int stage_of_v = [] {
  constexpr int s = detail::latest_stage_below<std::remove_cvref_t<E>>();
  return s < 0 ? 0 : s;
}();

// on<P>(e): e placed on P (see the top of this file).
template <class P, expression E>
auto on(const E& e) {
  static_assert(is_stage_v<P>, "gradus: on<P>(e): P must be a placement: g::stage<K>");
  if constexpr (is_stage_v<P>) {
    constexpr int inner = detail::latest_stage_inside<std::remove_cvref_t<E>>();
    static_assert(inner <= P::index,
                  "gradus: on<stage<K>>(e): e reads the output of a later stage (stages only read earlier ones; "
                  "the node's type and both stages are above)");
  }
  return placed_node<P, std::remove_cvref_t<E>>{{}, e};
}

}  // namespace gradus
