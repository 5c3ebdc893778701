#define BOOST_TEST_MODULE nn_losses_dense
// nn::dense (variables named by the layer, forward vs a plain loop), the losses against
// plain-loop values and finite differences (double, central differences, < 1e-6), and
// the host metrics against hand counts.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "../support/finite_difference.hpp"

namespace g = gradus;
using gradus_test::check_gradients;
using gradus_test::set_random;

static_assert((g::fixed_string("fc1") + "/w").view() == "fc1/w");
static_assert((g::fixed_string("a") + g::fixed_string("bc")).view() == "abc");

BOOST_AUTO_TEST_CASE(dense_names_and_forward) {
  g::nn::dense<"enc/fc1", 3, 2> fc;
  static_assert(decltype(fc.w)::name.view() == "enc/fc1/w");
  static_assert(decltype(fc.b)::name.view() == "enc/fc1/b");
  g::placeholder<"x", float, g::dyn, 3> x;
  g::session<g::cpu_simd> s;
  fc.initialize(s, 5);
  const std::vector<float> w{1, -1, 0.5f, 2, -2, 1}, b{0.25f, -3}, xs{1, 2, 3, -1, 0, 4};
  g::assign(s, fc.w, g::view(w.data(), {3, 2}));
  g::assign(s, fc.b, g::view(b.data(), {2}));
  const auto y = s.run(fc(x), x = g::view(xs.data(), {2, 3}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) {
      float r = b[static_cast<std::size_t>(j)];
      for (int k = 0; k < 3; ++k) r += xs[static_cast<std::size_t>(i * 3 + k)] * w[static_cast<std::size_t>(k * 2 + j)];
      BOOST_TEST(y[i * 2 + j] == r);
    }
  // initialize: he_normal weights (not all zero, seeded), zero bias
  g::session<g::cpu_simd> t, u;
  fc.initialize(t, 9);
  fc.initialize(u, 9);
  BOOST_TEST(g::value(t, fc.w)[0] == g::value(u, fc.w)[0]);
  BOOST_TEST(g::value(t, fc.w)[0] != 0.f);
  BOOST_TEST(g::value(t, fc.b)[1] == 0.f);
}

BOOST_AUTO_TEST_CASE(loss_values) {
  g::placeholder<"p", double, g::dyn> p;
  g::placeholder<"q", double, g::dyn> q;
  const std::vector<double> a{0.5, -2, 30, -40, 0}, y{1, 0, 1, 0, 0.25};
  g::session<g::cpu_simd> s;
  const double mse = s.run(g::nn::mse(p, q), p = g::view(a.data(), {5}), q = g::view(y.data(), {5}))[0];
  double ref = 0;
  for (std::size_t i = 0; i < 5; ++i) ref += (a[i] - y[i]) * (a[i] - y[i]) / 5;
  BOOST_TEST(mse == ref, boost::test_tools::tolerance(1e-14));
  // -y log sigmoid(z) - (1 - y) log(1 - sigmoid(z)), stable for |z| = 30, 40
  const double bce = s.run(g::nn::binary_cross_entropy_with_logits(p, q), p = g::view(a.data(), {5}),
                           q = g::view(y.data(), {5}))[0];
  ref = 0;
  for (std::size_t i = 0; i < 5; ++i) {
    const double log_sig = -std::log1p(std::exp(-a[i])), log_one_minus = -a[i] - std::log1p(std::exp(-a[i]));
    ref += -(y[i] * log_sig + (1 - y[i]) * log_one_minus) / 5;
  }
  BOOST_TEST(std::isfinite(bce));
  BOOST_TEST(bce == ref, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(loss_gradients_by_finite_differences) {
  gradus_test::session s;
  g::nn::dense<"fc", 4, 3, double> fc;
  g::variable<"target", double, 5, 3> t;
  g::variable<"z", double, 7> z;
  g::variable<"y01", double, 7> y01;
  set_random(s, fc.w, -1, 1);
  set_random(s, fc.b, -1, 1);
  set_random(s, t, -1, 1);
  set_random(s, z, -5, 5);
  set_random(s, y01, 0, 1);
  const std::vector<double> xs = [] {
    std::vector<double> v(20);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.7 * double(i));
    return v;
  }();
  // the input is a constant (fd_error runs the loss without feeds)
  const auto xc = g::constant(xt::xtensor<double, 2>(xt::adapt(xs, std::array<std::size_t, 2>{5, 4})));
  check_gradients(s, g::nn::mse(g::tanh(fc(xc)), t), fc.w, fc.b, t);
  check_gradients(s, g::nn::binary_cross_entropy_with_logits(z * 2.0, y01), z, y01);
}

BOOST_AUTO_TEST_CASE(metrics) {
  // rows: argmax 2, 0 (tie 0/1 -> first), 1, 1
  const std::vector<float> sc{0.1f, 0.2f, 0.7f, 0.5f, 0.5f, 0.0f, -1, 3, 2, 0, 1, 0};
  const std::vector<std::int32_t> lab{2, 1, 1, 0};
  const g::tensor_view<const float> scores{sc.data(), g::dims{4, 3}};
  const g::tensor_view<const std::int32_t> labels{lab.data(), g::dims{4}};
  BOOST_TEST(g::nn::accuracy(scores, labels) == 0.5);
  std::vector<std::int64_t> cm;
  g::nn::confusion_matrix(scores, labels, cm);
  g::nn::confusion_matrix(scores, labels, cm);  // accumulates
  const std::vector<std::int64_t> want{0, 2, 0, 2, 2, 0, 0, 0, 2};  // [true][pred]
  BOOST_TEST(cm == want, boost::test_tools::per_element());
  const std::vector<std::int32_t> bad{2, 1, 3, 0};
  try {
    g::nn::accuracy(scores, g::tensor_view<const std::int32_t>{bad.data(), g::dims{4}});
    BOOST_FAIL("no error");
  } catch (const g::index_error& e) {
    BOOST_TEST(std::string(e.what()).find("accuracy: label 3 at position 2 is outside [0, 3)") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(metrics_take_xtensor_scores_and_labels_of_any_integer_type) {
  // the rows of `metrics` above: argmax 2, 0, 1, 1
  const xt::xtensor<float, 2> scores{{0.1f, 0.2f, 0.7f}, {0.5f, 0.5f, 0.0f}, {-1, 3, 2}, {0, 1, 0}};
  BOOST_TEST(g::nn::accuracy(scores, xt::xtensor<std::int32_t, 1>{2, 1, 1, 0}) == 0.5);
  BOOST_TEST(g::nn::accuracy(scores, xt::xtensor<std::int64_t, 1>{2, 0, 1, 1}) == 1.0);
  BOOST_TEST(g::nn::accuracy(scores, xt::xtensor<std::uint8_t, 1>{0, 0, 0, 0}) == 0.25);
  std::vector<std::int64_t> cm;
  g::nn::confusion_matrix(scores, xt::xtensor<std::int64_t, 1>{2, 1, 1, 0}, cm);
  const std::vector<std::int64_t> want{0, 1, 0, 1, 1, 0, 0, 0, 1};
  BOOST_TEST(cm == want, boost::test_tools::per_element());
  try {
    (void)g::nn::accuracy(scores, xt::xtensor<std::uint32_t, 1>{2, 1, 7, 0});
    BOOST_FAIL("no error");
  } catch (const g::index_error& e) {
    BOOST_TEST(std::string(e.what()).find("accuracy: label 7 at position 2 is outside [0, 3)") != std::string::npos);
  }
  try {
    (void)g::nn::accuracy(scores, xt::xtensor<std::int32_t, 1>{2, 1, 1});
    BOOST_FAIL("no error");
  } catch (const g::shape_error& e) {
    BOOST_TEST(std::string(e.what()).find("accuracy: 4 predictions but labels of shape (3,)") != std::string::npos);
  }
}

// predictions (so accuracy) choose as g::argmax does: a NaN never wins over a number, wherever
// it is in the row (a row of NaNs answers 0); scores without classes are refused
BOOST_AUTO_TEST_CASE(predictions_never_choose_a_nan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const xt::xtensor<float, 2> scores{{nan, 0.2f, 0.7f}, {0.5f, nan, 0.9f}, {-1, 3, nan}, {nan, nan, nan}};
  const std::vector<std::int32_t> want{2, 2, 1, 0};
  BOOST_TEST(g::nn::predictions(scores) == want, boost::test_tools::per_element());
  g::session<g::cpu_simd> s;
  g::placeholder<"z", float, 4, 3> z;
  const auto am = s.run(g::argmax<1>(z), z = g::view(scores.data(), {4, 3}));
  BOOST_TEST(std::vector<std::int32_t>(am.begin(), am.end()) == want, boost::test_tools::per_element());
  BOOST_TEST(g::nn::accuracy(scores, xt::xtensor<std::int32_t, 1>{2, 2, 1, 1}) == 0.75);
  try {
    (void)g::nn::predictions(xt::xtensor<float, 2>::from_shape({2, 0}));
    BOOST_FAIL("no error");
  } catch (const g::shape_error& e) {
    BOOST_TEST(std::string(e.what()) == "gradus: predictions: scores of (2, 0) have no classes");
  }
}
