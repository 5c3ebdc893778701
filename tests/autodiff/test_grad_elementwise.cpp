#define BOOST_TEST_MODULE autodiff_grad_elementwise
#include "../support/finite_difference.hpp"

using namespace gradus_test;

namespace {
g::variable<"a", double, 3, 5> a;
g::variable<"b", double, 3, 5> b;
g::variable<"w", double, 3, 5> w;  // weights the sum so every element's gradient differs
g::variable<"row", double, 5> row;
g::variable<"col", double, 3, 1> col;

struct fixture {
  session s;
  fixture() {
    set_random(s, w, -1.5, 1.5);
    set_random(s, row, -1, 1);
    set_random(s, col, 0.5, 1.5);
  }
};
}  // namespace

BOOST_FIXTURE_TEST_SUITE(unary_rules, fixture)

BOOST_AUTO_TEST_CASE(smooth_ops) {
  set_random(s, a, -2, 2);
  check_gradients(s, g::sum(g::exp(a) * w), a);
  check_gradients(s, g::sum(g::tanh(a) * w), a);
  check_gradients(s, g::sum(g::sigmoid(a) * w), a);
  check_gradients(s, g::sum(g::softplus(a) * w), a);
  check_gradients(s, g::sum(g::square(a) * w), a);
  check_gradients(s, g::sum(-a * w), a);
}

BOOST_AUTO_TEST_CASE(positive_domain_ops) {
  set_random(s, a, 0.3, 3);
  check_gradients(s, g::sum(g::log(a) * w), a);
  check_gradients(s, g::sum(g::log1p(a) * w), a);
  check_gradients(s, g::sum(g::sqrt(a) * w), a);
  check_gradients(s, g::sum(g::rsqrt(a) * w), a);
}

BOOST_AUTO_TEST_CASE(piecewise_ops_away_from_kinks) {
  set_random(s, a, -2, 2, {0.0, -0.5, 0.7});
  check_gradients(s, g::sum(g::abs(a) * w), a);
  check_gradients(s, g::sum(g::relu(a) * w), a);
  check_gradients(s, g::sum(g::leaky_relu(a, 0.1) * w), a);
  check_gradients(s, g::sum(g::elu(a, 0.7) * w), a);
  check_gradients(s, g::sum(g::clamp(a, -0.5, 0.7) * w), a);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(binary_rules, fixture)

BOOST_AUTO_TEST_CASE(same_shape) {
  set_random(s, a, 0.5, 2);
  set_random(s, b, 0.5, 2);
  check_gradients(s, g::sum((a + b) * w), a, b);
  check_gradients(s, g::sum((a - b) * w), a, b);
  check_gradients(s, g::sum(a * b * w), a, b);
  check_gradients(s, g::sum(a / b * w), a, b);
  check_gradients(s, g::sum(g::pow(a, b) * w), a, b);
}

BOOST_AUTO_TEST_CASE(maximum_minimum_without_ties) {
  set_random(s, a, -2, 2);
  set_random(s, b, -2, 2);
  check_gradients(s, g::sum(g::maximum(a, b) * w), a, b);
  check_gradients(s, g::sum(g::minimum(a, b) * w), a, b);
}

// Broadcast operands get their adjoint summed over the broadcast axes.
BOOST_AUTO_TEST_CASE(broadcasting) {
  set_random(s, a, 0.5, 2);
  check_gradients(s, g::sum((a + row) * w), a, row);
  check_gradients(s, g::sum(a * row * w), a, row);
  check_gradients(s, g::sum(a / col * w), a, col);
  check_gradients(s, g::sum(g::pow(col, row) * w), col, row);
  check_gradients(s, g::sum((a - 2.5) * w * 3.0), a);
}

BOOST_AUTO_TEST_CASE(where_and_comparisons) {
  set_random(s, a, -2, 2);
  set_random(s, b, -2, 2);
  // the mask is piecewise constant: gradient flows only through the chosen branch
  check_gradients(s, g::sum(g::where(g::greater(a, b), a * a, b * 3.0) * w), a, b);
  check_gradients(s, g::sum(g::where(g::less(a, 0.0), row, a) * w), a, row);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_FIXTURE_TEST_SUITE(graphs, fixture)

// One subexpression feeding several consumers: contributions add up.
BOOST_AUTO_TEST_CASE(shared_subexpression) {
  set_random(s, a, -1, 1);
  set_random(s, b, -1, 1);
  auto h = g::tanh(a * b + row);
  check_gradients(s, g::sum(h * h * w + g::exp(h) - h * a), a, b, row);
}

BOOST_AUTO_TEST_CASE(variable_not_on_any_path_gets_zeros) {
  set_random(s, a, -1, 1);
  set_random(s, b, -1, 1);
  auto gb = s.run(g::grad(g::sum(a * w), b));
  BOOST_TEST(gb.shape().numel() == 15);
  for (double v : gb) BOOST_TEST(v == 0.0);
}

BOOST_AUTO_TEST_SUITE_END()
