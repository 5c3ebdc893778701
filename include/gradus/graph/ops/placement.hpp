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
// Devices. A stage may name the device it runs on: on<stage<K, device::cuda<0>>>(e), or
// on<device::cuda<0>>(e), which is a stage of its own, the next after every stage inside e
// (1 + the latest stage placed in e, 0 when none), so a chain of device placements numbers
// its own stages:
//
//   const auto h = g::on<g::device::cpu>(g::relu(fc1(x)));                    // stage 0, the CPU
//   const auto loss = g::on<g::device::cuda<0>>(g::nn::softmax_cross_entropy_loss(fc2(h), y));  // stage 1, GPU 0
//
// Stages on devices of one process run as parallel::pipeline_in_process (one thread and one
// session per stage, the session's backend the device's: cpu_simd for device::cpu, gradus::cuda
// for device::cuda<N>); across processes each rank's session must suit its stage's device. A
// session whose backend cannot run its stage's device (a CUDA placement given a cpu_simd
// session, as in a build without the CUDA backend) is a compile-time error naming the stage and
// the backend. device::any (stage<K>'s default) runs on whatever backend the session has.
#include <algorithm>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gradus/graph/node.hpp"

namespace gradus {

/// Where a stage runs, inside its process (see the top of this file).
namespace device {
/// The session's backend, whatever it is (stage<K>'s default).
struct any {
  static constexpr const char* name = "any";  ///< its name (label() gives "" for it: no device named)
};
/// The host's cores: a backend whose tensors are host memory (cpu_simd).
struct cpu {
  static constexpr const char* name = "cpu";  ///< its name, what label() gives
};
/// CUDA device N (its ordinal, >= 0): the gradus::cuda backend.
template <int N>
struct cuda {
  static_assert(N >= 0, "gradus: device::cuda<N>: the device ordinal must be >= 0");
  static constexpr int ordinal = N;            ///< N, the CUDA device ordinal
  static constexpr const char* name = "cuda";  ///< its name; label() adds the ordinal: "cuda:0"
};
/// Whether D is a device: any, cpu or cuda<N>.
template <class D>
inline constexpr bool is_device_v = false;
/// any is a device.
template <>
inline constexpr bool is_device_v<any> = true;
/// cpu is a device.
template <>
inline constexpr bool is_device_v<cpu> = true;
/// cuda<N> is a device.
template <int N>
inline constexpr bool is_device_v<cuda<N>> = true;
/// "cpu", "cuda:0" (what the placement log and to_dot print); empty for any
template <class D>
std::string label() {
  if constexpr (requires { D::ordinal; }) return std::string(D::name) + ":" + std::to_string(D::ordinal);
  else if constexpr (std::is_same_v<D, any>) return {};
  else return D::name;
}
}  // namespace device

/// Pipeline stage K (0-based): one rank (or one group of data-parallel replicas) each, or one
/// device of this process (pipeline_in_process); Device: where it runs.
template <int K, class Device = device::any>
struct stage {
  static_assert(K >= 0, "gradus: stage<K>: the stage index must be >= 0");
  static_assert(device::is_device_v<Device>, "gradus: stage<K, D>: D must be g::device::any, cpu or cuda<N>");
  static constexpr int index = K;  ///< K, the stage's position in the pipeline
  using device_type = Device;      ///< where the stage runs
};

/// Whether placement P is a stage (a device alone is not: on<P>() makes it one).
template <class P>
inline constexpr bool is_stage_v = false;
/// stage<K, D> is a stage.
template <int K, class D>
inline constexpr bool is_stage_v<stage<K, D>> = true;

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

/// Whether node N is a placement, what on<P>(e) returns.
template <class N>
inline constexpr bool is_placed_v = false;
/// A placed_node is one.
template <class P, class E>
inline constexpr bool is_placed_v<placed_node<P, E>> = true;

/// Whether node N is placed on a pipeline stage (every placement on<P>() makes is).
template <class N>
inline constexpr bool is_stage_placed_v = false;
/// A node placed on stage<K, D> is one.
template <int K, class D, class E>
inline constexpr bool is_stage_placed_v<placed_node<stage<K, D>, E>> = true;

namespace detail {
/// The latest stage of a placed node in E's tree, stopping at each placed node (its own
/// stage counts, not what is under it), or -1 where E holds none.
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
/// The latest stage under E's own placement, looking through E when it is placed itself.
template <class E>
constexpr int latest_stage_inside() {
  if constexpr (is_stage_placed_v<E>) return latest_stage_below<std::remove_cvref_t<decltype(std::declval<const E&>().e)>>();
  else return latest_stage_below<E>();
}

/// The device of stage K in E's tree: that of the first node placed on stage K with a device
/// (device::any where none names one). Stages before K hold no stage-K node: not searched.
template <class... Ds>
struct first_named_device {
  using type = device::any;
};
template <class D, class... Ds>
struct first_named_device<D, Ds...> {
  using type = std::conditional_t<std::is_same_v<D, device::any>, typename first_named_device<Ds...>::type, D>;
};
template <int K, class E>
struct stage_device_of;
template <int K, class Children>
struct stage_device_among;
template <int K, class... Cs>
struct stage_device_among<K, std::tuple<Cs...>> {
  using type = typename first_named_device<typename stage_device_of<K, std::remove_cvref_t<Cs>>::type...>::type;
};
template <int K, class E>
struct stage_device_of {
  static auto pick() {
    if constexpr (is_stage_placed_v<E>) {
      if constexpr (E::placement::index < K) return std::type_identity<device::any>{};
      else if constexpr (E::placement::index == K && !std::is_same_v<typename E::placement::device_type, device::any>)
        return std::type_identity<typename E::placement::device_type>{};
      else return std::type_identity<typename stage_device_among<K, std::remove_cvref_t<decltype(std::declval<const E&>().children())>>::type>{};
    } else if constexpr (requires { std::declval<const E&>().children(); }) {
      return std::type_identity<typename stage_device_among<K, std::remove_cvref_t<decltype(std::declval<const E&>().children())>>::type>{};
    } else {
      return std::type_identity<device::any>{};
    }
  }
  using type = typename decltype(pick())::type;
};
}  // namespace detail

/// The device stage K of E names (device::any when none does).
template <int K, class E>
using stage_device_t = typename detail::stage_device_of<K, std::remove_cvref_t<E>>::type;

/// The stage E's root runs on: its own placement, else the latest among its inputs (0 when
/// nothing is placed: an unplaced graph is a one-stage pipeline).
template <class E>
inline constexpr int stage_of_v = [] {
  constexpr int s = detail::latest_stage_below<std::remove_cvref_t<E>>();
  return s < 0 ? 0 : s;
}();

/// on<P>(e): e placed on P, a stage<K, Device> or a device (which makes a stage of its own,
/// the next after every stage inside e; see the top of this file). The same value, dtype and
/// shape as e (a view of e's buffer); it changes only where the planner cuts the graph.
/// Gradient: g passes through unchanged.
template <class P, expression E>
auto on(const E& e) {
  static_assert(is_stage_v<P> || device::is_device_v<P>,
                "gradus: on<P>(e): P must be a placement: g::stage<K>, g::stage<K, Device>, or a device "
                "(g::device::cpu, g::device::cuda<N>)");
  if constexpr (device::is_device_v<P>) {  // a stage of its own, after every stage inside e
    return placed_node<stage<detail::latest_stage_below<std::remove_cvref_t<E>>() + 1, P>, std::remove_cvref_t<E>>{{}, e};
  } else {
    constexpr int inner = detail::latest_stage_inside<std::remove_cvref_t<E>>();
    static_assert(inner <= P::index,
                  "gradus: on<stage<K>>(e): e reads the output of a later stage (stages only read earlier ones; "
                  "the node's type and both stages are above)");
    return placed_node<P, std::remove_cvref_t<E>>{{}, e};
  }
}

}  // namespace gradus
