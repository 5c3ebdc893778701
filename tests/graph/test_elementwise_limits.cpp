// Elementwise passes at their limits: extreme values (no NaN where the math has none,
// exact limits), zero-size feeds, and passes large enough to run multi-threaded.
#define BOOST_TEST_MODULE graph_elementwise_limits
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

BOOST_AUTO_TEST_CASE_TEMPLATE(unary_ops_of_extreme_values, T, real_types) {
  // Each extreme appears in SIMD lanes and in the scalar tail (37 = 2*16 + 5 floats).
  const std::vector<double> extremes = {1e30, -1e30, 1000, -1000, 80, -80, 0, -0.0, 1e-30, -1e-30, 30, -30};
  std::vector<T> xv(37);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<T>(extremes[i % extremes.size()]);
  const auto xt = tensor<T, 1>({xv.size()}, xv);
  g::placeholder<"x", T, g::dyn> x;
  g::session<g::cpu_simd> s;
  const auto [ex, sg, sp, el, el5, th, re, lg, l1, sq] =
      s.run(g::exp(x), g::sigmoid(x), g::softplus(x), g::elu(x), g::elu(x, 0.5), g::tanh(x), g::relu(x),
            g::log(g::abs(x)), g::log1p(g::abs(x)), g::sqrt(g::abs(x)), x = xt);
  check_map<T>("exp", ex, xv, [](double v) { return std::exp(v); }, false);
  check_map<T>("sigmoid", sg, xv, sigmoid_ref, false);
  check_map<T>("softplus", sp, xv, softplus_ref, false);
  check_map<T>("elu", el, xv, [](double v) { return elu_ref(v, 1.0); }, false);
  check_map<T>("elu(0.5)", el5, xv, [](double v) { return elu_ref(v, 0.5); }, false);
  check_map<T>("tanh", th, xv, [](double v) { return std::tanh(v); }, false);
  check_map<T>("relu", re, xv, [](double v) { return v > 0 ? v : 0.0; }, false);
  check_map<T>("log(abs)", lg, xv, [](double v) { return std::log(std::abs(v)); }, false);
  check_map<T>("log1p(abs)", l1, xv, [](double v) { return std::log1p(std::abs(v)); }, false);
  check_map<T>("sqrt(abs)", sq, xv, [](double v) { return std::sqrt(std::abs(v)); }, false);

  // The limits named by the math, exactly.
  for (std::size_t i = 0; i < xv.size(); ++i) {
    const auto k = static_cast<g::index_t>(i);
    if (xv[i] == T(-1000)) {
      BOOST_TEST(sg[k] == T(0));
      BOOST_TEST(sp[k] == T(0));
      BOOST_TEST(el5[k] == T(-0.5));
      BOOST_TEST(ex[k] == T(0));
      BOOST_TEST(th[k] == T(-1));
    }
    if (xv[i] == T(1000)) {
      BOOST_TEST(sg[k] == T(1));
      BOOST_TEST(sp[k] == T(1000));
      BOOST_TEST(el[k] == T(1000));
      BOOST_TEST(std::isinf(ex[k]));
      BOOST_TEST(th[k] == T(1));
    }
    if (xv[i] == T(1e30)) BOOST_TEST(sp[k] == T(1e30));
    if (xv[i] == T(0)) BOOST_TEST(std::isinf(lg[k]));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_size_feeds_give_zero_size_results, T, real_types) {
  g::placeholder<"x", T, g::dyn, 4> x;
  g::placeholder<"b", T, 4> b;
  g::session<g::cpu_simd> s;
  const xt::xtensor<T, 2> empty(std::array<std::size_t, 2>{0, 4});
  const auto bt = random_tensor<T, 1>({4});
  const auto r = s.run(g::exp(x) * b + 1, x = empty, b = bt);
  BOOST_TEST(same_shape(r, {0, 4}));
  BOOST_TEST(r.size() == 0);
  // The same graph then runs on a non-empty feed, and again on an empty one.
  const auto xt = random_tensor<T, 2>({2, 4});
  const auto r2 = s.run(g::exp(x) * b + 1, x = xt, b = bt);
  BOOST_TEST(same_shape(r2, {2, 4}));
  std::vector<double> want(8);
  for (std::size_t i = 0; i < 8; ++i) want[i] = std::exp(double(xt.data()[i])) * bt.data()[i % 4] + 1;
  BOOST_TEST(close(r2, want, 2 * rtol<T>()));
  BOOST_TEST(same_shape(s.run(g::exp(x) * b + 1, x = empty, b = bt), {0, 4}));

  g::placeholder<"y", T, g::dyn, g::dyn> y;
  const xt::xtensor<T, 2> empty2(std::array<std::size_t, 2>{4, 0});
  BOOST_TEST(same_shape(s.run(g::relu(y) - 1, y = empty2), {4, 0}));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(large_passes_run_threaded_and_match, T, real_types) {
  // > 2^16 elements: the threaded path, as rows of a bias add, one long flat row split
  // into pieces, and rows longer than a piece.
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn> b;
  g::session<g::cpu_simd> s;
  const auto e = a * b + g::exp(-g::square(a));
  const std::pair<std::size_t, std::size_t> shapes[] = {{600, 201}, {1, 70001}, {3, 40000}, {70001, 1}};
  for (auto [n, m] : shapes) {
    const auto av = uniform<T>(n * m, -2, 2), bv = uniform<T>(m, -2, 2);
    const auto r = s.run(e, a = tensor<T, 2>({n, m}, av), b = tensor<T, 1>({m}, bv));
    BOOST_TEST(same_shape(r, {long(n), long(m)}));
    std::vector<double> want(n * m);
    for (std::size_t i = 0; i < n * m; ++i) {
      const double x = av[i];
      want[i] = x * bv[i % m] + std::exp(-x * x);
    }
    BOOST_TEST(close(r, want, 2 * rtol<T>(), {}, 2 * rtol<T>()), "shape " << n << "x" << m);
  }
}
