#pragma once
// What the MNIST examples share: their command line, loading the data, the epoch loop with
// a progress bar, evaluation on the 10,000 test images after every epoch, checkpoints and
// resuming, the metrics CSV, the SVG curves and the final JSON line. An example adds its own
// options, builds its model on x [B, 784] float and y [B] int32 (reshaping inside the graph
// where it needs images or sequences) and hands over the session, the training step and the
// logits:
//
//   gradus_examples::mnist_options o;
//   double lr = 0.05, momentum = 0.9;
//   if (auto rc = gradus_examples::parse_command_line(argc, argv, "...", o, gradus_examples::sgd_options(lr, momentum)))
//     return *rc;
//   return gradus_examples::guarded([&] {
//     auto data = gradus_examples::load_mnist(o);
//     g::placeholder<"x", float, g::dyn, 784> x;  g::placeholder<"y", std::int32_t, g::dyn> y;
//     ... logits, session s (variables initialised with o.seed), step = g::minimize(s, loss, opt) ...
//     return gradus_examples::train_mnist("mnist_mlp", o, data, s, step, logits, x, y);
//   });
//
// Reproducibility: epoch e (0-based) trains on train.shuffle(seed, e), so a run resumed
// from the checkpoint of epoch k sees the same batches as one that never stopped, and with
// the same --threads gives the same weights: 1 epoch, then --resume to 2, equals 2 straight
// (examples/check_resume.cmake). The epochs a checkpoint holds are its global_step divided
// by the steps of an epoch.
//
// Data-parallel (--comm ring), every rank: the step compares a run fingerprint before its
// first collective — the graph, the optimizer and its hyper-parameters, and here the batch
// size, steps per epoch, epochs, data seed, training examples and --max-loss-ratio — so
// ranks given another --lr or --batch fail at once, naming the field and both values.
// Only rank 0 reads a checkpoint to resume (node-local disks need not hold it elsewhere):
// its variables, optimizer state and global step are broadcast, so every rank resumes at
// rank 0's epoch. Checkpoints record the world size that wrote them and refuse another.
// At the end the replicas are compared tensor by tensor (step.check_replicas(); every N
// steps with --check-replicas N).
//
// A diverging run stops with an error naming the global step: a step's loss that is not
// finite or above --max-loss-ratio (1000) times the run's first loss. Alone it stops at
// once; data-parallel ranks combine their verdicts with the epoch's losses in one
// all-reduce at the epoch's end, so every rank stops together and names the same step.
//
// With --json, stdout is one JSON line: example, epochs, start_epoch, batch, threads, seed,
// train_examples, test_accuracy (after the last epoch), epoch_seconds (mean training
// seconds per epoch of this run, evaluation excluded), examples_per_second, final_loss
// (mean training loss of the last epoch, over every rank), peak_rss_mb, restarts (the
// GRADUS_RESTART_COUNT that gradus-run --max-restarts gave this start), and in a _cuda twin
// peak_device_mb (the device memory its allocator held at most); precision (--precision),
// loss_scale (the dynamic loss scale at the end; 1 where the policy scales no loss) and
// skipped_steps (steps skipped for Inf/NaN gradients). The progress goes to stderr
// (a live line on a terminal, plain lines otherwise; --quiet turns it off).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "example_backend.hpp"  // gradus_examples::backend: cpu_simd, or cuda in a _cuda twin
#include <gradus/parallel/data_parallel.hpp>
#include <gradus/io/checkpoint.hpp>
#include <gradus/gradus.hpp>
#include <gradus/util/progress.hpp>

#include "comm_options.hpp"

namespace gradus_examples {


namespace g = gradus;

struct mnist_options : comm_options {
  std::string data = "data/mnist";
  int epochs = 1;
  std::int64_t batch = 64;
  int threads = 2;
  std::uint64_t seed = 1;
  bool json = false;
  bool quiet = false;
  bool resume = false;
  std::string metrics, plot, checkpoint;
  std::int64_t train_limit = 0;  // 0: all 60,000
  std::int64_t log_every = 0;    // plain progress: a line every this many steps (0: per epoch)
  double max_loss_ratio = 1000;  // a step's loss above this times the run's first loss: diverged (0: off)
  // a pipeline (examples/mnist_pipeline.hpp): the model cut into --stages over as many ranks
  // (per replica), each batch in --micro-batches, run under --schedule
  int stages = 1;
  int micro_batches = 1;
  std::string schedule = "1f1b";
  bool rematerialize = false;
  bool log_placement = false;  // --log-placement: the pipeline's placement log on stderr
  bool pipelined() const { return stages > 1 || micro_batches > 1; }
  // --precision: the session's policy (core/precision.hpp): fp32, bf16 (g::mixed_bf16) or fp16
  // (g::mixed_fp16, with dynamic loss scaling)
  std::string precision = "fp32";
};

// The options above (and --comm's), with their checks.
void add_mnist_options(CLI::App& app, mnist_options& o);



struct mnist_data {
  g::data::dataset train;
  std::vector<float> test_x;          // [10000, 784] in [0, 1]
  std::vector<std::int32_t> test_y;   // [10000]
  g::index_t test_n = 0;
};

// A ps task serves; restarted (gradus-run --max-restarts), it reloads its shards from
// --checkpoint when the workers rejoin it (server recovery).
inline std::optional<int> serve_if_ps(const mnist_options& o) {
  return serve_if_ps(static_cast<const comm_options&>(o), o.checkpoint);
}

// The four IDX files of --data (the training images stay bytes: 47 MB, not 188 MB as float;
// batches are scaled to [0, 1]); --train-limit keeps the first N training images.
mnist_data load_mnist(const mnist_options& o);

// --lr and --momentum of the examples trained with SGD (defaults: the 0.05, 0.9).
void add_sgd_options(CLI::App& app, double& lr, double& momentum);

// An example's own option: a number in [lo, hi].
struct number_option {
  std::string name, help;
  double* value;
  double lo, hi;
};
inline std::vector<number_option> sgd_options(double& lr, double& momentum) {
  return {{"--lr", "learning rate", &lr, 0.0, 10.0}, {"--momentum", "SGD momentum", &momentum, 0.0, 0.999}};
}

// The example's command line (CLI11, in mnist_common.cpp: an example's translation unit
// does not compile it): the MNIST options, --comm's, and the example's own. Returns the
// exit status when the program should stop (--help: 0; a bad option: its message and
// CLI11's status), nothing when it should go on.
std::optional<int> parse_command_line(int argc, char** argv, const std::string& description, mnist_options& o,
                                      const std::vector<number_option>& own = {});

double peak_rss_mb();

// The directory a file will be written to exists (or is created now), before any
// training: a bad --checkpoint path fails at once, not after the first epoch.
void ensure_parent_directory(const std::string& file, const std::string& option);

// The epochs a resumed run's global step holds (0 for a new run), refusing a step that is
// not a whole number of epochs or already holds every epoch asked for.
int resumed_epochs(const std::string& example, const mnist_options& o, std::int64_t global_step, std::int64_t steps_per_epoch);
// The epoch a parameter-server worker's restart goes on from: the others' step, which is an
// epoch's end (it came back at pull_state's join point).
int rejoined_epoch(const std::string& example, std::int64_t global_step, std::int64_t steps_per_epoch);

// Checkpoints of the session (gradus::io's save_checkpoint / restore_checkpoint, recording
// the world size that wrote them).
template <class B>
void restore_session(g::session<B>& s, const std::string& file, int world) {
  g::restore_checkpoint(s, file, {.world_size = world});
}
template <class B>
void save_session(const g::session<B>& s, const std::string& file, int world) {
  g::save_checkpoint(s, file, {.world_size = world});
}

// Rank 0's record of the epochs: --metrics (a CSV, appended to when resuming at first_epoch)
// and --plot (the loss and accuracy curves, rewritten after every epoch).
class epoch_records {
 public:
  epoch_records(const mnist_options& o, int first_epoch, bool chief);
  ~epoch_records();
  epoch_records(const epoch_records&) = delete;
  epoch_records& operator=(const epoch_records&) = delete;
  // epoch, step, train_loss, test_accuracy, train_seconds, examples_per_second, comm_wait_seconds
  void add(const std::vector<double>& row);

 private:
  struct impl;
  std::unique_ptr<impl> p_;
};

// f.template operator()<P>() for the precision policy --precision names: g::full_precision,
// g::mixed_bf16 or g::mixed_fp16. A mixed one is instantiated only where its flag is true (a
// policy is a session type: each one compiles the training loop again), so an example offers
// them on the paths it names and refuses them elsewhere, naming the option.
[[noreturn]] inline void refuse_precision(const std::string& example, const mnist_options& o) {
  throw g::error("gradus: " + example + ": --precision " + o.precision + " is built for the unpipelined model only " +
                 "in this example (no --stages or --micro-batches); pipelines run in fp32, and in bf16 over the " +
                 "stages of mnist_deep_mlp");
}
template <bool Bf16, bool Fp16 = Bf16, class F>
int with_precision(const std::string& example, const mnist_options& o, F&& f) {
  if (o.precision == "fp32") return f.template operator()<g::full_precision>();
  if constexpr (Bf16)
    if (o.precision == "bf16") return f.template operator()<g::mixed_bf16>();
  if constexpr (Fp16)
    if (o.precision == "fp16") return f.template operator()<g::mixed_fp16>();
  refuse_precision(example, o);
}

// The --json line (the file's header lists its fields).
struct run_summary {
  int first_epoch = 0;  // 0-based epoch this run started at
  std::size_t train_examples = 0;
  double test_accuracy = 0, train_seconds = 0, final_loss = 0;
  int world_size = 1;
  std::string comm;
  double comm_wait_seconds = 0;
  double peak_device_mb = -1;  // -1: not a device backend (no field in the JSON)
  double loss_scale = 1;        // the loss scale at the end (1: the policy scales no loss)
  std::int64_t skipped_steps = 0;  // steps skipped for Inf/NaN gradients under loss scaling
  // a pipelined run (stages > 0): its shape and what it measured
  int stages = 0, micro_batches = 0;
  std::string schedule{};
  double bubble_fraction = 0, ideal_bubble = 0, bytes_per_step = 0;
  // per rank (rank order): the activations it held at most, and its deferred weight
  // gradients' stash, in MB
  std::vector<double> peak_activation_mb{}, deferred_mb{};
};
void print_json(const std::string& example, const mnist_options& o, const run_summary& r);

// Runs f (returning the exit status); a gradus or standard error is printed on stderr, exit 1.
template <class F>
int guarded(F&& f) {
  try {
    return f();
  } catch (const g::error& e) {
    std::cerr << e.what() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
}

// One checksum of the replica (FNV-1a over the per-tensor checksums of
// parallel::replica_fields): data-parallel ranks print it at the end; they must agree.
template <class Session>
std::uint64_t session_checksum(Session& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (const auto& f : g::parallel::replica_fields(s))
    for (const char c : f.name + "=" + f.value + ";") h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// Accuracy of `logits` on the test set, in batches of 1000.
template <class Session, class Logits, class X>
double mnist_test_accuracy(Session& s, const Logits& logits, const X& x, const mnist_data& d) {
  std::int64_t hits = 0;
  for (g::index_t b0 = 0; b0 < d.test_n; b0 += 1000) {
    const g::index_t m = std::min<g::index_t>(1000, d.test_n - b0);
    const auto out = s.run(logits, x = g::view(d.test_x.data() + b0 * 784, {m, 784}));
    hits += static_cast<std::int64_t>(std::lround(
        g::nn::accuracy(out, g::tensor_view<const std::int32_t>{d.test_y.data() + b0, g::dims{m}}) *
        static_cast<double>(m)));
  }
  return static_cast<double>(hits) / static_cast<double>(d.test_n);
}

// What every rank of a run must agree on besides the graph, the optimizer and the world
// (the data-parallel step and the pipeline add those): ranks given another --batch,
// --epochs, --seed, --train-limit or --max-loss-ratio fail at once, naming the field.
inline std::vector<g::parallel::run_field> mnist_run_fields(const mnist_options& o, const mnist_data& d,
                                                            std::int64_t steps_per_epoch) {
  return {{"batch_size", std::to_string(o.batch)},
          {"steps_per_epoch", std::to_string(steps_per_epoch)},
          {"epochs", std::to_string(o.epochs)},
          {"data_seed", std::to_string(o.seed)},
          {"train_examples", std::to_string(d.train.size())},
          {"max_loss_ratio", g::shortest_text(o.max_loss_ratio)}};
}

template <class Session, class Step, class Logits, class X, class Y>
int train_mnist(const std::string& example, const mnist_options& o, const mnist_data& d, Session& s, Step& step,
                const Logits& logits, const X& x, const Y& y) {
  if (o.pipelined())
    throw g::error("gradus: " + example + ": --stages and --micro-batches are not built into this example; " +
                   "mnist_mlp, seq_mnist_lstm and mnist_deep_mlp run as pipelines");
  set_threads(o.threads);
  auto& comm = step.communicator();
  const int rank = comm.rank(), world = comm.world_size();
  const bool chief = rank == 0;
  // Rank r trains on examples r, r + world, ... of each epoch's shuffle (the same shuffle on
  // every rank), in batches of --batch: the world's batch is world x --batch. Every rank
  // takes the same number of steps: those of the smallest shard.
  const g::index_t shard_n = d.train.size() / world;
  const std::int64_t steps_per_epoch = (shard_n + o.batch - 1) / o.batch;
  if (shard_n == 0)
    throw g::error("gradus: " + example + ": " + std::to_string(d.train.size()) + " training examples for " +
                   std::to_string(world) + " ranks");
  const bool quiet = o.quiet || !chief;
  if (o.resume && o.checkpoint.empty())
    throw g::error("gradus: " + example + ": --resume needs --checkpoint FILE.npz");
  if (!o.checkpoint.empty() && chief) ensure_parent_directory(o.checkpoint, "--checkpoint");

  // ---- what every rank must agree on besides the graph and the optimizer (the step adds
  // those): ranks given another --batch, --epochs, --seed or --train-limit fail at once
  step.set_run_fingerprint(mnist_run_fields(o, d, steps_per_epoch));

  // ---- resume: rank 0 reads the checkpoint and every rank takes the state and the global
  // step from it (node-local disks: the others need not see the file); the checkpoint's
  // global step says how many epochs it holds
  if (o.resume && chief && std::filesystem::exists(o.checkpoint)) {
    restore_session(s, o.checkpoint, world);
  } else if (o.resume && chief) {
    if (const auto staged = g::stage_checkpoints_present(o.checkpoint); !staged.empty())
      throw g::error("gradus: " + example + ": --checkpoint '" + o.checkpoint + "' was written by a pipeline of " +
                     std::to_string(staged.back()) + " stages ('" + g::checkpoint_commit_file(o.checkpoint).string() +
                     "'); resume it with --stages " +
                     std::to_string(staged.back()) + ", or start a new run");
    if (!quiet) std::cerr << example << ": no checkpoint '" << o.checkpoint << "' yet: starting at epoch 1\n";
  }
  try {
    step.broadcast_variables();  // compares the run fingerprint first
  } catch (const g::parallel::job_finished& e) {  // a restarted ps worker the job no longer needs
    std::cerr << e.what() << "\n";
    return 0;
  }
  // A parameter-server worker's restart comes back at the others' step, an epoch's end
  // (data_parallel_step::pull_state), and trains the epochs left from there.
  const int first = step.rejoined() ? rejoined_epoch(example, s.global_step(), steps_per_epoch)
                                    : resumed_epochs(example, o, s.global_step(), steps_per_epoch);

  // ---- metrics CSV (appended to when resuming) and the SVG curves, on rank 0
  epoch_records records(o, first, chief);

  g::util::progress::options popt;
  popt.every = o.log_every;
  g::util::progress bar(std::cerr, g::util::is_terminal(std::cerr), popt);
  double train_seconds = 0, last_loss = 0, acc = 0, wait_total = 0;
  double first_loss = 0;                 // this run's first step's loss on this rank
  std::int64_t diverged_at = -1;         // the first global step whose loss diverged here
  double diverged_loss = 0;
  for (int e = first; e < o.epochs; ++e) {
    if (!quiet) bar.start_epoch(e + 1, o.epochs, steps_per_epoch);
    const auto t0 = std::chrono::steady_clock::now();
    const double wait0 = step.stats().wait_seconds;
    double sum = 0;
    std::int64_t k = 0;
    for (auto [xb, yb] : d.train.shuffle(o.seed, static_cast<std::uint64_t>(e)).shard(rank, world).batch(o.batch)) {
      if (k++ == steps_per_epoch) break;
      const std::int64_t at = s.global_step();
      const double l = step.run(x = xb, y = yb);
      o.maybe_slow(rank);
      if (e == first && k == 1) first_loss = l;
      if (diverged_at < 0 &&
          (!std::isfinite(l) || (o.max_loss_ratio > 0 && first_loss > 0 && l > o.max_loss_ratio * first_loss))) {
        diverged_at = at;
        diverged_loss = l;
        if (world == 1) break;  // alone, stop now; a data-parallel rank must finish the epoch's collectives
      }
      sum += l;
      if (!quiet) bar.step(l, xb.shape().d[0] * world);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double wait = step.stats().wait_seconds - wait0;
    if (!quiet) bar.stop();
    train_seconds += secs;
    wait_total += wait;
    // The epoch's mean loss over every rank, and whether any rank diverged: one all-reduce
    // (slot 0: the loss sums; slot 1 + r: rank r's first diverged step + 1), so that every
    // rank stops at the same epoch end and names the same step.
    std::vector<double> epoch(1 + static_cast<std::size_t>(world), 0.0);
    epoch[0] = sum;
    epoch[1 + static_cast<std::size_t>(rank)] = static_cast<double>(diverged_at + 1);
    if (world > 1) comm.allreduce_sum(std::span<double>(epoch));
    last_loss = epoch[0] / static_cast<double>(steps_per_epoch * world);
    for (int r = 0; r < world; ++r)
      if (const double bad = epoch[1 + static_cast<std::size_t>(r)]; bad > 0) {
        std::string what = "gradus: " + example + ": training diverged at global step " +
                           std::to_string(static_cast<std::int64_t>(bad) - 1) + " (epoch " + std::to_string(e + 1) + ")";
        if (world > 1) what += " on rank " + std::to_string(r);
        if (r == rank)
          what += ": loss " + g::shortest_text(static_cast<float>(diverged_loss)) + ", the run's first loss " +
                  g::shortest_text(static_cast<float>(first_loss));
        what += " (the limit: a loss that is not finite or above --max-loss-ratio " + g::shortest_text(o.max_loss_ratio) +
                " times the first); lower the learning rate (--lr)";
        throw g::error(what);
      }
    if (world > 1 && !o.quiet)  // every rank: a straggler's peers wait longest
      std::cerr << example << ": rank " << rank << " of " << world << ": epoch " << e + 1 << ": " << secs
                << " s training, " << wait << " s waiting for the all-reduce\n";
    // --comm ps: the servers' variables and optimizer state into every worker's session, as
    // one consistent step (between two barriers), so that the chief evaluates and saves them
    if (o.comm == "ps") step.pull_state();
    if (!chief) continue;  // the replicas are identical: rank 0 evaluates, saves and reports
    {
      const g::util::trace_span span("evaluate", "train");
      acc = mnist_test_accuracy(s, logits, x, d);
    }
    if (!quiet) bar.end_epoch({{"test_accuracy", acc}});
    if (!o.checkpoint.empty()) {
      const g::util::trace_span span("checkpoint", "io");
      save_session(s, o.checkpoint, world);
    }
    records.add({static_cast<double>(e + 1), static_cast<double>(s.global_step()), last_loss, acc, secs,
                 static_cast<double>(d.train.size()) / secs, wait});
  }

  if (world > 1) {  // every rank: the replicas must hold the same bits
    step.pull_variables();  // a parameter server's final values on every worker
    step.check_replicas();  // names the first tensor that differs, on every rank
    // a chief that came back (a ps restart) after the last epoch's end evaluates here
    if (chief && first >= o.epochs) acc = mnist_test_accuracy(s, logits, x, d);
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(session_checksum(s)));
    // one write: launchers that merge the ranks' output (mpirun) keep the line whole
    std::cerr << (example + ": rank " + std::to_string(rank) + " of " + std::to_string(world) + ": replica checksum " + hex + "\n");
  }
  double loss_scale = 1;
  std::int64_t skipped = 0;
  if constexpr (requires { step.local_step().loss_scale(); }) {
    loss_scale = step.local_step().loss_scale();
    skipped = step.local_step().skipped_steps();
  }
  if (o.json && chief)
    print_json(example, o,
               {.first_epoch = first, .train_examples = static_cast<std::size_t>(d.train.size()), .test_accuracy = acc,
                .train_seconds = train_seconds, .final_loss = last_loss, .world_size = world, .comm = comm.name(),
                .comm_wait_seconds = wait_total, .peak_device_mb = peak_device_mb(), .loss_scale = loss_scale,
                .skipped_steps = skipped});
  return 0;
}

}  // namespace gradus_examples
