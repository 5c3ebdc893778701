#define BOOST_TEST_MODULE nn_batch_norm
// nn::batch_norm: training output against loops over the definition (biased batch
// variance), the moving averages after several runs against the EMA computed here (unbiased
// variance), evaluation with the moving averages, gradients against central differences
// (through the batch statistics), and a training step that trains gamma and beta only.
#include "../support/check.hpp"
#include "../support/finite_difference.hpp"

#include <array>
#include <cmath>
#include <vector>

using namespace gradus_test;

namespace {

// per channel of x [n, c, hw]: mean and biased variance
struct stats {
  std::vector<double> mean, var;
};
stats channel_stats(const std::vector<double>& x, int n, int c, int hw) {
  stats s{std::vector<double>(c, 0), std::vector<double>(c, 0)};
  const double cnt = double(n) * hw;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < c; ++k)
      for (int p = 0; p < hw; ++p) s.mean[k] += x[(i * c + k) * hw + p] / cnt;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < c; ++k)
      for (int p = 0; p < hw; ++p) s.var[k] += std::pow(x[(i * c + k) * hw + p] - s.mean[k], 2) / cnt;
  return s;
}
std::vector<double> normalised(const std::vector<double>& x, int n, int c, int hw, const std::vector<double>& mean,
                               const std::vector<double>& var, const std::vector<double>& gamma,
                               const std::vector<double>& beta, double eps) {
  std::vector<double> y(x.size());
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < c; ++k)
      for (int p = 0; p < hw; ++p) {
        const int j = (i * c + k) * hw + p;
        y[j] = (x[j] - mean[k]) / std::sqrt(var[k] + eps) * gamma[k] + beta[k];
      }
  return y;
}

}  // namespace

BOOST_AUTO_TEST_CASE(train_eval_and_moving_averages_nchw) {
  session s;
  g::nn::batch_norm<"bn", 3, double> bn;
  bn.initialize(s);
  const std::vector<double> gamma{1.5, -0.5, 2.0}, beta{0.1, 0.2, -0.3};
  gradus::assign(s, bn.gamma, g::view(gamma.data(), {3}));
  gradus::assign(s, bn.beta, g::view(beta.data(), {3}));
  g::placeholder<"x", double, g::dyn, 3, 4, 5> x;
  const auto yt = bn.train(x);
  const auto ye = bn.eval(x);
  std::vector<double> mm(3, 0.0), mv(3, 1.0);
  for (int run = 0; run < 3; ++run) {
    const int n = 2 + run;
    auto xs = uniform<double>(static_cast<std::size_t>(n * 60), -2 + run, 3 + 2 * run);
    const auto st = channel_stats(xs, n, 3, 20);
    const auto r = s.run(yt, x = g::view(xs.data(), {n, 3, 4, 5}));
    BOOST_TEST(close(r, normalised(xs, n, 3, 20, st.mean, st.var, gamma, beta, 1e-5), 1e-12, {}, 1e-12));
    const double cnt = n * 20.0;
    for (int k = 0; k < 3; ++k) {
      mm[k] = 0.9 * mm[k] + 0.1 * st.mean[k];
      mv[k] = 0.9 * mv[k] + 0.1 * st.var[k] * cnt / (cnt - 1);
    }
    BOOST_TEST(close(gradus::value(s, bn.moving_mean), mm, 1e-12), "moving mean after run " << run);
    BOOST_TEST(close(gradus::value(s, bn.moving_var), mv, 1e-12), "moving variance after run " << run);
  }
  // evaluation uses the moving averages and changes nothing
  const auto xs = uniform<double>(2 * 60, -1, 1);
  const auto r = s.run(ye, x = g::view(xs.data(), {2, 3, 4, 5}));
  BOOST_TEST(close(r, normalised(xs, 2, 3, 20, mm, mv, gamma, beta, 1e-5), 1e-12, {}, 1e-12));
  BOOST_TEST(close(gradus::value(s, bn.moving_mean), mm, 1e-12));
}

BOOST_AUTO_TEST_CASE(train_dense_float) {
  g::session<g::cpu_simd> s;
  g::nn::batch_norm<"bn2", 4> bn;
  bn.initialize(s);
  g::placeholder<"x", float, g::dyn, 4> x;
  const auto xs = uniform<float>(8 * 4, -3, 3);
  std::vector<double> xd(xs.begin(), xs.end());
  const auto st = channel_stats(xd, 8, 4, 1);
  const auto r = s.run(bn.train(x), x = g::view(xs.data(), {8, 4}));
  BOOST_TEST(close(r, normalised(xd, 8, 4, 1, st.mean, st.var, {1, 1, 1, 1}, {0, 0, 0, 0}, 1e-5), 1e-5, {}, 1e-5));
}

namespace {
g::variable<"xv", double, 3, 2, 3, 3> xv;
g::variable<"u", double, 3, 2, 3, 3> u;
g::variable<"xd", double, 5, 3> xd;
g::variable<"ud", double, 5, 3> ud;
}  // namespace

BOOST_AUTO_TEST_CASE(gradients_through_batch_statistics) {
  session s;
  g::nn::batch_norm<"bn4", 2, double> bn;
  g::nn::batch_norm<"bn5", 3, double> bnd;
  bn.initialize(s);
  bnd.initialize(s);
  set_random(s, bn.gamma, 0.5, 1.5);
  set_random(s, bn.beta, -0.5, 0.5);
  set_random(s, bnd.gamma, 0.5, 1.5);
  set_random(s, xv, -1, 2);
  set_random(s, u, -1, 1);
  set_random(s, xd, -2, 1);
  set_random(s, ud, -1, 1);
  // a non-linear loss, so the gradient through the mean and the variance is not trivial
  const auto l4 = g::sum(g::square(bn.train(xv)) * u + bn.train(xv) * u);
  for (const char* what : {"x", "gamma", "beta"}) {
    double err = 0;
    if (std::string(what) == "x") err = fd_error(s, l4, g::grad(l4, xv), xv);
    else if (std::string(what) == "gamma") err = fd_error(s, l4, g::grad(l4, bn.gamma), bn.gamma);
    else err = fd_error(s, l4, g::grad(l4, bn.beta), bn.beta);
    BOOST_TEST(err < 1e-6, "NCHW batch_norm / " << what << ": " << err);
  }
  const auto l2 = g::sum(g::tanh(bnd.train(xd)) * ud);
  BOOST_TEST(fd_error(s, l2, g::grad(l2, xd), xd) < 1e-6);
  BOOST_TEST(fd_error(s, l2, g::grad(l2, bnd.gamma), bnd.gamma) < 1e-6);
}

BOOST_AUTO_TEST_CASE(minimize_trains_gamma_and_beta_only) {
  session s;
  g::nn::batch_norm<"bn6", 3, double> bn;
  bn.initialize(s);
  g::placeholder<"x", double, g::dyn, 3> x;
  const auto loss = g::mean(g::square(bn.train(x) - 1.0));
  using vars = g::variables_of_t<decltype(loss)>;
  static_assert(std::tuple_size_v<vars> == 2, "only gamma and beta are trainable");
  auto step = g::minimize(s, loss, g::sgd{.lr = 0.1});
  const auto xs = uniform<double>(6 * 3, -1, 1);
  std::vector<double> xd(xs.begin(), xs.end());
  const auto st = channel_stats(xd, 6, 3, 1);
  step.run(x = g::view(xs.data(), {6, 3}));
  // one step = one update of the moving averages (not one per gradient)
  for (int k = 0; k < 3; ++k) {
    BOOST_TEST(std::abs(gradus::value(s, bn.moving_mean)[k] - 0.1 * st.mean[k]) < 1e-12);
    BOOST_TEST(std::abs(gradus::value(s, bn.moving_var)[k] - (0.9 + 0.1 * st.var[k] * 6 / 5)) < 1e-12);
  }
  // dL/dbeta_k = sum over channel k's 6 values of 2 (y - 1) / 18 = 2 (beta - 1) / 3 (the
  // normalised values sum to 0), so beta moves from 0 to 0.1 * 2/3
  for (int k = 0; k < 3; ++k) BOOST_TEST(std::abs(gradus::value(s, bn.beta)[k] - 0.2 / 3) < 1e-12);
}
