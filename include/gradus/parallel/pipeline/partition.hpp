#pragma once
// Stage partitioning at compile time: a chain of layers cut into S contiguous stages of
// balanced cost, the cost read from each layer's type (nn::dense<..., In, Out> does 2·In·Out
// multiply-adds per row forward: its `flops_per_row`; a layer without one counts its
// `parameters`, and a layer with neither costs nothing).
//
//   constexpr auto cut = g::parallel::balanced_cut<2, decltype(fc1), decltype(fc2), decltype(fc3)>();
//   cut.stage[i]   the stage of layer i;   cut.cost[k]   stage k's cost;   cut.describe()
//
//   auto logits = g::parallel::sequential<2>(x, relu, fc1, fc2, fc3);
//     = fc3(relu(on<stage<1>>... : each layer applied in turn, `act` between layers, and
//       each stage's last output placed on it (the last layer's on stage S - 1), so the
//       loss above it is the last stage's; with S = 1 nothing is placed (the plain chain).
//
// The cut minimises the most expensive stage (the pipeline's pace: every micro-batch passes
// every stage), by dynamic programming over the prefix sums (linear partition), ties broken
// toward earlier cuts. DeepSpeed's PipelineModule offers the same as partition_method
// "parameters"; here it is a constant of the model's type.
#include <array>
#include <cstddef>
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>

#include "gradus/graph/ops/placement.hpp"

namespace gradus::parallel {

/// Layer type L's cost for balanced_cut: its `flops_per_row`, else its `parameters`, else 0.
template <class L>
constexpr double layer_cost() {
  if constexpr (requires { L::flops_per_row; }) return static_cast<double>(L::flops_per_row);
  else if constexpr (requires { L::parameters; }) return static_cast<double>(L::parameters);
  else return 0.0;
}

/// N layers cut into S contiguous stages (balanced_cut): each layer's stage, and each
/// stage's cost and first and last layer.
template <std::size_t N, int S>
struct stage_cut {
  std::array<int, N> stage{};     ///< per layer
  std::array<double, S> cost{};   ///< per stage
  std::array<int, S> first{};     ///< each stage's first layer
  std::array<int, S> last{};      ///< and its last
  /// The most expensive stage's cost: the pipeline's pace, which the cut minimises.
  double max_cost() const {
    double m = 0;
    for (double c : cost) m = c > m ? c : m;
    return m;
  }
  /// "stage 0: layers 0-1 (cost 4.0e+05, 49%); stage 1: ..."
  std::string describe() const {
    double total = 0;
    for (double c : cost) total += c;
    std::string r;
    for (int k = 0; k < S; ++k) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%sstage %d: layers %d-%d (cost %.3g, %.0f%%)", k ? "; " : "", k, first[static_cast<std::size_t>(k)],
                    last[static_cast<std::size_t>(k)], cost[static_cast<std::size_t>(k)],
                    total > 0 ? 100 * cost[static_cast<std::size_t>(k)] / total : 0.0);
      r += buf;
    }
    return r;
  }
};

/// The balanced cut of layers with these costs into S stages.
template <int S, std::size_t N>
constexpr stage_cut<N, S> balanced_cut(const std::array<double, N>& c) {
  static_assert(S >= 1, "gradus: balanced_cut: S >= 1 stages");
  static_assert(N >= static_cast<std::size_t>(S), "gradus: balanced_cut: fewer layers than stages (every stage needs one)");
  std::array<double, N + 1> pre{};
  for (std::size_t i = 0; i < N; ++i) pre[i + 1] = pre[i] + c[i];
  // best[k][i]: the least max-stage cost of the first i layers in k + 1 stages; at[k][i] the
  // first layer of the last of those stages
  std::array<std::array<double, N + 1>, static_cast<std::size_t>(S)> best{};
  std::array<std::array<std::size_t, N + 1>, static_cast<std::size_t>(S)> at{};
  for (std::size_t i = 0; i <= N; ++i) best[0][i] = pre[i];
  for (std::size_t k = 1; k < static_cast<std::size_t>(S); ++k)
    for (std::size_t i = k + 1; i <= N; ++i) {
      best[k][i] = 1e300;
      for (std::size_t j = k; j < i; ++j) {  // the last stage holds layers j .. i - 1
        const double here = best[k - 1][j] > pre[i] - pre[j] ? best[k - 1][j] : pre[i] - pre[j];
        if (here < best[k][i]) best[k][i] = here, at[k][i] = j;
      }
    }
  stage_cut<N, S> r{};
  std::size_t end = N;
  for (std::size_t k = static_cast<std::size_t>(S); k-- > 0;) {
    const std::size_t begin = k == 0 ? 0 : at[k][end];
    for (std::size_t i = begin; i < end; ++i) r.stage[i] = static_cast<int>(k);
    r.cost[k] = pre[end] - pre[begin];
    r.first[k] = static_cast<int>(begin);
    r.last[k] = static_cast<int>(end) - 1;
    end = begin;
  }
  return r;
}
/// The balanced cut of the layer types L... into S stages, each costed by layer_cost.
template <int S, class... L>
constexpr stage_cut<sizeof...(L), S> balanced_cut() {
  return balanced_cut<S>(std::array<double, sizeof...(L)>{layer_cost<L>()...});
}

namespace detail {
template <int S, class Layers>
struct cut_of;
template <int S, class... L>
struct cut_of<S, std::tuple<const L&...>> {
  static constexpr auto value = balanced_cut<S, L...>();
};

/// Layer I applied to h, placed where its stage ends. (The cut is a constant of the layers'
/// types, looked up here rather than passed as a class-type template argument, which nvcc's
/// front end does not deduce.)
template <int S, std::size_t I, class H, class Act, class Layers>
auto chain(const H& h, const Act& act, const Layers& layers) {
  constexpr auto& cut = cut_of<S, Layers>::value;
  constexpr std::size_t n = std::tuple_size_v<Layers>;
  const auto y = std::get<I>(layers)(h);
  if constexpr (I + 1 == n) {
    return on<stage<cut.stage[I]>>(y);
  } else if constexpr (cut.stage[I] != cut.stage[I + 1]) {
    return chain<S, I + 1>(on<stage<cut.stage[I]>>(act(y)), act, layers);
  } else {
    return chain<S, I + 1>(act(y), act, layers);
  }
}
template <std::size_t I, class H, class Act, class Layers>
auto chain_unplaced(const H& h, const Act& act, const Layers& layers) {
  const auto y = std::get<I>(layers)(h);
  if constexpr (I + 1 == std::tuple_size_v<Layers>) return y;
  else return chain_unplaced<I + 1>(act(y), act, layers);
}
}  // namespace detail

/// The layers applied to x in turn, `act` between them, cut into S balanced stages.
template <int S, expression X, class Act, class... L>
auto sequential(const X& x, const Act& act, const L&... layers) {
  static_assert(sizeof...(L) >= 1, "gradus: sequential: name at least one layer");
  if constexpr (S == 1) return detail::chain_unplaced<0>(x, act, std::tie(layers...));  // one stage: nothing to place
  else return detail::chain<S, 0>(x, act, std::tie(layers...));
}

}  // namespace gradus::parallel
