// What examples/mnist_common.hpp declares and every MNIST example shares without a template:
// options, loading, checkpoints, the metrics CSV and curves, the JSON line. Compiled once
// (CMake: gradus_examples_common), so that an example's translation unit compiles its model.
#include "mnist_common.hpp"

#include "cli_checks.hpp"

#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <tuple>

#include <gradus/io/checkpoint.hpp>
#include <gradus/util/metrics_log.hpp>
#include <gradus/util/svg_plot.hpp>

namespace gradus_examples {

void add_mnist_options(CLI::App& app, mnist_options& o) {
  app.option_defaults()->always_capture_default();
  app.add_option("--data", o.data, "directory with the four MNIST IDX files (tools/fetch-mnist.sh)");
  app.add_option("--epochs", o.epochs, "training epochs (in all, counting those a resumed checkpoint holds)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--batch", o.batch, "minibatch size")->check(CLI::Range(std::int64_t{1}, std::int64_t{60000}));
  app.add_option("--threads", o.threads, "threads (fused passes and GEMM blocks; fewer while other processes hold cores, same results)")->check(CLI::Range(1, 256));
  app.add_option("--seed", o.seed, "seed of the initial weights and of each epoch's shuffle")->check(seed_check);
  app.add_flag("--json", o.json, "print one final line of JSON metrics on stdout");
  app.add_flag("--quiet", o.quiet, "no progress output on stderr");
  app.add_option("--metrics", o.metrics, "append one row per epoch to this CSV file (epoch, step, train_loss, ...)");
  app.add_option("--plot", o.plot, "write the loss and accuracy curves to this SVG file after every epoch");
  auto* ck =
      app.add_option("--checkpoint", o.checkpoint, "save the weights and optimizer state to this .npz after every epoch");
  app.add_flag("--resume", o.resume, "restore --checkpoint (when it exists) and continue at its next epoch")->needs(ck);
  app.add_option("--train-limit", o.train_limit, "train on the first N training images only (0: all)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{60000}));
  app.add_option("--log-every", o.log_every, "without a terminal: a progress line every N steps (0: one per epoch)")
      ->check(CLI::Range(std::int64_t{0}, std::numeric_limits<std::int64_t>::max()));
  app.add_option("--max-loss-ratio", o.max_loss_ratio,
                 "stop with an error when a step's loss is not finite or exceeds this times the run's first loss "
                 "(a diverging run; 0: only non-finite losses)")
      ->check(finite_range(0.0, 1e300));
  app.add_option("--stages", o.stages,
                 "pipeline stages: the model cut into S parts over S ranks per replica (gradus-run -np S x replicas; "
                 "1: no pipeline)")
      ->check(CLI::Range(1, 64));
  app.add_option("--micro-batches", o.micro_batches,
                 "micro-batches per batch in a pipeline (gradients accumulated over them, one update per batch)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--schedule", o.schedule,
                 "pipeline schedule: 1f1b (one forward, one backward: at most S micro-batches in flight) or gpipe (all "
                 "forwards, then all backwards)")
      ->check(CLI::IsMember({"gpipe", "1f1b"}));
  app.add_flag("--rematerialize", o.rematerialize,
               "a pipeline: keep only each micro-batch's stage input and recompute its forward pass in the backward");
  app.add_flag("--log-placement", o.log_placement,
               "a pipeline: log on stderr where each node ran (stage, rank) and the bytes sent across each cut per step "
               "(TensorFlow's log_device_placement)");
  app.add_option("--precision", o.precision,
                 "compute precision: fp32, bf16 (matmuls and convolutions in bfloat16 with fp32 sums and fp32 master "
                 "weights) or fp16 (the same in IEEE half, with dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  add_comm_options(app, o);
}


mnist_data load_mnist(const mnist_options& o) {
  g::dims train_shape, test_shape;
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    const auto p = std::filesystem::path(o.data) / f;
    std::error_code ec;
    if (std::filesystem::is_directory(p, ec))
      throw g::data_error("gradus: MNIST: IDX file '" + o.data + "/" + f + "': cannot open it (it is a directory, " +
                          "not a file); point --data DIR at the directory that holds the four MNIST files");
    if (!std::filesystem::is_regular_file(p, ec))
      throw g::data_error("gradus: MNIST: IDX file '" + o.data + "/" + f + "': cannot open it (no such file); " +
                          "tools/fetch-mnist.sh puts the four MNIST files in data/mnist/, or point --data DIR at a "
                          "directory that holds them");
  }
  // the training images stay bytes (47 MB, not 188 MB as float); batches are scaled to [0, 1];
  // images other than 28x28 are refused by the loaders, naming the file and both sizes
  auto train_x = g::data::load_mnist_image_bytes(o.data + "/train-images-idx3-ubyte", &train_shape, 28, 28);
  auto train_y = g::data::load_mnist_labels(o.data + "/train-labels-idx1-ubyte");
  auto test_x = g::data::load_mnist_images(o.data + "/t10k-images-idx3-ubyte", &test_shape, 28, 28);
  auto test_y = g::data::load_mnist_labels(o.data + "/t10k-labels-idx1-ubyte");
  const g::index_t n = train_shape.d[0], nt = test_shape.d[0];
  for (const auto& [set, images, labels] :
       {std::tuple{"train", n, train_y.size()}, std::tuple{"t10k", nt, test_y.size()}})
    if (static_cast<g::index_t>(labels) != images)
      throw g::data_error("gradus: MNIST in '" + o.data + "': " + set + "-images-idx3-ubyte holds " +
                          std::to_string(images) + " images but " + set + "-labels-idx1-ubyte " +
                          std::to_string(labels) + " labels: each image needs one label");
  if (o.train_limit > 0 && o.train_limit < n) {
    train_x.resize(static_cast<std::size_t>(o.train_limit * 784));
    train_y.resize(static_cast<std::size_t>(o.train_limit));
  }
  return {g::data::dataset(std::move(train_x), g::dims{784}, std::move(train_y), 1.0f / 255.0f), std::move(test_x),
          std::move(test_y), nt};
}

// --lr and --momentum of the examples trained with SGD (defaults: the 0.05, 0.9).
std::optional<int> parse_command_line(int argc, char** argv, const std::string& description, mnist_options& o,
                                      const std::vector<number_option>& own) {
  CLI::App app{description};
  add_mnist_options(app, o);
  for (const number_option& n : own) app.add_option(n.name, *n.value, n.help)->check(finite_range(n.lo, n.hi));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

void add_sgd_options(CLI::App& app, double& lr, double& momentum) {
  app.add_option("--lr", lr, "learning rate")->check(finite_range(0.0, 10.0));
  app.add_option("--momentum", momentum, "SGD momentum")->check(finite_range(0.0, 0.999));
}

// The peak resident set of this program's address space: /proc/self/status's VmHWM. Not
// getrusage's ru_maxrss, which Linux carries across exec: started by a 230 MB Python
// process (benchmarks/mnist_vs_pytorch.py after `import torch`), this program would report
// the parent's 230 MB instead of its own ~100.
double peak_rss_mb() {
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long kib = -1;
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) break;
    std::fclose(f);
    if (kib >= 0) return static_cast<double>(kib) / 1024.0;
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: KiB
}

// The directory a file will be written to exists (or is created now), before any
// training: a bad --checkpoint path fails at once, not after the first epoch.
void ensure_parent_directory(const std::string& file, const std::string& option) {
  const std::filesystem::path p(file);
  std::error_code ec, stat_ec;  // (stat_ec: a path that cannot be looked at is not a directory here)
  if (p.filename().empty() || std::filesystem::is_directory(p, stat_ec))
    throw g::error("gradus: " + option + " '" + file + "' is a directory, not a file: give a file in it, e.g. '" +
                   (p / "ckpt.npz").lexically_normal().string() + "'");
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  if (ec || (p.has_parent_path() && !std::filesystem::is_directory(p.parent_path())))
    throw g::error("gradus: " + option + " '" + file + "': cannot create the directory '" + p.parent_path().string() +
                   "'" + (ec ? ": " + ec.message() : std::string()));
}

int resumed_epochs(const std::string& example, const mnist_options& o, std::int64_t gs, std::int64_t steps_per_epoch) {
  if (gs == 0) return 0;
  if (gs % steps_per_epoch != 0)
    throw g::error("gradus: " + example + ": checkpoint '" + o.checkpoint + "' holds " + std::to_string(gs) +
                   " steps, not a whole number of epochs of " + std::to_string(steps_per_epoch) +
                   " steps: was it written with another --batch or --train-limit?");
  if (gs / steps_per_epoch >= o.epochs)
    throw g::error("gradus: " + example + ": checkpoint '" + o.checkpoint + "' already holds " +
                   std::to_string(gs / steps_per_epoch) + " epochs; ask for more with --epochs (now " +
                   std::to_string(o.epochs) + ")");
  return static_cast<int>(gs / steps_per_epoch);
}

int rejoined_epoch(const std::string& example, std::int64_t gs, std::int64_t steps_per_epoch) {
  if (gs % steps_per_epoch != 0)
    throw g::error("gradus: " + example + ": this restart came back at global step " + std::to_string(gs) +
                   ", not at an epoch's end (epochs of " + std::to_string(steps_per_epoch) + " steps): the workers' join point moved?");
  return static_cast<int>(gs / steps_per_epoch);
}

struct epoch_records::impl {
  std::string plot;
  std::optional<g::util::metrics_log> log;
  g::util::metrics_table history;
};

epoch_records::epoch_records(const mnist_options& o, int first_epoch, bool chief) : p_(std::make_unique<impl>()) {
  const std::vector<std::string> columns{"epoch",         "step",          "train_loss",         "test_accuracy",
                                         "train_seconds", "examples_per_second", "comm_wait_seconds"};
  p_->plot = o.plot;
  p_->history = {columns, {}};
  if (!o.metrics.empty() && chief) {
    p_->log = first_epoch > 0 ? g::util::metrics_log::append(o.metrics, columns, first_epoch)
                              : g::util::metrics_log::create(o.metrics, columns);
    p_->history = p_->log->table();
  }
}

epoch_records::~epoch_records() = default;

void epoch_records::add(const std::vector<double>& row) {
  if (p_->log) {
    p_->log->write(row);
    p_->history = p_->log->table();
  } else {
    p_->history.rows.push_back(row);
  }
  if (!p_->plot.empty()) g::util::write_svg(p_->plot, g::util::training_curves(p_->history));
}

// GRADUS_RESTART_COUNT: how often gradus-run --max-restarts has started this run again.
static int restart_count() {
  const char* n = std::getenv("GRADUS_RESTART_COUNT");
  return n ? std::max(0, std::atoi(n)) : 0;
}

void print_json(const std::string& example, const mnist_options& o, const run_summary& r) {
  const int run = o.epochs - r.first_epoch;
  nlohmann::json j = {{"example", example},
                      {"epochs", o.epochs},
                      {"start_epoch", r.first_epoch + 1},
                      {"batch", o.batch},
                      {"threads", o.threads},
                      {"seed", o.seed},
                      {"train_examples", r.train_examples},
                      {"test_accuracy", r.test_accuracy},
                      {"epoch_seconds", r.train_seconds / run},
                      {"examples_per_second", static_cast<double>(r.train_examples) * run / r.train_seconds},
                      {"final_loss", r.final_loss},
                      {"world_size", r.world_size},
                      {"comm", r.comm},
                      {"comm_wait_seconds", r.comm_wait_seconds / run},
                      {"peak_rss_mb", peak_rss_mb()},
                      {"restarts", restart_count()},
                      {"precision", o.precision},
                      {"loss_scale", r.loss_scale},
                      {"skipped_steps", r.skipped_steps}};
  if (r.peak_device_mb >= 0) j["peak_device_mb"] = r.peak_device_mb;
  if (r.stages > 0) {
    j["stages"] = r.stages;
    j["micro_batches"] = r.micro_batches;
    j["schedule"] = r.schedule;
    j["rematerialize"] = o.rematerialize;
    j["bubble_fraction"] = r.bubble_fraction;
    j["ideal_bubble_fraction"] = r.ideal_bubble;
    j["bytes_per_step"] = r.bytes_per_step;
    j["peak_activation_mb"] = r.peak_activation_mb;
    j["deferred_gradient_mb"] = r.deferred_mb;
  }
  if (o.comm == "ps") {
    j["consistency"] = o.consistency;
    j["servers"] = cluster_ps_count();
  }
  std::cout << j.dump() << std::endl;
}

}  // namespace gradus_examples
