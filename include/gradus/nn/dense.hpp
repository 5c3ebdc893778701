#pragma once
// dense<"fc1", In, Out>: a fully connected layer, y = x @ w + b, whose variables are named
// by the layer ("fc1/w" [In, Out], "fc1/b" [Out]) — so checkpoints, feeds and the graph
// drawing show the layer's name. A layer is a value with no state of its own: the
// session holds its variables, like any other.
//
//   g::nn::dense<"fc1", 784, 256> fc1;
//   auto h = g::relu(fc1(x));
//   fc1.initialize(s, seed);   // w: he_normal (for ReLU layers; glorot_uniform with
//                              // init::glorot_uniform{} as the second argument), b: zeros
#include <cstdint>

#include "gradus/core/fixed_string.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/matmul.hpp"
#include "gradus/nn/init.hpp"

namespace gradus::nn {

/// A fully connected layer, `y = x @ w + b`, mapping `[N, In]` to `[N, Out]`, with
/// variables named after the layer: `Name + "/w"` `[In, Out]` and `Name + "/b"` `[Out]`, of
/// dtype `T` (float by default). The layer is a value without state: the session holds the
/// variables' values. `In` and `Out` must be positive (a compile error otherwise).
template <fixed_string Name, index_t In, index_t Out, class T = float>
struct dense {
  static_assert(In > 0 && Out > 0, "gradus: nn::dense: extents must be positive");
  variable<Name + "/w", T, In, Out> w;  ///< the weights, `[In, Out]`, named `Name + "/w"`
  variable<Name + "/b", T, Out> b;      ///< the bias, `[Out]`, named `Name + "/b"`
  /// Trainable elements, `In * Out + Out`: a layer's cost for a pipeline's stage cut when it
  /// has no `flops_per_row` (parallel/pipeline/partition.hpp).
  static constexpr index_t parameters = In * Out + Out;
  /// Floating-point operations per input row of the forward pass, `2 * In * Out` (one
  /// multiply and one add per weight): the cost a pipeline's stage cut weighs the layer by.
  static constexpr index_t flops_per_row = 2 * In * Out;

  /// `matmul(x, w) + b`: x `[N, In]` -> `[N, Out]`, or `[B, N, In]` -> `[B, N, Out]` (w shared
  /// over the batch); x's dtype must be `T` (a compile error otherwise).
  template <expression X>
  auto operator()(const X& x) const {
    return matmul(x, w) + b;
  }

  /// Gives w its first value from `how` (default init::he_normal, for a ReLU after the layer;
  /// init::glorot_uniform for tanh or sigmoid) and b zeros, seeded by `seed` and each
  /// variable's name (see gradus::initialize). Replaces any value they had in `s`.
  template <class Backend, class Init = init::he_normal>
  void initialize(session<Backend>& s, std::uint64_t seed, const Init& how = {}) const {
    gradus::initialize(s, w, how, seed);
    gradus::initialize(s, b, init::zeros{}, seed);
  }
};

}  // namespace gradus::nn
