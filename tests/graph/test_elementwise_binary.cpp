// Every binary elementwise op (arithmetic, maximum/minimum, pow, comparisons, where) on
// two rank-2 operands under each broadcasting pattern, against plain loops in double.
#define BOOST_TEST_MODULE graph_elementwise_binary
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

BOOST_AUTO_TEST_CASE_TEMPLATE(every_binary_op_under_rank2_broadcasting, T, real_types) {
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn, g::dyn> b;
  g::session<g::cpu_simd> s;
  const bcast_case cases[] = {
      {{7, 5}, {7, 5}, {7, 5}},       {{7, 5}, {1, 5}, {7, 5}},       {{7, 1}, {1, 5}, {7, 5}},
      {{1, 1}, {7, 5}, {7, 5}},       {{7, 5}, {7, 1}, {7, 5}},       {{1, 17}, {3, 1}, {3, 17}},
      {{33, 17}, {33, 17}, {33, 17}}, {{2, 1023}, {1, 1023}, {2, 1023}}, {{1, 1}, {1, 1}, {1, 1}},
      {{16, 16}, {16, 1}, {16, 16}},  {{9, 1}, {9, 31}, {9, 31}},     {{7, 1}, {1, 1}, {7, 1}},
      {{1, 5}, {1, 1}, {1, 5}},       {{1, 23}, {1, 23}, {1, 23}}};
  const auto outputs = [&](const auto& at, const auto& bt) {
    return s.run(a + b, a - b, a * b, a / b, g::maximum(a, b), g::minimum(a, b), g::pow(g::abs(a) + 0.5, b), a < b,
                 g::less_equal(a, b), a > b, g::greater_equal(a, b), g::equal(a, b), g::not_equal(a, b),
                 g::where(g::greater(a, b), a, b * 2), a = at, b = bt);
  };
  for (const auto& c : cases) {
    const std::string label = "a" + std::to_string(c.a[0]) + "x" + std::to_string(c.a[1]) +
                              " b" + std::to_string(c.b[0]) + "x" + std::to_string(c.b[1]);
    {  // continuous values: every op
      const auto av = uniform<T>(numel(c.a), -2, 2), bv = nonzero<T>(numel(c.b));
      const auto at = as_tensor<T, 2>(c.a, av), bt = as_tensor<T, 2>(c.b, bv);
      const auto rs = outputs(at, bt);
      const double tol = rtol<T>();
      BOOST_TEST(shape_is(std::get<0>(rs), c.out), label);
      BOOST_TEST(close(std::get<0>(rs), ref2(c, av, bv, [](double x, double y) { return x + y; }), tol), "add " << label);
      BOOST_TEST(close(std::get<1>(rs), ref2(c, av, bv, [](double x, double y) { return x - y; }), tol), "sub " << label);
      BOOST_TEST(close(std::get<2>(rs), ref2(c, av, bv, [](double x, double y) { return x * y; }), tol), "mul " << label);
      BOOST_TEST(close(std::get<3>(rs), ref2(c, av, bv, [](double x, double y) { return x / y; }), tol), "div " << label);
      BOOST_TEST(close(std::get<4>(rs), ref2(c, av, bv, [](double x, double y) { return std::max(x, y); }), 0.0),
                 "maximum " << label);
      BOOST_TEST(close(std::get<5>(rs), ref2(c, av, bv, [](double x, double y) { return std::min(x, y); }), 0.0),
                 "minimum " << label);
      // the base is rounded to T first, as the fused pass does
      const auto pw = ref2(c, av, bv, [](double x, double y) {
        return std::pow(static_cast<double>(static_cast<T>(std::abs(x) + 0.5)), y);
      });
      BOOST_TEST(close(std::get<6>(rs), pw, 4 * tol), "pow " << label);
      BOOST_TEST(equal(std::get<7>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x < y); })), "< " << label);
      BOOST_TEST(equal(std::get<9>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x > y); })), "> " << label);
      BOOST_TEST(close(std::get<13>(rs), ref2(c, av, bv, [](double x, double y) { return x > y ? x : 2 * y; }), 0.0),
                 "where " << label);
    }
    {  // values in {-1, 0, 1}: comparisons with ties
      const auto av = discrete<T>(numel(c.a), -1, 1), bv = discrete<T>(numel(c.b), -1, 1);
      const auto at = as_tensor<T, 2>(c.a, av), bt = as_tensor<T, 2>(c.b, bv);
      const auto rs = outputs(at, bt);
      BOOST_TEST(equal(std::get<4>(rs), ref2(c, av, bv, [](double x, double y) { return std::max(x, y); })),
                 "maximum " << label);
      BOOST_TEST(equal(std::get<5>(rs), ref2(c, av, bv, [](double x, double y) { return std::min(x, y); })),
                 "minimum " << label);
      BOOST_TEST(equal(std::get<7>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x < y); })), "< " << label);
      BOOST_TEST(equal(std::get<8>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x <= y); })),
                 "<= " << label);
      BOOST_TEST(equal(std::get<9>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x > y); })), "> " << label);
      BOOST_TEST(equal(std::get<10>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x >= y); })),
                 ">= " << label);
      BOOST_TEST(equal(std::get<11>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x == y); })),
                 "equal " << label);
      BOOST_TEST(equal(std::get<12>(rs), ref2(c, av, bv, [](double x, double y) { return b2d(x != y); })),
                 "not_equal " << label);
      BOOST_TEST(equal(std::get<13>(rs), ref2(c, av, bv, [](double x, double y) { return x > y ? x : 2 * y; })),
                 "where " << label);
    }
  }
}

