#pragma once
// hogwild(session, loss, sgd, threads[, variables...]): Hogwild! (Niu, Recht, Ré and Wright
// 2011) — asynchronous SGD by several threads of one process that share the variables and
// update them without locks. Meant for sparse models (embedding_lookup /
// nn::embedding<..., Sparse = true>), where a step touches few rows of a large table, so
// two threads rarely write the same element and the lost updates Hogwild! allows are rare.
//
//   auto hw = g::hogwild(s, loss, g::sgd{.lr = 0.1}, 4);        // every variable the loss reads
//   auto report = hw.run([&](auto& worker) {                     // on each of the 4 threads
//     for (std::size_t b = worker.thread(); b < batches; b += worker.threads())
//       worker.step(ids = ..., y = ...);                          // one lock-free SGD step
//   });
//   // report.steps[t], report.total_steps == s.global_step() advance, report.seconds
//
// How the threads share the variables. The executor's kernels read a variable's storage
// with plain (SIMD) loads, so a compiled graph cannot read storage that another thread
// writes at the same time without a C++ data race (undefined behaviour, and what
// ThreadSanitizer reports), and a session is not thread-safe (its graph cache). So each
// worker has its own session and train_step (its plans, activations and gradients) holding
// a private copy of the variables, and the shared values live only in the caller's session:
//   1. read: before each step the worker copies from the shared storage into its copy the
//      rows its batch names (the embedding's index expression, evaluated first from the
//      step's feeds) and every dense variable whole — Niu et al.'s "read x_e";
//   2. compute: forward and backward on its private copy (train_step::compute_gradients);
//   3. write: plain SGD, w -= lr * (g + weight_decay * w), on the shared elements of the
//      named rows (sparse) or the whole variable (dense), element by element.
// Every access to shared storage while the workers run is a std::atomic_ref<T> load or
// store with memory_order_relaxed: no lock, no ordering, plain moves on x86-64 and AArch64,
// and no data race. A read-modify-write of one element is a load then a store, not an
// atomic add, so two threads updating the same element at once may lose one update —
// exactly Hogwild!'s relaxation. The learning rate follows the optimizer's schedule over a
// shared step counter, which becomes the session's global_step.
//
// Only plain SGD (sgd with momentum 0; weight_decay and clip_global_norm apply, per
// worker step): momentum or Adam state would be shared per-row state, not Hogwild!.
// Storage must be host memory (CPU backends). Each worker holds a copy of every variable
// the loss reads (memory: threads x the model). While run() runs, the worker function must
// not use the session; run() blocks until every thread has joined. An exception in a
// worker stops the others at their next step and is rethrown by run() as a gradus::error
// naming the thread (the original nested: std::rethrow_if_nested).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gradus/exec/session.hpp"
#include "gradus/graph/ops/index.hpp"  // scatter_add_node, which train_step.hpp names
#include "gradus/train/optimizer.hpp"
#include "gradus/train/train_step.hpp"

namespace gradus {

namespace detail {
/// Whether expression E reads a placeholder named `name` (to pass an index expression only
/// the feeds it reads: a run refuses a feed its graph has no placeholder for).
template <class E>
constexpr bool reads_placeholder(std::string_view name) {
  if constexpr (E::kind == node_kind::placeholder) {
    return E::name.view() == name;
  } else if constexpr (requires { std::declval<const E&>().children(); }) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (reads_placeholder<std::remove_cvref_t<std::tuple_element_t<I, children_t<E>>>>(name) || ...);
    }(std::make_index_sequence<std::tuple_size_v<children_t<E>>>{});
  } else {
    return false;
  }
}
/// Thrown inside a worker when another one has failed: unwinds its loop; not reported.
struct hogwild_stopped {};
inline void prefetch([[maybe_unused]] const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#endif
}
}  // namespace detail

/// What run() did: steps per thread (their sum is how far the session's global_step moved),
/// each thread's mean loss over its steps (NaN without steps), and the wall time.
struct hogwild_report {
  std::vector<std::int64_t> steps;  ///< steps each thread took, by thread index
  std::vector<double> mean_loss;    ///< each thread's mean loss over its steps (NaN for none)
  std::int64_t total_steps = 0;     ///< the sum of steps: how far the session's global_step moved
  double seconds = 0;               ///< wall time from just before the threads start until all joined
};

/// Hogwild! (Niu, Recht, Ré and Wright 2011): plain SGD by several threads of one process
/// that share the variables `Vs...` of the session and update them without locks, for
/// sparse models (embedding_lookup, `nn::embedding<..., Sparse = true>`). Made by hogwild().
///
/// Each worker thread has its own session and train_step over a private copy of the
/// variables. A step copies in from the shared storage the rows its batch names (every
/// element of a dense variable), computes the gradients on the copy, and writes
/// `w -= lr * (scale * g + weight_decay * w)` into the shared elements those gradients cover;
/// every shared access is a relaxed std::atomic_ref load or store, so two threads updating
/// the same element at once may lose one update, as Hogwild! allows. The learning rate is
/// the optimizer's schedule at a shared step counter that becomes the session's global_step;
/// clip_global_norm clips each worker step's own gradients.
///
/// Needs a backend whose storage is host memory (cpu_simd) and a dtype with lock-free
/// atomics (compile errors otherwise); memory: one copy of every variable the loss reads per
/// thread. Movable, not copyable; it refers to the session, which must outlive it.
template <class Backend, class Loss, class... Vs>
class hogwild_trainer {
  /// The workers' threads read and write the shared variables with atomics on the host.
  static_assert(backend_host_memory<Backend>,
                "gradus: hogwild needs a backend whose tensors live in host memory (cpu_simd), not a device's");
  using step_t = train_step<Backend, sgd, Loss, Vs...>;
  using grads_t = std::remove_cvref_t<decltype(std::declval<const step_t&>().gradient_expressions())>;
  template <std::size_t I>
  using var_t = std::tuple_element_t<I, std::tuple<Vs...>>;
  template <std::size_t I>
  static constexpr bool sparse_v = detail::is_sparse_grad_v<std::tuple_element_t<I, grads_t>, var_t<I>>;
  static_assert(((std::atomic_ref<value_t<Vs>>::is_always_lock_free) && ...),
                "gradus: hogwild: the variables' dtype has no lock-free atomic access on this target");

 public:
  using loss_type = typename step_t::loss_type;  ///< the loss's dtype, what worker::step() returns

  /// One thread's handle: its index, and step(feeds...) — one lock-free SGD step on the
  /// shared variables, returning the batch's loss (computed on the values it read).
  class worker {
   public:
    std::size_t thread() const { return thread_; }    ///< this thread's index, in [0, threads())
    std::size_t threads() const { return threads_; }  ///< how many threads run
    std::int64_t steps() const { return steps_; }     ///< steps this worker took in this run()

    /// One lock-free SGD step on the batch `feeds` (as for session::run: `x = tensor, ...`):
    /// reads the shared values it needs, computes the gradients, writes the update; returns
    /// the batch's loss before the update. After another worker has failed it throws an
    /// internal exception that ends this worker's function (run() catches it; let it pass).
    template <class... Feeds>
    loss_type step(const Feeds&... feeds) {
      if (stop_->load(std::memory_order_relaxed)) throw detail::hogwild_stopped{};
      [&]<std::size_t... I>(std::index_sequence<I...>) { (read<I>(feeds...), ...); }(
          std::index_sequence_for<Vs...>{});
      const loss_type l = step_.compute_gradients(feeds...);
      double scale = 1;
      if (opt_.clip_global_norm > 0) {
        const double norm = step_.gradient_norm();
        if (norm > opt_.clip_global_norm) scale = opt_.clip_global_norm / norm;
      }
      const std::int64_t gs = counter_->fetch_add(1, std::memory_order_relaxed);
      const double lr = opt_.lr(gs);
      [&]<std::size_t... I>(std::index_sequence<I...>) { (write<I>(lr, scale), ...); }(
          std::index_sequence_for<Vs...>{});
      ++steps_;
      loss_sum_ += static_cast<double>(l);
      return l;
    }

   private:
    friend class hogwild_trainer;
    worker(const Loss& loss, const sgd& opt, const Vs&... vs)
        : session_(std::make_unique<session<Backend>>()), step_(*session_, loss, opt, vs...), opt_(opt) {}

    /// The shared values this step reads into the private copy: the named rows of a
    /// sparse variable (an out-of-range index is skipped here; the step's gather then
    /// throws its index_error), all of a dense one.
    template <std::size_t I, class... Feeds>
    void read(const Feeds&... feeds) {
      using V = var_t<I>;
      using T = value_t<V>;
      T* const shared = static_cast<T*>(shared_[I]);
      T* const mine = static_cast<T*>(private_[I]);
      constexpr dims vd = static_dims<shape_t<V>>();
      if constexpr (sparse_v<I>) {
        constexpr index_t vocab = vd.d[0], len = vd.numel() / vd.d[0];
        const auto& idx = std::get<I>(step_.gradient_expressions()).e.idx;
        using idx_t = std::remove_cvref_t<decltype(idx)>;
        auto picked = std::tuple_cat([&] {
          if constexpr (detail::reads_placeholder<idx_t>(Feeds::name.view())) return std::tuple<const Feeds&>(feeds);
          else return std::tuple<>{};
        }()...);
        const auto rows = std::apply([&](const auto&... f) { return session_->run(idx, f...); }, picked);
        // rows of a large table are cache misses in both copies: fetching a few rows ahead
        // took one thread from 1.7x to 1.25x a train_step's epoch (100k x 32 floats)
        constexpr index_t ahead = 8;
        const index_t n = rows.size();
        for (index_t p = 0; p < n; ++p) {
          const std::int32_t r = rows[p];
          if (p + ahead < n && rows[p + ahead] >= 0 && rows[p + ahead] < vocab) {
            detail::prefetch(shared + rows[p + ahead] * len);
            detail::prefetch(mine + rows[p + ahead] * len);
          }
          if (r < 0 || r >= vocab) continue;
          for (index_t j = 0; j < len; ++j)
            mine[r * len + j] = std::atomic_ref<T>(shared[r * len + j]).load(std::memory_order_relaxed);
        }
      } else {
        for (index_t i = 0; i < vd.numel(); ++i)
          mine[i] = std::atomic_ref<T>(shared[i]).load(std::memory_order_relaxed);
      }
    }

    /// The SGD update of the shared elements this step's gradient covers (a load and a
    /// store each: a concurrent update of the same element may be lost, as Hogwild! allows).
    template <std::size_t I>
    void write(double lr, double scale) {
      using T = value_t<var_t<I>>;
      const gradient_buffer& gb = step_.gradients()[I];
      T* const shared = static_cast<T*>(shared_[I]);
      const T* const g = static_cast<const T*>(gb.data);
      const opt_detail::sgd_rule<T> rule{static_cast<T>(lr), static_cast<T>(opt_.weight_decay), static_cast<T>(scale)};
      auto apply = [&](T& w, T gi) {
        std::atomic_ref<T> a(w);
        T v = a.load(std::memory_order_relaxed);
        rule(v, gi);
        a.store(v, std::memory_order_relaxed);
      };
      if (gb.sparse()) {
        for (index_t k = 0; k < gb.rows; ++k) {
          T* const row = shared + static_cast<index_t>(gb.indices[k]) * gb.row_len;
          for (index_t j = 0; j < gb.row_len; ++j) apply(row[j], g[k * gb.row_len + j]);
        }
      } else {
        for (index_t i = 0; i < gb.size; ++i) apply(shared[i], g[i]);
      }
    }

    std::unique_ptr<session<Backend>> session_;  ///< first: step_ refers to it
    step_t step_;
    sgd opt_;
    std::array<void*, sizeof...(Vs)> shared_{};   ///< the caller's session's storage
    std::array<void*, sizeof...(Vs)> private_{};  ///< this worker's copy
    std::atomic<std::int64_t>* counter_ = nullptr;
    const std::atomic<bool>* stop_ = nullptr;
    std::size_t thread_ = 0, threads_ = 0;
    std::int64_t steps_ = 0;
    double loss_sum_ = 0;
  };

  /// `threads` workers for training `vs...` of `s` on `loss` with `opt`. Throws gradus::error
  /// when opt is invalid (sgd::validate), has momentum (plain SGD only: momentum is state the
  /// threads would share), or threads is outside [1, max_threads]. Each worker's session
  /// checks numerics if `s` did when the trainer was made. Prefer hogwild().
  hogwild_trainer(session<Backend>& s, const Loss& loss, const sgd& opt, std::size_t threads, const Vs&... vs)
      : s_(s) {
    opt.validate();
    if (opt.momentum != 0)
      throw error("gradus: hogwild: plain SGD only (Niu et al.'s update), but momentum = " +
                  std::to_string(opt.momentum) + ": momentum is per-element state the threads would share; " +
                  "use minimize() for momentum or Adam");
    if (threads == 0 || threads > max_threads)
      throw error("gradus: hogwild: threads = " + std::to_string(threads) + " is outside [1, " +
                  std::to_string(max_threads) + "]");
    workers_.reserve(threads);
    for (std::size_t t = 0; t < threads; ++t) {
      workers_.push_back(std::unique_ptr<worker>(new worker(loss, opt, vs...)));
      workers_.back()->thread_ = t;
      workers_.back()->threads_ = threads;
      workers_.back()->session_->set_check_numerics(s.check_numerics());
    }
  }
  hogwild_trainer(const hogwild_trainer&) = delete;
  hogwild_trainer& operator=(const hogwild_trainer&) = delete;
  hogwild_trainer(hogwild_trainer&&) noexcept = default;  ///< moves the workers; the session stays the same

  static constexpr std::size_t max_threads = 1024;         ///< the most threads a trainer runs
  std::size_t threads() const { return workers_.size(); }  ///< how many worker threads run() starts

  /// Runs fn(worker&) on each of threads() new threads and joins them. The workers start
  /// from the session's current values (every variable the loss reads: each needs a value,
  /// else a feed_error naming it) and global_step. fn must not use the session while it
  /// runs. If a worker throws, the others stop at their next step, the updates made so far
  /// stay (global_step counts them), and run() throws a gradus::error naming the thread,
  /// with the worker's exception nested (std::rethrow_if_nested).
  template <class Fn>
  hogwild_report run(Fn&& fn) {
    // before any thread starts: each worker's copy of the variables the loss reads (plain
    // copies — nothing runs concurrently yet), and where the trained ones live. A trained
    // variable is copied whole on the first run only: every step refreshes each element
    // of it that the step reads (the named rows, or all of a dense one) before reading it.
    for (auto& w : workers_) {
      [&]<class... A>(std::tuple<A...>*) { (copy_in(*w->session_, A{}, !primed_ || !trained<A>()), ...); }(
          static_cast<variables_of_t<Loss>*>(nullptr));
      [&]<std::size_t... I>(std::index_sequence<I...>) {
        ((w->shared_[I] = s_.template data<value_t<Vs>>(Vs::name.view()),
          w->private_[I] = w->session_->template data<value_t<Vs>>(Vs::name.view())),
         ...);
      }(std::index_sequence_for<Vs...>{});
      w->steps_ = 0;
      w->loss_sum_ = 0;
    }
    primed_ = true;
    std::atomic<std::int64_t> counter{s_.global_step()};
    std::atomic<bool> stop{false};
    const std::size_t n = workers_.size();
    std::vector<std::exception_ptr> failed(n);
    std::vector<std::thread> pool;
    pool.reserve(n);
    const auto t0 = std::chrono::steady_clock::now();
    auto body = [&](std::size_t t) {
      try {
        fn(*workers_[t]);
      } catch (const detail::hogwild_stopped&) {  // another worker failed first
      } catch (...) {
        failed[t] = std::current_exception();
        stop.store(true, std::memory_order_relaxed);
      }
    };
    try {
      for (std::size_t t = 0; t < n; ++t) {
        workers_[t]->counter_ = &counter;
        workers_[t]->stop_ = &stop;
        pool.emplace_back(body, t);
      }
    } catch (...) {  // a thread could not start: stop and join the started ones
      stop.store(true, std::memory_order_relaxed);
      for (auto& th : pool) th.join();
      s_.set_global_step(counter.load());
      throw;
    }
    for (auto& th : pool) th.join();
    hogwild_report r;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto& w : workers_) {
      r.steps.push_back(w->steps_);
      r.mean_loss.push_back(w->steps_ ? w->loss_sum_ / static_cast<double>(w->steps_)
                                      : std::numeric_limits<double>::quiet_NaN());
      r.total_steps += w->steps_;
    }
    s_.set_global_step(counter.load());  // the updates that happened stay, failure or not
    for (std::size_t t = 0; t < n; ++t) {
      if (!failed[t]) continue;
      const std::string where = "gradus: hogwild: worker thread " + std::to_string(t) + " of " + std::to_string(n) +
                                " failed after " + std::to_string(workers_[t]->steps_) + " steps (the others were " +
                                "stopped; " + std::to_string(r.total_steps) + " steps were applied in all): ";
      try {
        std::rethrow_exception(failed[t]);
      } catch (const std::exception& e) {
        std::throw_with_nested(error(where + e.what()));
      } catch (...) {
        std::throw_with_nested(error(where + "an exception not derived from std::exception"));
      }
    }
    return r;
  }

 private:
  template <class A>
  static constexpr bool trained() {
    return (std::is_same_v<A, Vs> || ...);
  }
  template <fixed_string Name, class T, index_t... E>
  void copy_in(session<Backend>& mine, const variable<Name, T, E...>& v, bool whole) {
    const T* from = s_.template data<T>(Name.view());  // throws, naming it, if it has no value
    if (whole) gradus::assign(mine, v, tensor_view<const T>{from, static_dims<shape<E...>>()});
  }

  session<Backend>& s_;
  std::vector<std::unique_ptr<worker>> workers_;
  bool primed_ = false;  ///< the workers hold a whole copy of every trained variable
};

/// hogwild(session, loss, sgd, threads, variables...): Hogwild! training of the named
/// variables (see hogwild_trainer); without variables, of every variable the loss reads.
template <class Backend, expression Loss, class... Vs>
  requires(sizeof...(Vs) > 0)
auto hogwild(session<Backend>& s, const Loss& loss, const sgd& opt, std::size_t threads, const Vs&... vs) {
  return hogwild_trainer<Backend, Loss, Vs...>(s, loss, opt, threads, vs...);
}
/// hogwild(session, loss, sgd, threads): Hogwild! training of every variable the loss reads
/// (variables_of_t).
template <class Backend, expression Loss>
auto hogwild(session<Backend>& s, const Loss& loss, const sgd& opt, std::size_t threads) {
  return [&]<class... Vs>(std::tuple<Vs...>*) {
    static_assert(sizeof...(Vs) > 0, "gradus: hogwild: the loss reads no variable");
    return hogwild_trainer<Backend, Loss, Vs...>(s, loss, opt, threads, Vs{}...);
  }(static_cast<variables_of_t<Loss>*>(nullptr));
}

}  // namespace gradus
