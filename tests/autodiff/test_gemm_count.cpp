#define BOOST_TEST_MODULE autodiff_gemm_count
// An L-layer MLP's training step (loss and every gradient, run together) executes
// exactly L forward GEMMs and 2L-1 backward GEMMs: gradients built on the way to
// different variables share their adjoints, and forward values are not recomputed.
#include <boost/test/unit_test.hpp>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <vector>

namespace g = gradus;

namespace {
g::placeholder<"x", float, g::dyn, 8> x;
g::placeholder<"y", std::int32_t, g::dyn> y;
g::variable<"w1", float, 8, 6> w1;
g::variable<"b1", float, 6> b1;
g::variable<"w2", float, 6, 5> w2;
g::variable<"b2", float, 5> b2;
g::variable<"w3", float, 5, 4> w3;
g::variable<"b3", float, 4> b3;
g::variable<"w4", float, 4, 3> w4;
g::variable<"b4", float, 3> b4;
g::variable<"o2", float, 6, 3> o2;  // output layer of the 2-layer net
g::variable<"o3", float, 5, 3> o3;  // output layer of the 3-layer net

template <g::fixed_string N, class T, g::index_t... E>
void fill(g::session<g::cpu_simd>& s, const g::variable<N, T, E...>& v) {
  std::vector<T> vals(static_cast<std::size_t>((E * ...)), T(0.1));
  for (std::size_t i = 0; i < vals.size(); ++i) vals[i] = T(0.01) * T(static_cast<int>(i % 17) - 8);
  g::assign(s, v, g::view(vals.data(), std::array<g::index_t, sizeof...(E)>{E...}));
}

struct fixture {
  g::session<g::cpu_simd> s;
  std::vector<float> xs = std::vector<float>(4 * 8, 0.5f);
  std::vector<std::int32_t> ys{0, 1, 2, 0};
  fixture() {
    fill(s, w1), fill(s, b1), fill(s, w2), fill(s, b2), fill(s, w3), fill(s, b3), fill(s, w4), fill(s, b4), fill(s, o2), fill(s, o3);
  }
  template <class... E>
  const g::graph_stats& step(const E&... e) {
    s.run(e..., x = g::view(xs.data(), {4, 8}), y = g::view(ys.data(), {4}));
    return s.stats();
  }
};

template <class Logits>
auto xent(const Logits& l) {
  return g::mean(g::softmax_cross_entropy(l, y));
}
}  // namespace

BOOST_FIXTURE_TEST_CASE(two_layers, fixture) {
  auto loss = xent(g::matmul(g::relu(g::matmul(x, w1) + b1), o2) + b4);
  auto [dw1, db1, do2, db4] = g::grad(loss, w1, b1, o2, b4);
  BOOST_TEST(step(loss).count("matmul") == 2u);
  const auto& st = step(loss, dw1, db1, do2, db4);
  BOOST_TEST(st.count("matmul") == 2u + 3u);
  BOOST_TEST(st.count("softmax_cross_entropy") == 1u);  // the forward value, reused
}

BOOST_FIXTURE_TEST_CASE(three_layers, fixture) {
  auto h1 = g::relu(g::matmul(x, w1) + b1);
  auto h2 = g::tanh(g::matmul(h1, w2) + b2);
  auto loss = xent(g::matmul(h2, o3) + b4);
  auto [dw1, db1, dw2, db2, do3, db4] = g::grad(loss, w1, b1, w2, b2, o3, b4);
  BOOST_TEST(step(loss).count("matmul") == 3u);
  BOOST_TEST(step(loss, dw1, db1, dw2, db2, do3, db4).count("matmul") == 3u + 5u);
}

BOOST_FIXTURE_TEST_CASE(four_layers, fixture) {
  auto h1 = g::relu(g::matmul(x, w1) + b1);
  auto h2 = g::sigmoid(g::matmul(h1, w2) + b2);
  auto h3 = g::relu(g::matmul(h2, w3) + b3);
  auto loss = xent(g::matmul(h3, w4) + b4);
  auto [dw1, db1, dw2, db2, dw3, db3, dw4, db4] = g::grad(loss, w1, b1, w2, b2, w3, b3, w4, b4);
  BOOST_TEST(step(loss).count("matmul") == 4u);
  const auto& st = step(loss, dw1, db1, dw2, db2, dw3, db3, dw4, db4);
  BOOST_TEST(st.count("matmul") == 4u + 7u);
  // no transpose is ever copied: every one is a GEMM flag
  BOOST_TEST(st.count("permute") == 0u);
}

// Only the weights of the first layer: the chain down to it still needs every
// activation gradient, but no other weight gradient.
BOOST_FIXTURE_TEST_CASE(first_layer_only, fixture) {
  auto h1 = g::relu(g::matmul(x, w1) + b1);
  auto h2 = g::tanh(g::matmul(h1, w2) + b2);
  auto loss = xent(g::matmul(h2, o3) + b4);
  BOOST_TEST(step(loss, g::grad(loss, w1)).count("matmul") == 3u + 3u);
}
