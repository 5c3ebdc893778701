#define BOOST_TEST_MODULE autodiff_grad_kernels
#include "../support/finite_difference.hpp"

using namespace gradus_test;

namespace {
g::variable<"a", double, 3, 4> a;
g::variable<"b", double, 4, 5> b;
g::variable<"bt", double, 5, 4> bt;
g::variable<"at", double, 4, 3> at;
g::variable<"w34", double, 3, 4> w34;
g::variable<"w35", double, 3, 5> w35;
g::variable<"a3", double, 2, 3, 4> a3;
g::variable<"b3", double, 2, 4, 5> b3;
g::variable<"w3", double, 2, 3, 5> w3;
}  // namespace

struct fixture {
  session s;
  fixture() {
    for (auto* unused : {&s}) (void)unused;
    set_random(s, a, -1, 1);
    set_random(s, b, -1, 1);
    set_random(s, bt, -1, 1);
    set_random(s, at, -1, 1);
    set_random(s, w34, -1, 1);
    set_random(s, w35, -1, 1);
    set_random(s, a3, -1, 1);
    set_random(s, b3, -1, 1);
    set_random(s, w3, -1, 1);
  }
};

BOOST_FIXTURE_TEST_SUITE(reductions, fixture)

BOOST_AUTO_TEST_CASE(sum_and_mean) {
  check_gradients(s, g::sum(g::square(a)), a);
  check_gradients(s, g::mean(g::square(a)), a);
  check_gradients(s, g::sum(g::sum<0>(a * w34) * g::sum<0>(w34)), a);
  check_gradients(s, g::sum(g::mean<1>(a * a) * g::sum<1>(w34)), a);
  check_gradients(s, g::sum(g::mean<-1, true>(a) * w34), a);
  check_gradients(s, g::sum(g::sum<0, true>(a) * w34), a);
}

BOOST_AUTO_TEST_CASE(max_and_min_without_ties) {
  check_gradients(s, g::sum(g::max<1>(a) * g::sum<1>(w34)), a);
  check_gradients(s, g::sum(g::min<0>(a) * g::sum<0>(w34)), a);
  check_gradients(s, g::max(a * w34), a);
}

// Issue 11's first case, with its exact input: tanh(x) of a 2x4 x is computed in one SIMD
// batch by the forward pass; the rule once recomputed it in the backward pass, where each
// row of 4 ran the scalar tail's std::tanh, one ulp away, and row 0 lost its gradient.
BOOST_AUTO_TEST_CASE(max_of_tanh_keeps_the_gradient_of_every_row) {
  session s;
  g::variable<"x", double, 2, 4> x;
  const std::vector<double> xv{0.18, -0.5, -0.6, -0.7, 0.3, 0.1, -0.2, -0.9};
  gradus::assign(s, x, g::view(xv.data(), {2, 4}));
  auto loss = g::sum(g::max<1>(g::tanh(x)));
  const auto [l, dx] = s.run(loss, g::grad(loss, x));
  BOOST_TEST(l[0] == std::tanh(0.18) + std::tanh(0.3), boost::test_tools::tolerance(1e-15));
  BOOST_TEST(dx[0] == 0.96828720441057803, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(dx[4] == 1 - std::tanh(0.3) * std::tanh(0.3), boost::test_tools::tolerance(1e-15));
  for (int i : {1, 2, 3, 5, 6, 7}) BOOST_TEST(dx[i] == 0.0);
}

// Every row's maximum, over a (64, 6) operand of each smooth unary map, gets f'(x) at its
// arg max (the issue counted 34 of 64 rows losing it for tanh).
BOOST_AUTO_TEST_CASE(max_of_a_map_over_rows_of_six) {
  session s;
  g::variable<"x", double, 64, 6> x;
  const auto xv = set_random(s, x, -2, 2);
  auto check = [&](auto f, auto df, const char* what) {
    auto loss = g::sum(g::max<1>(f(x)));
    const auto dx = s.run(g::grad(loss, x));
    int lost = 0, wrong = 0;
    for (std::size_t r = 0; r < 64; ++r) {
      std::size_t best = 0;
      for (std::size_t c = 1; c < 6; ++c)
        if (xv[r * 6 + c] > xv[r * 6 + best]) best = c;  // each map is increasing
      for (std::size_t c = 0; c < 6; ++c) {
        const double want = c == best ? df(xv[r * 6 + c]) : 0.0, got = dx[static_cast<g::index_t>(r * 6 + c)];
        if (c == best && got == 0) ++lost;
        else if (std::abs(got - want) > 1e-12 * std::max(1.0, std::abs(want))) ++wrong;
      }
    }
    BOOST_TEST(lost == 0, what << ": " << lost << " of 64 rows lost their gradient");
    BOOST_TEST(wrong == 0, what << ": " << wrong << " wrong gradient entries");
  };
  check([](const auto& e) { return g::tanh(e); }, [](double v) { return 1 - std::tanh(v) * std::tanh(v); }, "tanh");
  check([](const auto& e) { return g::exp(e); }, [](double v) { return std::exp(v); }, "exp");
  check([](const auto& e) { return g::sigmoid(e); },
        [](double v) { const double y = 1 / (1 + std::exp(-v)); return y * (1 - y); }, "sigmoid");
  check([](const auto& e) { return g::exp(e) + g::tanh(e) * 3.0; },
        [](double v) { return std::exp(v) + 3 * (1 - std::tanh(v) * std::tanh(v)); }, "exp + 3 tanh");
}

// Issue 11's second case: with a column of w all negative, v + relu(w) ties in that
// column; the maximum moves one-for-one with v, so dv is 1 there, not the tie count.
// Ties share the gradient evenly (TensorFlow's reduce_max, PyTorch's amax).
BOOST_AUTO_TEST_CASE(ties_share_the_gradient) {
  session s;
  g::variable<"v", double, 4> v;
  g::variable<"w", double, 3, 4> w;
  const std::vector<double> vv{0.25, -0.5, 1.5, 0.125};
  // column 0: three ties (all negative); column 1: two ties at 0.75; columns 2, 3: one maximum
  const std::vector<double> wv{-0.5, 0.75, 0.3, -1, -0.25, 0.75, 0.9, -2, -0.1, -0.3, -0.4, 0.6};
  gradus::assign(s, v, g::view(vv.data(), {4}));
  gradus::assign(s, w, g::view(wv.data(), {3, 4}));
  auto loss = g::sum(g::max<0>(v + g::relu(w)));
  const auto [l, dv, dw] = s.run(loss, g::grad(loss, v), g::grad(loss, w));
  BOOST_TEST(l[0] == 0.25 + (-0.5 + 0.75) + (1.5 + 0.9) + (0.125 + 0.6), boost::test_tools::tolerance(1e-15));
  for (int j = 0; j < 4; ++j) BOOST_TEST(dv[j] == 1.0, "dv[" << j << "] = " << dv[j]);
  const std::vector<double> want_dw{0, 0.5, 0, 0, 0, 0.5, 1, 0, 0, 0, 0, 1};
  for (int i = 0; i < 12; ++i) BOOST_TEST(dw[i] == want_dw[static_cast<std::size_t>(i)], "dw[" << i << "] = " << dw[i]);
  // min over the negated operand: the same, mirrored; and over every axis at once
  auto loss_min = g::sum(g::min<0>(-(v + g::relu(w))));
  const auto dvm = s.run(g::grad(loss_min, v));
  for (int j = 0; j < 4; ++j) BOOST_TEST(dvm[j] == -1.0);
  g::variable<"c", double, 2, 3> c;
  const std::vector<double> cv{0.5, 2, 2, -1, 2, 0};
  gradus::assign(s, c, g::view(cv.data(), {2, 3}));
  const auto dc = s.run(g::grad(g::max(c * 3.0), c));
  for (int i = 0; i < 6; ++i) BOOST_TEST(dc[i] == (cv[static_cast<std::size_t>(i)] == 2 ? 1.0 : 0.0), "dc[" << i << "]");
}

// maximum/minimum at a tie: half of g to each operand (PyTorch's rule)
BOOST_AUTO_TEST_CASE(elementwise_maximum_splits_ties) {
  session s;
  g::variable<"p", double, 3> p;
  g::variable<"q", double, 3> q;
  const std::vector<double> pv{1, 2, 3}, qv{1, 5, -3};
  gradus::assign(s, p, g::view(pv.data(), {3}));
  gradus::assign(s, q, g::view(qv.data(), {3}));
  const auto [dp, dq] = s.run(g::grad(g::sum(g::maximum(p, q)), p), g::grad(g::sum(g::maximum(p, q)), q));
  const auto [ep, eq] = s.run(g::grad(g::sum(g::minimum(p, q)), p), g::grad(g::sum(g::minimum(p, q)), q));
  const std::vector<double> max_p{0.5, 0, 1}, max_q{0.5, 1, 0}, min_p{0.5, 1, 0}, min_q{0.5, 0, 1};
  for (int i = 0; i < 3; ++i) {
    const auto k = static_cast<std::size_t>(i);
    BOOST_TEST(dp[i] == max_p[k]);
    BOOST_TEST(dq[i] == max_q[k]);
    BOOST_TEST(ep[i] == min_p[k]);
    BOOST_TEST(eq[i] == min_q[k]);
  }
  // maximum(p, p): the two halves add up to the derivative of p itself
  const auto dpp = s.run(g::grad(g::sum(g::maximum(p, p) * 2.0), p));
  for (int i = 0; i < 3; ++i) BOOST_TEST(dpp[i] == 2.0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(matmul_rules, fixture)

BOOST_AUTO_TEST_CASE(plain_and_transposed_operands) {
  check_gradients(s, g::sum(g::matmul(a, b) * w35), a, b);
  check_gradients(s, g::sum(g::matmul(a, g::transpose(bt)) * w35), a, bt);
  check_gradients(s, g::sum(g::matmul(g::transpose(at), b) * w35), at, b);
  check_gradients(s, g::sum(g::matmul(g::transpose(at), g::transpose(bt)) * w35), at, bt);
}

BOOST_AUTO_TEST_CASE(batched_and_broadcast) {
  check_gradients(s, g::sum(g::matmul(a3, b3) * w3), a3, b3);
  check_gradients(s, g::sum(g::matmul(a3, b) * w3), a3, b);
  check_gradients(s, g::sum(g::matmul(a, b3) * w3), a, b3);
  check_gradients(s, g::sum(g::matmul(a3, g::matrix_transpose(g::permute<0, 2, 1>(b3))) * w3), a3, b3);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(softmax_family, fixture)

BOOST_AUTO_TEST_CASE(softmax_and_log_softmax) {
  check_gradients(s, g::sum(g::softmax(a * 3.0) * w34), a);
  check_gradients(s, g::sum(g::log_softmax(a * 3.0) * w34), a);
}

BOOST_AUTO_TEST_CASE(cross_entropy_against_labels) {
  g::placeholder<"labels", std::int32_t, g::dyn> y;
  const std::vector<std::int32_t> labels{3, 0, 2};
  auto loss = g::mean(g::softmax_cross_entropy(g::matmul(a, b) * 2.0, y));
  const auto feed = (y = g::view(labels.data(), {3}));
  const double ea = fd_error(s, loss, g::grad(loss, a), a, feed);
  const double eb = fd_error(s, loss, g::grad(loss, b), b, feed);
  BOOST_TEST(ea < 1e-6);
  BOOST_TEST(eb < 1e-6);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(layout_rules, fixture)

BOOST_AUTO_TEST_CASE(permute_transpose_reshape) {
  check_gradients(s, g::sum(g::transpose(a) * at * 2.0), a);
  check_gradients(s, g::sum(g::permute<2, 0, 1>(a3) * g::permute<2, 0, 1>(g::square(a3))), a3);
  check_gradients(s, g::sum(g::reshape<4, 3>(a) * at), a);
  check_gradients(s, g::sum(g::reshape<g::dyn, 6>(g::exp(a)) * g::reshape<2, 6>(w34)), a);
  check_gradients(s, g::sum(g::matmul(g::reshape<6, 4>(a3), b) * g::reshape<6, 5>(w3)), a3, b);
}

BOOST_AUTO_TEST_SUITE_END()

// A two-layer perceptron, and the gradient with respect to its input placeholder.
BOOST_FIXTURE_TEST_CASE(mlp_end_to_end, fixture) {
  g::variable<"w1", double, 4, 5> w1;
  g::variable<"b1", double, 5> b1;
  g::variable<"w2", double, 5, 3> w2;
  g::variable<"b2", double, 3> b2;
  set_random(s, w1, -1, 1);
  set_random(s, b1, -0.5, 0.5);
  set_random(s, w2, -1, 1);
  set_random(s, b2, -0.5, 0.5);
  g::placeholder<"labels", std::int32_t, g::dyn> y;
  const std::vector<std::int32_t> labels{2, 0, 1};
  auto h = g::sigmoid(g::matmul(a, w1) + b1);
  auto loss = g::mean(g::softmax_cross_entropy(g::matmul(h, w2) + b2, y));
  const auto feed = (y = g::view(labels.data(), {3}));
  for (double e : {fd_error(s, loss, g::grad(loss, w1), w1, feed), fd_error(s, loss, g::grad(loss, b1), b1, feed),
                   fd_error(s, loss, g::grad(loss, w2), w2, feed), fd_error(s, loss, g::grad(loss, b2), b2, feed),
                   fd_error(s, loss, g::grad(loss, a), a, feed)})
    BOOST_TEST(e < 1e-6);
}

BOOST_AUTO_TEST_CASE(grad_of_a_placeholder) {
  session s;
  g::placeholder<"x", double, g::dyn, 3> x;
  g::variable<"v", double, 3> v;
  const std::vector<double> vv{0.5, -1.0, 2.0}, xv{1, 2, 3, -1, 0.5, 4};
  gradus::assign(s, v, g::view(vv.data(), {3}));
  auto gx = s.run(g::grad(g::sum(g::square(x) * v), x), x = g::view(xv.data(), {2, 3}));
  BOOST_TEST(gx.shape().rank == 2u);
  for (std::size_t i = 0; i < xv.size(); ++i)
    BOOST_TEST(gx[static_cast<g::index_t>(i)] == 2 * xv[i] * vv[i % 3], boost::test_tools::tolerance(1e-12));
}
