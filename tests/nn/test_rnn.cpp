#define BOOST_TEST_MODULE nn_rnn
// nn::lstm / nn::gru: variables named by the layer with the right shapes, PyTorch's
// uniform(-1/sqrt(H), 1/sqrt(H)) initialisation (seeded, per variable), the layer equal
// to the op on its variables, and a small sequence classifier (time_major -> lstm ->
// last_step -> dense) whose loss falls under Adam.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "../support/check.hpp"

namespace g = gradus;
using gradus_test::equal;
using gradus_test::same_shape;
using gradus_test::uniform;

namespace {
template <class T>
bool all_within(const g::tensor_view<const T>& v, double bound) {
  return std::all_of(v.begin(), v.end(), [&](T x) { return std::abs(double(x)) <= bound; });
}
template <class T>
double spread(const g::tensor_view<const T>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return double(*hi) - double(*lo);
}
}  // namespace

BOOST_AUTO_TEST_CASE(lstm_names_shapes_and_init) {
  g::nn::lstm<"enc/lstm1", 28, 16> l;
  static_assert(decltype(l.wx)::name.view() == "enc/lstm1/wx");
  static_assert(decltype(l.wh)::name.view() == "enc/lstm1/wh");
  static_assert(decltype(l.b)::name.view() == "enc/lstm1/b");
  static_assert(std::is_same_v<g::shape_t<decltype(l.wx)>, g::shape<28, 64>>);
  static_assert(std::is_same_v<g::shape_t<decltype(l.wh)>, g::shape<16, 64>>);
  static_assert(std::is_same_v<g::shape_t<decltype(l.b)>, g::shape<64>>);
  g::session<g::cpu_simd> s, t;
  l.initialize(s, 3);
  l.initialize(t, 3);
  const double k = 1 / std::sqrt(16.0);  // 0.25
  for (const auto& v : {g::value(s, l.wx), g::value(s, l.wh), g::value(s, l.b)}) {
    BOOST_TEST(all_within(v, k));
    BOOST_TEST(spread(v) > 1.5 * k);  // spread over the range, not a constant
  }
  BOOST_TEST(equal(g::value(s, l.wx), std::vector<float>(g::value(t, l.wx).begin(), g::value(t, l.wx).end())));  // seeded
  // wx and wh draw from different streams: wh's 16 x 64 values are not wx's first 16 rows
  const auto wx = g::value(s, l.wx), wh = g::value(s, l.wh);
  BOOST_TEST(!std::equal(wh.begin(), wh.end(), wx.begin()));

  // the layer is the op on its variables: [T, B, 28] -> [T, B, 16]
  gradus_test::dyn_placeholder<"xs", float, 3> xs;
  const auto xv = uniform<float>(5 * 2 * 28, -1, 1);
  const auto a = s.run(l(xs), xs = g::view(xv.data(), {5, 2, 28}));
  BOOST_TEST(same_shape(a, {5, 2, 16}));
  const std::vector<float> got(a.begin(), a.end());
  BOOST_TEST(equal(s.run(g::lstm(xs, l.wx, l.wh, l.b), xs = g::view(xv.data(), {5, 2, 28})), got));
}

BOOST_AUTO_TEST_CASE(gru_names_shapes_and_init) {
  g::nn::gru<"gru1", 8, 9, double> l;
  static_assert(decltype(l.wx)::name.view() == "gru1/wx");
  static_assert(decltype(l.wh)::name.view() == "gru1/wh");
  static_assert(decltype(l.bx)::name.view() == "gru1/bx");
  static_assert(decltype(l.bh)::name.view() == "gru1/bh");
  static_assert(std::is_same_v<g::shape_t<decltype(l.wx)>, g::shape<8, 27>>);
  static_assert(std::is_same_v<g::shape_t<decltype(l.wh)>, g::shape<9, 27>>);
  static_assert(std::is_same_v<g::shape_t<decltype(l.bh)>, g::shape<27>>);
  g::session<g::cpu_simd> s;
  l.initialize(s, 11);
  for (const auto& v : {g::value(s, l.wx), g::value(s, l.wh), g::value(s, l.bx), g::value(s, l.bh)}) {
    BOOST_TEST(all_within(v, 1 / 3.0));
    BOOST_TEST(spread(v) > 0.5);
  }
  gradus_test::dyn_placeholder<"xs", double, 3> xs;
  const auto xv = uniform<double>(4 * 3 * 8, -1, 1);
  BOOST_TEST(same_shape(s.run(l(xs), xs = g::view(xv.data(), {4, 3, 8})), {4, 3, 9}));
}

// Rows [B, T*I] -> time_major -> lstm -> last step -> dense: the class is whether the
// first step's first feature is positive, which only the recurrence carries to the end.
BOOST_AUTO_TEST_CASE(sequence_classifier_learns) {
  constexpr g::index_t T = 6, I = 3, Bn = 32;
  g::nn::lstm<"lstm1", I, 12> rnn;
  g::nn::dense<"fc", 12, 2> fc;
  g::placeholder<"x", float, g::dyn, T * I> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::session<g::cpu_simd> s;
  rnn.initialize(s, 1);
  fc.initialize(s, 2);
  const auto loss = g::mean(g::softmax_cross_entropy(fc(g::last_step(rnn(g::time_major<T, I>(x)))), y));
  auto step = g::minimize(s, loss, g::adam{.lr = 1e-2});
  const auto xv = uniform<float>(Bn * T * I, -1, 1);
  std::vector<std::int32_t> yv(Bn);
  for (g::index_t b = 0; b < Bn; ++b) yv[static_cast<std::size_t>(b)] = xv[static_cast<std::size_t>(b * T * I)] > 0;
  const auto feeds = [&] { return std::tuple{x = g::view(xv.data(), {Bn, T * I}), y = g::view(yv.data(), {Bn})}; };
  const float first = std::apply([&](const auto&... f) { return step.run(f...); }, feeds());
  float last = first;
  for (int i = 0; i < 150; ++i) last = std::apply([&](const auto&... f) { return step.run(f...); }, feeds());
  BOOST_TEST_MESSAGE("loss " << first << " -> " << last);
  BOOST_TEST(first > 0.5f);
  BOOST_TEST(last < 0.1f, "loss " << first << " -> " << last);
}
