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

class dropout {
 public:
  explicit dropout(double rate, std::uint64_t seed = 0) : state_(std::make_shared<dropout_state>()) {
    if (!(rate >= 0 && rate < 1))
      throw error("gradus: nn::dropout: rate must be in [0, 1), got " + std::to_string(rate));
    state_->keep = 1 - rate;
    state_->seed = seed;
  }
  template <expression X>
  auto operator()(const X& x) const {
    return x * dropout_mask_node<value_t<X>, X>{{}, x, state_};
  }
  void train(bool on = true) { state_->training = on; }
  void eval() { state_->training = false; }
  bool training() const { return state_->training; }
  std::uint64_t draws() const { return state_->draws; }
  void set_draws(std::uint64_t n) { state_->draws = n; }

 private:
  std::shared_ptr<dropout_state> state_;
};

}  // namespace gradus::nn
