#pragma once
// pipeline<S>(comm, options, session, loss, optimizer): a training step that runs an
// S-stage placed loss (graph/ops/placement.hpp) as a pipeline over the ranks of `comm`.
//
//   auto step = g::parallel::pipeline<2>(comm, {.micro_batches = 8, .schedule = g::parallel::schedule_kind::one_f_one_b},
//                                        s, loss, g::sgd{.lr = 0.05});
//   float l = step.run(x = xb, y = yb);   // every rank, the same call; the batch's loss
//
// Ranks: world = S x R. Rank r runs stage r % S of pipeline replica r / S (a pipeline's stages
// are consecutive ranks: on one host they talk through shared memory). Each step:
//   - the batch (every feed's first axis) is split into M micro-batches (micro_batch_sizes);
//   - the stage runs its forward and backward passes of each micro-batch in the schedule's
//     order (schedule.hpp), receiving its input activations from the previous stage and
//     sending its output to the next, receiving the output's gradient from the next stage
//     and sending its input's gradient back (point-to-point: each transfer a header — kind,
//     step, micro-batch, dims — then the values);
//   - each micro-batch's gradients are accumulated, weighted by its share of the batch (the
//     loss is a mean over the batch's rows, as nn/losses.hpp's are: micro-batch m of b_m rows
//     weighs b_m / B); with R > 1 the replicas of a stage average their sums in their own
//     sub-group (comm.split(stage, replica));
//   - one optimizer update per batch, so the pipelined step equals the unsplit model's (to
//     float rounding: the batch's sums are added in another order).
// Only the first stage reads the feeds its placeholders name (x), only the last those of the
// loss (y); each rank is given the batch and takes what its stage reads.
//
// Faults: every wait is the communicator's (a deadline, a dead peer named); an error names
// this stage, the micro-batch and the peer. At construction each stage checks its
// neighbours' stage count, micro-batches, schedule, re-materialisation and replica count
// and refuses a mismatch, naming both values and the peer.
//
// Measured per step (stats()): the time this rank spent computing (its graphs, gradient
// accumulation, the update) against the step's wall time (the rest is the bubble: waiting
// for the other stages, and the transfers), the bytes it sent and received, and the bytes of
// activations it held at most (graphs in flight).
#include <array>
#include <filesystem>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/parallel/pipeline/checkpoint.hpp"
#include "gradus/parallel/pipeline/pipeline_stage.hpp"
#include "gradus/parallel/pipeline/transfers.hpp"
#include "gradus/parallel/point_to_point.hpp"

namespace gradus::parallel {

/// The step a program holds: the stage this rank runs, behind one interface.
template <class Comm>
class pipeline_step {
 public:
  /// Holds the stage p (what pipeline() makes).
  explicit pipeline_step(std::unique_ptr<pipeline_base<Comm>> p) : p_(std::move(p)) {}
  /// One training step over the batch the feeds hold (every rank, the same call): the
  /// batch's loss (the last stage's, sent to the others). Fails as pipeline_base::run_raw
  /// says: every error names this stage, the micro-batch and the peer.
  template <class... Feeds>
  double run(const Feeds&... feeds) {
    const detail::raw_feed raw[] = {detail::raw_feed{Feeds::name.view(), element_type_of<typename Feeds::value_type>, feeds.data,
                                                     feeds.d, sizeof(typename Feeds::value_type)}...};
    return p_->run_raw(std::span<const detail::raw_feed>(raw, sizeof...(Feeds)));
  }
  /// What this rank's last step measured (time computing, bubble, bytes sent and received,
  /// activations held), and its stage and replica.
  const pipeline_stats& stats() const { return p_->stats(); }
  /// Fields every rank must agree on (batch size, epochs, data seed...), compared with the
  /// pipeline's shape and the optimizer at the first run: ranks that differ fail at once, each
  /// naming the field and both values (agree.hpp). Set before the first run.
  void set_run_fingerprint(std::vector<run_field> fields) { p_->set_run_fingerprint(std::move(fields)); }
  /// What the ranks compare before their first step: the world size, the pipeline's shape
  /// (stages, micro-batches, schedule, re-materialisation), the optimizer and its
  /// hyper-parameters, and the program's fields.
  std::vector<run_field> run_fingerprint() const { return p_->run_fingerprint(); }
  /// Every stage's variables into rank 0's session (every rank calls it).
  void gather_variables() { p_->gather_variables(); }
  /// One file per stage, "run/ckpt.npz" -> "run/ckpt-N.stage-K-of-S.npz", written by replica 0
  /// of each stage, then committed together by rank 0's record "run/ckpt.commit"
  /// (pipeline/checkpoint.hpp): a job killed at any point of a save restarts from the newest
  /// complete set. Every rank calls it.
  void save_checkpoint(const std::filesystem::path& file) { save_pipeline_checkpoint(*p_, file); }
  /// The committed set's files, each read by replica 0 of its stage and broadcast to its
  /// replicas: true when restored, false when nothing is committed yet. Every rank calls it
  /// (two all-reduces), and every rank throws `error`, naming the cause, where the files are
  /// of another stage count or a whole model's, some are missing, they hold another global
  /// step than the commit record, or a stage could not restore its own.
  bool restore_checkpoint(const std::filesystem::path& file) { return restore_pipeline_checkpoint(*p_, file); }
  /// Numbers of every rank (each gives as many), on rank 0 in rank order; the other ranks get
  /// their own back. Every rank calls it.
  std::vector<std::vector<double>> gather_report(const std::vector<double>& mine) { return p_->gather_report(mine); }
  /// This rank in the world: stage rank % S of replica rank / S.
  int rank() const { return p_->rank(); }
  /// Every rank of every stage and replica: S x R.
  int world_size() const { return p_->world_size(); }

 private:
  std::unique_ptr<pipeline_base<Comm>> p_;
};

/// The pipeline of an S-stage placed loss, this rank's stage made (see the top of this file).
/// Every rank of the world calls it together (the neighbours exchange and compare their
/// shapes), with the same S, options, loss and optimizer. Throws `error` where S does not
/// divide the world, the options are invalid, this rank's session cannot run its stage's
/// device, stage replicas need a split the communicator lacks, or a neighbour runs another
/// shape (naming the peer and both values); a transfer's failure as `comm_error`.
template <int S, class Backend, class Comm, expression Loss, class Opt>
pipeline_step<Comm> pipeline(Comm& comm, const pipeline_options& o, session<Backend>& s, const Loss& loss, const Opt& opt) {
  static_assert(point_to_point<Comm>, "gradus: pipeline: the communicator has no point-to-point send/recv");
  static_assert(S >= 1, "gradus: pipeline<S>: S >= 1 stages");
  if (comm.world_size() % S != 0)
    throw error("gradus: pipeline: " + std::to_string(S) + " stages do not divide the world of " +
                std::to_string(comm.world_size()) + " ranks; start a multiple of " + std::to_string(S) + " ranks");
  const int stage = comm.rank() % S;
  std::unique_ptr<pipeline_base<Comm>> p;
  [&]<int... K>(std::integer_sequence<int, K...>) {
    ((stage == K ? (p = std::make_unique<pipeline_stage<K, S, Backend, Comm, Loss, Opt>>(comm, o, s, loss, opt), 0) : 0), ...);
  }(std::make_integer_sequence<int, S>{});
  return pipeline_step<Comm>(std::move(p));
}


}  // namespace gradus::parallel
