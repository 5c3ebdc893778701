#pragma once
// The MNIST MLP, 784-256-128-10 with ReLU between the layers: its layers, their
// initialisation and its logits, shared by mnist_mlp (training) and mnist_infer (inference)
// so that both hold the same variables ("fc1/w" [784, 256], "fc1/b" [256], ... "fc3/b" [10]):
// what one's --checkpoint writes, the other loads.
//
//   gradus_examples::mnist_mlp_model m;
//   auto logits = m.logits<1>(x);   // fc3(relu(fc2(relu(fc1(x))))); S > 1: cut into S stages
//   m.initialize(s, seed);          // he_normal for fc1 and fc2, glorot_uniform for fc3
#include <cstdint>

#include <gradus/gradus.hpp>
#include <gradus/parallel/pipeline/partition.hpp>

namespace gradus_examples {

struct mnist_mlp_model {
  gradus::nn::dense<"fc1", 784, 256> fc1;
  gradus::nn::dense<"fc2", 256, 128> fc2;
  gradus::nn::dense<"fc3", 128, 10> fc3;

  // the activation between two layers
  struct activation {
    template <class H>
    auto operator()(const H& h) const {
      return gradus::relu(h);
    }
  };

  // The logits of x [B, 784], cut into S balanced stages (1: not cut; parallel::sequential).
  template <int S, class X>
  auto logits(const X& x) const {
    return gradus::parallel::sequential<S>(x, activation{}, fc1, fc2, fc3);
  }

  template <class Session>
  void initialize(Session& s, std::uint64_t seed) const {
    fc1.initialize(s, seed);
    fc2.initialize(s, seed);
    fc3.initialize(s, seed, gradus::init::glorot_uniform{});
  }
};

}  // namespace gradus_examples
