// Ridge regression two ways, in double precision, on seeded synthetic data (correlated
// features of different scales and non-zero means):
//
//   objective   L(w, b) = 1/(2n) · Σᵢ (xᵢ·w + b − yᵢ)²  +  λ/2 · ‖w‖²
//               (mean squared error / 2 plus λ/2 times the squared norm of the weights;
//               the bias b is NOT penalised)
//
//   (a) closed form, through xtensor-blas (xt::linalg, LAPACK): setting ∂L/∂b = 0 gives
//       b = ȳ − x̄·w, and substituting it leaves ridge on the centred data
//       X_c = X − x̄, y_c = y − ȳ, whose normal equations are
//           (X_cᵀ X_c / n + λ I) w = X_cᵀ y_c / n,      b = ȳ − x̄·w
//       (the exact minimiser of L above, not an approximation).
//   (b) gradient descent in gradus: L written as an expression over the raw (uncentred)
//       data with a bias variable, minimised with g::minimize and plain gradient descent
//       until the gradient's norm is below --tol (or --steps updates).
//
// `closed_form_vs_gd_rel_diff` = ‖w_gd − w_cf‖ / ‖w_cf‖ (the weights; the bias's
// difference is `bias_abs_diff`). The Hessian of L is constant: the example reports its
// condition number (xt::linalg::eigvalsh), which sets how many steps descent needs.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
// xtensor-blas next to gradus' backend: both use xtensor-blas's CBLAS declarations (the
// backend includes them), so LAPACK and BLAS calls all go to OpenBLAS.
#include <xtensor-blas/xlinalg.hpp>
#include <xtensor/xtensor.hpp>
#include <xtensor/xview.hpp>

#include "regression_cli.hpp"

namespace g = gradus;

namespace {
using gradus_examples::non_negative;
using gradus_examples::positive;
constexpr g::index_t features = 10;
}

int main(int argc, char** argv) {
  gradus_examples::regression_cli cli{
      "Ridge regression in double precision, objective\n"
      "  L(w, b) = 1/(2n) * sum_i (x_i.w + b - y_i)^2 + lambda/2 * ||w||^2   (bias not penalised),\n"
      "solved (a) in closed form, (X_c^T X_c/n + lambda I) w = X_c^T y_c/n on centred data, b = mean(y) - "
      "mean(x).w, through xtensor-blas (LAPACK), and (b) by gradient descent in gradus (g::minimize); "
      "reports ||w_gd - w_cf|| / ||w_cf||."};
  std::int64_t samples = 500, steps = 20000;
  double lambda = 0.1, lr = 0.3, tol = 1e-10, noise = 0.5;
  CLI::App& app = cli.app;
  app.add_option("--samples", samples, "number of samples n")->check(CLI::Range(std::int64_t{2}, std::int64_t{100000000}));
  app.add_option("--lambda", lambda, "L2 penalty lambda on the weights")->check(non_negative);
  app.add_option("--steps", steps, "most gradient-descent steps")->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--tol", tol, "stop when the gradient's norm is below this")->check(non_negative);
  app.add_option("--lr", lr, "learning rate of gradient descent")->check(positive);
  app.add_option("--noise", noise, "standard deviation of the Gaussian noise")->check(non_negative);
  cli.add_shared_options("seed of the data and of the initial weights");

  return cli.run("ridge_regression", argc, argv, [&] {
    const std::uint64_t seed = cli.seed;
    const gradus_examples::comm_options& co = cli.co;
    bool json = cli.json;

    // ---- data: x = A z + mu (correlated, scaled, shifted), y = x.w_true + b_true + noise
    const auto n = static_cast<std::size_t>(samples);
    constexpr auto d = static_cast<std::size_t>(features);
    g::init::generator rng(g::init::stream_seed(seed, "data"));
    xt::xtensor<double, 2> mix(std::array<std::size_t, 2>{d, d});
    for (std::size_t i = 0; i < d; ++i)
      for (std::size_t j = 0; j < d; ++j)
        mix(i, j) = (i == j ? 0.5 + 0.15 * static_cast<double>(i) : 0) + (j == 0 ? 0.5 : 0);  // scales, a shared factor
    xt::xtensor<double, 1> w_true(std::array<std::size_t, 1>{d}), mu(std::array<std::size_t, 1>{d});
    for (std::size_t j = 0; j < d; ++j) {
      w_true(j) = rng.uniform(-2, 2);
      mu(j) = rng.uniform(-1, 1);
    }
    const double b_true = 0.7;
    xt::xtensor<double, 2> X(std::array<std::size_t, 2>{n, d});
    xt::xtensor<double, 1> y(std::array<std::size_t, 1>{n});
    std::vector<double> z(d);
    for (std::size_t i = 0; i < n; ++i) {
      for (auto& v : z) v = rng.normal();
      for (std::size_t j = 0; j < d; ++j) {
        double v = mu(j);
        for (std::size_t k = 0; k < d; ++k) v += mix(j, k) * z[k];
        X(i, j) = v;
      }
      double t = b_true + noise * rng.normal();
      for (std::size_t j = 0; j < d; ++j) t += X(i, j) * w_true(j);
      y(i) = t;
    }

    // ---- (a) closed form: centred normal equations, solved by LAPACK (gesv)
    const auto tc0 = std::chrono::steady_clock::now();
    const xt::xtensor<double, 1> xbar = xt::mean(X, {0});
    const double ybar = xt::mean(y)();
    const xt::xtensor<double, 2> Xc = X - xt::view(xbar, xt::newaxis(), xt::all());
    const xt::xtensor<double, 1> yc = y - ybar;
    const double inv_n = 1.0 / static_cast<double>(n);
    xt::xtensor<double, 2> A = xt::linalg::dot(xt::transpose(Xc), Xc) * inv_n + lambda * xt::eye<double>(d);
    const xt::xtensor<double, 1> rhs = xt::linalg::dot(xt::transpose(Xc), yc) * inv_n;
    const xt::xtensor<double, 1> w_cf = xt::linalg::solve(A, rhs);
    const double b_cf = ybar - xt::linalg::dot(xbar, w_cf)();
    const double cf_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc0).count();
    // L at the closed-form solution, and the condition number of L's Hessian in (w, b):
    // [[XᵀX/n + λI, x̄], [x̄ᵀ, 1]]
    const xt::xtensor<double, 1> r_cf = xt::linalg::dot(X, w_cf) + b_cf - y;
    const double cf_loss = 0.5 * xt::mean(r_cf * r_cf)() + 0.5 * lambda * xt::sum(w_cf * w_cf)();
    xt::xtensor<double, 2> H = xt::zeros<double>({d + 1, d + 1});
    xt::view(H, xt::range(0, d), xt::range(0, d)) = xt::linalg::dot(xt::transpose(X), X) * inv_n + lambda * xt::eye<double>(d);
    xt::view(H, xt::range(0, d), d) = xbar;
    xt::view(H, d, xt::range(0, d)) = xbar;
    H(d, d) = 1;
    const xt::xtensor<double, 1> eig = xt::linalg::eigvalsh(H);
    const double eig_min = xt::amin(eig)(), eig_max = xt::amax(eig)();

    // ---- (b) gradient descent on the same objective, written as a gradus expression
    g::placeholder<"x", double, g::dyn, features> x;
    g::placeholder<"y", double, g::dyn, 1> yp;
    g::variable<"w", double, features, 1> w;
    g::variable<"b", double, 1> b;
    const auto residual = g::matmul(x, w) + b - yp;
    const auto loss = 0.5 * g::mean(g::square(residual)) + (0.5 * lambda) * g::sum(g::square(w));

    g::session<g::cpu_simd> s;
    s.set_check_numerics(co.check_numerics);
    g::initialize(s, w, g::init::zeros{}, seed);
    g::initialize(s, b, g::init::zeros{}, seed);
    // data-parallel (--comm ring): each rank descends on its share of the rows; the averaged
    // gradients (equal shares) are the full-batch gradient, and the same on every rank, so
    // every rank stops at the same step
    auto comm = gradus_examples::make_communicator(co);
    const int rank = comm.rank(), world = comm.world_size();
    const auto shard = gradus_examples::shard_of(samples, rank, world);
    if (rank != 0) json = true;  // progress is rank 0's alone
    auto step = g::parallel::minimize(comm, gradus_examples::data_parallel_options(co), s, loss, g::sgd{.lr = lr});
    step.set_run_fingerprint({{"samples", std::to_string(samples)}, {"steps", std::to_string(steps)},
                              {"tol", g::shortest_text(tol)}, {"lambda", g::shortest_text(lambda)},
                              {"noise", g::shortest_text(noise)}, {"seed", std::to_string(seed)}});

    if (!json) {
      std::printf("ridge regression: n = %lld, %lld features, lambda %g, noise %g\n", static_cast<long long>(samples),
                  static_cast<long long>(features), lambda, noise);
      std::printf("Hessian of L: eigenvalues in [%.4g, %.4g], condition number %.1f; gradient descent with lr %g "
                  "contracts the error by at most %.4f a step\n",
                  eig_min, eig_max, eig_max / eig_min, lr,
                  std::max(std::abs(1 - lr * eig_min), std::abs(1 - lr * eig_max)));
    }

    const auto feed_x = x = g::view(X.data() + shard.begin * features, {shard.end - shard.begin, features});
    const auto feed_y = yp = g::view(y.data() + shard.begin, {shard.end - shard.begin, 1});
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t done = 0;
    double gnorm = 0;
    for (; done < steps;) {
      const double l = step.run(feed_x, feed_y);
      co.maybe_slow(rank);
      ++done;
      double sq = 0;
      for (const auto& gb : step.gradients())
        for (g::index_t i = 0; i < gb.size; ++i) sq += static_cast<const double*>(gb.data)[i] * static_cast<const double*>(gb.data)[i];
      gnorm = std::sqrt(sq);  // at the weights before this step's update
      if (!std::isfinite(l) || !std::isfinite(gnorm)) {
        std::fprintf(stderr, "ridge_regression: gradient descent diverged at step %lld; lower --lr (below 2/%.4g)\n",
                     static_cast<long long>(done), eig_max);
        return 1;
      }
      if (!json && (done == 1 || done % 100 == 0))
        std::printf("step %6lld  loss %.12g  |grad| %.3e\n", static_cast<long long>(done), l, gnorm);
      if (gnorm <= tol) break;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step.pull_variables();  // --comm ps: every worker ends on the servers' final values
    const double final_loss =
        s.run(loss, x = g::view(X.data(), {samples, features}), yp = g::view(y.data(), {samples, 1}))[0];

    const auto wv = g::value(s, w);
    const double b_gd = g::value(s, b)[0];
    double diff = 0, ref = 0;
    std::vector<double> w_gd, w_closed;
    for (std::size_t j = 0; j < d; ++j) {
      w_gd.push_back(wv[static_cast<g::index_t>(j)]);
      w_closed.push_back(w_cf(j));
      diff += (w_gd[j] - w_cf(j)) * (w_gd[j] - w_cf(j));
      ref += w_cf(j) * w_cf(j);
    }
    const double rel = std::sqrt(diff / ref);

    if (rank != 0) return 0;  // the replicas are identical: rank 0 reports
    if (json) {
      nlohmann::ordered_json j;
      j["example"] = "ridge_regression";
      j["world_size"] = world;
      j["comm"] = comm.name();
      j["samples"] = samples;
      j["features"] = features;
      j["lambda"] = lambda;
      j["noise"] = noise;
      j["seed"] = seed;
      j["lr"] = lr;
      j["steps"] = done;
      j["converged"] = gnorm <= tol;
      j["grad_norm"] = gnorm;
      j["hessian_condition"] = eig_max / eig_min;
      j["final_loss"] = final_loss;
      j["closed_form_loss"] = cf_loss;
      j["closed_form_vs_gd_rel_diff"] = rel;
      j["bias_abs_diff"] = std::abs(b_gd - b_cf);
      j["w_closed_form"] = w_closed;
      j["w_gd"] = w_gd;
      j["b_closed_form"] = b_cf;
      j["b_gd"] = b_gd;
      j["threads"] = g::cpu_simd::threads();
      j["closed_form_seconds"] = cf_seconds;
      j["seconds"] = seconds;
      std::cout << j.dump() << std::endl;
    } else {
      std::printf("%s after %lld steps (%.3f s), |grad| %.3e\n", gnorm <= tol ? "converged" : "stopped",
                  static_cast<long long>(done), seconds, gnorm);
      std::printf("               %-12s %-12s %s\n", "closed form", "descent", "true");
      for (std::size_t j = 0; j < d; ++j)
        std::printf("  w[%zu]        %12.8f %12.8f %8.4f\n", j, w_cf(j), w_gd[j], w_true(j));
      std::printf("  b           %12.8f %12.8f %8.4f\n", b_cf, b_gd, b_true);
      std::printf("objective: closed form %.12f, descent %.12f\n", cf_loss, final_loss);
      std::printf("||w_gd - w_cf|| / ||w_cf|| = %.3e, |b_gd - b_cf| = %.3e\n", rel, std::abs(b_gd - b_cf));
    }
    return 0;
  });
}
