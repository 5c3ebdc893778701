// Broadcasting between operands of different ranks and in the middle of rank 3 (also
// large enough to run threaded), and where() with broadcast masks, against plain loops.
#define BOOST_TEST_MODULE graph_elementwise_broadcast
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

BOOST_AUTO_TEST_CASE_TEMPLATE(rank2_with_rank1_operand, T, real_types) {
  // (N, C) + (C,), and (N, 1) against (C,) which broadcasts both ways.
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn> b;
  g::session<g::cpu_simd> s;
  const bcast_case cases[] = {{{7, 5}, {5}, {7, 5}},     {{1, 1}, {1}, {1, 1}},     {{3, 1023}, {1023}, {3, 1023}},
                              {{4, 17}, {1}, {4, 17}},   {{6, 1}, {16}, {6, 16}},   {{1, 33}, {33}, {1, 33}}};
  for (const auto& c : cases) {
    const auto av = uniform<T>(numel(c.a), -2, 2), bv = uniform<T>(numel(c.b), -2, 2);
    const auto [sum, prod, sel] =
        s.run(a + b, b * a, g::where(b < a, a, b), a = as_tensor<T, 2>(c.a, av), b = as_tensor<T, 1>(c.b, bv));
    BOOST_TEST(shape_is(sum, c.out));
    BOOST_TEST(shape_is(prod, c.out));
    BOOST_TEST(close(sum, ref2(c, av, bv, [](double x, double y) { return x + y; }), rtol<T>()));
    BOOST_TEST(close(prod, ref2(c, av, bv, [](double x, double y) { return x * y; }), rtol<T>()));
    BOOST_TEST(equal(sel, ref2(c, av, bv, [](double x, double y) { return y < x ? x : y; })));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(rank3_middle_and_mixed_broadcasts, T, real_types) {
  g::placeholder<"a", T, g::dyn, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn, g::dyn, g::dyn> b;
  g::placeholder<"m", T, g::dyn, g::dyn> m;
  g::session<g::cpu_simd> s;
  const bcast_case cases[] = {{{4, 1, 5}, {4, 3, 5}, {4, 3, 5}},     {{4, 3, 5}, {1, 3, 1}, {4, 3, 5}},
                              {{4, 3, 1}, {1, 1, 5}, {4, 3, 5}},     {{2, 3, 17}, {2, 3, 17}, {2, 3, 17}},
                              {{1, 1, 1}, {3, 7, 16}, {3, 7, 16}},   {{5, 1, 33}, {1, 7, 1}, {5, 7, 33}},
                              {{2, 9, 1}, {2, 1, 1023}, {2, 9, 1023}},
                              // threaded: 480 rows of 500; rows longer than a piece
                              {{16, 1, 500}, {16, 30, 500}, {16, 30, 500}},
                              {{3, 1, 1}, {1, 5, 20000}, {3, 5, 20000}}};
  for (const auto& c : cases) {
    const auto av = uniform<T>(numel(c.a), -2, 2), bv = uniform<T>(numel(c.b), -2, 2);
    const auto [sum, diff] =
        s.run(a + b, a * b - b, a = as_tensor<T, 3>(c.a, av), b = as_tensor<T, 3>(c.b, bv));
    BOOST_TEST(shape_is(sum, c.out));
    BOOST_TEST(close(sum, ref2(c, av, bv, [](double x, double y) { return x + y; }), rtol<T>()));
    BOOST_TEST(close(diff, ref2(c, av, bv, [](double x, double y) { return x * y - y; }), 4 * rtol<T>(), {},
                     4 * rtol<T>()));
  }
  // rank 3 against rank 2: the rank-2 operand is right-aligned.
  const bcast_case mixed[] = {{{4, 3, 5}, {3, 5}, {4, 3, 5}}, {{4, 1, 5}, {3, 1}, {4, 3, 5}}, {{2, 7, 1}, {1, 19}, {2, 7, 19}}};
  for (const auto& c : mixed) {
    const auto av = uniform<T>(numel(c.a), -2, 2), bv = uniform<T>(numel(c.b), -2, 2);
    const auto r = s.run(m - a, a = as_tensor<T, 3>(c.a, av), m = as_tensor<T, 2>(c.b, bv));
    BOOST_TEST(shape_is(r, c.out));
    BOOST_TEST(close(r, ref2(c, av, bv, [](double x, double y) { return y - x; }), rtol<T>()));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(where_with_broadcast_mask_and_clamp, T, real_types) {
  // where(mask [N, 1], a [N, C], b [C]) and masks made by comparisons.
  g::placeholder<"m", T, g::dyn, 1> m;
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn> b;
  g::session<g::cpu_simd> s;
  const std::pair<std::size_t, std::size_t> shapes[] = {{1, 1}, {5, 7}, {3, 17}, {2, 1023}};
  for (auto [n, c] : shapes) {
    const auto mk = uniform_int(n, 0, 1);
    const std::vector<T> mv(mk.begin(), mk.end());
    const auto av = uniform<T>(n * c, -2, 2), bv = uniform<T>(c, -2, 2);
    const auto [w1, w2, w3] =
        s.run(g::where(m, a, b), g::where(g::less(a, 0), -a, a), g::clamp(g::where(a > b, a, b), -1, 1.5),
              m = tensor<T, 2>({n, 1}, mv), a = tensor<T, 2>({n, c}, av), b = tensor<T, 1>({c}, bv));
    std::vector<double> e1(n * c), e2(n * c), e3(n * c);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < c; ++j) {
        const double x = av[i * c + j], y = bv[j];
        e1[i * c + j] = mv[i] != 0 ? x : y;
        e2[i * c + j] = std::abs(x);
        e3[i * c + j] = std::min(std::max(x > y ? x : y, -1.0), 1.5);
      }
    BOOST_TEST(same_shape(w1, {long(n), long(c)}));
    BOOST_TEST(equal(w1, e1));
    BOOST_TEST(equal(w2, e2));
    BOOST_TEST(equal(w3, e3));
  }
}
