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
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/parallel/collectives.hpp"
#include "gradus/parallel/pipeline/schedule.hpp"
#include "gradus/parallel/pipeline/stage_graph.hpp"
#include "gradus/parallel/point_to_point.hpp"
#include "gradus/train/optimizer.hpp"

namespace gradus::parallel {

struct pipeline_options {
  int micro_batches = 1;
  schedule_kind schedule = schedule_kind::gpipe;
  // GPipe's re-materialisation: keep only each micro-batch's stage input and recompute its
  // forward pass in the backward (one graph's activations alive instead of M).
  bool rematerialize = false;
};

// What one step of one rank measured.
struct pipeline_stats {
  int stage = 0, stages = 1, replica = 0, replicas = 1, micro_batches = 1;
  double step_seconds = 0;     // wall time of the last step
  double compute_seconds = 0;  // of which computing
  double bubble_fraction() const { return step_seconds > 0 ? 1 - compute_seconds / step_seconds : 0; }
  std::uint64_t bytes_sent = 0, bytes_received = 0;  // the last step's activations and gradients (headers apart)
  std::size_t peak_activation_bytes = 0;             // the graphs in flight and stashed inputs, at most
};

namespace detail {
// A feed as a stage sees it before it knows its type: name, dtype, data, dims.
struct raw_feed {
  std::string_view name;
  std::string_view dtype;
  const void* data;
  dims d;
  std::size_t elem_size;
};

// The header of every pipeline message: what it is, for which step and micro-batch, its dims.
enum class pipe_msg : std::int64_t { config = 1, activation = 2, gradient = 3, loss = 4, variables = 5, report = 6 };
struct pipe_header {
  std::int64_t magic = 0x67726164504950LL;  // "gradPIP"
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
  }
  return "a message";
}

// The optimizer's state tensors of one variable ("w/momentum", ...), made in the session.
template <class T, class Backend, class Opt>
std::array<T*, 2> optimizer_slots(session<Backend>& s, const Opt& opt, std::string_view name, const dims& d) {
  std::array<T*, 2> r{};
  for (int k = 0; k < opt.slot_count(); ++k)
    r[static_cast<std::size_t>(k)] = s.template state<T>(std::string(name) + "/" + std::string(opt.slot_name(k)), d);
  return r;
}

// The communicator of a sub-group (split), where the communicator makes them.
template <class C>
struct sub_group {
  using type = int;
};
template <splittable C>
struct sub_group<C> {
  using type = decltype(std::declval<C&>().split(0, 0));
};

template <class T>
struct axpy_rule {  // acc = acc + a * g
  T a;
  template <class V>
  GRADUS_HD void operator()(V& acc, const V& g) const {
    acc = acc + V(a) * g;
  }
};
template <class T>
struct scale_rule {  // x = a * y
  T a;
  template <class V>
  GRADUS_HD void operator()(V& x, const V& y) const {
    x = V(a) * y;
  }
};
}  // namespace detail

// The running pipeline of one rank: the stage-independent part (transfers, measurements).
template <class Comm>
class pipeline_base {
 protected:
  using pipe_msg = detail::pipe_msg;

 public:
  virtual ~pipeline_base() = default;
  virtual double run_raw(std::span<const detail::raw_feed> feeds) = 0;
  virtual void gather_variables() = 0;
  const pipeline_stats& stats() const { return stats_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.world_size(); }

  // Two numbers of every rank (e.g. its mean bubble fraction and bytes sent per step), on
  // rank 0 in rank order (every rank calls it; the others get their own): what a run reports
  // for the whole pipeline.
  std::vector<std::array<double, 2>> gather_report(const std::array<double, 2>& mine) {
    std::vector<std::array<double, 2>> all{mine};
    if (comm_.rank() != 0) {
      send_values(pipe_msg::report, -1, std::span<const double>(mine), 0, {});
      return all;
    }
    for (int r = 1; r < comm_.world_size(); ++r) {
      std::array<double, 2> theirs{};
      recv_values(pipe_msg::report, -1, std::span<double>(theirs), r);
      all.push_back(theirs);
    }
    return all;
  }

 protected:
  pipeline_base(Comm& comm, int stages, const pipeline_options& o) : comm_(comm), o_(o) {
    const int world = comm.world_size();
    if (stages < 1 || world % stages != 0)
      throw error("gradus: pipeline: " + std::to_string(stages) + " stages do not divide the world of " +
                  std::to_string(world) + " ranks; start stages x replicas ranks (e.g. gradus-run -np " +
                  std::to_string(stages * std::max(1, world / std::max(1, stages))) + ")");
    if (o.micro_batches < 1) throw error("gradus: pipeline: --micro-batches must be >= 1, not " + std::to_string(o.micro_batches));
    if (o.rematerialize && o.schedule != schedule_kind::gpipe)
      throw error("gradus: pipeline: re-materialisation is GPipe's (the 1f1b schedule holds at most S micro-batches already)");
    stats_.stages = stages;
    stats_.stage = comm.rank() % stages;
    stats_.replica = comm.rank() / stages;
    stats_.replicas = world / stages;
    stats_.micro_batches = o.micro_batches;
    ops_ = schedule_for(o.schedule, stats_.stage, stages, o.micro_batches);
  }

  int prev_rank() const { return comm_.rank() - 1; }
  int next_rank() const { return comm_.rank() + 1; }
  bool first() const { return stats_.stage == 0; }
  bool last() const { return stats_.stage == stats_.stages - 1; }
  std::string where(int micro) const {
    return "gradus: pipeline stage " + std::to_string(stats_.stage) + " (rank " + std::to_string(comm_.rank()) + ")" +
           (micro >= 0 ? ", micro-batch " + std::to_string(micro) : std::string()) + ": ";
  }

  // The neighbours agree on the pipeline's shape (every rank calls it once).
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
  static std::string value_name(int i, std::int64_t v) {
    if (i == 2) return std::string(schedule_name(static_cast<schedule_kind>(v)));
    if (i == 3) return v ? "on" : "off";
    return std::to_string(v);
  }

  // A message: its header, then the values (as bytes); d: the tensor's dims, or {} for plain
  // values (sent as their count).
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
    try {
      comm_.send(std::span<const std::byte>(reinterpret_cast<const std::byte*>(&h), sizeof h), to);
      comm_.send(std::span<const std::byte>(reinterpret_cast<const std::byte*>(x.data()), x.size_bytes()), to);
    } catch (const std::exception& e) {
      rethrow(e, where(micro) + "sending " + detail::msg_name(kind) + " to rank " + std::to_string(to), to);
    }
    if (kind == pipe_msg::activation || kind == pipe_msg::gradient) stats_.bytes_sent += x.size_bytes();
  }
  // Receives a message of `kind` for `micro` from `from`: its dims (the values go to `into`,
  // resized to them).
  template <class T>
  dims recv_into(pipe_msg kind, int micro, std::vector<T>& into, int from) {
    detail::pipe_header h;
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
    return d;
  }
  template <class T>
  void recv_values(pipe_msg kind, int micro, std::span<T> x, int from) {
    std::vector<T> v;
    recv_into(kind, micro, v, from);
    if (v.size() != x.size())
      throw error(where(micro) + "rank " + std::to_string(from) + " sent " + std::to_string(v.size()) + " values of " +
                  detail::msg_name(kind) + ", this stage expects " + std::to_string(x.size()));
    std::memcpy(x.data(), v.data(), x.size_bytes());
  }
  // A communicator's error, with what the pipeline was doing and the peer in front.
  [[noreturn]] static void rethrow(const std::exception& e, const std::string& doing, int peer) {
    if (const auto* c = dynamic_cast<const comm_error*>(&e)) throw comm_error(doing + ": " + e.what(), peer, c->peer_state);
    throw comm_error(doing + ": " + e.what(), peer, "");
  }
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

  Comm& comm_;
  pipeline_options o_;
  pipeline_stats stats_;
  std::vector<pipeline_op> ops_;
  std::int64_t step_ = 0;
};

// Stage K's part of the pipeline.
template <int K, int S, class Backend, class Comm, class Loss, class Opt>
class pipeline_stage final : public pipeline_base<Comm> {
  using base = pipeline_base<Comm>;
  using graph_t = stage_graph<Backend, K, S, Loss>;
  using T = typename graph_t::value_type;
  using vars_t = typename graph_t::variables;
  static constexpr std::size_t nv = graph_t::variable_count;
  static constexpr bool last = K == S - 1;
  using placeholders_t = stage_placeholders_t<K, S, Loss>;
  using sub_t = typename detail::sub_group<Comm>::type;
  static_assert([]<class... Vs>(std::tuple<Vs...>*) { return (std::is_same_v<value_t<Vs>, T> && ...); }(static_cast<vars_t*>(nullptr)),
                "gradus: pipeline: a stage's variables must have its output's dtype");

 public:
  pipeline_stage(Comm& comm, const pipeline_options& o, session<Backend>& s, const Loss& loss, const Opt& opt)
      : base(comm, S, o), s_(s), g_(loss), opt_(opt) {
    opt_.validate();
    if (opt_.clip_global_norm > 0)
      throw error("gradus: pipeline: clip_global_norm is not supported yet (the norm spans every stage's gradients)");
    [&]<class... Vs>(std::tuple<Vs...>*) {
      (s_.declare(Vs{}), ...);
      std::size_t i = 0;
      ((slots_[i++] = detail::optimizer_slots<value_t<Vs>>(s_, opt_, Vs::name.view(), static_dims<shape_t<Vs>>())), ...);
    }(static_cast<vars_t*>(nullptr));
    {
      const auto bound = s_.bind();
      for (std::size_t i = 0; i < nv; ++i) acc_[i].reserve(sizes_[i]);
    }
    if (this->stats_.replicas > 1) {
      if constexpr (splittable<Comm>) replicas_.emplace(comm.split(K, this->stats_.replica));
      else throw error("gradus: pipeline: stage replicas need a communicator with sub-groups (split); this one has none");
    }
    this->check_config();
  }

  // Every stage's variables into rank 0's session (replica 0's stages send theirs): rank 0
  // then holds the whole model (to evaluate or save it). Every rank calls it.
  void gather_variables() override {
    const auto bound = s_.bind();
    if (this->stats_.replica != 0) return;
    if constexpr (K > 0) {
      [&]<class... Vs>(std::tuple<Vs...>*) {
        std::size_t i = 0;
        ((send_device(detail::pipe_msg::variables, static_cast<int>(i), s_.template data<T>(Vs::name.view()),
                      static_dims<shape_t<Vs>>(), 0),
          ++i),
         ...);
      }(static_cast<vars_t*>(nullptr));
    } else {
      [&]<int... k>(std::integer_sequence<int, k...>) { (receive_stage_variables<k + 1>(), ...); }(
          std::make_integer_sequence<int, S - 1>{});
    }
  }

  double run_raw(std::span<const detail::raw_feed> feeds) override {
    using clock = std::chrono::steady_clock;
    const auto t0 = clock::now();
    double computing = 0;
    auto timed = [&](auto&& f) {
      const auto a = clock::now();
      f();
      computing += std::chrono::duration<double>(clock::now() - a).count();
    };
    this->stats_.bytes_sent = this->stats_.bytes_received = 0;
    const auto bound = s_.bind();
    if constexpr (has_before_run<Backend>) Backend::before_run();  // as session::run does
    const long batch = feeds.empty() ? 0 : feeds[0].d.d[0];
    for (const auto& f : feeds)
      if (f.d.rank == 0 || f.d.d[0] != batch)
        throw feed_error(this->where(-1) + "every feed's first axis is the batch: '" + std::string(f.name) + "' has " +
                         to_string(f.d) + ", the first feed " + std::to_string(batch) + " rows");
    const int M = this->o_.micro_batches;
    const std::vector<long> sizes = (K == 0 || last) ? micro_batch_sizes(batch, M) : std::vector<long>(static_cast<std::size_t>(M), 0);
    std::vector<long> offsets(sizes.size(), 0);
    for (std::size_t m = 1; m < sizes.size(); ++m) offsets[m] = offsets[m - 1] + sizes[m - 1];
    inputs_.resize(static_cast<std::size_t>(M));
    input_dims_.resize(static_cast<std::size_t>(M));
    double loss = 0;
    bool first_grad = true;
    std::vector<char> alive(static_cast<std::size_t>(M), 0);  // forward done, backward not yet
    for (const auto& op : this->ops_) {
      const int m = op.micro;
      const std::size_t um = static_cast<std::size_t>(m);
      auto& gr = g_.graph(graph_index(um));
      if (op.forward) {
        if constexpr (K > 0) input_dims_[um] = this->recv_into(detail::pipe_msg::activation, m, inputs_[um], this->prev_rank());
        timed([&] { forward(gr, feeds, m, offsets[um], sizes[um]); });
        if constexpr (!last) {
          const auto out = gr.template output<0>();
          send_device(detail::pipe_msg::activation, m, out.data(), out.shape, this->next_rank());
        } else {
          T l{};
          Backend::copy_to_host(&l, gr.template output<0>().data(), sizeof(T));
          loss += static_cast<double>(l) * static_cast<double>(sizes[um]) / static_cast<double>(batch);
        }
        alive[um] = 1;
        note_memory(alive);
      } else {
        if (this->o_.rematerialize) timed([&] { forward(gr, feeds, m, offsets[um], sizes[um]); });
        const T w = last ? static_cast<T>(static_cast<double>(sizes[um]) / static_cast<double>(batch)) : T(1);
        if constexpr (!last) {
          const dims dd = this->recv_into(detail::pipe_msg::gradient, m, dy_, this->next_rank());
          using dy_t = typename graph_t::adjoint_t;
          timed([&] { gr.run_part(s_.variables(), 1, feed<dy_t::name, T, shape_t<dy_t>>{dy_.data(), dd}); });
        } else {
          timed([&] { gr.run_part(s_.variables(), 1); });
        }
        timed([&] {
          accumulate(gr, w, first_grad);
          first_grad = false;
        });
        alive[um] = 0;
        if constexpr (K > 0) {
          const auto din = gr.template output<nv + 1>();
          if constexpr (last) {
            // the loss's adjoint is 1 per micro-batch: its share of the batch scales what goes back
            const auto n = static_cast<std::size_t>(din.size());
            T* tmp = scratch(n);
            Backend::for_each(din.size(), detail::scale_rule<T>{w}, tmp, din.data());
            send_device(detail::pipe_msg::gradient, m, tmp, din.shape, this->prev_rank());
          } else {
            send_device(detail::pipe_msg::gradient, m, din.data(), din.shape, this->prev_rank());
          }
        }
      }
    }
    timed([&] {
      if (replicas_)
        for (std::size_t i = 0; i < nv; ++i) average(i);
      update();
    });
    // the batch's loss, from the last stage to the others of its pipeline
    if constexpr (last) {
      for (int k = 0; k < S - 1; ++k)
        this->send_values(detail::pipe_msg::loss, -1, std::span<const double>(&loss, 1), this->comm_.rank() - (S - 1) + k, {});
    } else {
      this->recv_values(detail::pipe_msg::loss, -1, std::span<double>(&loss, 1), this->comm_.rank() - K + (S - 1));
    }
    ++this->step_;
    this->stats_.step_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    this->stats_.compute_seconds = computing;
    return loss;
  }

 private:
  void forward(typename graph_t::graph_t& gr, std::span<const detail::raw_feed> feeds, int m, long offset, long rows) {
    const std::size_t um = static_cast<std::size_t>(m);
    [&]<class... P>(std::tuple<P...>*) {
      auto call = [&](const auto&... f) {
        if constexpr (K > 0)
          gr.run_part(s_.variables(), 0, f..., stage_input<typename graph_t::input_t, T>{g_.input(), inputs_[um].data(), input_dims_[um]});
        else
          gr.run_part(s_.variables(), 0, f...);
      };
      call(typed_feed<P>(feeds, offset, rows)...);
    }(static_cast<placeholders_t*>(nullptr));
  }
  // Placeholder P's feed, its rows [offset, offset + rows).
  template <class P>
  auto typed_feed(std::span<const detail::raw_feed> feeds, long offset, long rows) const {
    using V = value_t<P>;
    for (const auto& f : feeds) {
      if (f.name != P::name.view()) continue;
      if (f.dtype != dtype_name<V>())
        throw feed_error(this->where(-1) + "feed '" + std::string(f.name) + "' is " + std::string(f.dtype) + ", its placeholder " +
                         std::string(dtype_name<V>()));
      dims d = f.d;
      const index_t row = d.d[0] ? d.numel() / d.d[0] : 0;
      d.d[0] = rows;
      return feed<P::name, V, shape_t<P>>{static_cast<const V*>(f.data) + offset * row, d};
    }
    throw feed_error(this->where(-1) + "placeholder '" + std::string(P::name.view()) + "' of stage " + std::to_string(K) +
                     " was not fed");
  }

  // Sends a device buffer (copied to the host first where the backend's memory is not).
  void send_device(detail::pipe_msg kind, int m, const T* p, const dims& d, int to) {
    const auto n = static_cast<std::size_t>(d.numel());
    if constexpr (backend_host_memory<Backend>) {
      this->send_values(kind, m, std::span<const T>(p, n), to, d);
    } else {
      scaled_.resize(n);
      Backend::copy_to_host(scaled_.data(), p, n * sizeof(T));
      this->send_values(kind, m, std::span<const T>(scaled_), to, d);
    }
  }

  // Stage J's variables, sent by rank J (replica 0), into this session.
  template <int J>
  void receive_stage_variables() {
    [&]<class... Vs>(std::tuple<Vs...>*) {
      int i = 0;
      (receive_variable<Vs>(J, i++), ...);
    }(static_cast<stage_variables_t<J, S, Loss>*>(nullptr));
  }
  template <class V>
  void receive_variable(int from, int i) {
    using VT = value_t<V>;
    std::vector<VT> v;
    const dims d = this->recv_into(detail::pipe_msg::variables, i, v, from);
    if (!(d == static_dims<shape_t<V>>()))
      throw error(this->where(-1) + "rank " + std::to_string(from) + " sent " + to_string(d) + " for variable '" +
                  std::string(V::name.view()) + "', which is " + to_string(static_dims<shape_t<V>>()) +
                  "; do the ranks run the same model and --stages?");
    Backend::copy_to_device(s_.template data<VT>(V::name.view()), v.data(), v.size() * sizeof(VT));
  }

  // Values in the backend's memory, freed with it (also when a constructor throws).
  struct device_values {
    T* p = nullptr;
    std::size_t n = 0;
    device_values() = default;
    device_values(const device_values&) = delete;
    device_values& operator=(const device_values&) = delete;
    ~device_values() {
      if (p) Backend::deallocate(p);
    }
    T* reserve(std::size_t want) {  // grown, never shrunk
      if (p && want <= n) return p;
      if (p) Backend::deallocate(p);
      p = nullptr;
      p = static_cast<T*>(Backend::allocate(std::max<std::size_t>(want, 1) * sizeof(T)));
      n = std::max<std::size_t>(want, 1);
      return p;
    }
  };
  T* scratch(std::size_t n) { return scratch_.reserve(n); }

  void accumulate(typename graph_t::graph_t& gr, T w, bool first) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (([&] {
         const auto gv = gr.template output<1 + I>();
         if (first) Backend::for_each(gv.size(), detail::scale_rule<T>{w}, acc_[I].p, gv.data());
         else Backend::for_each(gv.size(), detail::axpy_rule<T>{w}, acc_[I].p, gv.data());
       }()),
       ...);
    }(std::make_index_sequence<nv>{});
  }
  void average(std::size_t i) {
    if constexpr (splittable<Comm>) {
      if constexpr (backend_host_memory<Backend>) {
        replicas_->allreduce_average(std::span<T>(acc_[i].p, sizes_[i]));
      } else {
        scaled_.resize(sizes_[i]);
        Backend::copy_to_host(scaled_.data(), acc_[i].p, sizes_[i] * sizeof(T));
        replicas_->allreduce_average(std::span<T>(scaled_));
        Backend::copy_to_device(acc_[i].p, scaled_.data(), sizes_[i] * sizeof(T));
      }
    }
  }
  void update() {
    const std::int64_t step = s_.global_step();
    [&]<class... Vs>(std::tuple<Vs...>*) {
      std::size_t i = 0;
      ((opt_.template apply<Backend>(static_cast<index_t>(sizes_[i]), s_.template data<T>(Vs::name.view()), acc_[i].p,
                                     slots_[i].data(), step, 1.0),
        ++i),
       ...);
    }(static_cast<vars_t*>(nullptr));
    s_.set_global_step(step + 1);
  }
  // After a forward pass: the activations held now — each micro-batch in flight's graph
  // (its forward buffers; one graph under re-materialisation) and the stage inputs kept.
  void note_memory(const std::vector<char>& alive) {
    std::size_t held = 0;
    for (std::size_t m = 0; m < alive.size(); ++m) {
      if (!alive[m]) continue;
      if (!this->o_.rematerialize || m == 0) held += g_.graph(graph_index(m)).owned_bytes(true);
      held += inputs_[m].size() * sizeof(T);
    }
    this->stats_.peak_activation_bytes = std::max(this->stats_.peak_activation_bytes, held);
  }
  // The graph (its buffers) micro-batch m runs in: one per micro-batch under GPipe, one per
  // micro-batch in flight under 1F1B (at most S), one with re-materialisation.
  std::size_t graph_index(std::size_t m) const {
    if (this->o_.rematerialize) return 0;
    return this->o_.schedule == schedule_kind::gpipe ? m : m % static_cast<std::size_t>(S);
  }

  session<Backend>& s_;
  graph_t g_;
  Opt opt_;
  static constexpr std::array<std::size_t, nv> sizes_ = []<class... Vs>(std::tuple<Vs...>*) {
    return std::array<std::size_t, nv>{static_cast<std::size_t>(static_dims<shape_t<Vs>>().numel())...};
  }(static_cast<vars_t*>(nullptr));
  std::array<std::array<T*, 2>, nv> slots_{};
  std::array<device_values, nv> acc_;  // the batch's gradient sums
  std::vector<std::vector<T>> inputs_;  // per micro-batch: the input received (kept to its backward)
  std::vector<dims> input_dims_;
  std::vector<T> dy_, scaled_;
  device_values scratch_;
  std::optional<sub_t> replicas_;
};

// The step a program holds: the stage this rank runs, behind one interface.
template <class Comm>
class pipeline_step {
 public:
  explicit pipeline_step(std::unique_ptr<pipeline_base<Comm>> p) : p_(std::move(p)) {}
  // One training step over the batch the feeds hold (every rank, the same call): the
  // batch's loss (the last stage's, sent to the others).
  template <class... Feeds>
  double run(const Feeds&... feeds) {
    const detail::raw_feed raw[] = {detail::raw_feed{Feeds::name.view(), dtype_name<typename Feeds::value_type>(), feeds.data,
                                                     feeds.d, sizeof(typename Feeds::value_type)}...};
    return p_->run_raw(std::span<const detail::raw_feed>(raw, sizeof...(Feeds)));
  }
  const pipeline_stats& stats() const { return p_->stats(); }
  // Every stage's variables into rank 0's session (every rank calls it).
  void gather_variables() { p_->gather_variables(); }
  // Two numbers of every rank, on rank 0 in rank order (every rank calls it).
  std::vector<std::array<double, 2>> gather_report(const std::array<double, 2>& mine) { return p_->gather_report(mine); }
  int rank() const { return p_->rank(); }
  int world_size() const { return p_->world_size(); }

 private:
  std::unique_ptr<pipeline_base<Comm>> p_;
};

// The pipeline of an S-stage placed loss, this rank's stage made (see the top of this file).
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
