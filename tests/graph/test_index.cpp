// Index ops: one_hot<Depth, T>(int32 labels) and gather(table, int32 indices), against
// plain loops. Out-of-range indices are covered by exec/test_errors.
#define BOOST_TEST_MODULE graph_index
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

std::vector<double> one_hot_ref(const std::vector<std::int32_t>& y, std::size_t depth) {
  std::vector<double> r(y.size() * depth, 0.0);
  for (std::size_t i = 0; i < y.size(); ++i) r[i * depth + static_cast<std::size_t>(y[i])] = 1.0;
  return r;
}

template <class T>
std::vector<double> gather_ref(const std::vector<T>& table, std::size_t row_len, const std::vector<std::int32_t>& idx) {
  std::vector<double> r;
  for (auto i : idx)
    for (std::size_t j = 0; j < row_len; ++j) r.push_back(static_cast<double>(table[static_cast<std::size_t>(i) * row_len + j]));
  return r;
}

using labels1 = g::placeholder<"y", std::int32_t, g::dyn>;

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(one_hot_rows, T, real_types) {
  // Depths 1, 7 and 17 (below, at and above a SIMD width) in one graph.
  g::placeholder<"y1", std::int32_t, g::dyn> y1;
  g::placeholder<"y7", std::int32_t, g::dyn> y7;
  labels1 y;
  g::placeholder<"z", std::int32_t, g::dyn, g::dyn> z;
  g::session<g::cpu_simd> s;
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(33), std::size_t(1023)}) {
    const auto l1 = uniform_int(n, 0, 0), l7 = uniform_int(n, 0, 6), l17 = uniform_int(n, 0, 16);
    const auto t1 = tensor<std::int32_t, 1>({n}, l1), t7 = tensor<std::int32_t, 1>({n}, l7),
               t17 = tensor<std::int32_t, 1>({n}, l17);
    const auto [r1, r7, r17] =
        s.run(g::one_hot<1, T>(y1), g::one_hot<7, T>(y7), g::one_hot<17, T>(y), y1 = t1, y7 = t7, y = t17);
    BOOST_TEST(same_shape(r1, {long(n), 1}));
    BOOST_TEST(equal(r1, one_hot_ref(l1, 1)));
    BOOST_TEST(same_shape(r7, {long(n), 7}));
    BOOST_TEST(equal(r7, one_hot_ref(l7, 7)));
    BOOST_TEST(same_shape(r17, {long(n), 17}));  // n = 0: an empty [0, 17]
    BOOST_TEST(equal(r17, one_hot_ref(l17, 17)));
  }
  // rank-2 labels: [2, 3] -> [2, 3, 5]; the static shape records the depth
  BOOST_TEST((std::is_same_v<g::shape_t<decltype(g::one_hot<5, T>(z))>, g::shape<g::dyn, g::dyn, 5>>));
  BOOST_TEST((std::is_same_v<g::value_t<decltype(g::one_hot<5, T>(z))>, T>));
  BOOST_TEST((std::is_same_v<g::value_t<decltype(g::one_hot<5>(z))>, float>));
  const xt::xtensor<std::int32_t, 2> zv = {{4, 0, 2}, {1, 1, 3}};
  const auto r = s.run(g::one_hot<5, T>(z), z = zv);
  BOOST_TEST(same_shape(r, {2, 3, 5}));
  BOOST_TEST(equal(r, one_hot_ref({4, 0, 2, 1, 1, 3}, 5)));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(one_hot_in_a_loss, T, real_types) {
  // -sum(one_hot(y) * log_softmax(l), axis 1): the one-hot rows pick each label's term.
  g::placeholder<"l", T, g::dyn, 6> l;
  labels1 y;
  g::session<g::cpu_simd> s;
  const std::size_t n = 9;
  const auto lv = uniform<T>(n * 6, -3, 3);
  const auto yv = uniform_int(n, 0, 5);
  const auto r = s.run(-g::sum<1>(g::one_hot<6, T>(y) * g::log_softmax(l)), l = tensor<T, 2>({n, 6}, lv),
                       y = tensor<std::int32_t, 1>({n}, yv));
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    double m = -1e300, sum = 0;
    for (std::size_t j = 0; j < 6; ++j) m = std::max(m, double(lv[i * 6 + j]));
    for (std::size_t j = 0; j < 6; ++j) sum += std::exp(double(lv[i * 6 + j]) - m);
    want[i] = -(double(lv[i * 6 + static_cast<std::size_t>(yv[i])]) - m - std::log(sum));
  }
  BOOST_TEST(same_shape(r, {long(n)}));
  BOOST_TEST(close(r, want, 4 * rtol<T>(), {}, 4 * rtol<T>() * 1e-3));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gather_rows_of_a_table, T, real_types) {
  g::variable<"emb", T, 11, 7> emb;
  labels1 i1;
  g::placeholder<"i2", std::int32_t, g::dyn, g::dyn> i2;
  g::session<g::cpu_simd> s;
  const auto ev = uniform<T>(11 * 7, -1, 1);
  g::assign(s, emb, tensor<T, 2>({11, 7}, ev));
  BOOST_TEST((std::is_same_v<g::shape_t<decltype(g::gather(emb, i2))>, g::shape<g::dyn, g::dyn, 7>>));
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(40)}) {
    auto idx = uniform_int(n, 0, 10);
    idx[0] = 10;  // the last row, and a repeat
    if (n > 1) idx[n - 1] = 10;
    const auto it = tensor<std::int32_t, 1>({n}, idx);
    const auto [r, re] = s.run(g::gather(emb, i1), g::gather(g::exp(emb), i1) * 2, i1 = it);
    BOOST_TEST(same_shape(r, {long(n), 7}));
    BOOST_TEST(equal(r, gather_ref(ev, 7, idx)));
    std::vector<T> e2(ev.size());
    for (std::size_t k = 0; k < ev.size(); ++k) e2[k] = static_cast<T>(std::exp(double(ev[k])));
    auto want = gather_ref(e2, 7, idx);
    for (auto& v : want) v *= 2;
    BOOST_TEST(close(re, want, rtol<T>()));
  }
  // rank-2 indices: [2, 3] -> [2, 3, 7]
  const xt::xtensor<std::int32_t, 2> iv = {{0, 5, 10}, {3, 3, 1}};
  const auto r2 = s.run(g::gather(emb, i2), i2 = iv);
  BOOST_TEST(same_shape(r2, {2, 3, 7}));
  BOOST_TEST(equal(r2, gather_ref(ev, 7, {0, 5, 10, 3, 3, 1})));
  // no indices: an empty [0, 7]
  const xt::xtensor<std::int32_t, 1> none(std::array<std::size_t, 1>{0});
  const auto [e0, e1] = s.run(g::gather(emb, i1), g::gather(g::exp(emb), i1) * 2, i1 = none);
  BOOST_TEST(same_shape(e0, {0, 7}));
  BOOST_TEST(same_shape(e1, {0, 7}));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gather_from_1d_and_fed_tables_and_large, T, real_types) {
  g::placeholder<"t", T, g::dyn> t;
  g::placeholder<"tab", T, g::dyn, g::dyn> tab;
  labels1 i;
  g::session<g::cpu_simd> s;
  // A 1-D table gives one element per index.
  const auto tv = uniform<T>(17, -1, 1);
  const auto idx = uniform_int(33, 0, 16);
  const auto tt = tensor<T, 1>({17}, tv);
  const auto r = s.run(g::gather(t, i), t = tt, i = tensor<std::int32_t, 1>({33}, idx));
  BOOST_TEST(same_shape(r, {33}));
  BOOST_TEST(equal(r, gather_ref(tv, 1, idx)));
  // 5000 rows of 20 gathered from a fed [100, 20] table: the threaded copy.
  const auto big = uniform<T>(100 * 20, -1, 1);
  const auto bidx = uniform_int(5000, 0, 99);
  const auto rb = s.run(g::gather(tab, i), tab = tensor<T, 2>({100, 20}, big), i = tensor<std::int32_t, 1>({5000}, bidx));
  BOOST_TEST(same_shape(rb, {5000, 20}));
  BOOST_TEST(equal(rb, gather_ref(big, 20, bidx)));
}
