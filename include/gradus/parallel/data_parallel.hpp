#pragma once
// Synchronous data parallelism over any communicator policy (communicator.hpp), as
// PyTorch's DistributedDataParallel and Horovod do it — the one road every data-parallel
// trainer takes (parallel::minimize, gradus::trainer in trainer.hpp, the estimators):
//
//   auto step = g::parallel::minimize(comm, s, loss, g::sgd{.lr = 0.05, .momentum = 0.9});
//   for (auto [xb, yb] : data.shard(comm.rank(), comm.world_size()).batch(64))
//     step.run(x = xb, y = yb);
//
// Each rank runs the same graph on its own shard of the batch; as each gradient is final
// during the backward pass it is finished in one of two ways:
//   - averaged through the collectives (gradient_buckets.hpp): on the first run rank 0's
//     variables and optimizer state are broadcast, so the replicas start identical; the
//     gradients are packed into buckets (25 MiB by default, in reverse order of the
//     variables: the last layers' gradients are final first) and each bucket is all-reduced
//     (averaged) on a background thread as soon as its last gradient is final — while the
//     backward pass computes the rest. Then the optimizer steps. Every rank applies the same
//     averaged gradients to the same variables, so with a deterministic communicator (the
//     ring gives every rank the same bits) the replicas stay bit-identical;
//   - pushed to a key-value store that holds the variables (a parameter server,
//     ps_worker.hpp), whose optimizer applies them; the variables are pulled back.
// Which is the communicator's: a parameter server (or an any_communicator holding one) is a
// store; anything else is averaged. Over a store that takes a lost worker's restart back
// (rejoin_store: async and ssp parameter servers), a restarted process skips the start-up
// collectives, waits for the others' next join point (pull_state's second barrier), and goes
// on from their step (rejoined()); the others compare the run fingerprint with it there.
//
// The background thread (comm_worker.hpp) is the only one that talks to the communicator
// (ZeroMQ sockets belong to one thread). An error there (a dead peer) is rethrown by run(),
// naming what the communicator named. stats() reports the time the training thread waited
// for the collectives (a straggler's peers wait longest) and the time spent inside them.
//
// Before the first broadcast the ranks compare a run fingerprint (agree.hpp): the
// graph's tensors (names, dtypes, shapes), the optimizer and every hyper-parameter, the
// world size, and what the program adds with set_run_fingerprint() (batch size, steps per
// epoch, epochs, the data seed). Ranks that differ in any of them fail at once, every rank
// naming the field and both values, instead of training on with diverging weights.
// check_replicas() compares the replicas' bits (a checksum per tensor) and names the first
// tensor that differs.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/precision.hpp"
#include "gradus/parallel/agree.hpp"
#include "gradus/parallel/comm_worker.hpp"
#include "gradus/parallel/communicator.hpp"
#include "gradus/parallel/gradient_buckets.hpp"
#include "gradus/parallel/ps_worker.hpp"
#include "gradus/train/train_step.hpp"
#include "gradus/util/trace_span.hpp"

namespace gradus::parallel {

/// A lost worker's restart that arrived after the job ended (data_parallel_step, over a
/// parameter server): nothing is left to train; a program exits successfully.
struct job_finished : error {
  using error::error;
};

/// How a data_parallel_step reduces the gradients (parallel::minimize's opts). The step's
/// constructor throws `error` where bucket_bytes is 0 or check_replicas_every is negative.
struct data_parallel_options {
  std::size_t bucket_bytes = default_bucket_bytes;  ///< 25 MiB, as PyTorch DDP's bucket_cap_mb
  bool overlap = true;  ///< false: reduce every bucket after the backward pass, on the caller's thread's turn
  /// Compare the replicas' contents (check_replicas()) after every this many steps; 0: only
  /// when the program calls check_replicas() (the examples do at the end of training).
  std::int64_t check_replicas_every = 0;
};

/// Cumulative over the runs so far.
struct comm_stats {
  double wait_seconds = 0;    ///< the training thread blocked on collectives after its backward pass
  double reduce_seconds = 0;  ///< inside the communicator's collectives (background thread)
  std::int64_t steps = 0;        ///< runs so far (a world of one's included)
  std::int64_t collectives = 0;  ///< bucket all-reduces issued (one per bucket and step)
  std::int64_t bytes = 0;  ///< gradient bytes all-reduced by this rank
};

/// A train_step (train/train_step.hpp) run data-parallel over a communicator.
template <communicator Comm, class Step>
class data_parallel_step {
  using store_type = key_value_store_t<Comm>;
  using ps_type = std::conditional_t<std::is_same_v<store_type, no_store>, no_ps_worker, ps_worker<store_type, Comm, Step>>;

 public:
  using loss_type = typename Step::loss_type;  ///< what run() returns: the loss's element type

  /// The step: a train_step of loss over the variables vs in s, with opt, reduced through
  /// comm. Nothing is communicated yet (the first run() does it); comm and s must outlive the
  /// step. Over a world of more than one without a store that moves rows, sparse gradients
  /// are reduced densely (set_sparse_as_dense). Throws `error` for bad opts or a variable
  /// that is not float32 or float64, and, over a parameter server, where an optimizer state
  /// tensor is missing from the session (at the first run).
  template <class Session, class Loss, class Opt, class... Vs>
  data_parallel_step(Comm& comm, data_parallel_options opts, Session& s, const Loss& loss, const Opt& opt,
                     const Vs&... vs)
      : comm_(comm), opts_(opts), step_(s, loss, opt, vs...), buckets_(checked(opts_).bucket_bytes),
        ps_(make_ps(opt)) {
    optimizer_fields_ = optimizer_fields(opt);
    // reduced densely, as Horovod's sparse_as_dense; a parameter server moves rows instead
    if (comm_.world_size() > 1 && !ps_.moves_rows()) step_.set_sparse_as_dense(true);
  }

  /// One synchronous training step on this rank's batch: the loss of that batch (before
  /// the update). The first run broadcasts rank 0's variables and optimizer state first
  /// (or, over a parameter server, offers them and pulls the servers' values).
  /// Every rank calls it, once per step. Throws what a collective or the store threw (a dead
  /// or silent peer: `comm_error` naming it, by the communicator's timeout where it has one),
  /// `run_mismatch_error` on the first run where the ranks' run fingerprints differ (on every
  /// rank), and `job_finished` for a restarted worker that came back after the job ended.
  template <class... Feeds>
  loss_type run(const Feeds&... feeds) {
    const auto bound = step_.owner().bind();  // copies on the session's stream (a GPU's)
    const bool store = ps_.active();          // false at compile time where Comm holds no variables
    if (!store && comm_.world_size() == 1) {
      ++stats_.steps;
      return step_.run(feeds...);
    }
    if (store) {
      if (!ps_.started()) start_store();
      ps_.begin_step();
    } else {
      if (!synced_) broadcast_variables();
      buckets_.begin_step();
    }
    std::exception_ptr hook_error;
    const loss_type l = step_.compute_gradients_hooked(
        [&](std::size_t i, const gradient_buffer& g) {
          try {
            if (store) ps_.arrived(i, g);
            else buckets_.arrived(i, g, [this](std::size_t k) {
              if (opts_.overlap) worker_.submit([this, k] { average(k); });
            });
          } catch (...) {
            if (!hook_error) hook_error = std::current_exception();
          }
        },
        feeds...);
    if (!store) {
      if (!opts_.overlap)
        for (std::size_t b = 0; b < buckets_.size(); ++b) worker_.submit([this, b] { average(b); });
      const util::trace_span span("wait for the all-reduces", "wait");
      worker_.wait(stats_.wait_seconds);  // rethrows a collective's error (a dead peer, a mismatch)
    }
    if (hook_error) {
      worker_.wait();
      std::rethrow_exception(hook_error);
    }
    if (store) {
      ps_.end_step();  // the servers applied the update: pulled back, the global step advanced
    } else {
      if (buckets_.filled() != buckets_.size())
        throw error("gradus: data_parallel: only " + std::to_string(buckets_.filled()) + " of " +
                    std::to_string(buckets_.size()) + " gradient buckets were filled by the backward pass");
      buckets_.upload(step_.gradients());
      step_.apply_gradients();
    }
    ++stats_.steps;
    if (!store && opts_.check_replicas_every > 0 && stats_.steps % opts_.check_replicas_every == 0) check_replicas();
    return l;
  }

  /// Rank 0's variables, optimizer state and global step to every rank (run() does it
  /// before its first step; call it again after restoring a checkpoint on rank 0 only). The
  /// first call compares the run fingerprint first.
  void broadcast_variables() {
    if (ps_.restarted()) return start_store();  // a lost worker's restart: the servers' state, at the others' step
    check_run_fingerprint();
    on_worker([this] { parallel::broadcast_variables(comm_, step_.owner()); });
    synced_ = true;
  }

  /// A parameter server: the servers' variables and optimizer state into this worker's
  /// session (between two barriers, so that no worker pushes meanwhile: one consistent
  /// step), so that save_checkpoint writes what the servers hold. Every worker calls it at
  /// the same step; elsewhere it does nothing.
  ///
  /// Its second barrier is a join point: a lost worker's restart waiting to rejoin comes back
  /// there (async and ssp parameter servers), and every worker then compares the run
  /// fingerprint with it, as the newcomer does first.
  void pull_state() {
    if (!ps_.pull_state().empty()) {
      fingerprint_checked_ = false;
      check_run_fingerprint();
    }
  }
  /// Whether this process took the place of a worker the job lost (a parameter server's
  /// restart, taken back at the others' step: the global step says which, and its epoch loop
  /// starts there instead of where a checkpoint says).
  bool rejoined() const { return rejoined_; }

  /// A parameter server: every worker waits for the others (a barrier), then pulls the
  /// variables, so that all replicas hold the servers' final values (in async and SSP modes
  /// they differ until then). Call it on every worker after the last step.
  void pull_variables() { ps_.pull_variables(); }

  /// Fields every rank must agree on besides those the step knows (the graph's tensors, the
  /// optimizer, the world size): {{"batch_size", "64"}, {"epochs", "3"}, {"data_seed", "1"}}.
  /// Set before the first run.
  void set_run_fingerprint(std::vector<run_field> fields) {
    if (fingerprint_checked_)
      throw error("gradus: data_parallel: set_run_fingerprint after the first run (the ranks already compared it)");
    extra_fields_ = std::move(fields);
  }
  /// What the ranks compare before their first collective.
  std::vector<run_field> run_fingerprint() const {
    std::vector<run_field> f{{"world_size", std::to_string(comm_.world_size())}, precision_field(step_.owner())};
    f.insert(f.end(), optimizer_fields_.begin(), optimizer_fields_.end());
    f.insert(f.end(), extra_fields_.begin(), extra_fields_.end());
    for (auto& t : session_fields(step_.owner())) f.push_back(std::move(t));
    return f;
  }
  /// Compares the fingerprint now (once; broadcast_variables and run() call it).
  void check_run_fingerprint() {
    if (fingerprint_checked_) return;
    on_worker([this] { parallel::agree(comm_, "run fingerprint", run_fingerprint()); });
    fingerprint_checked_ = true;
  }
  /// Every rank's variables and optimizer state must hold the same bits as rank 0's: throws
  /// run_mismatch_error on every rank naming the first tensor that differs and the ranks.
  /// A collective: every rank calls it at the same step.
  void check_replicas() {
    on_worker([this] { parallel::agree(comm_, "replica check", replica_fields(step_.owner())); });
  }

  data_parallel_step(const data_parallel_step&) = delete;
  data_parallel_step& operator=(const data_parallel_step&) = delete;
  /// A communicator reads no buffer of a collective that has returned or thrown (the ring
  /// closes its sending socket on failure and waits for ZeroMQ to let go), so the buckets
  /// are freed with the step even after a failure, once the device has read them
  /// (gradient_buckets waits for that; the worker's thread, the last member, stops first).
  ~data_parallel_step() = default;

  /// Waits, reduce time, steps, collectives and bytes, cumulative over the runs so far.
  const comm_stats& stats() const { return stats_; }
  /// The last run's gradients, averaged over the world (what the optimizer applied).
  std::span<gradient_buffer> gradients() { return step_.gradients(); }
  /// The gradient buckets planned: the all-reduces of each step.
  std::size_t bucket_count() const { return buckets_.size(); }
  /// This rank's train_step (its gradients, its settings); running it directly skips the
  /// reduction.
  Step& local_step() { return step_; }
  /// The communicator it reduces through.
  Comm& communicator() { return comm_; }
  /// The optimizer's learning rate at the session's global step (its schedule's value).
  double learning_rate() const { return step_.learning_rate(); }

 private:
  static const data_parallel_options& checked(const data_parallel_options& o) {
    if (o.bucket_bytes == 0) throw error("gradus: data_parallel: bucket_bytes must be positive");
    if (o.check_replicas_every < 0)
      throw error("gradus: data_parallel: check_replicas_every must be >= 0, got " + std::to_string(o.check_replicas_every));
    return o;
  }
  template <class Opt>
  ps_type make_ps(const Opt& opt) {
    if constexpr (std::is_same_v<ps_type, no_ps_worker>) {
      return {};
    } else {
      std::vector<std::string> slots;
      for (int k = 0; k < opt.slot_count(); ++k) slots.emplace_back(opt.slot_name(k));
      return ps_type(key_value_store_of(comm_), comm_, step_, worker_, stats_.wait_seconds, std::move(slots));
    }
  }

  /// The first step over a key-value store: the optimizer, the variables and the step offered,
  /// the servers' values pulled. A lost worker's restart instead waits for the others' next
  /// join point, compares the run fingerprint with them (they do at once after the join
  /// point: pull_state), then takes the servers' whole state at their step.
  void start_store() {
    if (ps_.restarted()) {
      const auto at = ps_.rejoin();
      if (!at)
        throw job_finished("gradus: data_parallel: rank " + std::to_string(comm_.rank()) +
                           " restarted in place of a lost worker, but the job ended before it could rejoin: nothing is left to train");
      fingerprint_checked_ = false;
      check_run_fingerprint();  // with the others, who compare it right after the join point
      step_.owner().set_global_step(*at);
      ps_.start(optimizer_fields_, /*whole_state=*/true);
      rejoined_ = true;
    } else {
      check_run_fingerprint();
      ps_.start(optimizer_fields_);
    }
    synced_ = true;
  }

  /// f() on the communicator's thread, waited for; its failure is rethrown here.
  template <class F>
  void on_worker(F&& f) {
    worker_.submit(std::forward<F>(f));
    worker_.wait();
  }

  /// On the background thread: bucket k averaged over the world.
  void average(std::size_t k) {
    util::trace_span span("all-reduce", "comm");
    if (span.on()) util::active_trace()->name_thread("all-reduce worker");
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes = buckets_.average(comm_, k);
    span.arg("bucket", k).arg("bytes", bytes);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lk(stats_m_);
    stats_.reduce_seconds += dt;
    ++stats_.collectives;
    stats_.bytes += static_cast<std::int64_t>(bytes);
  }

  Comm& comm_;
  data_parallel_options opts_;
  Step step_;
  std::mutex stats_m_;
  comm_stats stats_;
  gradient_buckets<Step> buckets_;  ///< finishing by the collectives
  ps_type ps_;                      ///< finishing by a key-value store
  std::vector<run_field> optimizer_fields_, extra_fields_;
  bool fingerprint_checked_ = false;
  bool synced_ = false;
  bool rejoined_ = false;
  comm_worker worker_;  ///< last: its thread stops before the buckets it reads go away
};

/// minimize(comm, session, loss, optimizer[, variables...]): a data-parallel training step.
template <communicator Comm, class Backend, class Opt, expression Loss, class... Vs>
auto minimize(Comm& comm, session<Backend>& s, const Loss& loss, const Opt& opt, const Vs&... vs) {
  if constexpr (sizeof...(Vs) > 0) {
    using step_t = train_step<Backend, Opt, Loss, Vs...>;
    return data_parallel_step<Comm, step_t>(comm, data_parallel_options{}, s, loss, opt, vs...);
  } else {
    return [&]<class... Ws>(std::tuple<Ws...>*) {
      static_assert(sizeof...(Ws) > 0, "gradus: minimize: the loss reads no variable");
      using step_t = train_step<Backend, Opt, Loss, Ws...>;
      return data_parallel_step<Comm, step_t>(comm, data_parallel_options{}, s, loss, opt, Ws{}...);
    }(static_cast<variables_of_t<Loss>*>(nullptr));
  }
}
/// minimize(comm, options, session, loss, optimizer): the data-parallel step over every variable
/// the loss reads, with `opts` (bucket size, overlap, replica checks).
template <communicator Comm, class Backend, class Opt, expression Loss>
auto minimize(Comm& comm, const data_parallel_options& opts, session<Backend>& s, const Loss& loss, const Opt& opt) {
  return [&]<class... Ws>(std::tuple<Ws...>*) {
    static_assert(sizeof...(Ws) > 0, "gradus: minimize: the loss reads no variable");
    using step_t = train_step<Backend, Opt, Loss, Ws...>;
    return data_parallel_step<Comm, step_t>(comm, opts, s, loss, opt, Ws{}...);
  }(static_cast<variables_of_t<Loss>*>(nullptr));
}

}  // namespace gradus::parallel
