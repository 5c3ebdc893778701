#pragma once
// Synchronous data parallelism over any communicator policy (dist/communicator.hpp), as
// PyTorch's DistributedDataParallel and Horovod do it:
//
//   g::trainer<g::cpu_simd, g::ring_allreduce> t(g::cluster::from_env());
//   auto step = t.minimize(loss, g::sgd{.lr = 0.05, .momentum = 0.9});
//   for (auto [xb, yb] : data.shard(t.rank(), t.world_size()).batches(64))
//     step.run(x = xb, y = yb);
//
// Each rank runs the same graph on its own shard of the batch. On the first run rank 0's
// variables and optimizer state are broadcast, so the replicas start identical. In every
// run the gradients are packed into buckets (25 MiB by default, in reverse order of the
// variables: the last layers' gradients are final first) and each bucket is all-reduced
// (averaged) on a background thread as soon as its last gradient is final — while the
// backward pass computes the rest. Then the optimizer steps. Every rank applies the same
// averaged gradients to the same variables, so with a deterministic communicator (the ring
// gives every rank the same bits) the replicas stay bit-identical.
//
// The background thread is the only one that talks to the communicator (ZeroMQ sockets
// belong to one thread). An error there (a dead peer) is rethrown by run(), naming what
// the communicator named. stats() reports the time the training thread waited for the
// collectives (a straggler's peers wait longest) and the time spent inside them.
//
// Before the first broadcast the ranks compare a run fingerprint (dist/agree.hpp): the
// graph's tensors (names, dtypes, shapes), the optimizer and every hyper-parameter, the
// world size, and what the program adds with set_run_fingerprint() (batch size, steps per
// epoch, epochs, the data seed). Ranks that differ in any of them fail at once, every rank
// naming the field and both values, instead of training on with diverging weights.
// check_replicas() compares the replicas' bits (a checksum per tensor) and names the first
// tensor that differs.
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/parallel/agree.hpp"
#include "gradus/parallel/communicator.hpp"
#include "gradus/train/train_step.hpp"

namespace gradus::parallel {

struct data_parallel_options {
  std::size_t bucket_bytes = std::size_t{25} << 20;  // as PyTorch DDP's bucket_cap_mb = 25
  bool overlap = true;  // false: reduce every bucket after the backward pass, on the caller's thread's turn
  // Compare the replicas' contents (check_replicas()) after every this many steps; 0: only
  // when the program calls check_replicas() (the examples do at the end of training).
  std::int64_t check_replicas_every = 0;
};

// Cumulative over the runs so far.
struct comm_stats {
  double wait_seconds = 0;    // the training thread blocked on collectives after its backward pass
  double reduce_seconds = 0;  // inside the communicator's collectives (background thread)
  std::int64_t steps = 0;
  std::int64_t collectives = 0;
  std::int64_t bytes = 0;  // gradient bytes all-reduced by this rank
};

// One background thread running queued tasks in order. After a task throws, the rest of
// the queue is dropped (its collectives could only fail or hang) and wait() rethrows.
class comm_worker {
 public:
  comm_worker() : thread_([this] { loop(); }) {}
  comm_worker(const comm_worker&) = delete;
  comm_worker& operator=(const comm_worker&) = delete;
  ~comm_worker() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(std::function<void()> task) {
    {
      std::lock_guard lk(m_);
      if (failed_) return;
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // Blocks until every submitted task has run; rethrows the first failure (once).
  void wait() {
    std::unique_lock lk(m_);
    idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
    if (failed_) {
      auto e = std::exchange(failed_, nullptr);
      std::rethrow_exception(e);
    }
  }

 private:
  void loop() {
    std::unique_lock lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      auto task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lk.unlock();
      std::exception_ptr err;
      try {
        task();
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      busy_ = false;
      if (err && !failed_) {
        failed_ = err;
        queue_.clear();
      }
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  std::exception_ptr failed_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: starts after the state above exists
};

// A train_step (train/train_step.hpp) run data-parallel over a communicator.
template <communicator Comm, class Step>
class data_parallel_step {
  using backend = typename std::remove_cvref_t<decltype(std::declval<Step&>().owner())>::backend_type;

 public:
  using loss_type = typename Step::loss_type;

  template <class Session, class Loss, class Opt, class... Vs>
  data_parallel_step(Comm& comm, data_parallel_options opts, Session& s, const Loss& loss, const Opt& opt,
                     const Vs&... vs)
      : comm_(comm), opts_(opts), step_(s, loss, opt, vs...) {
    if (opts_.bucket_bytes == 0) throw error("gradus: data_parallel: bucket_bytes must be positive");
    if (opts_.check_replicas_every < 0)
      throw error("gradus: data_parallel: check_replicas_every must be >= 0, got " +
                  std::to_string(opts_.check_replicas_every));
    optimizer_fields_.push_back({"optimizer", std::string(Opt::name)});
    for (int k = 0; k < opt.slot_count(); ++k) slot_names_.emplace_back(opt.slot_name(k));
    if constexpr (requires { opt.settings([](std::string_view, const std::string&) {}); })
      opt.settings([&](std::string_view k, const std::string& v) {
        optimizer_fields_.push_back({"optimizer." + std::string(k), v});
      });
    // reduced densely, as Horovod's sparse_as_dense; a parameter server moves rows instead
    if (comm_.world_size() > 1 && !moves_rows()) step_.set_sparse_as_dense(true);
    plan_buckets();
  }

  // One synchronous training step on this rank's batch: the loss of that batch (before
  // the update). The first run broadcasts rank 0's variables and optimizer state first.
  template <class... Feeds>
  loss_type run(const Feeds&... feeds) {
    const auto bound = step_.owner().bind();  // copies on the session's stream (a GPU's)
    if constexpr (parameter_server_policy<Comm>)
      if (parallel::holds_variables(comm_)) return run_with_server(feeds...);
    if (comm_.world_size() == 1) {
      ++stats_.steps;
      return step_.run(feeds...);
    }
    if (!synced_) broadcast_variables();
    for (auto& b : buckets_) b.pending = b.members.size();
    next_ = 0;
    std::exception_ptr hook_error;
    const loss_type l = step_.compute_gradients_hooked(
        [&](std::size_t i, const gradient_buffer& g) {
          try {
            arrived(i, g);
          } catch (...) {
            if (!hook_error) hook_error = std::current_exception();
          }
        },
        feeds...);
    if (!opts_.overlap)
      for (std::size_t b = 0; b < buckets_.size(); ++b) worker_.submit([this, b] { reduce(b); });
    const auto t0 = std::chrono::steady_clock::now();
    worker_.wait();  // rethrows a collective's error (a dead peer, a mismatch)
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (hook_error) std::rethrow_exception(hook_error);
    if (next_ != buckets_.size())
      throw error("gradus: data_parallel: only " + std::to_string(next_) + " of " + std::to_string(buckets_.size()) +
                  " gradient buckets were filled by the backward pass");
    // the averaged gradients back where the optimizer reads them (queued on the stream: the
    // next step's copies into the buckets come after these on the same stream, and its
    // reductions after those)
    auto grads = step_.gradients();
    for (const auto& b : buckets_)
      for (const auto& m : b.members)
        queue_copy_to_device<backend>(grads[m.var].data, b.data.data() + m.offset, m.bytes);
    uploaded_.record();
    step_.apply_gradients();
    ++stats_.steps;
    if (opts_.check_replicas_every > 0 && stats_.steps % opts_.check_replicas_every == 0) check_replicas();
    return l;
  }

  // Rank 0's variables, optimizer state and global step to every rank (run() does it
  // before its first step; call it again after restoring a checkpoint on rank 0 only). The
  // first call compares the run fingerprint first.
  void broadcast_variables() {
    check_run_fingerprint();
    on_worker([this] { parallel::broadcast_variables(comm_, step_.owner()); });
    synced_ = true;
  }

  // A parameter server: the servers' variables and optimizer state into this worker's
  // session (between two barriers, so that no worker pushes meanwhile: one consistent
  // step), so that save_checkpoint writes what the servers hold. Every worker calls it at
  // the same step; elsewhere it does nothing.
  void pull_state() {
    if constexpr (parameter_server_policy<Comm>) {
      if (!parallel::holds_variables(comm_) || !on_server_) return;
      const auto bound = step_.owner().bind();
      on_worker([this] {
        const auto& names = Step::variable_names();
        comm_.barrier();
        for (std::size_t i = 0; i < Step::variable_count; ++i)
          with_span(i, [&](auto sp) {
            using T = typename decltype(sp)::element_type;
            if constexpr (requires { comm_.snapshot(names[i], sp, std::vector<std::span<T>>{}); }) {
              std::vector<std::span<T>> slots;
              for (auto& b : slot_host_[i]) slots.emplace_back(reinterpret_cast<T*>(b.data()), b.size() / sizeof(T));
              (void)comm_.snapshot(names[i], sp, std::move(slots));
            } else {
              comm_.pull(names[i], sp);
            }
          });
        comm_.barrier();
      });
      for (std::size_t i = 0; i < Step::variable_count; ++i) {
        backend::copy_to_device(storage_[i], host_[i].data(), host_[i].size());
        for (std::size_t k = 0; k < slot_names_.size(); ++k)
          backend::copy_to_device(slot_storage_[i][k], slot_host_[i][k].data(), slot_host_[i][k].size());
      }
    }
  }

  // A parameter server: every worker waits for the others (a barrier), then pulls the
  // variables, so that all replicas hold the servers' final values (in async and SSP modes
  // they differ until then). Call it on every worker after the last step.
  void pull_variables() {
    if constexpr (parameter_server_policy<Comm>) {
      if (!parallel::holds_variables(comm_) || !on_server_) return;
      const auto bound = step_.owner().bind();
      on_worker([this] { comm_.barrier(); });
      pull_all();
    }
  }

  // Fields every rank must agree on besides those the step knows (the graph's tensors, the
  // optimizer, the world size): {{"batch_size", "64"}, {"epochs", "3"}, {"data_seed", "1"}}.
  // Set before the first run.
  void set_run_fingerprint(std::vector<run_field> fields) {
    if (fingerprint_checked_)
      throw error("gradus: data_parallel: set_run_fingerprint after the first run (the ranks already compared it)");
    extra_fields_ = std::move(fields);
  }
  // What the ranks compare before their first collective.
  std::vector<run_field> run_fingerprint() const {
    std::vector<run_field> f{{"world_size", std::to_string(comm_.world_size())}};
    f.insert(f.end(), optimizer_fields_.begin(), optimizer_fields_.end());
    f.insert(f.end(), extra_fields_.begin(), extra_fields_.end());
    for (auto& t : session_fields(step_.owner())) f.push_back(std::move(t));
    return f;
  }
  // Compares the fingerprint now (once; broadcast_variables and run() call it).
  void check_run_fingerprint() {
    if (fingerprint_checked_) return;
    on_worker([this] { parallel::agree(comm_, "run fingerprint", run_fingerprint()); });
    fingerprint_checked_ = true;
  }
  // Every rank's variables and optimizer state must hold the same bits as rank 0's: throws
  // run_mismatch_error on every rank naming the first tensor that differs and the ranks.
  // A collective: every rank calls it at the same step.
  void check_replicas() {
    on_worker([this] { parallel::agree(comm_, "replica check", replica_fields(step_.owner())); });
  }

  // A parameter server keeps the variables: push each gradient as it is final, end the
  // step, pull every variable back (the server's optimizer has applied the updates).
  template <class... Feeds>
  loss_type run_with_server(const Feeds&... feeds) {
    auto& s = step_.owner();
    const auto& names = Step::variable_names();
    if (!on_server_) {  // offer this rank's first values (the server keeps rank 0's), then pull
      check_run_fingerprint();
      if constexpr (requires { comm_.set_optimizer(std::string(), std::map<std::string, std::string>()); }) {
        std::map<std::string, std::string> settings;
        for (const auto& f : optimizer_fields_)
          if (f.name.rfind("optimizer.", 0) == 0) settings[f.name.substr(10)] = f.value;
        comm_.set_optimizer(optimizer_fields_.front().value, std::move(settings));
      }
      locate_storage();
      const std::int64_t at = s.global_step();
      for (std::size_t i = 0; i < Step::variable_count; ++i) {
        backend::copy_to_host(host_[i].data(), storage_[i], host_[i].size());
        for (std::size_t k = 0; k < slot_names_.size(); ++k)
          backend::copy_to_host(slot_host_[i][k].data(), slot_storage_[i][k], slot_host_[i][k].size());
        worker_.submit([this, i, at, key = names[i]] {
          with_span(i, [&](auto sp) {
            using T = typename decltype(sp)::element_type;
            if constexpr (requires { comm_.initialize(key, as_const(sp), std::vector<std::span<const T>>{}, at); }) {
              // with the optimizer's state and the step: a resumed checkpoint goes on where it stopped
              std::vector<std::span<const T>> slots;
              for (auto& b : slot_host_[i]) slots.emplace_back(reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T));
              comm_.initialize(key, as_const(sp), std::move(slots), at);
            } else {
              comm_.initialize(key, as_const(sp));
            }
          });
          if constexpr (requires { comm_.set_rows(key, std::size_t{}); })
            if (Step::variable_row_lengths()[i] > 0 && moves_rows()) comm_.set_rows(key, static_cast<std::size_t>(Step::variable_row_lengths()[i]));
        });
      }
      pull_all();  // every variable whole, the first time; then a table's changed rows only
      on_server_ = synced_ = true;
    }
    if constexpr (requires { comm_.set_learning_rate(1.0); }) {
      const double lr = step_.learning_rate();
      worker_.submit([this, lr] { comm_.set_learning_rate(lr); });
    }
    std::exception_ptr hook_error;
    const loss_type l = step_.compute_gradients_hooked(
        [&](std::size_t i, const gradient_buffer& g) {
          try {
            if (g.sparse()) {
              push_rows(i, g);
              return;
            }
            queue_copy_to_host<backend>(grad_host_[i].data(), g.data, grad_host_[i].size());
            grad_ready_[i].record();
            worker_.submit([this, i, key = names[i]] {
              grad_ready_[i].wait();  // the copy out of the device (queued: the backward pass goes on)
              with_grad_span(i, [&](auto sp) { comm_.push(key, as_const(sp)); });
            });
          } catch (...) {
            if (!hook_error) hook_error = std::current_exception();
          }
        },
        feeds...);
    if (hook_error) {
      worker_.wait();
      std::rethrow_exception(hook_error);
    }
    worker_.submit([this] { comm_.step_done(); });
    pull_all();
    s.set_global_step(s.global_step() + 1);
    ++stats_.steps;
    return l;
  }

  data_parallel_step(const data_parallel_step&) = delete;
  data_parallel_step& operator=(const data_parallel_step&) = delete;
  // A communicator reads no buffer of a collective that has returned or thrown (the ring
  // closes its sending socket on failure and waits for ZeroMQ to let go), so the buckets
  // are freed with the step even after a failure, once the device has read them.
  ~data_parallel_step() { uploaded_.wait(); }

  const comm_stats& stats() const { return stats_; }
  // The last run's gradients, averaged over the world (what the optimizer applied).
  std::span<gradient_buffer> gradients() { return step_.gradients(); }
  std::size_t bucket_count() const { return buckets_.size(); }
  Step& local_step() { return step_; }
  Comm& communicator() { return comm_; }
  double learning_rate() const { return step_.learning_rate(); }

 private:
  struct member {
    std::size_t var;
    std::size_t offset;  // bytes into the bucket
    std::size_t bytes;
  };
  struct bucket {
    std::string_view dtype;
    std::vector<member> members;
    std::size_t bytes = 0;
    host_buffer<backend> data;  // host memory the communicator reduces in place (pinned on a GPU)
    backend_event<backend> ready;  // after the copies of its gradients out of the device
    std::size_t pending = 0;
  };

  // f() on the communicator's thread, waited for; its failure is rethrown here.
  template <class F>
  void on_worker(F&& f) {
    worker_.submit(std::forward<F>(f));
    worker_.wait();
  }

  template <class T>
  static std::span<const T> as_const(std::span<T> x) {
    return {x.data(), x.size()};
  }
  // f(span of the host copy of variable i / of its gradient), typed by the variable's dtype
  template <class F>
  void with_span(std::size_t i, F&& f) {
    typed_at(i, host_[i], f);
  }
  template <class F>
  void with_grad_span(std::size_t i, F&& f) {
    typed_at(i, grad_host_[i], f);
  }
  template <class F, class Buffer>
  void typed_at(std::size_t i, Buffer& b, F& f) {
    if (Step::variable_dtypes()[i] == std::string_view("float64"))
      f(std::span<double>(reinterpret_cast<double*>(b.data()), b.size() / 8));
    else
      f(std::span<float>(reinterpret_cast<float*>(b.data()), b.size() / 4));
  }
  void locate_storage() {
    auto entries = step_.owner().entries();
    const auto& names = Step::variable_names();
    for (std::size_t i = 0; i < Step::variable_count; ++i) {
      const std::size_t bytes = static_cast<std::size_t>(Step::variable_sizes()[i]) *
                                (Step::variable_dtypes()[i] == std::string_view("float64") ? 8 : 4);
      slot_storage_[i].assign(slot_names_.size(), nullptr);
      slot_host_[i].assign(slot_names_.size(), std::vector<std::byte>(bytes));
      for (const auto& e : entries) {
        if (e.name == names[i]) storage_[i] = e.data;
        for (std::size_t k = 0; k < slot_names_.size(); ++k)
          if (e.name == std::string(names[i]) + "/" + slot_names_[k]) slot_storage_[i][k] = e.data;
      }
      for (std::size_t k = 0; k < slot_names_.size(); ++k)
        if (!slot_storage_[i][k])
          throw error("gradus: data_parallel: the optimizer state '" + std::string(names[i]) + "/" + slot_names_[k] + "' is not in the session");
      host_[i].resize(bytes);
      grad_host_[i].resize(bytes);
    }
  }
  // Whether the communicator is a parameter server that moves sparse rows (push_rows,
  // pull_rows): an embedding's gradient then goes as its rows and indices only.
  bool moves_rows() {
    if constexpr (parameter_server_policy<Comm>) {
      if (!parallel::holds_variables(comm_)) return false;
      if constexpr (requires { comm_.has_rows(); }) return comm_.has_rows();
      else return requires(std::span<const std::int64_t> r, std::span<const float> v) { comm_.push_rows(std::string_view(), r, v); };
    }
    return false;
  }
  // A sparse-row gradient (rows, sorted and unique; their values) to the servers.
  void push_rows(std::size_t i, const gradient_buffer& g) {
    if constexpr (requires(std::span<const std::int64_t> r, std::span<const float> v) { comm_.push_rows(std::string_view(), r, v); }) {
      if (!moves_rows()) throw error("gradus: data_parallel: a sparse gradient ('" + std::string(g.name) + "') for a communicator that moves no rows");
      const std::size_t elem = Step::variable_dtypes()[i] == std::string_view("float64") ? 8 : 4;
      const auto n = static_cast<std::size_t>(g.rows), L = static_cast<std::size_t>(g.row_len);
      backend::copy_to_host(grad_host_[i].data(), g.data, n * L * elem);
      rows_host_[i].assign(g.indices, g.indices + n);
      worker_.submit([this, i, n, L, key = Step::variable_names()[i]] {
        with_grad_span(i, [&](auto sp) { comm_.push_rows(key, std::span<const std::int64_t>(rows_host_[i]), as_const(sp.subspan(0, n * L))); });
      });
    } else {
      throw error("gradus: data_parallel: a sparse gradient ('" + std::string(g.name) + "') for a communicator that moves no rows");
    }
  }
  void pull_all() {
    const auto& names = Step::variable_names();
    for (std::size_t i = 0; i < Step::variable_count; ++i)
      worker_.submit([this, i, key = names[i]] {
        with_span(i, [&](auto sp) {
          if constexpr (requires { comm_.pull_rows(key, sp); })
            if (on_server_ && Step::variable_row_lengths()[i] > 0 && moves_rows()) return comm_.pull_rows(key, sp);
          comm_.pull(key, sp);
        });
      });
    const auto t0 = std::chrono::steady_clock::now();
    worker_.wait();
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t i = 0; i < Step::variable_count; ++i)
      backend::copy_to_device(storage_[i], host_[i].data(), host_[i].size());
  }

  // Reverse variable order (DDP's heuristic: the backward pass finishes the last layers'
  // gradients first), one dtype per bucket, at most bucket_bytes unless one gradient alone
  // is larger.
  void plan_buckets() {
    const auto& dtypes = Step::variable_dtypes();
    const auto& sizes = Step::variable_sizes();
    bucket_of_.assign(Step::variable_count, 0);
    for (std::size_t k = Step::variable_count; k-- > 0;) {
      const std::size_t elem = dtypes[k] == std::string_view("float64") ? 8 : 4;
      if (dtypes[k] != std::string_view("float32") && dtypes[k] != std::string_view("float64"))
        throw error("gradus: data_parallel: variable '" + std::string(Step::variable_names()[k]) + "' has dtype " +
                    std::string(dtypes[k]) + "; only float32 and float64 gradients are reduced");
      const std::size_t bytes = static_cast<std::size_t>(sizes[k]) * elem;
      if (buckets_.empty() || buckets_.back().dtype != dtypes[k] ||
          (buckets_.back().bytes + bytes > opts_.bucket_bytes && !buckets_.back().members.empty())) {
        buckets_.emplace_back();
        buckets_.back().dtype = dtypes[k];
      }
      auto& b = buckets_.back();
      b.members.push_back({k, b.bytes, bytes});
      b.bytes += bytes;
      bucket_of_[k] = buckets_.size() - 1;
    }
    for (auto& b : buckets_) b.data.resize(b.bytes);
  }

  // Gradient i is final: into its bucket; full buckets go to the background thread in
  // bucket order (every rank issues the same collectives in the same order).
  void arrived(std::size_t i, const gradient_buffer& g) {
    auto& b = buckets_[bucket_of_[i]];
    for (const auto& m : b.members)
      if (m.var == i) {
        if (static_cast<std::size_t>(g.size) * (b.dtype == std::string_view("float64") ? 8 : 4) != m.bytes || g.sparse())
          throw error("gradus: data_parallel: gradient of '" + std::string(g.name) + "' is not the dense size planned");
        queue_copy_to_host<backend>(b.data.data() + m.offset, g.data, m.bytes);
        if (--b.pending == 0) b.ready.record();
      }
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      if (opts_.overlap) worker_.submit([this, k = next_] { reduce(k); });
      ++next_;
    }
  }

  // On the background thread.
  void reduce(std::size_t k) {
    auto& b = buckets_[k];
    b.ready.wait();  // its gradients' copies out of the device
    const auto t0 = std::chrono::steady_clock::now();
    if (b.dtype == std::string_view("float64"))
      comm_.allreduce_average(std::span<double>(reinterpret_cast<double*>(b.data.data()), b.data.size() / 8));
    else
      comm_.allreduce_average(std::span<float>(reinterpret_cast<float*>(b.data.data()), b.data.size() / 4));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lk(stats_m_);
    stats_.reduce_seconds += dt;
    ++stats_.collectives;
    stats_.bytes += static_cast<std::int64_t>(b.data.size());
  }

  Comm& comm_;
  data_parallel_options opts_;
  Step step_;
  std::vector<bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  // parameter-server mode: each variable's storage, its host copy and its gradient's
  std::array<void*, Step::variable_count> storage_{};
  std::array<std::vector<std::byte>, Step::variable_count> host_{};
  std::array<host_buffer<backend>, Step::variable_count> grad_host_{};       // pinned on a GPU: pushed from there
  std::array<backend_event<backend>, Step::variable_count> grad_ready_{};  // after each one's copy out of the device
  std::array<std::vector<std::int64_t>, Step::variable_count> rows_host_{};  // a sparse gradient's rows
  std::vector<run_field> optimizer_fields_, extra_fields_;
  bool fingerprint_checked_ = false;
  std::size_t next_ = 0;
  bool synced_ = false;
  bool on_server_ = false;
  std::vector<std::string> slot_names_;  // the optimizer's state tensors: "<variable>/<slot>" in the session
  std::array<std::vector<void*>, Step::variable_count> slot_storage_{};
  std::array<std::vector<std::vector<std::byte>>, Step::variable_count> slot_host_{};  // a parameter server holds the variables (run_with_server's first step)
  std::mutex stats_m_;
  comm_stats stats_;
  backend_event<backend> uploaded_;  // after the last step's averaged gradients went back to the device
  comm_worker worker_;  // last: its thread stops before the buckets it reads go away
};

// minimize(comm, session, loss, optimizer[, variables...]): a data-parallel training step.
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
template <communicator Comm, class Backend, class Opt, expression Loss>
auto minimize(Comm& comm, const data_parallel_options& opts, session<Backend>& s, const Loss& loss, const Opt& opt) {
  return [&]<class... Ws>(std::tuple<Ws...>*) {
    static_assert(sizeof...(Ws) > 0, "gradus: minimize: the loss reads no variable");
    using step_t = train_step<Backend, Opt, Loss, Ws...>;
    return data_parallel_step<Comm, step_t>(comm, opts, s, loss, opt, Ws{}...);
  }(static_cast<variables_of_t<Loss>*>(nullptr));
}

}  // namespace gradus::parallel

namespace gradus {

// trainer<Backend, Comm>: a session and a communicator (built from the constructor's
// arguments: a cluster spec, options, or nothing for parallel::local) that make
// data-parallel training steps.
template <class Backend, parallel::communicator Comm>
class trainer {
 public:
  template <class... A>
  explicit trainer(A&&... comm_args) : comm_(std::forward<A>(comm_args)...) {}
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  template <expression Loss, class Opt>
  auto minimize(const Loss& loss, const Opt& opt, const parallel::data_parallel_options& opts = {}) {
    return parallel::minimize(comm_, opts, s_, loss, opt);
  }
  ::gradus::session<Backend>& session() { return s_; }
  Comm& communicator() { return comm_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.world_size(); }

 private:
  Comm comm_;
  ::gradus::session<Backend> s_;
};

}  // namespace gradus
