#define BOOST_TEST_MODULE autodiff_grad_conv
// Gradients of conv2d (its data- and weight-gradient kernels), max/avg pooling and
// flatten, against central differences in double, with stride and padding; a LeNet-shaped
// composite; the kernel trace of one conv layer's backward pass; and im2col / col2im's
// rules.
#include "../support/check.hpp"
#include "../support/finite_difference.hpp"

using namespace gradus_test;

namespace {
g::variable<"x", double, 2, 3, 7, 6> x;      // N=2, C=3, 7x6 images
g::variable<"w", double, 4, 3, 3, 3> w;      // 3 -> 4 channels, 3x3
g::variable<"b", double, 4> b;
g::variable<"u5", double, 2, 4, 5, 4> u5;    // weights of a loss over [2,4,5,4]
g::variable<"u7", double, 2, 4, 7, 6> u7;    // ... over [2,4,7,6] (padding 1)
g::variable<"u3", double, 2, 4, 3, 2> u3;    // ... over [2,4,3,2] (stride 2, padding 0)
g::variable<"p3", double, 2, 3, 3, 3> p3;    // ... over pooled [2,3,3,3]
g::variable<"p4", double, 2, 3, 4, 3> p4;    // ... over pooled [2,3,4,3] (3x3, stride 2, pad 1)

struct fixture {
  session s;
  fixture() {
    set_random(s, x, -1, 1);
    set_random(s, w, -0.7, 0.7);
    set_random(s, b, -0.5, 0.5);
    set_random(s, u5, -1, 1);
    set_random(s, u7, -1, 1);
    set_random(s, u3, -1, 1);
    set_random(s, p3, -1, 1);
    set_random(s, p4, -1, 1);
  }
};

template <class Loss, class V>
void fd_check(session& s, const char* what, const Loss& loss, const V& v) {
  const double err = fd_error(s, loss, g::grad(loss, v), v);
  BOOST_TEST_MESSAGE(what << ": max relative error " << err);
  BOOST_TEST(err < 1e-6, what << ": max relative error " << err);
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(conv_rules, fixture)

BOOST_AUTO_TEST_CASE(conv2d_weights_and_input) {
  const auto l0 = g::sum(g::conv2d(x, w) * u5);
  fd_check(s, "conv2d s1 p0 / w", l0, w);
  fd_check(s, "conv2d s1 p0 / x", l0, x);
  const auto l1 = g::sum(g::square(g::conv2d<1, 1>(x, w) + g::reshape<1, 4, 1, 1>(b)) * u7);
  fd_check(s, "(conv2d s1 p1 + b)^2 / w", l1, w);
  fd_check(s, "(conv2d s1 p1 + b)^2 / x", l1, x);
  fd_check(s, "(conv2d s1 p1 + b)^2 / b", l1, b);
  const auto l2 = g::sum(g::tanh(g::conv2d<2, 0>(x, w)) * u3);
  fd_check(s, "tanh(conv2d s2 p0) / w", l2, w);
  fd_check(s, "tanh(conv2d s2 p0) / x", l2, x);
}

BOOST_AUTO_TEST_CASE(pooling) {
  fd_check(s, "max_pool2d 2 / x", g::sum(g::max_pool2d<2>(x) * p3), x);
  fd_check(s, "max_pool2d 3 s2 p1 / x", g::sum(g::max_pool2d<3, 2, 1>(x) * p4), x);
  fd_check(s, "avg_pool2d 2 / x", g::sum(g::avg_pool2d<2>(x) * p3), x);
  fd_check(s, "avg_pool2d 3 s2 p1 / x", g::sum(g::avg_pool2d<3, 2, 1>(x) * p4), x);
}

// conv -> relu -> max-pool -> flatten -> dense -> mean squared output: LeNet's shape.
BOOST_AUTO_TEST_CASE(lenet_shaped_composite) {
  const auto h = g::max_pool2d<2>(g::relu(g::conv2d<1, 1>(x, w) + g::reshape<1, 4, 1, 1>(b)));  // [2,4,3,3]
  static_assert(std::is_same_v<g::shape_t<decltype(g::flatten(h))>, g::shape<2, 36>>);
  g::variable<"d36", double, 36, 5> d36;
  set_random(s, d36, -1, 1);
  const auto loss = g::mean(g::square(g::matmul(g::flatten(h), d36)));
  fd_check(s, "composite / w", loss, w);
  fd_check(s, "composite / b", loss, b);
  fd_check(s, "composite / d", loss, d36);
  fd_check(s, "composite / x", loss, x);
}

// One conv layer's backward pass: one data-gradient and one weight-gradient kernel.
BOOST_AUTO_TEST_CASE(backward_kernel_trace) {
  const auto loss = g::sum(g::conv2d(x, w) * u5);
  const auto [gw, gx] = g::grad(loss, w, x);
  s.run(loss, gw, gx);
  const auto& st = s.stats();
  BOOST_TEST(st.count("conv2d") == 1u);
  BOOST_TEST(st.count("conv2d_data_grad") == 1u);
  BOOST_TEST(st.count("conv2d_weight_grad") == 1u);
  BOOST_TEST(st.count("matmul") + st.count("im2col") + st.count("col2im") == 0u);
}

// im2col and col2im are each other's adjoints.
BOOST_AUTO_TEST_CASE(im2col_and_col2im) {
  constexpr g::window2d win{3, 3, 2, 1};
  g::variable<"c", double, 27, 2 * 4 * 3> cv;  // columns of x's 3x3 / s2 / p1 patches
  set_random(s, cv, -1, 1);
  fd_check(s, "im2col / x", g::sum(g::im2col<win>(x) * cv), x);
  fd_check(s, "col2im / c", g::sum(g::col2im<win>(cv, x) * x), cv);
}

BOOST_AUTO_TEST_SUITE_END()
