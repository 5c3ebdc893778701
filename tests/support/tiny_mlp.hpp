#pragma once
// The small two-layer MLP and its synthetic batches that the communicator tests train
// (tests/dist): 9 inputs, 13 tanh units, 4 classes, float64, batches of 24.
#include <cstdint>
#include <random>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace gradus_test {

namespace g = gradus;

inline constexpr g::index_t n_in = 9, n_h = 13, n_out = 4, batch = 24;
inline g::placeholder<"x", double, g::dyn, n_in> x;
inline g::placeholder<"y", std::int32_t, g::dyn> y;

struct mlp {
  g::nn::dense<"fc1", n_in, n_h, double> fc1;
  g::nn::dense<"fc2", n_h, n_out, double> fc2;
  auto loss() const { return g::nn::softmax_cross_entropy_loss(fc2(g::tanh(fc1(x))), y); }
  template <class Backend>
  void init(g::session<Backend>& s, std::uint64_t seed) const {
    fc1.initialize(s, seed);
    fc2.initialize(s, seed + 1);
  }
  // every weight, fc1 then fc2, w before b
  std::vector<double> weights(g::session<g::cpu_simd>& s) const {
    auto [w1, b1, w2, b2] = s.run(fc1.w, fc1.b, fc2.w, fc2.b);
    std::vector<double> r(w1.begin(), w1.end());
    r.insert(r.end(), b1.begin(), b1.end());
    r.insert(r.end(), w2.begin(), w2.end());
    r.insert(r.end(), b2.begin(), b2.end());
    return r;
  }
};

struct dataset {
  std::vector<double> xs;
  std::vector<std::int32_t> ys;
};
// `steps` batches of normal inputs; labels random, or (learnable) the sign pattern of the
// first two inputs.
inline dataset make_data(int steps, bool learnable) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> nd(0, 1);
  dataset d;
  d.xs.resize(static_cast<std::size_t>(steps * batch * n_in));
  d.ys.resize(static_cast<std::size_t>(steps * batch));
  for (auto& v : d.xs) v = nd(rng);
  for (std::size_t i = 0; i < d.ys.size(); ++i)
    d.ys[i] = learnable ? (d.xs[i * n_in] > 0 ? 1 : 0) + (d.xs[i * n_in + 1] > 0 ? 2 : 0) : static_cast<std::int32_t>(rng() % n_out);
  return d;
}

// The reference the data-parallel tests compare against: one process, the whole batch in
// each of `steps` steps, from mlp::init(s, 11) (the seed the tests give rank 0).
template <class Opt>
std::vector<double> single_process(const dataset& d, int steps, const Opt& opt) {
  mlp m;
  g::session<g::cpu_simd> s;
  m.init(s, 11);
  auto step = g::minimize(s, m.loss(), opt);
  for (int k = 0; k < steps; ++k)
    step.run(x = g::view(d.xs.data() + k * batch * n_in, {batch, n_in}), y = g::view(d.ys.data() + k * batch, {batch}));
  return m.weights(s);
}

}  // namespace gradus_test
