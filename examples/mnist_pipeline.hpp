#pragma once
// The MNIST training loop of a pipelined model (--stages S, --micro-batches M, --schedule,
// --rematerialize): the placed loss runs as g::parallel::pipeline<S> over the ranks of
// --comm (gradus-run -np S x R ... --comm ring; R replicas of the pipeline average their
// gradients per stage). An example chooses S at compile time from --stages
// (with_stages<...>) and calls train_mnist_pipelined instead of train_mnist.
//
// Every rank reads the data (its replica's shard of each epoch's shuffle: the stages of one
// replica see the same batches); the first stage feeds the images, the last the labels. At
// each epoch's end every stage's weights go to rank 0 (pipeline_step::gather_variables),
// which evaluates the whole model and reports. The JSON line adds stages, micro_batches,
// schedule, rematerialize, bubble_fraction (the mean over ranks of each rank's idle share of
// its steps: waiting for other stages and transferring), ideal_bubble_fraction ((S - 1) /
// (M + S - 1)) and bytes_per_step (activations and gradients sent by every rank in one
// step), peak_activation_mb and deferred_gradient_mb (per rank: the activations it held at
// most, the stash of its deferred weight gradients).
//
// --checkpoint FILE: after every epoch, replica 0 of each stage writes its stage's file
// (FILE.npz -> FILE-N.stage-K-of-S.npz: its variables, optimizer slots and the global step),
// and rank 0 commits the set (FILE.commit), so that a kill at any point of a save leaves the
// newest complete set; --resume: each stage's replica 0 reads the committed file, its replicas
// take it from there, and the run goes on from the epoch the files hold (the same batches as a
// run that never stopped: 1 epoch, then --resume to 2, equals 2 straight;
// examples/check_pipeline_resume.sh). Files of another stage count, a whole model's file, a
// missing stage or a file changed after its commit are refused on every rank
// (parallel/pipeline/checkpoint.hpp). --metrics and --plot as
// train_mnist's. --comm ps runs no pipeline (docs/pipelines.md says why).
//
// `logits` is the model unplaced (sequential<1>, no on<stage<K>>): what rank 0 evaluates
// after every epoch. A placement is an identity, so it computes what the placed logits do,
// and one evaluation graph serves every S the example builds instead of one per S.
#include <array>
#include <cmath>
#include <iostream>
#include <string>
#include <vector>

#include <gradus/parallel/pipeline/partition.hpp>
#include <gradus/parallel/pipeline/pipeline.hpp>

#include "mnist_common.hpp"

namespace gradus_examples {

// f.template operator()<S>() for the S that --stages names, among Supported.
template <int... Supported, class F>
int with_stages(const std::string& example, int stages, F&& f) {
  int rc = -1;
  ((stages == Supported ? (rc = f.template operator()<Supported>(), 0) : 0), ...);
  if (rc < 0) {
    std::string list;
    ((list += (list.empty() ? "" : ", ") + std::to_string(Supported)), ...);
    throw g::error("gradus: " + example + ": --stages " + std::to_string(stages) + " is not built in; this example runs " +
                   list + " stages");
  }
  return rc;
}

template <int S, class Session, class Loss, class Logits, class X, class Y, class Opt>
int train_mnist_pipelined(const std::string& example, const mnist_options& o, const mnist_data& d, Session& s,
                          const Loss& loss, const Logits& logits, const X& x, const Y& y, const Opt& opt,
                          const std::string& cut);

// An S-stage model trained as --stages and --micro-batches ask: as a pipeline, or (one stage,
// one micro-batch) by the data-parallel step of every other example (train_mnist).
// MixedPipelines: whether a pipeline is built under a mixed precision policy too (each policy
// compiles the pipeline again: an example offers it where it names it, and refuses it
// elsewhere by name).
template <int S, bool MixedPipelines = false, class Session, class Loss, class Logits, class X, class Y, class Opt>
int train_mnist_staged(const std::string& example, const mnist_options& o, const mnist_data& d, Session& s,
                       const Loss& loss, const Logits& logits, const X& x, const Y& y, const Opt& opt,
                       const std::string& cut) {
  if constexpr (MixedPipelines || std::is_same_v<g::precision_of_backend_t<typename Session::backend_type>, g::full_precision>) {
    if (o.pipelined()) return train_mnist_pipelined<S>(example, o, d, s, loss, logits, x, y, opt, cut);
  } else if (o.pipelined()) {
    refuse_precision(example, o);
  }
  if constexpr (S == 1) {
    auto comm = make_communicator(o);
    auto step = g::parallel::minimize(comm, data_parallel_options(o), s, loss, opt);
    return train_mnist(example, o, d, s, step, logits, x, y);
  } else {
    throw g::error("gradus: " + example + ": internal: " + std::to_string(S) + " stages without a pipeline");
  }
}

template <int S, class Session, class Loss, class Logits, class X, class Y, class Opt>
int train_mnist_pipelined(const std::string& example, const mnist_options& o, const mnist_data& d, Session& s,
                          const Loss& loss, const Logits& logits, const X& x, const Y& y, const Opt& opt,
                          const std::string& cut) {
#if defined(GRADUS_EXAMPLE_CUDA)
  (void)o, (void)d, (void)s, (void)loss, (void)logits, (void)x, (void)y, (void)opt, (void)cut;
  throw g::error("gradus: " + example + ": the _cuda twins do not run pipelines yet (--stages, --micro-batches)");
#else
  namespace gp = g::parallel;
  set_threads(o.threads);
  if (o.resume && o.checkpoint.empty())
    throw g::error("gradus: " + example + ": --resume needs --checkpoint FILE.npz");
  if (o.comm == "ps") throw g::error("gradus: " + example + ": a pipeline runs over --comm ring, mpi or local, not ps");
  auto comm = make_communicator(o);
  const int world = comm.world_size(), rank = comm.rank();
  if (world % S != 0)
    throw g::error("gradus: " + example + ": --stages " + std::to_string(S) + " does not divide the " +
                   std::to_string(world) + " ranks; start stages x replicas processes (gradus-run -np " +
                   std::to_string(S * std::max(1, world / S)) + ")" +
                   (o.comm == "local" ? " and let them train together (--comm auto or ring, not local)" : ""));
  const int replicas = world / S, replica = rank / S;
  const bool chief = rank == 0, quiet = o.quiet || !chief;
  auto step = gp::pipeline<S>(comm, {.micro_batches = o.micro_batches, .schedule = gp::parse_schedule(o.schedule),
                                     .rematerialize = o.rematerialize, .placement_log = o.log_placement ? &std::cerr : nullptr},
                              s, loss, opt);
  if (!quiet) std::cerr << example << ": " << S << " stages x " << replicas << " replicas; " << cut << "\n";

  const g::index_t shard_n = d.train.size() / replicas;
  const std::int64_t steps_per_epoch = (shard_n + o.batch - 1) / o.batch;
  step.set_run_fingerprint(mnist_run_fields(o, d, steps_per_epoch));
  if (!o.checkpoint.empty() && replica == 0) ensure_parent_directory(o.checkpoint, "--checkpoint");
  if (o.resume && !step.restore_checkpoint(o.checkpoint) && !quiet)
    std::cerr << example << ": no checkpoint '" << o.checkpoint << "' (a pipeline's commit record '"
              << g::checkpoint_commit_file(o.checkpoint).string() << "') yet: starting at epoch 1\n";
  const int first = resumed_epochs(example, o, s.global_step(), steps_per_epoch);
  epoch_records records(o, first, chief);
  g::util::progress::options popt;
  popt.every = o.log_every;
  g::util::progress bar(std::cerr, g::util::is_terminal(std::cerr), popt);
  double train_seconds = 0, last_loss = 0, acc = 0, bubble_sum = 0, bytes_sum = 0, first_loss = 0;
  std::int64_t steps_run = 0;
  for (int e = first; e < o.epochs; ++e) {
    if (!quiet) bar.start_epoch(e + 1, o.epochs, steps_per_epoch);
    const auto t0 = std::chrono::steady_clock::now();
    double sum = 0;
    std::int64_t k = 0, diverged_at = -1;
    for (auto [xb, yb] : d.train.shuffle(o.seed, static_cast<std::uint64_t>(e)).shard(replica, replicas).batch(o.batch)) {
      if (k++ == steps_per_epoch) break;
      const double l = step.run(x = xb, y = yb);
      o.maybe_slow(rank);
      if (e == first && k == 1) first_loss = l;
      if (diverged_at < 0 && (!std::isfinite(l) || (o.max_loss_ratio > 0 && first_loss > 0 && l > o.max_loss_ratio * first_loss)))
        diverged_at = s.global_step() - 1;
      sum += l;
      bubble_sum += step.stats().bubble_fraction();
      bytes_sum += static_cast<double>(step.stats().bytes_sent);
      ++steps_run;
      if (!quiet) bar.step(l, xb.shape().d[0] * replicas);
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!quiet) bar.stop();
    train_seconds += secs;
    // the epoch's mean loss over the replicas, and whether any rank diverged
    std::vector<double> epoch{sum, static_cast<double>(diverged_at + 1)};
    if (world > 1) comm.allreduce_sum(std::span<double>(epoch));
    last_loss = epoch[0] / static_cast<double>(steps_per_epoch * world);
    if (epoch[1] > 0)
      throw g::error("gradus: " + example + ": training diverged in epoch " + std::to_string(e + 1) +
                     " (a loss that is not finite or above --max-loss-ratio " + g::shortest_text(o.max_loss_ratio) +
                     " times the first); lower the learning rate (--lr)");
    if (!o.checkpoint.empty()) step.save_checkpoint(o.checkpoint);  // each stage's replica 0 its file
    step.gather_variables();  // rank 0 holds the whole model
    if (!chief) continue;
    acc = mnist_test_accuracy(s, logits, x, d);
    if (!quiet) bar.end_epoch({{"test_accuracy", acc}});
    records.add({static_cast<double>(e + 1), static_cast<double>(s.global_step()), last_loss, acc, secs,
                 static_cast<double>(d.train.size()) / secs, 0});
  }
  const auto report = step.gather_report({bubble_sum / static_cast<double>(std::max<std::int64_t>(steps_run, 1)),
                                          bytes_sum / static_cast<double>(std::max<std::int64_t>(steps_run, 1)),
                                          static_cast<double>(step.stats().peak_activation_bytes) / (1 << 20),
                                          static_cast<double>(step.stats().deferred_bytes) / (1 << 20)});
  if (o.json && chief) {
    double bubble = 0, bytes = 0;
    std::vector<double> activation_mb, deferred_mb;
    for (const auto& r : report) bubble += r[0], bytes += r[1], activation_mb.push_back(r[2]), deferred_mb.push_back(r[3]);
    print_json(example, o,
               {.first_epoch = first, .train_examples = static_cast<std::size_t>(d.train.size()), .test_accuracy = acc,
                .train_seconds = train_seconds, .final_loss = last_loss, .world_size = world, .comm = comm.name(),
                .comm_wait_seconds = 0, .peak_device_mb = peak_device_mb(), .loss_scale = step.stats().loss_scale,
                .skipped_steps = step.stats().skipped_steps, .stages = S, .micro_batches = o.micro_batches,
                .schedule = o.schedule, .bubble_fraction = bubble / static_cast<double>(report.size()),
                .ideal_bubble = gp::ideal_bubble(S, o.micro_batches), .bytes_per_step = bytes / replicas,
                .peak_activation_mb = activation_mb, .deferred_mb = deferred_mb});
  }
  return 0;
#endif
}

}  // namespace gradus_examples
