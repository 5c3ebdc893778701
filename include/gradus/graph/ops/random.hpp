#pragma once
// Random masks. dropout_mask_node gives, for x's shape, 1/keep with probability keep and 0
// otherwise (inverted dropout), from a counter-based generator: element i of draw c is a
// hash of (seed, c, i), so a mask does not depend on thread count or backend, and draw c
// can be recomputed without state. The draw counter lives in a state shared by every copy
// of the node; it advances once per run that computes the mask in training mode. In
// evaluation mode the mask is all ones. The mask has no children: no gradient flows
// through it, and d(x * mask)/dx = mask comes from the product's rule.
#include <cstdint>
#include <memory>
#include <tuple>

#include "gradus/core/error.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

/// What one dropout site (nn::dropout) shares with every copy of its mask node: the keep
/// probability, the seed, the draw counter and the mode. The counter is a plain integer:
/// two runs that compute the same site's mask at once (from two threads) race on it.
struct dropout_state {
  double keep = 1;           ///< 1 - rate
  std::uint64_t seed = 0;    ///< the seed of the counter-based generator
  std::uint64_t draws = 0;   ///< masks drawn so far (training mode)
  bool training = true;      ///< true: each run that computes the mask draws the next one; false: all ones
};

template <class T, class X>
struct dropout_mask_node : expr_base {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gradus: dropout: float or double input");
  using value_type = T;
  using shape_type = shape_t<X>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "dropout_mask";
  X x;  ///< lends its dims only
  std::shared_ptr<dropout_state> state;
  auto operands() const { return std::tie(x); }
  auto children() const { return std::tuple<>{}; }
  dims infer(const dims& d) const { return d; }
  template <class Backend>
  void compute(T* out, const dims& d, tensor_view<const T>) const {
    if (state->training) {
      Backend::dropout_mask(out, d.numel(), state->keep, state->seed, state->draws);
      ++state->draws;
    } else {
      Backend::dropout_mask(out, d.numel(), 1.0, state->seed, 0);
    }
  }
  bool operator==(const dropout_mask_node& o) const { return state == o.state && x == o.x; }
};

}  // namespace gradus
