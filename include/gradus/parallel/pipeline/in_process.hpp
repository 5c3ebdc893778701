#pragma once
// pipeline_in_process<S>(options, loss, optimizer, sessions...): the S stages of a placed loss
// run by S threads of this process, stage k in the k-th session — model parallelism across
// the devices of one machine (TensorFlow's `with tf.device("/gpu:0")` inside one program).
//
//   const auto h = g::on<g::device::cpu>(g::relu(fc1(x)));                           // stage 0
//   const auto loss = g::on<g::device::cuda<0>>(g::nn::softmax_cross_entropy_loss(fc2(h), y));  // stage 1
//   g::session<g::cpu_simd> host;
//   g::session<g::cuda> gpu;
//   auto step = g::parallel::pipeline_in_process<2>({.micro_batches = 4}, loss, g::sgd{.lr = 0.05}, host, gpu);
//   double l = step.run(x = xb, y = yb);
//
// Each session's backend must run its stage's device (stage_graph.hpp device_runs_on:
// device::cpu a host backend such as cpu_simd, device::cuda<N> gradus::cuda): otherwise the
// call does not compile, the stage and backend named in the instantiation. A stage placed
// on no device (stage<K>, device::any) runs on whatever its session's backend is.
//
// The stages are pipeline_stage.hpp's, as across processes, over a thread_world: the
// schedule (GPipe, 1F1B), the micro-batches, re-materialisation, one update per batch, the
// deferred weight gradients and the bytes per cut are the same. Where an edge crosses
// devices the transfer is a host copy: the sender's activations leave its device
// (Backend::copy_to_host), pass through the world's mailbox, and enter the receiver's device
// as its graph's feed; the gradients go back the same way, so the transfers of the forward
// and the backward graph are inserted by the cut the type names. The stages run
// concurrently: a stage's transfers overlap the other stages' compute.
//
// Failures: a stage that throws aborts the world, every other stage's wait ends at once, and
// run() rethrows the failing stage's error (the one that failed first, if several); the step
// is then unusable (its stages are mid-batch): make a new one. Results: stats(k), and
// gather_variables() brings every stage's variables into the first session (to evaluate or
// save the whole model); save_checkpoint/restore_checkpoint write one file per stage
// (pipeline/checkpoint.hpp). With options.placement_log, each stage's lines are written
// after the step, in stage order (the stages' threads never share the stream).
#include <array>
#include <chrono>
#include <exception>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/parallel/pipeline/checkpoint.hpp"
#include "gradus/parallel/pipeline/pipeline_stage.hpp"
#include "gradus/parallel/thread_world.hpp"

namespace gradus::parallel {

/// The S stages of a placed loss run by S threads of this process over a thread_world, stage
/// K in the K-th session (pipeline_in_process() makes it; see the top of this file). Each
/// call runs every stage at once, stage 0 on the caller's thread, and returns when all are
/// done. A stage that throws aborts the world (the others' waits end at once) and the call
/// rethrows the error of the stage that failed first; after a failed run() the object is
/// mid-batch and unusable. Not copyable or movable: the stages hold its mailboxes and log
/// streams.
template <int S, class Loss, class Opt, class... Backends>
class in_process_pipeline {
  static_assert(sizeof...(Backends) == S, "gradus: pipeline_in_process<S>: give one session per stage (S sessions)");
  using backends = std::tuple<Backends...>;
  template <int K>
  using stage_t = pipeline_stage<K, S, std::tuple_element_t<K, backends>, thread_world, Loss, Opt>;
  template <class Seq>
  struct stage_tuple;
  template <int... K>
  struct stage_tuple<std::integer_sequence<int, K...>> {
    using type = std::tuple<std::unique_ptr<stage_t<K>>...>;
  };
  using stages_t = typename stage_tuple<std::make_integer_sequence<int, S>>::type;

 public:
  /// A wait longer than `timeout` (a stage's whole step) is reported as a silent stage.
  in_process_pipeline(const pipeline_options& o, const Loss& loss, const Opt& opt, session<Backends>&... s,
                      std::chrono::milliseconds timeout = std::chrono::minutes(5))
      : comms_(thread_world::world(S, timeout)), log_(o.placement_log) {
    auto sessions = std::tie(s...);
    on_stages([&]<int K>() {
      pipeline_options mine = o;
      mine.placement_log = log_ ? &logs_[static_cast<std::size_t>(K)] : nullptr;
      std::get<K>(stages_) = std::make_unique<stage_t<K>>(comms_[static_cast<std::size_t>(K)], mine, std::get<K>(sessions), loss, opt);
    });
  }
  /// The stages hold this object's mailboxes and log streams: it stays where it was made
  /// (pipeline_in_process returns it by guaranteed copy elision).
  in_process_pipeline(const in_process_pipeline&) = delete;
  in_process_pipeline& operator=(const in_process_pipeline&) = delete;

  /// One training step over the batch the feeds hold: the batch's loss.
  template <class... Feeds>
  double run(const Feeds&... feeds) {
    const detail::raw_feed raw[] = {detail::raw_feed{Feeds::name.view(), element_type_of<typename Feeds::value_type>, feeds.data,
                                                     feeds.d, sizeof(typename Feeds::value_type)}...};
    const std::span<const detail::raw_feed> all(raw, sizeof...(Feeds));
    double loss = 0;
    on_stages([&]<int K>() {
      const double l = std::get<K>(stages_)->run_raw(all);
      if constexpr (K == 0) loss = l;
    });
    if (log_)
      for (auto& l : logs_) *log_ << l.str(), l.str({});
    return loss;
  }

  /// What stage `stage`'s last step measured. Throws `error` where stage is not in
  /// 0 .. S - 1.
  const pipeline_stats& stats(int stage) const {
    const pipeline_stats* r = nullptr;
    [&]<int... K>(std::integer_sequence<int, K...>) {
      ((stage == K ? (r = &std::get<K>(stages_)->stats(), 0) : 0), ...);
    }(std::make_integer_sequence<int, S>{});
    if (!r) throw error("gradus: pipeline_in_process: stage " + std::to_string(stage) + " of " + std::to_string(S));
    return *r;
  }
  /// Every stage's variables into the first session (stage 0's).
  void gather_variables() {
    on_stages([&]<int K>() { std::get<K>(stages_)->gather_variables(); });
  }
  /// One file per stage, "run/ckpt.npz" -> "run/ckpt-N.stage-K-of-S.npz", committed together by
  /// "run/ckpt.commit" (pipeline/checkpoint.hpp), each stage's thread writing its own.
  void save_checkpoint(const std::filesystem::path& file) {
    on_stages([&]<int K>() { save_pipeline_checkpoint(*std::get<K>(stages_), file); });
  }
  /// The committed set's files: true when restored, false when nothing is committed yet.
  /// Throws `error`, naming the cause, where the files are of another stage count or a whole
  /// model's, some are missing, they hold another global step than the commit record, or a
  /// stage could not restore its own.
  bool restore_checkpoint(const std::filesystem::path& file) {
    bool r = false;
    on_stages([&]<int K>() {
      const bool mine = restore_pipeline_checkpoint(*std::get<K>(stages_), file);
      if constexpr (K == 0) r = mine;
    });
    return r;
  }

 private:
  /// `f.template operator()<K>()` for every stage K, stage K on thread K (stage 0 on this one),
  /// all joined; a stage that throws aborts the world (the others' waits end), and its error
  /// is rethrown once every thread has ended.
  template <class F>
  void on_stages(F&& f) {
    std::array<std::exception_ptr, S> errors{};
    const auto body = [&]<int K>() {
      try {
        f.template operator()<K>();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(K)] = std::current_exception();
        comms_[static_cast<std::size_t>(K)].abort(e.what());
      } catch (...) {
        errors[static_cast<std::size_t>(K)] = std::current_exception();
        comms_[static_cast<std::size_t>(K)].abort("an exception");
      }
    };
    std::vector<std::thread> threads;
    threads.reserve(S - 1);
    [&]<int... K>(std::integer_sequence<int, K...>) {
      ([&] {
         if constexpr (K > 0) threads.emplace_back([&body] { body.template operator()<K>(); });
       }(),
       ...);
    }(std::make_integer_sequence<int, S>{});
    body.template operator()<0>();
    for (auto& t : threads) t.join();
    if (const int k = comms_[0].failed_rank(); k >= 0 && errors[static_cast<std::size_t>(k)])
      std::rethrow_exception(errors[static_cast<std::size_t>(k)]);
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
  }

  std::vector<thread_world> comms_;
  std::ostream* log_;
  std::array<std::ostringstream, S> logs_;
  stages_t stages_;
};

/// See the top of this file.
template <int S, class Loss, class Opt, class... Backends>
in_process_pipeline<S, Loss, Opt, Backends...> pipeline_in_process(const pipeline_options& o, const Loss& loss, const Opt& opt,
                                                                   session<Backends>&... s) {
  static_assert(sizeof...(Backends) == S, "gradus: pipeline_in_process<S>: give one session per stage (S sessions)");
  constexpr bool runs = []<int... K>(std::integer_sequence<int, K...>) {
    return (device_runs_on<stage_device_t<K, Loss>, std::tuple_element_t<K, std::tuple<Backends...>>> && ...);
  }(std::make_integer_sequence<int, S>{});
  static_assert(runs,
                "gradus: pipeline_in_process: a stage is placed on a device its session's backend cannot run "
                "(device::cuda<N> needs a session<g::cuda>: link gradus::cuda and compile as CUDA; device::cpu a host "
                "backend such as cpu_simd); the loss's type (its placements) and the sessions' backends are above");
  return in_process_pipeline<S, Loss, Opt, Backends...>(o, loss, opt, s...);
}

}  // namespace gradus::parallel
