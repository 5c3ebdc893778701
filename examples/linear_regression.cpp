// Linear regression by gradient descent: synthetic data y = X·w_true + b_true + noise
// (seeded), a model written as a gradus expression, mean squared error minimised with
// g::minimize (full-batch gradient descent, or minibatches with --batch), and the learned
// coefficients compared with the true ones.
//
//   linear_regression                 progress and the coefficients, human-readable
//   linear_regression --json          one line of JSON metrics on stdout
//   gradus-run -np 2 linear_regression --comm ring --json
//                                     data-parallel: each rank on its share of the samples
//
// The features are independent standard normals, so XᵀX/n ≈ I and the least-squares
// estimate of each coefficient differs from the true one by about noise/sqrt(n) (0.003
// for the defaults); gradient descent reaches that estimate, and `max_abs_coef_error` is
// the largest |learned − true| over the 8 weights and the bias.
#include "example_backend.hpp"  // first: gradus_examples::backend

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gradus/gradus.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "regression_cli.hpp"

namespace g = gradus;

namespace {
using gradus_examples::non_negative;
using gradus_examples::positive;
constexpr g::index_t features = 8;
constexpr std::array<double, features> w_true{1.5, -2.0, 0.5, 3.0, -1.0, 0.25, 2.0, -0.75};
constexpr double b_true = 0.5;
}  // namespace

int main(int argc, char** argv) {
  gradus_examples::regression_cli cli{
      "Linear regression by gradient descent on synthetic data y = X w_true + b_true + noise "
      "(8 standard-normal features, n samples, Gaussian noise), minimising the mean squared error "
      "with gradus (g::minimize, plain gradient descent)."};
  std::int64_t samples = 1000, steps = 200, batch = 0;
  double lr = 0.1, noise = 0.1;
  CLI::App& app = cli.app;
  app.add_option("--samples", samples, "number of samples n")->check(CLI::Range(std::int64_t{2}, std::int64_t{100000000}));
  app.add_option("--steps", steps, "gradient-descent steps (updates)")->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--batch", batch, "minibatch size; 0 = the full batch (plain gradient descent)")
      ->check(non_negative);
  app.add_option("--lr", lr, "learning rate")->check(positive);
  app.add_option("--noise", noise, "standard deviation of the Gaussian noise")->check(non_negative);
  cli.add_shared_options("seed of the data and of the initial weights");

  return cli.run("linear_regression", argc, argv, [&] {
    const std::uint64_t seed = cli.seed;
    const gradus_examples::comm_options& co = cli.co;
    bool json = cli.json;
    auto comm = gradus_examples::make_communicator(co);
    const int rank = comm.rank(), world = comm.world_size();
    // this rank's samples (all of them in one process); full batch = the whole share
    const auto shard = gradus_examples::shard_of(samples, rank, world);
    const std::int64_t mine = shard.end - shard.begin;
    if (batch > mine) batch = mine;
    const std::int64_t b = batch == 0 ? mine : batch;
    if (rank != 0) json = true;  // progress is rank 0's alone (the other ranks print nothing)

    // ---- data: gradus' seeded generator gives the same numbers on every standard library
    const auto n = static_cast<std::size_t>(samples);
    std::vector<float> xs(n * features), ys(n);
    g::init::generator rng(g::init::stream_seed(seed, "data"));
    for (std::size_t i = 0; i < n; ++i) {
      double y = b_true;
      for (std::size_t j = 0; j < features; ++j) {
        const double v = rng.normal();
        xs[i * features + j] = static_cast<float>(v);
        y += w_true[j] * v;
      }
      ys[i] = static_cast<float>(y + noise * rng.normal());
    }

    // ---- the model and its loss, as expressions
    g::placeholder<"x", float, g::dyn, features> x;
    g::placeholder<"y", float, g::dyn, 1> y;
    g::variable<"w", float, features, 1> w;
    g::variable<"b", float, 1> bias;
    const auto pred = g::matmul(x, w) + bias;
    const auto loss = g::mean(g::square(pred - y));

    g::session<gradus_examples::backend> s;
    s.set_check_numerics(co.check_numerics);
    g::initialize(s, w, g::init::normal{0, 0.1}, seed);
    g::initialize(s, bias, g::init::zeros{}, seed);
    auto step = g::parallel::minimize(comm, gradus_examples::data_parallel_options(co), s, loss, g::sgd{.lr = lr});
    step.set_run_fingerprint({{"samples", std::to_string(samples)}, {"steps", std::to_string(steps)},
                              {"batch", std::to_string(batch)}, {"noise", g::shortest_text(noise)},
                              {"seed", std::to_string(seed)}});

    if (!json) {
      std::printf("linear regression: n = %lld, %lld features, noise %.3g, %s, lr %g, %lld steps\n",
                  static_cast<long long>(samples), static_cast<long long>(features), noise,
                  batch == 0 ? "full batch" : ("minibatches of " + std::to_string(b)).c_str(), lr,
                  static_cast<long long>(steps));
      std::printf("true coefficients: w =");
      for (double v : w_true) std::printf(" %g", v);
      std::printf(", b = %g\n", b_true);
    }

    const std::int64_t batches = mine / b;  // a partial last batch is skipped
    const std::int64_t report = std::max<std::int64_t>(1, steps / 10);
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t k = 0; k < steps; ++k) {
      const auto first = static_cast<std::size_t>(shard.begin + (k % batches) * b);
      const float l = step.run(x = g::view(xs.data() + first * features, {b, features}),
                               y = g::view(ys.data() + first, {b, 1}));
      co.maybe_slow(rank);
      if (!std::isfinite(l)) {
        std::fprintf(stderr, "linear_regression: the loss diverged at step %lld (loss %g); lower --lr\n",
                     static_cast<long long>(k), static_cast<double>(l));
        return 1;
      }
      if (!json && (k % report == 0 || k + 1 == steps))
        std::printf("step %6lld  loss %.6f\n", static_cast<long long>(k), static_cast<double>(l));
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step.pull_variables();  // --comm ps: every worker ends on the servers' final values

    // ---- results: the full-data loss and the coefficients against the true ones
    const double final_loss = s.run(loss, x = g::view(xs.data(), {samples, features}), y = g::view(ys.data(), {samples, 1}))[0];
    const auto wv = g::value(s, w);
    const double bv = g::value(s, bias)[0];
    double max_err = std::abs(bv - b_true);
    std::vector<double> learned;
    for (std::size_t j = 0; j < features; ++j) {
      learned.push_back(wv[static_cast<g::index_t>(j)]);
      max_err = std::max(max_err, std::abs(learned.back() - w_true[j]));
    }

    if (rank != 0) return 0;  // the replicas are identical: rank 0 reports
    if (json) {
      nlohmann::ordered_json j;
      j["example"] = "linear_regression";
      j["world_size"] = world;
      j["comm"] = comm.name();
      j["samples"] = samples;
      j["features"] = features;
      j["noise"] = noise;
      j["seed"] = seed;
      j["lr"] = lr;
      j["batch"] = b;
      j["steps"] = steps;
      j["threads"] = gradus_examples::threads();
      j["final_loss"] = final_loss;
      j["max_abs_coef_error"] = max_err;
      j["w"] = learned;
      j["b"] = bv;
      j["seconds"] = seconds;
      std::cout << j.dump() << std::endl;
    } else {
      std::printf("learned:           w =");
      for (double v : learned) std::printf(" %.4f", v);
      std::printf(", b = %.4f\n", bv);
      std::printf("final loss (MSE over all %lld samples) %.6f (noise variance %.6f)\n",
                  static_cast<long long>(samples), final_loss, noise * noise);
      std::printf("max |learned - true| over the coefficients and the bias: %.5f (noise/sqrt(n) = %.5f)\n", max_err,
                  noise / std::sqrt(static_cast<double>(samples)));
      std::printf("%lld steps in %.3f s\n", static_cast<long long>(steps), seconds);
    }
    return 0;
  });
}
