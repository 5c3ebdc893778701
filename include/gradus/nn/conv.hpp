#pragma once
// conv2d<"conv1", In, Out, K, Stride = 1, Pad = 0>: a 2-D convolution layer over NCHW
// images, y = conv2d(x, w) + b, with variables "conv1/w" [Out, In, K, K] and "conv1/b"
// [Out]. Like nn::dense, the layer is a value; the session holds its variables.
//
//   g::nn::conv2d<"conv1", 1, 6, 5> conv1;
//   auto h = g::max_pool2d<2>(g::relu(conv1(x)));   // x: [N, 1, 28, 28] -> h: [N, 6, 12, 12]
//   conv1.initialize(s, seed);  // w: he_normal (fan_in = In*K*K), b: zeros
#include <cstdint>

#include "gradus/core/fixed_string.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/ops/conv.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/shape_ops.hpp"
#include "gradus/nn/init.hpp"

namespace gradus::nn {

/// A 2-D convolution layer over NCHW images, `y = conv2d<Stride, Pad>(x, w) + b`: `In` input
/// channels, `Out` filters of `K x K`, stride `Stride` (default 1) and `Pad` zeros on each
/// side (default 0), so x `[N, In, H, W]` gives `[N, Out, OH, OW]` with
/// `OH = (H + 2 Pad - K) / Stride + 1` (likewise OW). Variables: `Name + "/w"`
/// `[Out, In, K, K]` and `Name + "/b"` `[Out]`, of dtype `T` (float or double). The layer is
/// a value; the session holds its variables.
template <fixed_string Name, index_t In, index_t Out, index_t K, index_t Stride = 1, index_t Pad = 0, class T = float>
struct conv2d {
  static_assert(In > 0 && Out > 0 && K > 0 && Stride > 0 && Pad >= 0, "gradus: nn::conv2d: extents must be positive");
  variable<Name + "/w", T, Out, In, K, K> w;  ///< the filters, `[Out, In, K, K]`, named `Name + "/w"`
  variable<Name + "/b", T, Out> b;            ///< one bias per output channel, `[Out]`, named `Name + "/b"`

  /// x `[N, In, H, W]` -> `[N, Out, OH, OW]`, b added to every position of its channel.
  template <expression X>
  auto operator()(const X& x) const {
    return gradus::conv2d<Stride, Pad>(x, w) + reshape<1, Out, 1, 1>(b);
  }

  /// Gives w its first value from `how` (default init::he_normal, with fan_in `In * K * K`)
  /// and b zeros, seeded by `seed` and each variable's name (see gradus::initialize).
  template <class Backend, class Init = init::he_normal>
  void initialize(session<Backend>& s, std::uint64_t seed, const Init& how = {}) const {
    gradus::initialize(s, w, how, seed);
    gradus::initialize(s, b, init::zeros{}, seed);
  }
};

}  // namespace gradus::nn
