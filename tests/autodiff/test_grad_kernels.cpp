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
  s.assign(v, g::view(vv.data(), {3}));
  auto gx = s.run(g::grad(g::sum(g::square(x) * v), x), x = g::view(xv.data(), {2, 3}));
  BOOST_TEST(gx.shape.rank == 2u);
  for (std::size_t i = 0; i < xv.size(); ++i)
    BOOST_TEST(gx[static_cast<g::index_t>(i)] == 2 * xv[i] * vv[i % 3], boost::test_tools::tolerance(1e-12));
}
