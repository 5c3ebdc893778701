// Fused elementwise chains and the leaves they read (constants, scalar constants,
// variables), several outputs of one run, rank-0 passes, against plain loops in double.
#define BOOST_TEST_MODULE graph_elementwise_fused
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

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
  g::assign(s, w, tensor<T, 2>({2, 3}, wv));
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
  BOOST_TEST(equal(g::value(s, w), std::vector<T>(wv)));

  // Another graph runs in between: the first run's results stay valid (their buffers
  // belong to that graph) until it runs again; a re-assigned variable is read anew.
  const auto other = s.run(g::exp(w) * 0);
  BOOST_TEST(equal(other, std::vector<double>(6, 0.0)));
  BOOST_TEST(close(r1, w1, rtol<T>(), {}, rtol<T>()));
  BOOST_TEST(close(r2, w2, rtol<T>()));
  const auto wv2 = uniform<T>(6, -1, 1);
  g::assign(s, w, tensor<T, 2>({2, 3}, wv2));
  const auto [q1, q2, q3] = s.run(x + w, g::exp(w), x, x = xt);
  for (std::size_t i = 0; i < 6; ++i) {
    w1[i] = double(xv[i]) + wv2[i];
    w2[i] = std::exp(double(wv2[i]));
  }
  BOOST_TEST(close(q1, w1, rtol<T>(), {}, rtol<T>()));
  BOOST_TEST(close(q2, w2, rtol<T>()));
  BOOST_TEST(equal(q3, w3));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(rank0_passes_over_reductions, T, real_types) {
  // sum(x) * 2 + max(x) is a fused pass of rank 0; mean(x) - sum<0>(x) broadcasts a
  // rank-0 value against rank 1; a constant alone is a pass of rank 0 too.
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  const std::size_t n = 5, c = 19;
  const auto xv = uniform<T>(n * c, -1, 1);
  const auto [r0, r1, r2] = s.run(g::sum(x) * 2 + g::max(x), g::mean(x) - g::sum<0>(x), g::constant(T(3)) * 2,
                                  x = tensor<T, 2>({n, c}, xv));
  double sum = 0, abs_sum = 0, mx = -1e300;
  std::vector<double> col(c, 0.0), col_abs(c, 0.0);
  for (std::size_t i = 0; i < n * c; ++i) {
    sum += xv[i];
    abs_sum += std::abs(double(xv[i]));
    mx = std::max(mx, double(xv[i]));
    col[i % c] += xv[i];
    col_abs[i % c] += std::abs(double(xv[i]));
  }
  BOOST_TEST(r0.shape().rank == 0u);
  BOOST_TEST(close(r0, std::vector<double>{2 * sum + mx}, rtol<T>(), {2 * abs_sum + 1}));
  std::vector<double> want(c), scale(c);
  for (std::size_t j = 0; j < c; ++j) {
    want[j] = sum / double(n * c) - col[j];
    scale[j] = abs_sum / double(n * c) + col_abs[j];
  }
  BOOST_TEST(same_shape(r1, {long(c)}));
  BOOST_TEST(close(r1, want, rtol<T>(), scale));
  BOOST_TEST(r2.shape().rank == 0u);
  BOOST_TEST(r2[0] == T(6));
}

