#pragma once
// Stage K of an S-stage pipeline on one rank (pipeline.hpp says what a pipeline does): its
// graphs (stage_graph.hpp), the schedule's forward and backward passes of each micro-batch,
// the gradient sums (weighted by each micro-batch's share of the batch; averaged over the
// stage's replicas in their sub-group), the one optimizer update per batch, and the
// activations it held. The transfers and the agreement with its neighbours are
// transfers.hpp's.
// (About 660 lines, one concept: a stage's step — its passes, gradient sums, deferred and
// tied gradients, clipping, loss scaling, update, checkpoint file and placement log — all
// over the same per-stage state. The deferred weight gradients' stash and products are
// deferred_gradients.hpp's.)
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/io/checkpoint.hpp"
#include "gradus/parallel/broadcast_variables.hpp"
#include "gradus/parallel/collectives.hpp"
#include "gradus/parallel/pipeline/deferred_gradients.hpp"
#include "gradus/parallel/pipeline/schedule.hpp"
#include "gradus/parallel/pipeline/stage_graph.hpp"
#include "gradus/parallel/pipeline/transfers.hpp"
#include "gradus/train/optimizer.hpp"
#include "gradus/util/trace_span.hpp"

namespace gradus::parallel {

namespace detail {
/// The optimizer's state tensors of one variable ("w/momentum", ...), made in the session.
template <class T, class Backend, class Opt>
std::array<T*, 2> optimizer_slots(session<Backend>& s, const Opt& opt, std::string_view name, const dims& d) {
  std::array<T*, 2> r{};
  for (int k = 0; k < opt.slot_count(); ++k)
    r[static_cast<std::size_t>(k)] = s.template state<T>(std::string(name) + "/" + std::string(opt.slot_name(k)), d);
  return r;
}

/// The communicator of a sub-group (split), where the communicator makes them.
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
}  // namespace detail

/// Stage K's part of the pipeline.
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
  using device_t = stage_device_t<K, Loss>;
  /// Whether the session's precision policy scales the loss (fp16): the last stage's backward
  /// pass starts from the scale (stage_graph.hpp), and every stage unscales, checks and skips
  /// alike (gradients_finite_everywhere).
  static constexpr bool scales_loss = precision_of_backend_t<Backend>::scales_loss && std::is_same_v<T, float>;
  static_assert([]<class... Vs>(std::tuple<Vs...>*) { return (std::is_same_v<value_t<Vs>, T> && ...); }(static_cast<vars_t*>(nullptr)),
                "gradus: pipeline: a stage's variables must have its output's dtype");

 public:
  /// Stage K on this rank of comm: declares its variables and their optimizer slots in s,
  /// splits its replicas into a sub-group (R > 1), and compares the pipeline's shape with its
  /// neighbours (a send and a receive each way: every rank constructs its stage together).
  /// Throws `error` where S does not divide the world, the options are invalid, the session's
  /// backend cannot run the stage's device, replicas need a split Comm lacks, or a neighbour
  /// runs another shape; the optimizer's validate() error for bad hyper-parameters.
  pipeline_stage(Comm& comm, const pipeline_options& o, session<Backend>& s, const Loss& loss, const Opt& opt)
      : base(comm, S, o, fingerprint_fields(s, opt)), s_(s), g_(loss), opt_(opt), scaling_(s) {
    opt_.validate();
    // across processes each rank runs the stage it is given at run time: a session that
    // cannot run that stage's device is refused here (pipeline_in_process: at compile time)
    if constexpr (!device_runs_on<device_t, Backend>)
      throw error(this->where(-1) + "the stage is placed on device " + device::label<device_t>() + ", and this rank's " +
                  "session runs the " + std::string(Backend::name) + " backend; give this rank a session whose backend " +
                  "runs that device (" + (std::is_same_v<device_t, device::cpu> ? "cpu_simd" : "gradus::cuda") + ")");
    [&]<class... Vs>(std::tuple<Vs...>*) {
      (declare(s_, Vs{}), ...);
      std::size_t i = 0;
      ((slots_[i++] = detail::optimizer_slots<value_t<Vs>>(s_, opt_, Vs::name.view(), static_dims<shape_t<Vs>>())), ...);
    }(static_cast<vars_t*>(nullptr));
    {
      const auto bound = s_.bind();
      for (std::size_t i = 0; i < nv; ++i) values(acc_[i], sizes_[i]);
    }
    if (this->stats_.replicas > 1) {
      if constexpr (splittable<Comm>) replicas_.emplace(comm.split(K, this->stats_.replica));
      else throw error("gradus: pipeline: stage replicas need a communicator with sub-groups (split); this one has none");
    }
    this->check_config();
  }

  /// Every stage's variables into rank 0's session (replica 0's stages send theirs): rank 0
  /// then holds the whole model (to evaluate or save it). Every rank calls it.
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

  std::int64_t save_stage_file(const std::filesystem::path& file) override {
    gradus::save_checkpoint(s_, file, file_options());
    return s_.global_step();
  }
  std::int64_t restore_stage_file(const std::filesystem::path& file) override {
    gradus::restore_checkpoint(s_, file, file_options());
    return s_.global_step();
  }
  void broadcast_to_replicas() override {
    if constexpr (splittable<Comm>)
      if (replicas_) broadcast_variables(*replicas_, s_, file_options().only);
  }

  /// One training step of stage K (pipeline_base::run_raw): the schedule's passes over the
  /// micro-batches, the weighted gradient sums, the replicas' average, the tied and clipped
  /// gradients, one optimizer update and the global step advanced; then the batch's loss
  /// from the last stage.
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
    this->stats_.activation_bytes_sent = this->stats_.gradient_bytes_sent = 0;
    if (util::trace_sink* const trace = util::active_trace()) trace->begin_step(s_.global_step());
    const util::trace_span span("pipeline step", "train");
    const auto bound = s_.bind();
    // over every micro-batch's passes, until the update: each weight converted once a step
    std::optional<decltype(hold_variables())> held(std::in_place, hold_variables());
    if constexpr (has_before_run<Backend>) Backend::before_run();  // as session::run does
    if constexpr (scales_loss) scaling_.before_backward();
    this->check_run_fingerprint();
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
    d_.begin_step();
    const bool probes = this->can_probe();
    this->stats_.early_gradients = 0;
    this->stats_.early_seconds = 0;
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
          send_device(detail::pipe_msg::activation, m, out.data(), out.shape(), this->next_rank());
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
          // the wait for a gradient (the next stages' forward and backward passes) computes
          // the deferred weight gradients ahead over the rows stashed so far: until the
          // gradient arrives where the communicator can tell (probe), else before the last
          // one for as long as the last step's wait lasted
          const bool wait_last = &op == &this->ops_.back();
          if (this->o_.early_gradients && (probes || wait_last)) {
            const double e0 = computing;
            if (probes) timed([&] { d_.work_ahead(acc_data(), [&] { return this->arrived(this->next_rank()); }); });
            else timed([&] { work_ahead_for(slot_); });
            this->stats_.early_seconds += computing - e0;
          }
          const auto r0 = clock::now();
          const dims dd = this->recv_into(detail::pipe_msg::gradient, m, dy_, this->next_rank());
          if (wait_last && !probes) {
            // the wait's length, for the next step's: what the work ahead took and what was
            // left to wait; a wait of (almost) nothing says it ran past: aim lower
            const double waited = std::chrono::duration<double>(clock::now() - r0).count();
            const double slot = this->stats_.early_seconds + waited;
            slot_ = waited > 20e-6 ? slot : 0.75 * slot;
          }
          using dy_t = typename graph_t::adjoint_t;
          timed([&] { gr.run_part(s_.variables(), 1, feed<dy_t::name, T, shape_t<dy_t>>{dy_.data(), dd}); });
        } else {
          timed([&] { gr.run_part(s_.variables(), 1); });
        }
        timed([&] {
          accumulate(gr, w, first_grad);
          stash(gr, w);
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
            send_device(detail::pipe_msg::gradient, m, tmp, din.shape(), this->prev_rank());
          } else {
            send_device(detail::pipe_msg::gradient, m, din.data(), din.shape(), this->prev_rank());
          }
        }
      }
    }
    // the batch's loss, from the last stage to the others of its pipeline, before the
    // updates: a stage whose update ends first goes on to the next step's first forward at
    // once (the message follows the last gradient, so a stage before the last finds it there
    // after its last backward pass, and before the messages of the updates: tied, norm)
    if constexpr (last) {
      for (int k = 0; k < S - 1; ++k)
        this->send_values(detail::pipe_msg::loss, -1, std::span<const double>(&loss, 1), this->comm_.rank() - (S - 1) + k, {});
    } else {
      this->recv_values(detail::pipe_msg::loss, -1, std::span<double>(&loss, 1), this->comm_.rank() - K + (S - 1));
    }
    this->stats_.early_gradients = d_.begun();
    held.reset();  // the update writes the weights
    timed([&] {
      // with nothing to do between a gradient and its update (no replicas to average with,
      // no tied variables, no clipping by the norm over every gradient), each deferred
      // gradient is computed and applied piece by piece while the piece is in cache
      const bool fused = !replicas_ && tied_order.empty() && !(opt_.clip_global_norm > 0) && !scales_loss;
      if (!fused) {
        deferred_gradients();
        if (replicas_)
          for (std::size_t i = 0; i < nv; ++i) average(i);
        for (const std::size_t i : tied_order)  // in an order every stage agrees on
          tie(i);
      }
      double unscale = 1;  // what undoes the loss scale
      bool apply = true;
      if constexpr (scales_loss) {
        apply = gradients_finite_everywhere(s_.global_step());
        unscale = scaling_.unscale();
        this->stats_.loss_scale = scaling_.scaler().scale();
        this->stats_.skipped_steps = scaling_.scaler().skipped_steps();
      }
      if (apply) update(unscale * clip_scale(unscale), fused);
      else s_.set_global_step(s_.global_step() + 1);  // skipped: nothing changes but the step
    });
    if (this->o_.placement_log) log_placement(*this->o_.placement_log);
    ++this->step_;
    this->stats_.step_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    this->stats_.compute_seconds = computing;
    return loss;
  }

 private:
  /// What the ranks compare besides the pipeline's shape: the session's precision policy
  /// (ranks of different policies are refused, naming both), the optimizer.
  static std::vector<run_field> fingerprint_fields(const session<Backend>& s, const Opt& opt) {
    std::vector<run_field> f{precision_field(s)};
    for (auto& x : optimizer_fields(opt)) f.push_back(std::move(x));
    return f;
  }
  /// Loss scaling: whether the gradients of every stage of this pipeline are finite. Each
  /// stage sends the index of its first non-finite gradient (or -1) to the others, so all
  /// agree, and each advances its scaler alike: a skipped step is skipped by every stage, and
  /// the floor's error names the first such variable in stage order.
  bool gradients_finite_everywhere(std::int64_t step) {
    int mine = -1;
    for (std::size_t i = 0; i < nv && mine < 0; ++i)
      if (Backend::first_nonfinite(static_cast<const T*>(acc_[i].data), sizes_[i]) >= 0) mine = static_cast<int>(i);
    const auto all = this->from_every_stage(detail::pipe_msg::finite, mine);
    for (int k = 0; k < S; ++k)
      if (all[static_cast<std::size_t>(k)] >= 0)
        return scaling_.record(step, stage_variable_name<S, Loss>(k, static_cast<int>(all[static_cast<std::size_t>(k)])));
    return scaling_.record(step, {});
  }
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
  /// Placeholder P's feed, its rows [offset, offset + rows).
  template <class P>
  auto typed_feed(std::span<const detail::raw_feed> feeds, long offset, long rows) const {
    using V = value_t<P>;
    for (const auto& f : feeds) {
      if (f.name != P::name.view()) continue;
      if (f.dtype != element_type_of<V>)
        throw feed_error(this->where(-1) + "feed '" + std::string(f.name) + "' is " + std::string(name_of(f.dtype)) + ", its placeholder " +
                         std::string(dtype_name<V>()));
      dims d = f.d;
      const index_t row = d.d[0] ? d.numel() / d.d[0] : 0;
      d.d[0] = rows;
      return feed<P::name, V, shape_t<P>>{static_cast<const V*>(f.data) + offset * row, d};
    }
    throw feed_error(this->where(-1) + "placeholder '" + std::string(P::name.view()) + "' of stage " + std::to_string(K) +
                     " was not fed");
  }

  /// What this stage's checkpoint file holds: its variables and their optimizer slots, the
  /// world, the stage layout.
  checkpoint_options file_options() const {
    checkpoint_options c{.world_size = this->comm_.world_size(), .stages = S, .stage = K, .only = {}};
    [&]<class... Vs>(std::tuple<Vs...>*) {
      ((c.only.emplace_back(Vs::name.view()), [&] {
         for (int k = 0; k < opt_.slot_count(); ++k)
           c.only.push_back(std::string(Vs::name.view()) + "/" + std::string(opt_.slot_name(k)));
       }()),
       ...);
    }(static_cast<vars_t*>(nullptr));
    if constexpr (scales_loss)  // the scaler's state: every stage holds the same
      for (const auto* n : {"loss_scaler/scale", "loss_scaler/good_steps"}) c.only.emplace_back(n);
    return c;
  }

  /// The placement log (pipeline_options::placement_log): after the first step, what this
  /// stage's graph ran (each node, its dims, forward or backward) and where; after every step,
  /// the bytes sent across each cut. One write per step, so ranks sharing a stream interleave
  /// by whole lines.
  void log_placement(std::ostream& os) {
    const auto& st = this->stats_;
    const int r = this->comm_.rank();
    const std::string dev = device::label<device_t>();
    const std::string where = "stage " + std::to_string(K) + " of " + std::to_string(S) + " (rank " + std::to_string(r) +
                              (st.replicas > 1 ? ", replica " + std::to_string(st.replica) : std::string()) +
                              (dev.empty() ? std::string() : ", " + dev) + ", " + Backend::name + ")";
    std::string out;
    if (this->step_ == 0)
      g_.graph(0).for_each_step([&](std::string_view label, const dims& d, int part) {
        out.append("gradus placement: ").append(label).append(" ").append(to_string(d));
        out.append(part ? " (backward): " : " (forward): ").append(where).append("\n");
      });
    if (this->step_ == 0)
      [&]<class... Vs>(std::tuple<Vs...>*) {
        std::size_t i = 0;
        ((graph_t::deferred[i++] ? (void)out.append("gradus placement: the gradient of '").append(Vs::name.view())
                                       .append("' ").append(to_string(static_dims<shape_t<Vs>>()))
                                       .append(" (deferred: one GEMM over the batch's rows): ").append(where).append("\n")
                                 : (void)0),
         ...);
      }(static_cast<vars_t*>(nullptr));
    out.append("gradus placement: step ").append(std::to_string(this->step_)).append(", ").append(where).append(":");
    if constexpr (!last)
      out.append(" sent ").append(std::to_string(st.activation_bytes_sent)).append(" bytes of activations to rank ")
          .append(std::to_string(this->next_rank())).append(" (stage ").append(std::to_string(K + 1)).append(")");
    if constexpr (K > 0)
      out.append(last ? "" : ",").append(" sent ").append(std::to_string(st.gradient_bytes_sent))
          .append(" bytes of gradients to rank ").append(std::to_string(this->prev_rank())).append(" (stage ")
          .append(std::to_string(K - 1)).append(")");
    out.append("\n");
    os << out << std::flush;
  }

  /// Sends a device buffer (copied to the host first where the backend's memory is not).
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

  /// Stage J's variables, sent by rank J (replica 0), into this session.
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

  /// n values in a device buffer (exec/backend.hpp: grown, freed with this stage)
  static T* values(device_buffer<Backend>& b, std::size_t n) { return static_cast<T*>(b.reserve(std::max<std::size_t>(n, 1) * sizeof(T))); }
  T* scratch(std::size_t n) { return values(scratch_, n); }

  void accumulate(typename graph_t::graph_t& gr, T w, bool first) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (([&] {
         if constexpr (graph_t::deferred[I]) return;
         const auto gv = gr.template output<1 + I>();
         if (first) Backend::for_each(gv.size(), detail::scale_rule<T>{w}, static_cast<T*>(acc_[I].data), gv.data());
         else Backend::for_each(gv.size(), detail::axpy_rule<T>{w}, static_cast<T*>(acc_[I].data), gv.data());
       }()),
       ...);
    }(std::make_index_sequence<nv>{});
  }
  /// A deferred gradient's rows of this micro-batch (stage_graph.hpp): its X, and its G
  /// scaled by the micro-batch's weight, appended to the step's stash.
  void stash(typename graph_t::graph_t& gr, T w) {
    long rows = -1;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (([&] {
         if constexpr (graph_t::deferred[I]) {
           const auto x = gr.template output<graph_t::rows_output[I]>();
           const auto g = gr.template output<1 + I>();
           rows = x.shape().d[0];
           if (rows == 0) return;
           const auto xc = static_cast<std::size_t>(x.size() / rows), gc = static_cast<std::size_t>(g.size() / rows);
           if (g.shape().d[0] != rows || xc * gc != sizes_[I])
             throw error(this->where(-1) + "a deferred weight gradient's rows are " + to_string(x.shape()) + " and " +
                         to_string(g.shape()) + ", which do not make its variable's " + std::to_string(sizes_[I]) + " values");
           d_.append(I, x.data(), g.data(), static_cast<index_t>(rows), xc, gc, w);
         }
       }()),
       ...);
    }(std::make_index_sequence<nv>{});
    if (rows > 0) d_.rows_added(static_cast<index_t>(rows));
    this->stats_.deferred_bytes = std::max(this->stats_.deferred_bytes, d_.bytes());
  }
  /// The deferred gradients, each over the step's stashed rows: X^T G.
  void deferred_gradients() {
    const util::trace_span span("deferred weight gradients", "compute");
    for (std::size_t i = 0; i < nv; ++i)
      if (graph_t::deferred[i]) deferred_gradient(i, 0, d_.rows() ? d_.cols(i).first : 0);
  }
  /// Rows [r0, r0 + rows) of deferred gradient i (X^T G is [X's columns, G's columns]); the
  /// whole gradient zero where no rows were stashed.
  void deferred_gradient(std::size_t i, index_t r0, index_t rows) {
    T* acc = static_cast<T*>(acc_[i].data);
    if (d_.rows() == 0) Backend::for_each(static_cast<index_t>(sizes_[i]), detail::scale_rule<T>{T(0)}, acc, acc);
    else d_.finish(i, r0, rows, acc);
  }
  /// The gradient sums' buffers.
  std::array<T*, nv> acc_data() {
    std::array<T*, nv> r{};
    for (std::size_t i = 0; i < nv; ++i) r[i] = static_cast<T*>(acc_[i].data);
    return r;
  }
  /// Where the communicator cannot tell when a gradient arrives: before the last one, the
  /// deferred gradients ahead for `budget` seconds (the last step's wait).
  void work_ahead_for(double budget) {
    if (budget <= 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    d_.work_ahead(acc_data(), [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= budget; });
  }
  void average(std::size_t i) {
    if constexpr (splittable<Comm>) {
      // float gradients travel as the policy's comm type (parallel/collectives.hpp average_as)
      const auto avg = [&](std::span<T> x) {
        if constexpr (std::is_same_v<T, float>) average_as(*replicas_, x, precision_of_backend_t<Backend>::comm_type);
        else replicas_->allreduce_average(x);
      };
      if constexpr (backend_host_memory<Backend>) {
        avg(std::span<T>(static_cast<T*>(acc_[i].data), sizes_[i]));
      } else {
        scaled_.resize(sizes_[i]);
        Backend::copy_to_host(scaled_.data(), static_cast<T*>(acc_[i].data), sizes_[i] * sizeof(T));
        avg(std::span<T>(scaled_));
        Backend::copy_to_device(static_cast<T*>(acc_[i].data), scaled_.data(), sizes_[i] * sizeof(T));
      }
    }
  }
  /// Tied variable i: its gradient is the sum of the parts of the stages that read it. Each
  /// sends its part to the others of its pipeline and sums all of them in stage order, so
  /// every copy gets the same bits and the copies stay equal.
  void tie(std::size_t i) {
    const auto n = sizes_[i];
    const int first = this->comm_.rank() - K;
    tied_mine_.resize(n);
    Backend::copy_to_host(tied_mine_.data(), acc_[i].data, n * sizeof(T));
    for (int k = 0; k < S; ++k)
      if (k != K && (graph_t::sharers[i] >> k & 1u))
        this->send_values(detail::pipe_msg::tied, graph_t::tie_key[i], std::span<const T>(tied_mine_), first + k, {});
    tied_sum_.assign(n, T(0));
    for (int k = 0; k < S; ++k) {
      if (!(graph_t::sharers[i] >> k & 1u)) continue;
      const T* part = tied_mine_.data();
      if (k != K) {
        tied_theirs_.resize(n);
        this->recv_values(detail::pipe_msg::tied, graph_t::tie_key[i], std::span<T>(tied_theirs_), first + k);
        part = tied_theirs_.data();
      }
      for (std::size_t j = 0; j < n; ++j) tied_sum_[j] += part[j];
    }
    Backend::copy_to_device(acc_[i].data, tied_sum_.data(), n * sizeof(T));
  }
  /// clip_global_norm: the norm over every stage's gradients (each stage's sum of squares
  /// sent to the others of its pipeline, summed in stage order, so every stage scales alike),
  /// of the unscaled gradients (the sums hold them times 1 / unscale).
  double clip_scale(double unscale) {
    if (opt_.clip_global_norm <= 0) return 1;
    double mine = 0;
    for (std::size_t i = 0; i < nv; ++i)  // a tied variable counted once: by the first stage that reads it
      if ((graph_t::sharers[i] & ((1u << K) - 1u)) == 0)
        mine += static_cast<double>(Backend::sum_squares(static_cast<const T*>(acc_[i].data), static_cast<index_t>(sizes_[i])));
    double sq = 0;
    for (const double theirs : this->from_every_stage(detail::pipe_msg::norm, mine)) sq += theirs;
    this->stats_.gradient_norm = std::sqrt(sq) * unscale;
    return this->stats_.gradient_norm > opt_.clip_global_norm ? opt_.clip_global_norm / this->stats_.gradient_norm : 1.0;
  }
  /// Under a mixed policy whose backend converts its GEMMs' operands: a token holding the
  /// stage's float variables (compute_kernels::hold_operands; each converted at the first GEMM
  /// that reads it); otherwise one that does nothing.
  auto hold_variables() {
    using compute = typename precision_of_backend_t<Backend>::compute;
    if constexpr (std::is_same_v<T, float> && !std::is_same_v<compute, float>) {
      auto held = compute_kernels<Backend, compute>::hold_operands();
      [&]<class... Vs>(std::tuple<Vs...>*) {
        std::size_t i = 0;
        ((held.add(s_.template data<T>(Vs::name.view()), sizes_[i]), ++i), ...);
      }(static_cast<vars_t*>(nullptr));
      return held;
    } else {
      return nothing_held{};
    }
  }
  /// The optimizer's step on every variable; `fused`: each deferred gradient computed here,
  /// in pieces of about 128 KiB of rows, each piece applied right after it (the optimizers'
  /// rules are elementwise, so the pieces give the whole pass's bits).
  void update(double scale, bool fused) {
    const util::trace_span span("optimizer update", "train");
    const std::int64_t step = s_.global_step();
    [&]<class... Vs>(std::tuple<Vs...>*) {
      std::size_t i = 0;
      const auto one = [&](T* w) {
        T* g = static_cast<T*>(acc_[i].data);
        if (fused && graph_t::deferred[i] && d_.rows() > 0) {
          const auto [m, n] = d_.cols(i);
          const index_t piece = detail::deferred_gradients<T, Backend, nv>::piece(n);
          for (index_t r0 = 0; r0 < m; r0 += piece) {
            const index_t rows = std::min(piece, m - r0);
            deferred_gradient(i, r0, rows);
            std::array<T*, 2> at = slots_[i];
            for (auto& p : at)
              if (p) p += r0 * n;
            opt_.template apply<Backend>(rows * n, w + r0 * n, g + r0 * n, at.data(), step, scale);
          }
        } else {
          if (fused && graph_t::deferred[i]) deferred_gradient(i, 0, 0);
          opt_.template apply<Backend>(static_cast<index_t>(sizes_[i]), w, g, slots_[i].data(), step, scale);
        }
        ++i;
      };
      (one(s_.template data<T>(Vs::name.view())), ...);
    }(static_cast<vars_t*>(nullptr));
    s_.set_global_step(step + 1);
  }
  /// After a forward pass: the activations held now — each micro-batch in flight's graph
  /// (its forward buffers; the one graph under re-materialisation) and the stage inputs kept.
  void note_memory(const std::vector<char>& alive) {
    std::size_t held = this->o_.rematerialize ? g_.graph(0).owned_bytes(true) : 0;
    for (std::size_t m = 0; m < alive.size(); ++m) {
      if (!alive[m]) continue;
      if (!this->o_.rematerialize) held += g_.graph(graph_index(m)).owned_bytes(true);
      held += inputs_[m].size() * sizeof(T);
    }
    this->stats_.peak_activation_bytes = std::max(this->stats_.peak_activation_bytes, held);
  }
  /// The graph (its buffers) micro-batch m runs in: one per micro-batch under GPipe, one per
  /// micro-batch in flight under 1F1B (at most S), one with re-materialisation.
  std::size_t graph_index(std::size_t m) const {
    if (this->o_.rematerialize) return 0;
    return this->o_.schedule == schedule_kind::gpipe ? m : m % static_cast<std::size_t>(S);
  }

  /// The tied variables (read by another stage too), by tie_key.
  static constexpr auto tied_order = [] {
    constexpr std::size_t n = [] {
      std::size_t c = 0;
      for (std::size_t i = 0; i < nv; ++i) c += graph_t::sharers[i] != (1u << K) ? 1 : 0;
      return c;
    }();
    std::array<std::size_t, n> r{};
    std::size_t c = 0;
    for (std::size_t i = 0; i < nv; ++i)
      if (graph_t::sharers[i] != (1u << K)) r[c++] = i;
    std::sort(r.begin(), r.end(), [](std::size_t a, std::size_t b) { return graph_t::tie_key[a] < graph_t::tie_key[b]; });
    return r;
  }();

  session<Backend>& s_;
  graph_t g_;
  Opt opt_;
  struct no_scaling {
    explicit no_scaling(session<Backend>&) {}
  };
  /// the loss scaler (train/loss_scale.hpp) where the policy scales the loss
  std::conditional_t<scales_loss, step_loss_scaling<Backend>, no_scaling> scaling_;
  static constexpr std::array<std::size_t, nv> sizes_ = []<class... Vs>(std::tuple<Vs...>*) {
    return std::array<std::size_t, nv>{static_cast<std::size_t>(static_dims<shape_t<Vs>>().numel())...};
  }(static_cast<vars_t*>(nullptr));
  std::array<std::array<T*, 2>, nv> slots_{};
  std::array<device_buffer<Backend>, nv> acc_;  ///< the batch's gradient sums
  /// the deferred gradients' stashes (rows of X and of G, the step's micro-batches one after
  /// another), their column counts, and the rows stashed this step
  detail::deferred_gradients<T, Backend, nv> d_{graph_t::deferred};  ///< the deferred weight gradients' stash
  /// without a probing communicator: the last step's wait for its last gradient
  double slot_ = 0;
  std::vector<std::vector<T>> inputs_;  ///< per micro-batch: the input received (kept to its backward)
  std::vector<dims> input_dims_;
  std::vector<T> dy_, scaled_;
  std::vector<T> tied_mine_, tied_theirs_, tied_sum_;  ///< a tied variable's gradient parts (host)
  device_buffer<Backend> scratch_;
  std::optional<sub_t> replicas_;
};


}  // namespace gradus::parallel
