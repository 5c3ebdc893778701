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

/// An LSTM layer over a time-major sequence, xs `[T, B, In]` -> hs `[T, B, Hidden]` (every
/// step's hidden state; T is a run-time extent), zero initial state, PyTorch's gate order
/// i, f, g, o and equations: `i, f, g, o = sigmoid, sigmoid, tanh, sigmoid(x Wx + h Wh + b)`,
/// `c' = f c + i g`, `h' = o tanh(c')`. Variables, dtype `T`: `Name + "/wx"` `[In, 4 Hidden]`,
/// `Name + "/wh"` `[Hidden, 4 Hidden]` and one bias `Name + "/b"` `[4 Hidden]` (PyTorch's
/// `b_ih + b_hh`, which only ever appear summed), the gates side by side in that order.
template <fixed_string Name, index_t In, index_t Hidden, class T = float>
struct lstm {
  static_assert(In > 0 && Hidden > 0, "gradus: nn::lstm: extents must be positive");
  variable<Name + "/wx", T, In, 4 * Hidden> wx;      ///< input weights, `[In, 4 Hidden]`
  variable<Name + "/wh", T, Hidden, 4 * Hidden> wh;  ///< recurrent weights, `[Hidden, 4 Hidden]`
  variable<Name + "/b", T, 4 * Hidden> b;            ///< the gates' bias, `[4 Hidden]`

  /// xs `[T, B, In]` -> hs `[T, B, Hidden]`; last_step(hs) `[B, Hidden]` is the final state.
  template <expression X>
  auto operator()(const X& xs) const {
    return gradus::lstm(xs, wx, wh, b);
  }
  /// Gives wx, wh and b values uniform in `[-1/sqrt(Hidden), 1/sqrt(Hidden)]` (PyTorch's),
  /// seeded by `seed` and each variable's name.
  template <class Backend>
  void initialize(session<Backend>& s, std::uint64_t seed) const {
    const init::uniform u{-1 / std::sqrt(double(Hidden)), 1 / std::sqrt(double(Hidden))};
    gradus::initialize(s, wx, u, seed);
    gradus::initialize(s, wh, u, seed);
    gradus::initialize(s, b, u, seed);
  }
};

/// A GRU layer over a time-major sequence, xs `[T, B, In]` -> hs `[T, B, Hidden]`, zero
/// initial state, PyTorch's gate order r, z, n and equations:
/// `r, z = sigmoid(x Wx_rz + bx_rz + h Wh_rz + bh_rz)`,
/// `n = tanh(x Wx_n + bx_n + r (h Wh_n + bh_n))`, `h' = (1 - z) n + z h`. Variables, dtype
/// `T`: `Name + "/wx"` `[In, 3 Hidden]`, `Name + "/wh"` `[Hidden, 3 Hidden]`, `Name + "/bx"` and
/// `Name + "/bh"` `[3 Hidden]` (PyTorch's b_ih and b_hh, kept apart because `bh_n` is scaled
/// by r).
template <fixed_string Name, index_t In, index_t Hidden, class T = float>
struct gru {
  static_assert(In > 0 && Hidden > 0, "gradus: nn::gru: extents must be positive");
  variable<Name + "/wx", T, In, 3 * Hidden> wx;      ///< input weights, `[In, 3 Hidden]`
  variable<Name + "/wh", T, Hidden, 3 * Hidden> wh;  ///< recurrent weights, `[Hidden, 3 Hidden]`
  variable<Name + "/bx", T, 3 * Hidden> bx;          ///< input bias, `[3 Hidden]` (PyTorch's b_ih)
  variable<Name + "/bh", T, 3 * Hidden> bh;          ///< recurrent bias, `[3 Hidden]` (PyTorch's b_hh)

  /// xs `[T, B, In]` -> hs `[T, B, Hidden]`.
  template <expression X>
  auto operator()(const X& xs) const {
    return gradus::gru(xs, wx, wh, bx, bh);
  }
  /// Gives wx, wh, bx and bh values uniform in `[-1/sqrt(Hidden), 1/sqrt(Hidden)]` (PyTorch's),
  /// seeded by `seed` and each variable's name.
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
