// Unary elementwise ops, fused chains and leaves (constants, scalars, variables),
// against plain loops in double. Limits (extremes, zero size, threads): test_elementwise_limits.
#define BOOST_TEST_MODULE graph_elementwise
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

// Sizes around the SIMD width (16 floats / 8 doubles with AVX-512) and beyond.
constexpr std::size_t sizes[] = {1, 7, 8, 15, 16, 17, 33, 64, 1023};

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(unary_ops_match_loops, T, real_types) {
  // One graph computes every unary op (several outputs, one plan), fed inputs in each
  // op's domain: x in [-10, 10], w in [-30, 30], p in [1e-3, 100], u in [-0.9, 10].
  g::placeholder<"x", T, g::dyn> x;
  g::placeholder<"w", T, g::dyn> w;
  g::placeholder<"p", T, g::dyn> p;
  g::placeholder<"u", T, g::dyn> u;
  g::session<g::cpu_simd> s;
  for (std::size_t n : sizes) {
    const auto xv = uniform<T>(n, -10, 10), wv = uniform<T>(n, -30, 30), pv = uniform<T>(n, 1e-3, 100),
               uv = uniform<T>(n, -0.9, 10);
    const auto xt = tensor<T, 1>({n}, xv), wt = tensor<T, 1>({n}, wv), pt = tensor<T, 1>({n}, pv),
               ut = tensor<T, 1>({n}, uv);
    const auto rs = s.run(-x, g::neg(x), g::exp(x), g::log(p), g::log1p(u), g::sqrt(p), g::rsqrt(p), g::abs(x),
                          g::square(x), g::tanh(x), g::sigmoid(w), g::relu(x), g::softplus(w), g::leaky_relu(x),
                          g::leaky_relu(x, 0.2), g::elu(x), g::elu(x, 0.5), g::clamp(x, -0.25, 0.5), x = xt, w = wt,
                          p = pt, u = ut);
    const double a02 = static_cast<double>(T(0.2));
    check_map<T>("neg", std::get<0>(rs), xv, [](double v) { return -v; });
    check_map<T>("neg()", std::get<1>(rs), xv, [](double v) { return -v; });
    check_map<T>("exp", std::get<2>(rs), xv, [](double v) { return std::exp(v); });
    check_map<T>("log", std::get<3>(rs), pv, [](double v) { return std::log(v); });
    check_map<T>("log1p", std::get<4>(rs), uv, [](double v) { return std::log1p(v); });
    check_map<T>("sqrt", std::get<5>(rs), pv, [](double v) { return std::sqrt(v); });
    check_map<T>("rsqrt", std::get<6>(rs), pv, [](double v) { return 1.0 / std::sqrt(v); });
    check_map<T>("abs", std::get<7>(rs), xv, [](double v) { return std::abs(v); });
    check_map<T>("square", std::get<8>(rs), xv, [](double v) { return v * v; });
    check_map<T>("tanh", std::get<9>(rs), xv, [](double v) { return std::tanh(v); });
    check_map<T>("sigmoid", std::get<10>(rs), wv, sigmoid_ref);
    check_map<T>("relu", std::get<11>(rs), xv, [](double v) { return v > 0 ? v : 0.0; });
    check_map<T>("softplus", std::get<12>(rs), wv, softplus_ref);
    check_map<T>("leaky_relu", std::get<13>(rs), xv, [](double v) { return v > 0 ? v : 0.01 * v; });
    check_map<T>("leaky_relu(0.2)", std::get<14>(rs), xv, [a02](double v) { return v > 0 ? v : a02 * v; });
    check_map<T>("elu", std::get<15>(rs), xv, [](double v) { return elu_ref(v, 1.0); });
    check_map<T>("elu(0.5)", std::get<16>(rs), xv, [](double v) { return elu_ref(v, 0.5); });
    check_map<T>("clamp", std::get<17>(rs), xv, [](double v) { return std::min(std::max(v, -0.25), 0.5); });
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fused_chain_with_broadcast_and_scalars, T, real_types) {
  // sigmoid(a * b + 0.5) - tanh(a) / (1 + square(b)) + c, a [N, C], b [C], c scalar const
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn> b;
  const T c = T(0.25);
  const auto e = g::sigmoid(a * b + 0.5) - g::tanh(a) / (1 + g::square(b)) + g::constant(c);
  g::session<g::cpu_simd> s;
  const std::pair<std::size_t, std::size_t> shapes[] = {{1, 1}, {7, 1}, {1, 7}, {3, 17}, {5, 16}, {2, 1023}, {9, 33}};
  for (auto [n, m] : shapes) {
    const auto av = uniform<T>(n * m, -2, 2), bv = uniform<T>(m, -2, 2);
    const auto r = s.run(e, a = tensor<T, 2>({n, m}, av), b = tensor<T, 1>({m}, bv));
    BOOST_TEST(same_shape(r, {long(n), long(m)}));
    std::vector<double> want(n * m);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < m; ++j) {
        const double x = av[i * m + j], y = bv[j];
        want[i * m + j] = sigmoid_ref(x * y + 0.5) - std::tanh(x) / (1 + y * y) + double(c);
      }
    BOOST_TEST(close(r, want, 4 * rtol<T>(), {}, 4 * rtol<T>()), "shape " << n << "x" << m);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(constant_tensor_leaf, T, real_types) {
  const auto cv = uniform<T>(3 * 5, -1, 1);
  const auto ct = g::constant(tensor<T, 2>({3, 5}, cv));
  g::placeholder<"x", T, g::dyn, 5> x;
  g::session<g::cpu_simd> s;
  const auto xv = uniform<T>(3 * 5, -1, 1);
  const auto r = s.run(x * ct + ct, x = tensor<T, 2>({3, 5}, xv));
  BOOST_TEST(same_shape(r, {3, 5}));
  std::vector<double> want(15);
  for (std::size_t i = 0; i < 15; ++i) want[i] = double(xv[i]) * cv[i] + cv[i];
  BOOST_TEST(close(r, want, 2 * rtol<T>(), {}, rtol<T>()));

  // A constant alone is an output too, and a scalar constant broadcasts.
  const auto rc = s.run(ct * g::constant(T(2)));
  std::vector<double> want2(15);
  for (std::size_t i = 0; i < 15; ++i) want2[i] = 2.0 * cv[i];
  BOOST_TEST(close(rc, want2, rtol<T>()));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(variable_leaf_and_several_outputs, T, real_types) {
  g::variable<"w", T, 2, 3> w;
  g::placeholder<"x", T, g::dyn, 3> x;
  g::session<g::cpu_simd> s;
  const auto wv = uniform<T>(6, -1, 1), xv = uniform<T>(6, -1, 1);
  s.assign(w, tensor<T, 2>({2, 3}, wv));
  // x itself is an output: its view is the feed's own data, alive while xt is.
  const auto xt = tensor<T, 2>({2, 3}, xv);
  const auto [r1, r2, r3] = s.run(x + w, g::exp(w), x, x = xt);
  std::vector<double> w1(6), w2(6), w3(6);
  for (std::size_t i = 0; i < 6; ++i) {
    w1[i] = double(xv[i]) + wv[i];
    w2[i] = std::exp(double(wv[i]));
    w3[i] = xv[i];
  }
  BOOST_TEST(close(r1, w1, rtol<T>(), {}, rtol<T>()));
  BOOST_TEST(close(r2, w2, rtol<T>()));
  BOOST_TEST(equal(r3, w3));
  BOOST_TEST(same_shape(r2, {2, 3}));
  // A variable read back through the session is the assigned value.
  BOOST_TEST(equal(s.value(w), std::vector<T>(wv)));
}

