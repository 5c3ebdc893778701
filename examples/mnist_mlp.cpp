// MNIST, a 784-256-128-10 ReLU MLP trained with softmax cross-entropy and SGD (lr 0.05,
// momentum 0.9, batch 64) on the real data set (tools/fetch-mnist.sh puts it in
// data/mnist/), evaluated on the 10,000 test images after every epoch.
//
//   mnist_mlp [--data DIR] [--epochs N] [--batch B] [--threads T] [--seed S] [--json]
//
// With --json the last line of stdout is one JSON object: test_accuracy (0-1, after the
// last epoch), epoch_seconds (mean training seconds per epoch, evaluation excluded),
// examples_per_second, final_loss (mean training loss of the last epoch), peak_rss_mb.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace g = gradus;

namespace {
double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MNIST 784-256-128-10 ReLU MLP, softmax cross-entropy, SGD with momentum, trained with gradus."};
  app.option_defaults()->always_capture_default();
  std::string dir = "data/mnist";
  int epochs = 1, threads = 2;
  std::int64_t batch = 64;
  std::uint64_t seed = 1;
  double lr = 0.05, momentum = 0.9;
  bool json = false;
  app.add_option("--data", dir, "directory with the four MNIST IDX files (tools/fetch-mnist.sh)");
  app.add_option("--epochs", epochs, "training epochs")->check(CLI::Range(1, 1000));
  app.add_option("--batch", batch, "minibatch size")->check(CLI::Range(std::int64_t{1}, std::int64_t{60000}));
  app.add_option("--threads", threads, "threads (OpenMP and OpenBLAS)")->check(CLI::Range(1, 256));
  app.add_option("--seed", seed, "seed of the initial weights and the shuffling");
  app.add_option("--lr", lr, "learning rate")->check(CLI::Range(0.0, 10.0));
  app.add_option("--momentum", momentum, "SGD momentum")->check(CLI::Range(0.0, 0.999));
  app.add_flag("--json", json, "print one final line of JSON metrics");
  CLI11_PARSE(app, argc, argv);

  try {
    g::cpu_simd::set_threads(threads);
    g::dims train_shape, test_shape;
    auto train_x = g::data::load_mnist_images(dir + "/train-images-idx3-ubyte", &train_shape);
    auto train_y = g::data::load_mnist_labels(dir + "/train-labels-idx1-ubyte");
    const auto test_x = g::data::load_mnist_images(dir + "/t10k-images-idx3-ubyte", &test_shape);
    const auto test_y = g::data::load_mnist_labels(dir + "/t10k-labels-idx1-ubyte");
    const g::index_t n = train_shape.d[0], nt = test_shape.d[0];
    if (train_shape.d[1] != 784 || test_shape.d[1] != 784 || static_cast<g::index_t>(train_y.size()) != n ||
        static_cast<g::index_t>(test_y.size()) != nt)
      throw g::data_error("gradus: mnist_mlp: the images are not 28x28 or their counts differ from the labels'");

    g::placeholder<"x", float, g::dyn, 784> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::dense<"fc1", 784, 256> fc1;
    g::nn::dense<"fc2", 256, 128> fc2;
    g::nn::dense<"fc3", 128, 10> fc3;
    const auto logits = fc3(g::relu(fc2(g::relu(fc1(x)))));
    const auto loss = g::nn::softmax_cross_entropy_loss(logits, y);

    g::session<g::cpu_simd> s;
    fc1.initialize(s, seed);
    fc2.initialize(s, seed);
    fc3.initialize(s, seed, g::init::glorot_uniform{});
    auto step = g::minimize(s, loss, g::sgd{.lr = lr, .momentum = momentum});

    const g::data::dataset train(std::move(train_x), g::dims{784}, std::move(train_y));
    double train_seconds = 0, last_loss = 0, acc = 0;
    for (int e = 0; e < epochs; ++e) {
      const auto t0 = std::chrono::steady_clock::now();
      double sum = 0;
      std::int64_t steps = 0;
      for (auto [xb, yb] : train.shuffle(seed, static_cast<std::uint64_t>(e)).batch(batch)) {
        sum += step.run(x = xb, y = yb);
        ++steps;
      }
      train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      last_loss = sum / static_cast<double>(steps);
      std::int64_t hits = 0;
      for (g::index_t b0 = 0; b0 < nt; b0 += 1000) {
        const g::index_t m = std::min<g::index_t>(1000, nt - b0);
        const auto out = s.run(logits, x = g::view(test_x.data() + b0 * 784, {m, 784}));
        hits += static_cast<std::int64_t>(
            std::lround(g::nn::accuracy(out, g::tensor_view<const std::int32_t>{test_y.data() + b0, g::dims{m}}) *
                        static_cast<double>(m)));
      }
      acc = static_cast<double>(hits) / static_cast<double>(nt);
      if (!json)
        std::printf("epoch %d/%d  loss %.4f  test accuracy %.4f  %.2f s  %.0f examples/s\n", e + 1, epochs, last_loss,
                    acc, train_seconds / (e + 1), static_cast<double>(n) * (e + 1) / train_seconds);
    }
    if (json) {
      const nlohmann::json j = {{"example", "mnist_mlp"},
                                {"epochs", epochs},
                                {"batch", batch},
                                {"threads", threads},
                                {"seed", seed},
                                {"test_accuracy", acc},
                                {"epoch_seconds", train_seconds / epochs},
                                {"examples_per_second", static_cast<double>(n) * epochs / train_seconds},
                                {"final_loss", last_loss},
                                {"peak_rss_mb", peak_rss_mb()}};
      std::cout << j.dump() << std::endl;
    }
  } catch (const g::error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
