// Inference with the MNIST MLP: the forward graph alone (no loss, no optimizer), its weights
// loaded from a checkpoint that `mnist_mlp --checkpoint FILE` wrote (g::load_weights skips
// the optimizer's state and the step counter), classifying the 10,000 test images.
//
//   mnist_infer --checkpoint FILE.npz [--data DIR] [--batch B] [--runs N] [--threads T] [--json]
//
// It prints the test accuracy (the training run's own, for the same weights), the latency
// of one image at batch 1 (median and 99th percentile over --runs single-image runs, after
// a warm-up) and the throughput at --batch (images per second over the whole test set, the
// median of 3 timed passes after a warm-up pass). With --json, stdout is one line: example,
// checkpoint, batch, threads, test_images, test_accuracy, latency_runs, latency_ms_median,
// latency_ms_p99, images_per_second.
//
// Errors: a gradus::error (a missing or mismatched checkpoint, missing data) is caught in
// main and printed, and the program exits 1 — the pattern for a program of one's own.
#include "example_backend.hpp"  // (first: see there)
#include "mnist_mlp_model.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <gradus/gradus.hpp>
#include <gradus/io/weights.hpp>

namespace g = gradus;
namespace gx = gradus_examples;

namespace {

struct options {
  std::string checkpoint, data = "data/mnist";
  std::int64_t batch = 1000;
  int runs = 1000;
  int threads = 2;
  bool json = false;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The value below which a fraction q of the sorted samples lie (nearest rank).
double quantile(const std::vector<double>& sorted, double q) {
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank > 0 ? rank - 1 : 0)];
}

int infer(const options& o) {
  gx::set_threads(o.threads);
  g::placeholder<"x", float, g::dyn, 784> x;
  const gx::mnist_mlp_model m;
  const auto logits = m.logits<1>(x);
  g::session<gx::backend> s;
  g::load_weights(s, o.checkpoint, logits);  // declares fc1/w ... fc3/b, then fills them

  g::dims shape;
  // images other than 28x28 are refused by the loader, naming the file and both sizes
  const std::vector<float> images = g::data::load_mnist_images(o.data + "/t10k-images-idx3-ubyte", &shape, 28, 28);
  const std::vector<std::int32_t> labels = g::data::load_mnist_labels(o.data + "/t10k-labels-idx1-ubyte");
  const g::index_t n = shape.d[0];
  if (static_cast<g::index_t>(labels.size()) != n)
    throw g::data_error("gradus: mnist_infer: MNIST in '" + o.data + "': t10k-images-idx3-ubyte holds " +
                        std::to_string(n) + " images but t10k-labels-idx1-ubyte " + std::to_string(labels.size()) +
                        " labels: each image needs one label");

  // the test set in batches of --batch: the correct predictions
  const auto classify_all = [&] {
    std::int64_t hits = 0;
    for (g::index_t b0 = 0; b0 < n; b0 += o.batch) {
      const g::index_t k = std::min<g::index_t>(o.batch, n - b0);
      const auto out = s.run(logits, x = g::view(images.data() + b0 * 784, {k, 784}));
      hits += std::lround(g::nn::accuracy(out, g::tensor_view<const std::int32_t>{labels.data() + b0, g::dims{k}}) *
                          static_cast<double>(k));
    }
    return hits;
  };
  const std::int64_t hits = classify_all();  // (also the warm-up: plans the graph)
  std::vector<double> pass;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    if (classify_all() != hits) throw g::error("gradus: mnist_infer: two passes over the test set disagree");
    pass.push_back(seconds_since(t0));
  }
  std::sort(pass.begin(), pass.end());
  const double images_per_second = static_cast<double>(n) / pass[1];

  // batch 1: one image a run, the images in turn
  std::vector<double> ms;
  ms.reserve(static_cast<std::size_t>(o.runs));
  float sink = 0;
  for (int r = -10; r < o.runs; ++r) {  // 10 warm-up runs
    const g::index_t i = (r + 10) % n;
    const auto t0 = std::chrono::steady_clock::now();
    const auto out = s.run(logits, x = g::view(images.data() + i * 784, {1, 784}));
    sink += out[0];
    if (r >= 0) ms.push_back(seconds_since(t0) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  const double median = quantile(ms, 0.5), p99 = quantile(ms, 0.99);
  const double accuracy = static_cast<double>(hits) / static_cast<double>(n);

  if (o.json) {
    std::cout << nlohmann::json{{"example", "mnist_infer"},
                                {"checkpoint", o.checkpoint},
                                {"batch", o.batch},
                                {"threads", o.threads},
                                {"test_images", n},
                                {"test_accuracy", accuracy},
                                {"latency_runs", o.runs},
                                {"latency_ms_median", median},
                                {"latency_ms_p99", p99},
                                {"images_per_second", images_per_second}}
                     .dump()
              << std::endl;
  } else {
    std::cout << "mnist_infer: " << o.checkpoint << ": test accuracy " << accuracy << " (" << hits << " of " << n
              << ")\n  batch 1: " << median << " ms median, " << p99 << " ms p99 per image (" << o.runs
              << " runs)\n  batch " << o.batch << ": " << images_per_second << " images/s (" << o.threads
              << " threads)\n";
  }
  return std::isfinite(sink) ? 0 : 1;  // (the outputs are finite: load_weights refuses NaN)
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"MNIST MLP inference: loads the weights of a mnist_mlp --checkpoint file, classifies the test set, "
               "measures latency and throughput."};
  app.option_defaults()->always_capture_default();
  app.add_option("--checkpoint", o.checkpoint, "a .npz that mnist_mlp --checkpoint wrote (or save_weights)")->required();
  app.add_option("--data", o.data, "directory with the MNIST IDX files (tools/fetch-mnist.sh)");
  app.add_option("--batch", o.batch, "batch size of the accuracy and throughput passes")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{10000}));
  app.add_option("--runs", o.runs, "single-image runs timed for the batch-1 latency")->check(CLI::Range(1, 1000000));
  app.add_option("--threads", o.threads, "threads (fused passes and GEMM blocks)")->check(CLI::Range(1, 256));
  app.add_flag("--json", o.json, "print one line of JSON on stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return infer(o);
  } catch (const g::error& e) {  // gradus' errors say what failed, where, and what to do
    std::cerr << e.what() << "\n";
    return 1;
  }
}
