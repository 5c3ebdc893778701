// Binary elementwise ops with a plain number on either side (the number adopts the
// expression's dtype), against plain loops in double.
#define BOOST_TEST_MODULE graph_elementwise_scalar
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

BOOST_AUTO_TEST_CASE_TEMPLATE(scalar_operands_on_either_side, T, real_types) {
  g::placeholder<"x", T, g::dyn> x;
  g::session<g::cpu_simd> s;
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(16), std::size_t(17), std::size_t(1023)}) {
    const auto xv = nonzero<T>(n);
    const auto xt = tensor<T, 1>({n}, xv);
    const auto rs = s.run(x + 2, 2 - x, x * 0.5, 3 / x, g::maximum(x, 0.25), g::minimum(0.25, x), g::pow(x, 2),
                          g::pow(2, x), x < 0.5, 0.5 <= x, g::where(x > 0, x, 0.1 * x), g::where(x > 1, 1, 0),
                          x - x / 4, x = xt);
    const T q = T(0.1);
    std::vector<double> w(n);
    auto want = [&](auto f) {
      for (std::size_t i = 0; i < n; ++i) w[i] = f(static_cast<double>(xv[i]));
      return w;
    };
    const double tol = rtol<T>();
    BOOST_TEST(close(std::get<0>(rs), want([](double v) { return v + 2; }), tol));
    BOOST_TEST(close(std::get<1>(rs), want([](double v) { return 2 - v; }), tol));
    BOOST_TEST(close(std::get<2>(rs), want([](double v) { return v * 0.5; }), tol));
    BOOST_TEST(close(std::get<3>(rs), want([](double v) { return 3 / v; }), tol));
    BOOST_TEST(equal(std::get<4>(rs), want([](double v) { return std::max(v, 0.25); })));
    BOOST_TEST(equal(std::get<5>(rs), want([](double v) { return std::min(v, 0.25); })));
    BOOST_TEST(close(std::get<6>(rs), want([](double v) { return v * v; }), 2 * tol), "pow(x, 2), x of either sign");
    BOOST_TEST(close(std::get<7>(rs), want([](double v) { return std::pow(2.0, v); }), 2 * tol));
    BOOST_TEST(equal(std::get<8>(rs), want([](double v) { return b2d(v < 0.5); })));
    BOOST_TEST(equal(std::get<9>(rs), want([](double v) { return b2d(0.5 <= v); })));
    BOOST_TEST(close(std::get<10>(rs), want([q](double v) { return v > 0 ? v : double(q) * v; }), tol));
    BOOST_TEST(equal(std::get<11>(rs), want([](double v) { return b2d(v > 1); })));
    BOOST_TEST(close(std::get<12>(rs), want([](double v) { return v - v / 4; }), 2 * tol));
  }
}

