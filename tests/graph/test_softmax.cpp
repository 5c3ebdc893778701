// softmax / log_softmax over the last axis and softmax_cross_entropy, against loops in
// double, including logits far from zero (±80, ±1000, ±1e30): no NaN, exact limits.
#define BOOST_TEST_MODULE graph_softmax
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

// Row-wise references in double, max subtracted first.
template <class T>
void softmax_ref(const std::vector<T>& x, std::size_t rows, std::size_t cols, std::vector<double>& sm,
                 std::vector<double>& lsm) {
  sm.assign(rows * cols, 0.0);
  lsm.assign(rows * cols, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::size_t c = 0; c < cols; ++c) m = std::max(m, static_cast<double>(x[r * cols + c]));
    double s = 0;
    for (std::size_t c = 0; c < cols; ++c) s += std::exp(static_cast<double>(x[r * cols + c]) - m);
    for (std::size_t c = 0; c < cols; ++c) {
      const double z = static_cast<double>(x[r * cols + c]) - m;
      sm[r * cols + c] = std::exp(z) / s;
      lsm[r * cols + c] = z - std::log(s);
    }
  }
}

template <class T>
std::vector<double> xent_ref(const std::vector<T>& x, const std::vector<std::int32_t>& y, std::size_t rows,
                             std::size_t cols) {
  std::vector<double> sm, lsm, loss(rows);
  softmax_ref(x, rows, cols, sm, lsm);
  for (std::size_t r = 0; r < rows; ++r) loss[r] = -lsm[r * cols + static_cast<std::size_t>(y[r])];
  return loss;
}

// Results of the reference rounded to T (a probability below T's range is 0 in T).
template <class T>
std::vector<double> in_t(const std::vector<double>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<double>(static_cast<T>(v[i]));
  return r;
}

using ph_labels = g::placeholder<"y", std::int32_t, g::dyn>;

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(softmax_and_log_softmax_rows, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  const std::pair<std::size_t, std::size_t> shapes[] = {{1, 1}, {5, 1},  {1, 7},  {3, 7},   {4, 15},  {4, 16},
                                                        {4, 17}, {2, 33}, {3, 64}, {2, 1023}, {7, 100}};
  for (auto [n, c] : shapes) {
    const auto xv = uniform<T>(n * c, -5, 5);
    const auto [sm, lsm] = s.run(g::softmax(x), g::log_softmax(x), x = tensor<T, 2>({n, c}, xv));
    std::vector<double> wsm, wlsm;
    softmax_ref(xv, n, c, wsm, wlsm);
    const std::string label = std::to_string(n) + "x" + std::to_string(c);
    BOOST_TEST(same_shape(sm, {long(n), long(c)}), label);
    BOOST_TEST(same_shape(lsm, {long(n), long(c)}), label);
    BOOST_TEST(close(sm, in_t<T>(wsm), 4 * rtol<T>(), {}, std::numeric_limits<T>::min()), "softmax " << label);
    BOOST_TEST(close(lsm, wlsm, 4 * rtol<T>()), "log_softmax " << label);
    for (std::size_t r = 0; r < n; ++r) {  // rows sum to 1
      double sum = 0;
      for (std::size_t j = 0; j < c; ++j) sum += sm[static_cast<g::index_t>(r * c + j)];
      BOOST_TEST(std::abs(sum - 1) <= 8 * rtol<T>(), "row " << r << " of " << label << " sums to " << sum);
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(softmax_of_rank1_and_rank3_and_fused_operands, T, real_types) {
  g::placeholder<"v", T, g::dyn> v;
  g::placeholder<"x", T, g::dyn, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  for (std::size_t c : {std::size_t(1), std::size_t(17), std::size_t(1023)}) {
    const auto vv = uniform<T>(c, -3, 3);
    const auto [sm, lsm] = s.run(g::softmax(v), g::log_softmax(v * 2 + 1), v = tensor<T, 1>({c}, vv));
    std::vector<T> v2(c);
    for (std::size_t i = 0; i < c; ++i) v2[i] = vv[i] * T(2) + T(1);
    std::vector<double> w1, w2, u1, u2;
    softmax_ref(vv, 1, c, w1, u1);
    softmax_ref(v2, 1, c, w2, u2);
    BOOST_TEST(same_shape(sm, {long(c)}));
    BOOST_TEST(close(sm, in_t<T>(w1), 4 * rtol<T>(), {}, std::numeric_limits<T>::min()));
    BOOST_TEST(close(lsm, u2, 4 * rtol<T>()));
  }
  const auto xv = uniform<T>(2 * 3 * 19, -3, 3);
  const auto [sm3, lsm3] = s.run(g::softmax(x), g::log_softmax(x), x = tensor<T, 3>({2, 3, 19}, xv));
  std::vector<double> w, u;
  softmax_ref(xv, 6, 19, w, u);
  BOOST_TEST(same_shape(sm3, {2, 3, 19}));
  BOOST_TEST(close(sm3, in_t<T>(w), 4 * rtol<T>(), {}, std::numeric_limits<T>::min()));
  BOOST_TEST(close(lsm3, u, 4 * rtol<T>()));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(softmax_of_extreme_logits, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  {
    const xt::xtensor<T, 2> xv = {{1000, 0},   {0, 1000},   {-1000, 0}, {T(1e30), T(-1e30)}, {T(-1e30), T(1e30)},
                                  {80, -80},   {1000, 1000}, {-1000, -1000}, {T(1e30), T(1e30)}, {T(-1e30), T(-1e30)}};
    const auto [sm, lsm] = s.run(g::softmax(x), g::log_softmax(x), x = xv);
    BOOST_TEST(no_nan(sm));
    BOOST_TEST(no_nan(lsm));
    std::vector<double> w, u;
    softmax_ref(std::vector<T>(xv.begin(), xv.end()), 10, 2, w, u);
    BOOST_TEST(close(sm, in_t<T>(w), rtol<T>(), {}, std::numeric_limits<T>::min()));
    BOOST_TEST(close(lsm, in_t<T>(u), rtol<T>()));
    // The limits, exactly: [1000, 0] -> [1, 0] and [0, -1000]; equal logits -> 1/2.
    BOOST_TEST(sm[0] == T(1));
    BOOST_TEST(sm[1] == T(0));
    BOOST_TEST(lsm[0] == T(0));
    BOOST_TEST(lsm[1] == T(-1000));
    BOOST_TEST(sm[6] == T(1));
    BOOST_TEST(lsm[7] == T(-2e30));
    for (g::index_t i = 12; i < 20; ++i) BOOST_TEST(sm[i] == T(0.5));
  }
  {
    // Rows of 37 (SIMD lanes and tail): one large logit among many, ±80 and ±1000 mixed.
    const std::size_t c = 37;
    const std::vector<double> ex = {1000, -1000, 80, -80, 1e30, -1e30, 0, 3};
    std::vector<T> xv(4 * c);
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t j = 0; j < c; ++j) xv[r * c + j] = static_cast<T>(ex[(r * 5 + j * 3) % ex.size()]);
    const auto [sm, lsm] = s.run(g::softmax(x), g::log_softmax(x), x = tensor<T, 2>({4, c}, xv));
    std::vector<double> w, u;
    softmax_ref(xv, 4, c, w, u);
    BOOST_TEST(no_nan(sm));
    BOOST_TEST(no_nan(lsm));
    BOOST_TEST(close(sm, in_t<T>(w), 4 * rtol<T>(), {}, std::numeric_limits<T>::min()));
    BOOST_TEST(close(lsm, in_t<T>(u), 4 * rtol<T>()));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(log_softmax_keeps_relative_precision_far_from_zero, T, real_types) {
  // Logits offset by a large constant: the answer depends only on the differences, which
  // are exact in T; log_softmax must not round the offset into the result.
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  for (double offset : {80.0, 1000.0, 1e5}) {
    const std::size_t n = 3, c = 21;
    auto xv = uniform<T>(n * c, -0.5, 0.5);
    for (auto& v : xv) v = static_cast<T>(static_cast<double>(v) + offset);
    const auto [lsm, sm] = s.run(g::log_softmax(x), g::softmax(x), x = tensor<T, 2>({n, c}, xv));
    std::vector<double> w, u;
    softmax_ref(xv, n, c, w, u);
    BOOST_TEST(close(lsm, u, 4 * rtol<T>()), "offset " << offset);
    BOOST_TEST(close(sm, w, 4 * rtol<T>()), "offset " << offset);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(softmax_cross_entropy_per_row, T, real_types) {
  g::placeholder<"l", T, g::dyn, g::dyn> l;
  ph_labels y;
  g::session<g::cpu_simd> s;
  const std::pair<std::size_t, std::size_t> shapes[] = {{1, 1}, {7, 1}, {1, 7}, {7, 16}, {33, 17}, {5, 1023}, {4, 10}};
  for (auto [n, c] : shapes) {
    const auto lv = uniform<T>(n * c, -5, 5);
    const auto yv = uniform_int(n, 0, static_cast<std::int32_t>(c) - 1);
    const auto lt = tensor<T, 2>({n, c}, lv);
    const auto yt = tensor<std::int32_t, 1>({n}, yv);
    const auto [loss, avg] = s.run(g::softmax_cross_entropy(l, y), g::mean(g::softmax_cross_entropy(l, y)), l = lt,
                                   y = yt);
    const auto want = xent_ref(lv, yv, n, c);
    const std::string label = std::to_string(n) + "x" + std::to_string(c);
    BOOST_TEST(same_shape(loss, {long(n)}), label);
    BOOST_TEST(close(loss, want, 4 * rtol<T>(), {}, 4 * rtol<T>() * 1e-3), label);
    double m = 0;
    for (double v : want) m += v;
    BOOST_TEST(avg.shape().rank == 0u);
    BOOST_TEST(close(avg, std::vector<double>{m / double(n)}, 4 * rtol<T>()), label);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(softmax_cross_entropy_of_extreme_logits, T, real_types) {
  g::placeholder<"l", T, g::dyn, g::dyn> l;
  ph_labels y;
  g::session<g::cpu_simd> s;
  const xt::xtensor<T, 2> lv = {{1000, 0},  {1000, 0}, {-1000, 0}, {T(1e30), T(-1e30)}, {T(1e30), T(-1e30)},
                                {80, -80},  {-80, 80}, {1000, 1000}, {-1000, -1000}, {T(-1e30), T(-1e30)}};
  const xt::xtensor<std::int32_t, 1> yv = {0, 1, 0, 0, 1, 1, 0, 1, 0, 1};
  const auto loss = s.run(g::softmax_cross_entropy(l, y), l = lv, y = yv);
  BOOST_TEST(no_nan(loss));
  const double l2 = std::log(2.0);
  const std::vector<double> want = {0, 1000, 1000, 0, 2e30, 160, 160, l2, l2, l2};
  BOOST_TEST(close(loss, in_t<T>(want), rtol<T>(), {}, 0.0));
  BOOST_TEST(loss[0] == T(0));
  BOOST_TEST(loss[1] == T(1000));
  // Rows of 37 logits with extremes in SIMD lanes and in the tail, every label position.
  const std::size_t n = 37, c = 37;
  const std::vector<double> ex = {1000, -1000, 80, -80, 0, 3, -2};
  std::vector<T> lw(n * c);
  std::vector<std::int32_t> yw(n);
  for (std::size_t r = 0; r < n; ++r) {
    yw[r] = static_cast<std::int32_t>(r);
    for (std::size_t j = 0; j < c; ++j) lw[r * c + j] = static_cast<T>(ex[(r + j * 2) % ex.size()]);
  }
  const auto lw_t = tensor<T, 2>({n, c}, lw);
  const auto yw_t = tensor<std::int32_t, 1>({n}, yw);
  const auto loss2 = s.run(g::softmax_cross_entropy(l, y), l = lw_t, y = yw_t);
  BOOST_TEST(no_nan(loss2));
  BOOST_TEST(close(loss2, in_t<T>(xent_ref(lw, yw, n, c)), 4 * rtol<T>(), {}, 4 * rtol<T>() * 1e-3));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(large_and_zero_size_batches, T, real_types) {
  g::placeholder<"l", T, g::dyn, g::dyn> l;
  ph_labels y;
  g::session<g::cpu_simd> s;
  // 5000 x 20 = 100000 elements: rows run on several threads.
  const std::size_t n = 5000, c = 20;
  const auto lv = uniform<T>(n * c, -5, 5);
  const auto yv = uniform_int(n, 0, static_cast<std::int32_t>(c) - 1);
  const auto lt = tensor<T, 2>({n, c}, lv);
  const auto yt = tensor<std::int32_t, 1>({n}, yv);
  const auto [loss, sm, lsm] = s.run(g::softmax_cross_entropy(l, y), g::softmax(l), g::log_softmax(l), l = lt, y = yt);
  std::vector<double> w, u;
  softmax_ref(lv, n, c, w, u);
  BOOST_TEST(close(loss, xent_ref(lv, yv, n, c), 4 * rtol<T>(), {}, 4 * rtol<T>() * 1e-3));
  BOOST_TEST(close(sm, in_t<T>(w), 4 * rtol<T>(), {}, std::numeric_limits<T>::min()));
  BOOST_TEST(close(lsm, u, 4 * rtol<T>()));
  // An empty batch gives empty results.
  const xt::xtensor<T, 2> l0(std::array<std::size_t, 2>{0, 20});
  const xt::xtensor<std::int32_t, 1> y0(std::array<std::size_t, 1>{0});
  const auto [loss0, sm0, lsm0] = s.run(g::softmax_cross_entropy(l, y), g::softmax(l), g::log_softmax(l), l = l0, y = y0);
  BOOST_TEST(same_shape(loss0, {0}));
  BOOST_TEST(same_shape(sm0, {0, 20}));
  BOOST_TEST(same_shape(lsm0, {0, 20}));
}
