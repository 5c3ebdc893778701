#pragma once
// One pipeline stage's share of a placed loss, found in the loss's type at compile time
// (graph/ops/placement.hpp):
//
//   stage_output_t<K, S, Loss>  what stage K computes: its on<stage<K>>(...) node, or the
//                               loss itself for the last stage (K = S - 1)
//   stage_variables_t<K, S, Loss>  the variables stage K reads (not those of other stages)
//   stage_graph<Backend, K, S, Loss>
//                               the compiled graphs of stage K: outputs (its output, the
//                               gradient of each of its variables, the gradient of its input
//                               for K > 0), cut at K: the previous stage's output is a leaf
//                               (stage_input), the adjoint of this stage's output a placeholder
//                               (`pipeline_dy`) fed with what the next stage sent back. One
//                               graph per micro-batch in flight, each keeping its activations
//                               between its forward and backward parts (run_part 0 and 1).
//                               A variable whose gradient is X^T G over the rows (deferred_v)
//                               has G as its output and X appended after the others: the
//                               pipeline stashes both and computes the gradient once a step.
//
// What a pipeline asks of the placed loss, each a compile-time error naming the stage:
// stages 0..S-1 each have exactly one placed output (the last may be the unplaced loss
// above stage S-2's output), and stage K reads only stage K - 1's output. A variable read by
// two stages or more (tied weights) is in each one's variables; `sharers` says which
// stages read it, and the pipeline sums their parts of its gradient (pipeline_stage.hpp).
#include <array>
#include <bit>
#include <cstdint>
#include <memory>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/autodiff/autodiff.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/graph/ops/placement.hpp"
#include "gradus/train/loss_scale.hpp"
#include "gradus/train/train_step.hpp"

namespace gradus::parallel {

namespace detail {
template <class... T>
struct type_list {};

template <class L, class T>
struct push_unique;
template <class... A, class T>
struct push_unique<type_list<A...>, T> {
  using type = std::conditional_t<(std::is_same_v<A, T> || ...), type_list<A...>, type_list<A..., T>>;
};

/// Every node of E's tree placed on stage K (each type once).
template <int K, class Acc, class E>
struct placed_on;
template <int K, class Acc, class E>
struct placed_on {
  template <class A, class Tuple, std::size_t I = 0>
  static auto walk() {
    if constexpr (I == std::tuple_size_v<Tuple>) return static_cast<A*>(nullptr);
    else {
      using child = std::remove_cvref_t<std::tuple_element_t<I, Tuple>>;
      using next = typename placed_on<K, A, child>::type;
      return walk<next, Tuple, I + 1>();
    }
  }
  using self = std::conditional_t<is_stage_placed_v<E> && [] {
    if constexpr (is_stage_placed_v<E>) return E::placement::index == K;
    else return false;
  }(), typename push_unique<Acc, E>::type, Acc>;
  static auto all() {
    if constexpr (requires { std::declval<const E&>().children(); })
      return walk<self, decltype(std::declval<const E&>().children())>();
    else
      return static_cast<self*>(nullptr);
  }
  using type = std::remove_pointer_t<decltype(all())>;
};

template <class L>
struct list_size;
template <class... A>
struct list_size<type_list<A...>> {
  static constexpr std::size_t value = sizeof...(A);
};
template <class L>
struct list_front;
template <class A, class... R>
struct list_front<type_list<A, R...>> {
  using type = A;
};

/// The first node of type T in e's tree (depth first), or null.
template <class T, class E>
const T* find_node(const E& e) {
  if constexpr (std::is_same_v<T, E>) {
    return &e;
  } else if constexpr (requires { e.children(); }) {
    const T* r = nullptr;
    std::apply([&](const auto&... c) { ((r = r ? r : find_node<T>(c)), ...); }, e.children());
    return r;
  } else {
    return nullptr;
  }
}

/// The nodes of E's tree that Pick selects, outside nodes placed on a stage other than K
/// (each type once, in order of first appearance).
template <int K, template <class> class Pick, class Acc, class E>
struct stage_nodes {
  template <class A, class Tuple, std::size_t I = 0>
  static auto walk() {
    if constexpr (I == std::tuple_size_v<Tuple>) return static_cast<A*>(nullptr);
    else {
      using child = std::remove_cvref_t<std::tuple_element_t<I, Tuple>>;
      return walk<typename stage_nodes<K, Pick, A, child>::type, Tuple, I + 1>();
    }
  }
  static auto all() {
    if constexpr (is_stage_placed_v<E>) {
      if constexpr (E::placement::index != K) return static_cast<Acc*>(nullptr);
      else return walk<Acc, decltype(std::declval<const E&>().children())>();
    } else if constexpr (Pick<E>::value) {
      return static_cast<typename push_unique<Acc, E>::type*>(nullptr);
    } else if constexpr (requires { std::declval<const E&>().children(); }) {
      return walk<Acc, decltype(std::declval<const E&>().children())>();
    } else {
      return static_cast<Acc*>(nullptr);
    }
  }
  using type = std::remove_pointer_t<decltype(all())>;
};
template <class E>
struct pick_variable : std::bool_constant<is_variable_v<E>> {};
template <class E>
struct pick_placeholder : std::bool_constant<E::kind == node_kind::placeholder> {};

template <class L>
struct as_tuple_of;
template <class... A>
struct as_tuple_of<type_list<A...>> {
  using type = std::tuple<A...>;
};

/// A weight gradient that is a contraction over the micro-batch's rows, X^T G (a dense
/// layer's: X its input, G its output's gradient, both [rows, n]): a sum over rows, so a
/// pipeline stashes each micro-batch's X and G and takes one GEMM over the whole batch at the
/// end of the step (the zero-bubble schedules' separate "W" pass) instead of a full weight
/// gradient per micro-batch added into a sum — at 8 or 16 rows a micro-batch, that traffic,
/// not the arithmetic, was the step.
template <class G>
struct row_contraction : std::false_type {};
template <class X, class G>
  requires(rank_v<X> == 2 && rank_v<G> == 2)
struct row_contraction<matmul_node<permute_node<X, 1, 0>, G>> : std::true_type {
  static const X& x(const matmul_node<permute_node<X, 1, 0>, G>& n) { return n.a.a; }
  static const G& g(const matmul_node<permute_node<X, 1, 0>, G>& n) { return n.b; }
};

template <fixed_string Name, class T, class S>
struct placeholder_of_shape;
template <fixed_string Name, class T, index_t... E>
struct placeholder_of_shape<Name, T, shape<E...>> {
  using type = placeholder<Name, T, E...>;
};
}  // namespace detail

/// The placed node stage K < S - 1 computes; the loss itself for K = S - 1. A stage but the
/// last without exactly one `on<stage<K>>(...)` node in Loss is a compile-time error.
template <int K, int S, class Loss>
struct stage_output {
  /// Every node of Loss placed on stage K (a type list).
  using placed = typename detail::placed_on<K, detail::type_list<>, Loss>::type;
  static_assert(K == S - 1 || detail::list_size<placed>::value == 1,
                "gradus: pipeline: each stage but the last needs exactly one on<stage<K>>(...) output in the loss "
                "(stage K and the loss's type are above)");
  /// The node type stage K computes.
  using type = typename std::conditional_t<K == S - 1, std::type_identity<Loss>, detail::list_front<placed>>::type;
};
/// `stage_output<K, S, Loss>::type`: the node type stage K of S computes.
template <int K, int S, class Loss>
using stage_output_t = typename stage_output<K, S, Loss>::type;

/// Stage K's variables: those under its output, not under another stage's placed node.
template <int K, int S, class Loss>
using stage_variables_t =
    typename detail::as_tuple_of<typename detail::stage_nodes<K, detail::pick_variable, detail::type_list<>,
                                                              stage_output_t<K, S, Loss>>::type>::type;
/// Stage K's placeholders (the feeds it reads).
template <int K, int S, class Loss>
using stage_placeholders_t =
    typename detail::as_tuple_of<typename detail::stage_nodes<K, detail::pick_placeholder, detail::type_list<>,
                                                              stage_output_t<K, S, Loss>>::type>::type;

/// The name of variable i of stage `stage` (stage_variables_t's order); empty when out of range.
template <int S, class Loss>
std::string_view stage_variable_name(int stage, int i) {
  std::string_view r;
  [&]<int... J>(std::integer_sequence<int, J...>) {
    const auto pick = [&]<class... Vs>(std::tuple<Vs...>*) {
      const std::array<std::string_view, sizeof...(Vs)> names{Vs::name.view()...};
      if (i >= 0 && static_cast<std::size_t>(i) < names.size()) r = names[static_cast<std::size_t>(i)];
    };
    ((stage == J ? pick(static_cast<stage_variables_t<J, S, Loss>*>(nullptr)) : void()), ...);
  }(std::make_integer_sequence<int, S>{});
  return r;
}

namespace detail {
template <class V, class Tuple>
inline constexpr bool has_type_v = false;
template <class V, class... A>
inline constexpr bool has_type_v<V, std::tuple<A...>> = (std::is_same_v<V, A> || ...);
template <class V, class Tuple>
struct index_in;
template <class V, class... A>
struct index_in<V, std::tuple<A...>> {
  static constexpr int value = [] {
    constexpr bool same[] = {std::is_same_v<V, A>..., false};
    for (int i = 0; i < static_cast<int>(sizeof...(A)); ++i)
      if (same[i]) return i;
    return -1;
  }();
};
/// The stages that read variable V, as a bit mask (bit J: stage J).
template <class V, int S, class Loss, int... J>
constexpr std::uint32_t stages_reading(std::integer_sequence<int, J...>) {
  return ((has_type_v<V, stage_variables_t<J, S, Loss>> ? std::uint32_t{1} << J : 0u) | ...);
}
/// Variable V's key, agreed by every stage that reads it: the first such stage and V's index
/// there (first * 65536 + index).
template <class V, int S, class Loss, int... J>
constexpr int tie_key_of(std::integer_sequence<int, J...> js) {
  constexpr int first = std::countr_zero(stages_reading<V, S, Loss>(std::integer_sequence<int, J...>{}));
  constexpr int index[] = {index_in<V, stage_variables_t<J, S, Loss>>::value...};
  (void)js;
  return first * 65536 + index[first];
}
}  // namespace detail

/// Whether a session of Backend can run a stage placed on Device (graph/ops/placement.hpp):
/// device::any anything, device::cpu a backend whose tensors are host memory (cpu_simd),
/// device::cuda<N> the CUDA backend (gradus::cuda; its Thrust-OpenMP build too).
template <class Device, class Backend>
inline constexpr bool device_runs_on = [] {
  if constexpr (std::is_same_v<Device, device::any>) return true;
  else if constexpr (std::is_same_v<Device, device::cpu>) return backend_host_memory<Backend>;
  else return std::string_view(Backend::name) == "cuda";
}();

/// The compiled graphs of stage K of an S-stage pipeline over Loss.
template <class Backend, int K, int S, class Loss>
class stage_graph {
  static_assert(K >= 0 && K < S, "gradus: pipeline: the stage index is outside the pipeline");
  static_assert(stage_of_v<Loss> == S - 1,
                "gradus: pipeline: the loss must be on the last stage (on<stage<S - 1>>(...) or above stage S - 2's "
                "output): S and the loss's type are above");

 public:
  using output_t = stage_output_t<K, S, Loss>;  ///< the node this stage computes
  /// The previous stage's output: the node this stage's input replaces (void for stage 0).
  using input_t = std::conditional_t<K == 0, void, stage_output_t<K == 0 ? 0 : K - 1, S, Loss>>;
  using value_type = value_t<output_t>;  ///< the output's element type (the stage's variables have it too)
  using variables = stage_variables_t<K, S, Loss>;  ///< a std::tuple of the variables this stage reads
  static constexpr bool last = K == S - 1;  ///< whether this stage computes the loss
  /// Whether the session's precision policy scales the loss (core/precision.hpp: fp16): the
  /// last stage's backward pass then starts from the loss scale ("loss_scaler/scale", the
  /// session's state) instead of 1, so every stage's gradients are those of the scaled loss,
  /// while its forward output stays the loss itself.
  static constexpr bool scales_loss = last && precision_of_backend_t<Backend>::scales_loss && std::is_same_v<value_type, float>;
  /// The adjoint this stage's output receives: 1 (or the loss scale) for the loss, else what
  /// the next stage sent.
  using adjoint_t = std::conditional_t<
      last, std::conditional_t<scales_loss, loss_scale_variable, scalar<value_type>>,
      typename detail::placeholder_of_shape<"pipeline_dy", value_type, shape_t<output_t>>::type>;

 private:
  template <class V>
  using backprop_t = decltype(backprop_within<K>(std::declval<const V&>(), std::declval<const output_t&>(), std::declval<const adjoint_t&>()));
  template <class V>
  static constexpr bool deferrable = detail::row_contraction<backprop_t<V>>::value;
  template <class V>
  static auto gradient(const V& v, const output_t& out, const adjoint_t& adj) {
    if constexpr (deferrable<V>) return detail::row_contraction<backprop_t<V>>::g(backprop_within<K>(v, out, adj));
    else return gradus::detail::as_gradient(v, backprop_within<K>(v, out, adj));
  }
  template <class V>
  static auto deferred_rows(const V& v, const output_t& out, const adjoint_t& adj) {
    if constexpr (deferrable<V>) return std::tuple(detail::row_contraction<backprop_t<V>>::x(backprop_within<K>(v, out, adj)));
    else return std::tuple<>{};
  }
  static adjoint_t adjoint() {
    if constexpr (last && !scales_loss) return adjoint_t{{}, value_type(1)};
    else return adjoint_t{};
  }
  static auto outputs(const output_t& out) {
    const adjoint_t adj = adjoint();
    return [&]<class... Vs>(std::tuple<Vs...>*) {
      if constexpr (K == 0)
        return std::tuple_cat(std::tuple(out, gradient(Vs{}, out, adj)...), deferred_rows(Vs{}, out, adj)...);
      else
        return std::tuple_cat(std::tuple(out, gradient(Vs{}, out, adj)..., gradient(*detail::find_node<input_t>(out), out, adj)),
                              deferred_rows(Vs{}, out, adj)...);
    }(static_cast<variables*>(nullptr));
  }
  using outputs_t = decltype(outputs(std::declval<const output_t&>()));
  template <class T>
  struct graph_of;
  template <class... O>
  struct graph_of<std::tuple<O...>> {
    using type = compiled_graph<Backend, O...>;
  };

 public:
  /// The compiled graph of the stage's outputs: [0] its output, [1 + i] variable i's gradient
  /// (its G where deferred), then the input's gradient (K > 0), then each deferred variable's
  /// X (rows_output). Forward is run_part 0, backward run_part 1.
  using graph_t = typename graph_of<outputs_t>::type;
  /// The number of variables this stage reads.
  static constexpr std::size_t variable_count = std::tuple_size_v<variables>;
  /// Per variable: whether its gradient is deferred (X^T G over the batch's rows), and the
  /// output holding its X (outputs 1 + i hold G; X follows the input's gradient).
  static constexpr std::array<bool, variable_count> deferred = []<class... Vs>(std::tuple<Vs...>*) {
    return std::array<bool, variable_count>{deferrable<Vs>...};
  }(static_cast<variables*>(nullptr));
  /// Per variable: the stages that read it (bit J: stage J); more than this stage's bit for
  /// tied weights, whose gradient parts the stages sum.
  static constexpr std::array<std::uint32_t, variable_count> sharers = []<class... Vs>(std::tuple<Vs...>*) {
    static_assert(S <= 32, "gradus: pipeline: at most 32 stages");
    return std::array<std::uint32_t, variable_count>{detail::stages_reading<Vs, S, Loss>(std::make_integer_sequence<int, S>{})...};
  }(static_cast<variables*>(nullptr));
  /// Per variable: a key every stage that reads it agrees on — the first such stage and its
  /// index there (first * 65536 + index): the order tied variables are exchanged in, and
  /// their messages' tag.
  static constexpr std::array<int, variable_count> tie_key = []<class... Vs>(std::tuple<Vs...>*) {
    return std::array<int, variable_count>{detail::tie_key_of<Vs, S, Loss>(std::make_integer_sequence<int, S>{})...};
  }(static_cast<variables*>(nullptr));
  /// Per variable: the output holding its X where its gradient is deferred, else 0.
  static constexpr std::array<std::size_t, variable_count> rows_output = [] {
    std::array<std::size_t, variable_count> r{};
    std::size_t next = 1 + variable_count + (K > 0 ? 1 : 0);
    for (std::size_t i = 0; i < variable_count; ++i) r[i] = deferred[i] ? next++ : 0;
    return r;
  }();

  /// Stage K's share of loss: its output node copied out of loss's tree and the expressions
  /// of its outputs; the graphs are compiled on first use (graph()).
  explicit stage_graph(const Loss& loss) : out_(find_output(loss)), outs_(outputs(out_)) {
    if constexpr (K > 0) input_ = detail::find_node<input_t>(out_);
  }
  stage_graph(const stage_graph&) = delete;  ///< input_ points into out_
  stage_graph& operator=(const stage_graph&) = delete;

  /// The graph of micro-batch slot i (made on first use; its buffers are that slot's).
  graph_t& graph(std::size_t i) {
    while (graphs_.size() <= i) graphs_.push_back(std::make_unique<graph_t>(outs_, K));
    return *graphs_[i];
  }
  /// The graphs made so far (one per micro-batch slot used).
  std::size_t graphs() const { return graphs_.size(); }
  /// The stage's output node.
  const output_t& output() const { return out_; }
  /// The previous stage's output (K > 0): the node a stage_input feeds.
  const auto& input() const
    requires(K > 0)
  {
    return *input_;
  }

 private:
  static const output_t& find_output(const Loss& loss) {
    if constexpr (last) return loss;
    else return *detail::find_node<output_t>(loss);
  }
  output_t out_;
  outputs_t outs_;
  const std::conditional_t<K == 0, int, input_t>* input_ = nullptr;
  std::vector<std::unique_ptr<graph_t>> graphs_;
};

}  // namespace gradus::parallel
