#pragma once
// The running pipeline of one rank, its stage-independent part (pipeline.hpp says what a
// pipeline does): the options and what a step measured, the messages between stages (a
// header — kind, step, micro-batch, dims — then the values, over the communicator's
// point-to-point sends; every error names this stage, the micro-batch and the peer), the
// neighbours' agreement on the pipeline's shape at construction, and the gathering of every
// rank's measurements. pipeline_stage.hpp is the stage-specific part.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <ostream>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/parallel/agree.hpp"
#include "gradus/parallel/point_to_point.hpp"
#include "gradus/parallel/pipeline/schedule.hpp"
#include "gradus/util/trace_span.hpp"

namespace gradus::parallel {

/// How a pipeline runs (pipeline(), pipeline_in_process()). Every rank gives the same: the
/// neighbours compare micro_batches, schedule and rematerialize at construction and refuse a
/// mismatch, naming both values.
struct pipeline_options {
  /// M, the micro-batches each batch is split into: at least 1 (else the constructor throws
  /// `error`) and at most the batch's rows (else run() throws).
  int micro_batches = 1;
  /// 1f1b (PipeDream-flush, Megatron-LM's and DeepSpeed's default) or gpipe (schedule.hpp):
  /// the same training; 1F1B holds at most S micro-batches' activations and keeps a layer's
  /// weights in cache from one micro-batch's forward to the next one's backward
  schedule_kind schedule = schedule_kind::one_f_one_b;
  /// Re-materialisation: keep only each micro-batch's stage input and recompute its forward
  /// pass in its backward (one graph's activations alive instead of M under GPipe, S under
  /// 1F1B).
  bool rematerialize = false;
  /// While a stage waits for a gradient, compute its deferred weight gradients ahead over the
  /// rows already stashed (deferred_gradients.hpp), where the backend's products go on from
  /// their partial sums (cpu_simd, float): the same bits, less of the weight-gradient pass
  /// after the last backward. Until the gradient arrives where the communicator can tell
  /// (parallel::probing: the ring, MPI); else only before the last gradient, for as long as
  /// the last step waited for it. Off: the whole pass after the last backward.
  bool early_gradients = true;
  /// TensorFlow's log_device_placement: where set, each rank writes there after its first
  /// step every node of its stage's graph with the stage and rank it ran on, and after every
  /// step the bytes it sent across each cut ("gradus placement: ..." lines).
  std::ostream* placement_log = nullptr;
};

/// What one step of one rank measured.
struct pipeline_stats {
  /// \var stage
  /// This rank's stage: rank % stages.
  /// \var stages
  /// S, the pipeline's stages.
  /// \var replica
  /// This rank's pipeline replica: rank / stages.
  /// \var replicas
  /// R, the pipeline replicas: world size / stages.
  /// \var micro_batches
  /// M, the micro-batches of a batch.
  int stage = 0, stages = 1, replica = 0, replicas = 1, micro_batches = 1;
  double step_seconds = 0;     ///< wall time of the last step
  double compute_seconds = 0;  ///< of which computing
  /// The share of the last step's wall time not spent computing (waiting for the other
  /// stages, and the transfers): 1 - compute_seconds / step_seconds; 0 before the first step.
  double bubble_fraction() const { return step_seconds > 0 ? 1 - compute_seconds / step_seconds : 0; }
  /// \var bytes_sent
  /// The bytes of activations and gradients this rank sent in the last step (headers apart).
  std::uint64_t bytes_sent = 0, bytes_received = 0;  ///< the bytes of activations and gradients it received in the last step
  /// \var activation_bytes_sent
  /// Of bytes_sent: the activations, to the next stage.
  std::uint64_t activation_bytes_sent = 0, gradient_bytes_sent = 0;  ///< of bytes_sent: the gradients, to the previous stage
  std::size_t peak_activation_bytes = 0;             ///< the graphs in flight and stashed inputs, at most
  std::size_t deferred_bytes = 0;  ///< the deferred weight gradients' stash (rows of X and G of the whole batch)
  /// The deferred weight gradients the last step began while waiting for a gradient
  /// (pipeline_options::early_gradients), and the seconds that work took.
  int early_gradients = 0;
  double early_seconds = 0;  ///< (see early_gradients)
  double gradient_norm = 0;        ///< with clip_global_norm: the last step's norm over every stage's gradients
  /// Under a policy that scales the loss (fp16): the scale the next step's backward pass
  /// uses, and the steps skipped for Inf or NaN gradients (every stage skips the same ones).
  double loss_scale = 1;
  std::int64_t skipped_steps = 0;  ///< (see loss_scale)
};


namespace detail {
/// A feed as a stage sees it before it knows its type: name, dtype, data, dims.
struct raw_feed {
  std::string_view name;
  element_type dtype;
  const void* data;
  dims d;
  std::size_t elem_size;
};


/// The header of every pipeline message: what it is, for which step and micro-batch, its dims.
enum class pipe_msg : std::int64_t { config = 1, activation = 2, gradient = 3, loss = 4, variables = 5, report = 6, norm = 7, tied = 8, finite = 9 };
struct pipe_header {
  std::int64_t magic = 0x67726164504950LL;  ///< "gradPIP"
  std::int64_t kind = 0;
  std::int64_t step = 0;
  std::int64_t micro = 0;
  std::int64_t rank = 0;
  std::int64_t nd = 0;
  std::int64_t d[max_rank] = {};
};

inline std::string msg_name(pipe_msg k) {
  switch (k) {
    case detail::pipe_msg::config: return "the pipeline's configuration";
    case pipe_msg::activation: return "activations";
    case pipe_msg::gradient: return "gradients";
    case pipe_msg::loss: return "the batch's loss";
    case pipe_msg::variables: return "a stage's variables";
    case pipe_msg::report: return "a rank's measurements";
    case pipe_msg::norm: return "a stage's sum of squared gradients";
    case pipe_msg::tied: return "a tied variable's gradient part";
    case pipe_msg::finite: return "a stage's verdict on its gradients (loss scaling)";
  }
  return "a message";
}

}  // namespace detail

/// The running pipeline of one rank: the stage-independent part (transfers, measurements).
template <class Comm>
class pipeline_base {
 protected:
  using pipe_msg = detail::pipe_msg;  ///< what a message is (its header's kind)

 public:
  virtual ~pipeline_base() = default;
  /// One training step of this rank's stage over the batch the feeds hold (every feed's
  /// first axis is the batch): the batch's loss, sent by the last stage to the others.
  /// pipeline_step::run() calls it; every rank of the pipeline runs it at the same step.
  /// Throws `feed_error` for a feed without the batch's rows, a placeholder not fed or fed
  /// another dtype; `comm_error` naming this stage, the micro-batch and the peer when a
  /// transfer fails (a dead or silent peer, at the communicator's deadline); `error` for a
  /// message of another kind, step or size; `run_mismatch_error` at the first step where the
  /// ranks' run fingerprints differ. A failed step leaves the pipeline mid-batch.
  virtual double run_raw(std::span<const detail::raw_feed> feeds) = 0;
  /// Every stage's variables into rank 0's session (replica 0's stages send theirs): rank 0
  /// then holds the whole model. Every rank calls it.
  virtual void gather_variables() = 0;
  /// This stage's checkpoint file (io/checkpoint.hpp's format: its variables, their optimizer
  /// slots, the global step, the stage layout); pipeline/checkpoint.hpp runs them on every rank.
  virtual std::int64_t save_stage_file(const std::filesystem::path& file) = 0;  ///< the global step written
  virtual std::int64_t restore_stage_file(const std::filesystem::path& file) = 0;  ///< the file's global step
  virtual void broadcast_to_replicas() = 0;  ///< replica 0's tensors and step to the stage's replicas
  /// A sum over every rank (pipeline/checkpoint.hpp's agreement on what each stage found).
  void allreduce_sum(std::span<double> x) { comm_.allreduce_sum(x); }
  /// What this rank's last step measured, and where it stands (stage, replica).
  const pipeline_stats& stats() const { return stats_; }
  /// This rank in the world: stage rank % S of replica rank / S.
  int rank() const { return comm_.rank(); }
  /// Every rank of every stage and replica: S x R.
  int world_size() const { return comm_.world_size(); }

  /// Fields every rank must agree on besides the pipeline's shape (the neighbours compare
  /// that at construction) and the optimizer: {{"batch_size", "64"}, {"data_seed", "1"}}, as
  /// data_parallel_step's. Set before the first run; the first run compares them (agree.hpp).
  void set_run_fingerprint(std::vector<run_field> fields) {
    if (fingerprint_checked_) throw error("gradus: pipeline: set_run_fingerprint after the first run (the ranks already compared it)");
    extra_fields_ = std::move(fields);
  }
  /// What the ranks compare before their first step: the world, the pipeline's shape, the
  /// optimizer and its hyper-parameters, and the program's fields.
  std::vector<run_field> run_fingerprint() const {
    std::vector<run_field> f{{"world_size", std::to_string(comm_.world_size())},
                             {"pipeline.stages", std::to_string(stats_.stages)},
                             {"pipeline.micro_batches", std::to_string(o_.micro_batches)},
                             {"pipeline.schedule", std::string(schedule_name(o_.schedule))},
                             {"pipeline.rematerialize", o_.rematerialize ? "on" : "off"}};
    f.insert(f.end(), optimizer_fields_.begin(), optimizer_fields_.end());
    f.insert(f.end(), extra_fields_.begin(), extra_fields_.end());
    return f;
  }

  /// Numbers of every rank (e.g. its mean bubble fraction, bytes sent per step, peak
  /// activation bytes: every rank gives as many), on rank 0 in rank order (every rank calls
  /// it; the others get their own): what a run reports for the whole pipeline.
  std::vector<std::vector<double>> gather_report(const std::vector<double>& mine) {
    std::vector<std::vector<double>> all{mine};
    if (comm_.rank() != 0) {
      send_values(pipe_msg::report, -1, std::span<const double>(mine), 0, {});
      return all;
    }
    for (int r = 1; r < comm_.world_size(); ++r) {
      std::vector<double> theirs(mine.size());
      recv_values(pipe_msg::report, -1, std::span<double>(theirs), r);
      all.push_back(std::move(theirs));
    }
    return all;
  }

 protected:
  /// optimizer: what optimizer_fields(opt) gives, for the run fingerprint
  pipeline_base(Comm& comm, int stages, const pipeline_options& o, std::vector<run_field> optimizer)
      : comm_(comm), o_(o), optimizer_fields_(std::move(optimizer)) {
    const int world = comm.world_size();
    if (stages < 1 || world % stages != 0)
      throw error("gradus: pipeline: " + std::to_string(stages) + " stages do not divide the world of " +
                  std::to_string(world) + " ranks; start stages x replicas ranks (e.g. gradus-run -np " +
                  std::to_string(stages * std::max(1, world / std::max(1, stages))) + ")");
    if (o.micro_batches < 1) throw error("gradus: pipeline: --micro-batches must be >= 1, not " + std::to_string(o.micro_batches));
    stats_.stages = stages;
    stats_.stage = comm.rank() % stages;
    stats_.replica = comm.rank() / stages;
    stats_.replicas = world / stages;
    stats_.micro_batches = o.micro_batches;
    ops_ = schedule_for(o.schedule, stats_.stage, stages, o.micro_batches);
  }

  /// The previous stage's rank in this replica (where not first()).
  int prev_rank() const { return comm_.rank() - 1; }
  /// The next stage's rank in this replica (where not last()).
  int next_rank() const { return comm_.rank() + 1; }
  /// Whether this is stage 0 (it reads the placeholders' feeds, receives no activations).
  bool first() const { return stats_.stage == 0; }
  /// Whether this is stage S - 1 (it computes the loss).
  bool last() const { return stats_.stage == stats_.stages - 1; }
  /// The head of this rank's errors: "gradus: pipeline stage K (rank r), micro-batch m: "
  /// (without the micro-batch where micro < 0).
  std::string where(int micro) const {
    return "gradus: pipeline stage " + std::to_string(stats_.stage) + " (rank " + std::to_string(comm_.rank()) + ")" +
           (micro >= 0 ? ", micro-batch " + std::to_string(micro) : std::string()) + ": ";
  }

  /// Every rank compares the run fingerprint (once, before the first step's transfers).
  void check_run_fingerprint() {
    if (fingerprint_checked_) return;
    try {
      agree(comm_, "run fingerprint", run_fingerprint());
    } catch (const comm_error& e) {  // a peer gone before the first step: name this stage
      rethrow(e, where(-1) + "comparing the run fingerprint before the first step", e.peer);
    }
    fingerprint_checked_ = true;
  }

  /// One number from every stage of this rank's pipeline replica, in stage order (this
  /// stage's `mine` in its place): each stage sends its own to the others and receives theirs,
  /// so every stage sees the same list. Every stage of the replica calls it together.
  std::vector<double> from_every_stage(pipe_msg kind, double mine) {
    const int S = stats_.stages, K = stats_.stage, first = comm_.rank() - K;
    for (int k = 0; k < S; ++k)
      if (k != K) send_values(kind, -1, std::span<const double>(&mine, 1), first + k, {});
    std::vector<double> all(static_cast<std::size_t>(S), mine);
    for (int k = 0; k < S; ++k)
      if (k != K) recv_values(kind, -1, std::span<double>(&all[static_cast<std::size_t>(k)], 1), first + k);
    return all;
  }

  /// The neighbours agree on the pipeline's shape (every rank calls it once).
  void check_config() {
    const std::int64_t mine[5] = {stats_.stages, o_.micro_batches, static_cast<std::int64_t>(o_.schedule), o_.rematerialize,
                                  stats_.replicas};
    const char* what[5] = {"stages", "micro-batches", "schedule", "re-materialisation", "replicas"};
    auto compare = [&](int peer, const std::int64_t* theirs) {
      for (int i = 0; i < 5; ++i)
        if (theirs[i] != mine[i])
          throw error(where(-1) + "rank " + std::to_string(peer) + " runs the pipeline with " + what[i] + " " +
                      value_name(i, theirs[i]) + ", this rank with " + value_name(i, mine[i]) +
                      "; start every rank with the same --stages, --micro-batches and --schedule");
    };
    std::int64_t theirs[5];
    if (!last()) send_values(detail::pipe_msg::config, -1, std::span<const std::int64_t>(mine, 5), next_rank(), {});
    if (!first()) {  // answered before comparing, so both sides of a mismatch say so
      recv_values(detail::pipe_msg::config, -1, std::span<std::int64_t>(theirs, 5), prev_rank());
      send_values(detail::pipe_msg::config, -1, std::span<const std::int64_t>(mine, 5), prev_rank(), {});
      compare(prev_rank(), theirs);
    }
    if (!last()) {
      recv_values(detail::pipe_msg::config, -1, std::span<std::int64_t>(theirs, 5), next_rank());
      compare(next_rank(), theirs);
    }
  }
  /// check_config's value i as text: the schedule's name, "on"/"off" for
  /// re-materialisation, else the number.
  static std::string value_name(int i, std::int64_t v) {
    if (i == 2) return std::string(schedule_name(static_cast<schedule_kind>(v)));
    if (i == 3) return v ? "on" : "off";
    return std::to_string(v);
  }

  /// A message: its header, then the values (as bytes); d: the tensor's dims, or {} for plain
  /// values (sent as their count).
  template <class T>
  void send_values(pipe_msg kind, int micro, std::span<const T> x, int to, const dims& d) {
    detail::pipe_header h;
    h.kind = static_cast<std::int64_t>(kind);
    h.step = step_;
    h.micro = micro;
    h.rank = comm_.rank();
    const dims shape = d.rank ? d : dims{static_cast<index_t>(x.size())};  // plain values: their count
    h.nd = static_cast<std::int64_t>(shape.rank);
    for (std::size_t i = 0; i < shape.rank; ++i) h.d[i] = shape.d[i];
    util::trace_sink* const trace = traced(kind) ? util::active_trace() : nullptr;
    const std::int64_t t0 = trace ? trace->now_ns() : 0;
    try {
      comm_.send(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&h), sizeof h), to);
      comm_.send(std::span<const std::byte>(reinterpret_cast<const std::byte*>(x.data()), x.size_bytes()), to);
    } catch (const std::exception& e) {
      rethrow(e, where(micro) + "sending " + detail::msg_name(kind) + " to rank " + std::to_string(to), to);
    }
    if (trace) {
      const std::int64_t dur = trace->now_ns() - t0;
      trace->complete(kind == pipe_msg::activation ? "send activations" : "send gradients", "transfer", t0, dur,
                      util::trace_args{}.add("micro_batch", micro).add("to", to).add("bytes", x.size_bytes()));
      trace->flow_start("transfer", "transfer", flow_id(step_, kind, micro, comm_.rank(), to), t0 + dur / 2);
    }
    if (kind == pipe_msg::activation || kind == pipe_msg::gradient) stats_.bytes_sent += x.size_bytes();
    if (kind == pipe_msg::activation) stats_.activation_bytes_sent += x.size_bytes();
    if (kind == pipe_msg::gradient) stats_.gradient_bytes_sent += x.size_bytes();
  }
  /// Receives a message of `kind` for `micro` from `from`: its dims (the values go to `into`,
  /// resized to them).
  template <class T>
  dims recv_into(pipe_msg kind, int micro, std::vector<T>& into, int from) {
    detail::pipe_header h;
    util::trace_sink* const trace = traced(kind) ? util::active_trace() : nullptr;
    const std::int64_t t0 = trace ? trace->now_ns() : 0;
    try {
      comm_.recv(std::span<std::byte>(reinterpret_cast<std::byte*>(&h), sizeof h), from);
    } catch (const std::exception& e) {
      rethrow(e, where(micro) + "waiting for " + detail::msg_name(kind) + " from rank " + std::to_string(from), from);
    }
    check_header(h, kind, micro, from);
    dims d;
    d.rank = static_cast<std::size_t>(h.nd);
    for (std::size_t i = 0; i < d.rank; ++i) d.d[i] = h.d[i];
    into.resize(static_cast<std::size_t>(d.numel()));
    try {
      comm_.recv(std::span<std::byte>(reinterpret_cast<std::byte*>(into.data()), into.size() * sizeof(T)), from);
    } catch (const std::exception& e) {
      rethrow(e, where(micro) + "receiving " + detail::msg_name(kind) + " from rank " + std::to_string(from), from);
    }
    if (kind == pipe_msg::activation || kind == pipe_msg::gradient) stats_.bytes_received += into.size() * sizeof(T);
    if (trace) {  // the wait for the message and its copy
      const std::int64_t dur = trace->now_ns() - t0;
      trace->complete(kind == pipe_msg::activation ? "receive activations" : "receive gradients", "transfer", t0, dur,
                      util::trace_args{}.add("micro_batch", micro).add("from", from).add("bytes", into.size() * sizeof(T)));
      trace->flow_end("transfer", "transfer", flow_id(h.step, kind, micro, from, comm_.rank()), t0 + dur / 2);
    }
    return d;
  }
  /// Whether a timeline shows messages of `kind`: the activations and gradients between
  /// stages (the other kinds are a step's few small agreements).
  static bool traced(pipe_msg kind) { return kind == pipe_msg::activation || kind == pipe_msg::gradient; }
  /// The id joining a message's send to its receive in a timeline (both sides compute it
  /// from the header's fields: step, kind, micro-batch, sender and receiver).
  static std::uint64_t flow_id(std::int64_t step, pipe_msg kind, int micro, int from, int to) {
    std::uint64_t z = 0x9E3779B97F4A7C15ull;
    for (const std::int64_t v : {step, static_cast<std::int64_t>(kind), std::int64_t{micro}, std::int64_t{from}, std::int64_t{to}}) {
      z ^= static_cast<std::uint64_t>(v) + 0x9E3779B97F4A7C15ull + (z << 6) + (z >> 2);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    }
    return z >> 11;  // 53 bits: exact in the JSON readers' doubles
  }
  /// Whether the communicator can tell a message has arrived without waiting for it
  /// (parallel::probing; any_communicator: where its policy can).
  bool can_probe() const {
    if constexpr (requires { comm_.can_probe(); }) return comm_.can_probe();
    else return parallel::probing<Comm>;
  }
  /// Whether the next message from `from` has arrived (recv_into would not wait). A failing
  /// communicator says yes: the recv that follows reports it, naming the stage and the peer.
  bool arrived(int from) {
    if constexpr (parallel::probing<Comm>) {
      try {
        return comm_.probe(from);
      } catch (const std::exception&) {
        return true;
      }
    } else {
      return true;
    }
  }
  /// Receives a message of `kind` for `micro` from `from` into x, whose size it must have:
  /// else throws `error` naming the peer and both counts. Fails as recv_into does.
  template <class T>
  void recv_values(pipe_msg kind, int micro, std::span<T> x, int from) {
    std::vector<T> v;
    recv_into(kind, micro, v, from);
    if (v.size() != x.size())
      throw error(where(micro) + "rank " + std::to_string(from) + " sent " + std::to_string(v.size()) + " values of " +
                  detail::msg_name(kind) + ", this stage expects " + std::to_string(x.size()));
    std::memcpy(x.data(), v.data(), x.size_bytes());
  }
  /// A communicator's error, with what the pipeline was doing and the peer in front.
  [[noreturn]] static void rethrow(const std::exception& e, const std::string& doing, int peer) {
    if (const auto* c = dynamic_cast<const comm_error*>(&e)) throw comm_error(doing + ": " + e.what(), peer, c->peer_state);
    throw comm_error(doing + ": " + e.what(), peer, "");
  }
  /// Throws `error` where h is not a pipeline message's header (another job's), or not the
  /// kind, micro-batch and step (but for the configuration) expected from `from`: a rank
  /// running another schedule or micro-batch count.
  void check_header(const detail::pipe_header& h, pipe_msg kind, int micro, int from) const {
    const detail::pipe_header want;
    if (h.magic != want.magic || h.nd < 0 || h.nd > static_cast<std::int64_t>(max_rank))
      throw error(where(micro) + "rank " + std::to_string(from) + " sent a message that is not a pipeline's; are both ranks in one pipeline job?");
    if (h.kind != static_cast<std::int64_t>(kind) || h.micro != micro || (kind != detail::pipe_msg::config && h.step != step_))
      throw error(where(micro) + "expected " + detail::msg_name(kind) + " of step " + std::to_string(step_) +
                  (micro >= 0 ? ", micro-batch " + std::to_string(micro) : std::string()) + " from rank " +
                  std::to_string(from) + ", got " + detail::msg_name(static_cast<pipe_msg>(h.kind)) + " of step " +
                  std::to_string(h.step) + ", micro-batch " + std::to_string(h.micro) +
                  "; do the ranks run the same --micro-batches and schedule?");
  }

  Comm& comm_;         ///< the whole world's communicator (every stage and replica)
  pipeline_options o_;  ///< the options this rank runs with
  /// \var optimizer_fields_
  /// The optimizer's name and hyper-parameters, for the run fingerprint (optimizer_fields()).
  std::vector<run_field> optimizer_fields_, extra_fields_;  ///< the program's fingerprint fields (set_run_fingerprint)
  pipeline_stats stats_;           ///< what this rank measured, and where it stands
  std::vector<pipeline_op> ops_;   ///< this stage's operations for one batch (schedule_for)
  std::int64_t step_ = 0;          ///< steps run so far; every message carries it
  bool fingerprint_checked_ = false;  ///< whether the ranks compared the run fingerprint
};


}  // namespace gradus::parallel
