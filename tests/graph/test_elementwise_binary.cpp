// Binary and ternary elementwise ops (arithmetic, maximum/minimum, pow, comparisons,
// where) under NumPy broadcasting, against plain loops in double.
#define BOOST_TEST_MODULE graph_elementwise_binary
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

using shape_v = std::vector<std::size_t>;

struct bcast_case {
  shape_v a, b, out;
};

// Values away from zero (divisors): uniform magnitude in [0.5, 2], random sign.
template <class T>
std::vector<T> nonzero(std::size_t n) {
  auto v = uniform<T>(n, 0.5, 2.0);
  const auto sign = uniform_int(n, 0, 1);
  for (std::size_t i = 0; i < n; ++i)
    if (sign[i]) v[i] = -v[i];
  return v;
}

// Values in {-1, 0, 1}: comparisons see ties and equalities.
template <class T>
std::vector<T> discrete(std::size_t n) {
  const auto k = uniform_int(n, -1, 1);
  return std::vector<T>(k.begin(), k.end());
}

// want[i] = f(a at its broadcast source, b at its)
template <class T, class F>
std::vector<double> ref2(const bcast_case& c, const std::vector<T>& a, const std::vector<T>& b, F f) {
  std::vector<double> want(numel(c.out));
  for (std::size_t i = 0; i < want.size(); ++i)
    want[i] = f(static_cast<double>(a[broadcast_source(i, c.out, c.a)]),
                static_cast<double>(b[broadcast_source(i, c.out, c.b)]));
  return want;
}

template <class T, std::size_t R>
xt::xtensor<T, R> as_tensor(const shape_v& s, const std::vector<T>& v) {
  std::array<std::size_t, R> sh{};
  std::copy(s.begin(), s.end(), sh.begin());
  return tensor<T, R>(sh, v);
}

template <class T>
boost::test_tools::predicate_result shape_is(const g::tensor_view<const T>& got, const shape_v& want) {
  g::dims w;
  w.rank = want.size();
  for (std::size_t i = 0; i < want.size(); ++i) w.d[i] = static_cast<g::index_t>(want[i]);
  if (got.shape == w) return true;
  boost::test_tools::predicate_result r(false);
  r.message() << "shape " << dims_str(got.shape) << " != " << dims_str(w);
  return r;
}

double b2d(bool v) { return v ? 1.0 : 0.0; }

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(every_binary_op_under_rank2_broadcasting, T, real_types) {
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn, g::dyn> b;
  g::session<g::cpu_simd> s;
  const bcast_case cases[] = {
      {{7, 5}, {7, 5}, {7, 5}},       {{7, 5}, {1, 5}, {7, 5}},       {{7, 1}, {1, 5}, {7, 5}},
      {{1, 1}, {7, 5}, {7, 5}},       {{7, 5}, {7, 1}, {7, 5}},       {{1, 17}, {3, 1}, {3, 17}},
      {{33, 17}, {33, 17}, {33, 17}}, {{2, 1023}, {1, 1023}, {2, 1023}}, {{1, 1}, {1, 1}, {1, 1}},
      {{16, 16}, {16, 1}, {16, 16}},  {{9, 1}, {9, 31}, {9, 31}}};
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
      const auto av = discrete<T>(numel(c.a)), bv = discrete<T>(numel(c.b));
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
                              {{2, 9, 1}, {2, 1, 1023}, {2, 9, 1023}}};
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
