#pragma once
// Recurrent layers over a time-major sequence [T, B, In] -> hs [T, B, Hidden], fused
// over all steps (graph/ops/rnn.hpp; T is a run-time extent):
//
//   g::nn::lstm<"lstm1", 28, 128> lstm1;       // "lstm1/wx" [28, 512], "lstm1/wh" [128, 512], "lstm1/b" [512]
//   auto logits = fc(g::last_step(lstm1(g::time_major<28, 28>(x))));
//   lstm1.initialize(s, seed);                 // PyTorch's uniform(-1/sqrt(Hidden), 1/sqrt(Hidden))
//
// nn::gru<"gru1", In, Hidden> holds "gru1/wx" [In, 3H], "gru1/wh" [H, 3H], "gru1/bx" and
// "gru1/bh" [3H] (PyTorch's b_ih and b_hh). The LSTM has one bias (PyTorch's
// b_ih + b_hh, which only ever appear summed).
#include <cmath>
#include <cstdint>

#include "gradus/core/fixed_string.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/ops/rnn.hpp"
#include "gradus/nn/init.hpp"

namespace gradus::nn {

template <fixed_string Name, index_t In, index_t Hidden, class T = float>
struct lstm {
  static_assert(In > 0 && Hidden > 0, "gradus: nn::lstm: extents must be positive");
  variable<Name + "/wx", T, In, 4 * Hidden> wx;
  variable<Name + "/wh", T, Hidden, 4 * Hidden> wh;
  variable<Name + "/b", T, 4 * Hidden> b;

  /// xs: [T, B, In] -> hs [T, B, Hidden]
  template <expression X>
  auto operator()(const X& xs) const {
    return gradus::lstm(xs, wx, wh, b);
  }
  template <class Backend>
  void initialize(session<Backend>& s, std::uint64_t seed) const {
    const init::uniform u{-1 / std::sqrt(double(Hidden)), 1 / std::sqrt(double(Hidden))};
    gradus::initialize(s, wx, u, seed);
    gradus::initialize(s, wh, u, seed);
    gradus::initialize(s, b, u, seed);
  }
};

template <fixed_string Name, index_t In, index_t Hidden, class T = float>
struct gru {
  static_assert(In > 0 && Hidden > 0, "gradus: nn::gru: extents must be positive");
  variable<Name + "/wx", T, In, 3 * Hidden> wx;
  variable<Name + "/wh", T, Hidden, 3 * Hidden> wh;
  variable<Name + "/bx", T, 3 * Hidden> bx;
  variable<Name + "/bh", T, 3 * Hidden> bh;

  template <expression X>
  auto operator()(const X& xs) const {
    return gradus::gru(xs, wx, wh, bx, bh);
  }
  template <class Backend>
  void initialize(session<Backend>& s, std::uint64_t seed) const {
    const init::uniform u{-1 / std::sqrt(double(Hidden)), 1 / std::sqrt(double(Hidden))};
    gradus::initialize(s, wx, u, seed);
    gradus::initialize(s, wh, u, seed);
    gradus::initialize(s, bx, u, seed);
    gradus::initialize(s, bh, u, seed);
  }
};

}  // namespace gradus::nn
