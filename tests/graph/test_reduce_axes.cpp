// Reductions of rank 3 (middle and negative axes), of zero-size operands (sum 0, mean
// NaN, max/min/argmax a shape_error), and of fused expressions, against plain loops.
#define BOOST_TEST_MODULE graph_reduce_axes
#include "../support/reduce_reference.hpp"

BOOST_AUTO_TEST_CASE_TEMPLATE(rank3_middle_axis_and_negative_axes, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  const shape_v shapes[] = {{3, 17, 5}, {2, 1, 7}, {4, 16, 33}, {1, 1023, 3}, {5, 7, 1}, {1, 1, 1}};
  for (const auto& sh : shapes)
    for (int pass = 0; pass < 2; ++pass) {
      const auto xv = pass == 0 ? uniform<T>(numel(sh), -1, 1) : discrete<T>(numel(sh), -2, 2);
      const auto xt = as_tensor<T, 3>(sh, xv);
      const auto rs = s.run(g::sum<0>(x), g::sum<1>(x), g::sum<2>(x), g::mean<1>(x), g::max<1>(x), g::min<2>(x),
                            g::argmax<1>(x), g::argmax<0>(x), g::sum<-1, true>(x), g::sum<1, true>(x), g::sum(x),
                            g::max<-3>(x), g::argmax<-2, true>(x), x = xt);
      check(std::get<0>(rs), rk::sum, 0, false, xv, sh);
      check(std::get<1>(rs), rk::sum, 1, false, xv, sh);
      check(std::get<2>(rs), rk::sum, 2, false, xv, sh);
      check(std::get<3>(rs), rk::mean, 1, false, xv, sh);
      check(std::get<4>(rs), rk::max, 1, false, xv, sh);
      check(std::get<5>(rs), rk::min, 2, false, xv, sh);
      check(std::get<6>(rs), rk::argmax, 1, false, xv, sh);
      check(std::get<7>(rs), rk::argmax, 0, false, xv, sh);
      check(std::get<8>(rs), rk::sum, 2, true, xv, sh);
      check(std::get<9>(rs), rk::sum, 1, true, xv, sh);
      check(std::get<10>(rs), rk::sum, all, false, xv, sh);
      check(std::get<11>(rs), rk::max, 0, false, xv, sh);
      check(std::get<12>(rs), rk::argmax, 1, true, xv, sh);
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_size_reductions, T, real_types) {
  g::placeholder<"x", T, g::dyn, 4> x;
  g::session<g::cpu_simd> s;
  const xt::xtensor<T, 2> empty(std::array<std::size_t, 2>{0, 4});
  const auto [s0, s1, sa, m0, mx1, am1] =
      s.run(g::sum<0>(x), g::sum<1>(x), g::sum(x), g::mean<0>(x), g::max<1>(x), g::argmax<1>(x), x = empty);
  BOOST_TEST(same_shape(s0, {4}));
  BOOST_TEST(equal(s0, std::vector<double>{0, 0, 0, 0}));
  BOOST_TEST(same_shape(s1, {0}));
  BOOST_TEST(sa.shape().rank == 0u);
  BOOST_TEST(sa[0] == T(0));
  BOOST_TEST(same_shape(m0, {4}));  // mean of nothing: NaN, as NumPy
  for (g::index_t i = 0; i < 4; ++i) BOOST_TEST(std::isnan(m0[i]));
  BOOST_TEST(same_shape(mx1, {0}));
  BOOST_TEST(same_shape(am1, {0}));
  // max / min / argmax of zero elements have no identity: a shape_error names the op.
  auto throws_naming = [&](auto expr, const std::string& op) {
    try {
      s.run(expr, x = empty);
      BOOST_ERROR(op << " of (0, 4) over axis 0 did not throw");
    } catch (const g::shape_error& e) {
      BOOST_TEST(std::string(e.what()).find(op) != std::string::npos, e.what());
      BOOST_TEST(std::string(e.what()).find("(0, 4)") != std::string::npos, e.what());
    }
  };
  throws_naming(g::max<0>(x), "max");
  throws_naming(g::min<0>(x), "min");
  throws_naming(g::argmax<0>(x), "argmax");
  // After the zero-size run, the same graph reduces real data.
  const auto xv = uniform<T>(12, -1, 1);
  const auto r = s.run(g::sum<0>(x), g::sum<1>(x), g::sum(x), g::mean<0>(x), g::max<1>(x), g::argmax<1>(x),
                       x = tensor<T, 2>({3, 4}, xv));
  check(std::get<0>(r), rk::sum, 0, false, xv, {3, 4});
  check(std::get<4>(r), rk::max, 1, false, xv, {3, 4});
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduction_of_a_fused_expression, T, real_types) {
  // sum<1>(exp(x) * b) and mean(square(x - mean<1, keep>(x))): reductions read fused passes.
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::placeholder<"b", T, g::dyn> b;
  g::session<g::cpu_simd> s;
  const std::size_t n = 9, c = 37;
  const auto xv = uniform<T>(n * c, -1, 1), bv = uniform<T>(c, -1, 1);
  const auto [r1, r2] = s.run(g::sum<1>(g::exp(x) * b), g::mean(g::square(x - g::mean<1, true>(x))),
                              x = tensor<T, 2>({n, c}, xv), b = tensor<T, 1>({c}, bv));
  std::vector<double> w1(n), s1(n);
  double var = 0, var_scale = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double m = 0;
    for (std::size_t j = 0; j < c; ++j) {
      const double t = std::exp(double(xv[i * c + j])) * bv[j];
      w1[i] += t;
      s1[i] += std::abs(t);
      m += xv[i * c + j];
    }
    m /= c;
    for (std::size_t j = 0; j < c; ++j) {
      const double d = xv[i * c + j] - m;
      var += d * d;
      var_scale += d * d + std::abs(d);
    }
  }
  BOOST_TEST(same_shape(r1, {long(n)}));
  BOOST_TEST(close(r1, w1, 2 * rtol<T>(), s1));
  BOOST_TEST(close(r2, std::vector<double>{var / double(n * c)}, 4 * rtol<T>(), {var_scale / double(n * c)}));
}
