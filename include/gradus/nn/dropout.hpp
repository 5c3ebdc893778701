#pragma once
// nn::dropout: inverted dropout with a seeded, counter-based mask (see
// graph/ops/random.hpp). One object is one dropout site; copies share its mode and
// counter.
//
//   g::nn::dropout drop(0.5, /*seed=*/7);
//   auto h = drop(g::relu(fc1(x)));     // training: x * mask / keep
//   drop.eval();  ... drop.train();     // evaluation: identity
//   drop.set_draws(n);                  // resume: masks continue from draw n
#include <cstdint>
#include <memory>
#include <string>

#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/random.hpp"

namespace gradus::nn {

/// Inverted dropout: in training mode `x * mask`, each mask element `1 / (1 - rate)` with
/// probability `1 - rate` and 0 otherwise; in evaluation mode the identity (the mask is all
/// ones). The mask comes from a counter-based generator: draw c, element i is a hash of
/// (seed, c, i), the same on every backend and thread count. The draw counter advances once
/// per session run that computes the mask in training mode. No gradient flows through the
/// mask: `d(x * mask)/dx = mask`.
///
/// One object is one dropout site. Copies, and the expressions built from any of them, share
/// the mode and the counter, which a run reads when it executes (so train() and eval() apply
/// to expressions already built). Not thread-safe: runs on several threads that compute the
/// same site's mask race on its counter.
class dropout {
 public:
  /// A site that drops each element with probability `rate`, in [0, 1) (gradus::error otherwise),
  /// with masks seeded by `seed`; it starts in training mode, at draw 0.
  explicit dropout(double rate, std::uint64_t seed = 0) : state_(std::make_shared<dropout_state>()) {
    if (!(rate >= 0 && rate < 1))
      throw error("gradus: nn::dropout: rate must be in [0, 1), got " + std::to_string(rate));
    state_->keep = 1 - rate;
    state_->seed = seed;
  }
  /// `x * mask` for a float or double x of any shape; the result has x's shape and dtype.
  template <expression X>
  auto operator()(const X& x) const {
    return x * dropout_mask_node<value_t<X>, X>{{}, x, state_};
  }
  void train(bool on = true) { state_->training = on; }  ///< training mode (evaluation mode with `false`)
  void eval() { state_->training = false; }              ///< evaluation mode: the identity
  bool training() const { return state_->training; }     ///< whether it is in training mode
  /// Masks drawn so far in training mode (save it with a checkpoint to resume the sequence).
  std::uint64_t draws() const { return state_->draws; }
  /// Sets the draw counter: the next training-mode mask is draw n (resuming from a checkpoint).
  void set_draws(std::uint64_t n) { state_->draws = n; }

 private:
  std::shared_ptr<dropout_state> state_;
};

}  // namespace gradus::nn
