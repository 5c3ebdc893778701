#pragma once
// ps_worker: the second way the data-parallel step (data_parallel.hpp) finishes a gradient —
// through a key-value store that holds the variables (key_value_store.hpp: a parameter
// server). (The first: averaged through the collectives, gradient_buckets.hpp.)
//
//   start()       the first step: the optimizer's name and settings and the precision
//                 policy's comm type (what pushes travel as) to the store, this
//                 rank's variables, optimizer state and global step offered (the store
//                 keeps the first it gets: rank 0's), every variable pulled
//   arrived(i, g) gradient i is final: copied out of the device and pushed under its
//                 variable's name on the communicator's thread (an embedding's sparse
//                 gradient as its rows, where the store moves rows)
//   end_step()    the step is over (step_done), every variable pulled back — the store's
//                 optimizer has applied the updates — and the global step advanced
//   rejoin()      a lost worker's restart (restarted()): waits for the others' next join
//                 point (pull_state's second barrier), then start(..., whole_state) at
//                 their step
//
// Every call to the store runs on the step's communicator thread (comm_worker.hpp), in
// order. The store's optional parts (state, snapshots, the optimizer, sparse rows) are used
// where it has them.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/precision.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/parallel/agree.hpp"
#include "gradus/parallel/comm_worker.hpp"
#include "gradus/parallel/key_value_store.hpp"
#include "gradus/train/train_step.hpp"

namespace gradus::parallel {

/// The data-parallel step's second way of finishing a gradient (the top of this file):
/// through a key-value store that holds the variables. Store is the store's type (a
/// parameter server, any_key_value_store), Comm the communicator of the workers' barriers,
/// Step the train_step. Every call to the store runs on the step's communicator thread, in
/// order; a failure there is rethrown by the next call that waits for it. data_parallel_step
/// drives it: a program calls the step's pull_state() and pull_variables().
template <class Store, class Comm, class Step>
class ps_worker {
  using backend = typename std::remove_cvref_t<decltype(std::declval<Step&>().owner())>::backend_type;
  static constexpr std::size_t n = Step::variable_count;

 public:
  /// store: nullptr when the communicator holds no variables at run time (then only
  /// active() and moves_rows() are asked). wait_seconds: where pulls add their wait.
  ps_worker(Store* store, Comm& comm, Step& step, comm_worker& worker, double& wait_seconds,
            std::vector<std::string> slot_names)
      : store_(store), comm_(comm), step_(step), worker_(worker), wait_seconds_(wait_seconds),
        slot_names_(std::move(slot_names)) {}
  ps_worker(const ps_worker&) = delete;
  ps_worker& operator=(const ps_worker&) = delete;

  /// Whether there is a store (false: the step averages instead).
  bool active() const { return store_ != nullptr; }
  /// Whether start() has run: the variables are on the store.
  bool started() const { return on_server_; }

  /// optimizer_fields: {"optimizer", name} then {"optimizer.<setting>", value}...
  /// whole_state: take the servers' optimizer state with the variables (a restart that rejoins:
  /// its session then holds what the others' last pull_state gave them).
  void start(const std::vector<run_field>& optimizer_fields, bool whole_state = false) {
    auto& s = step_.owner();
    const auto& names = Step::variable_names();
    if constexpr (requires { store_->set_optimizer(std::string(), std::map<std::string, std::string>()); }) {
      std::map<std::string, std::string> settings;
      for (const auto& f : optimizer_fields)
        if (f.name.rfind("optimizer.", 0) == 0) settings[f.name.substr(10)] = f.value;
      store_->set_optimizer(optimizer_fields.front().value, std::move(settings));
    }
    // the precision policy's comm type for the pushes, where the store carries it
    constexpr element_type wire = precision_of_backend_t<backend>::comm_type;
    bool carried = wire == element_type::f32;
    if constexpr (requires { store_->set_push_type(wire); }) carried = store_->set_push_type(wire);
    if (!carried && comm_.rank() == 0 && !warned_push_type_) {
      warned_push_type_ = true;
      std::fprintf(stderr, "gradus: data_parallel: this key-value store's pushes carry float32, not the precision policy's %s\n",
                   std::string(name_of(wire)).c_str());
    }
    locate_storage();
    const std::int64_t at = s.global_step();
    for (std::size_t i = 0; i < n; ++i) {
      backend::copy_to_host(host_[i].data(), storage_[i], host_[i].size());
      for (std::size_t k = 0; k < slot_names_.size(); ++k)
        backend::copy_to_host(slot_host_[i][k].data(), slot_storage_[i][k], slot_host_[i][k].size());
      worker_.submit([this, i, at, key = names[i]] {
        with_span(i, [&](auto sp) {
          using T = typename decltype(sp)::element_type;
          if constexpr (requires { store_->initialize(key, as_const(sp), std::vector<std::span<const T>>{}, at); }) {
            // with the optimizer's state and the step: a resumed checkpoint goes on where it stopped
            std::vector<std::span<const T>> slots;
            for (auto& b : slot_host_[i]) slots.emplace_back(reinterpret_cast<const T*>(b.data()), b.size() / sizeof(T));
            store_->initialize(key, as_const(sp), std::move(slots), at);
          } else {
            store_->initialize(key, as_const(sp));
          }
        });
        if constexpr (requires { store_->set_rows(key, std::size_t{}); })
          if (Step::variable_row_lengths()[i] > 0 && moves_rows()) store_->set_rows(key, static_cast<std::size_t>(Step::variable_row_lengths()[i]));
      });
    }
    if (whole_state) snapshot_all();
    else pull_all();  // every variable whole, the first time; then a table's changed rows only
    on_server_ = true;
  }

  /// Whether this process takes the place of a worker the job lost (rejoin_store: a parameter
  /// server in async or ssp); rejoin() then waits for the workers' next join point and
  /// returns the step to go on from, or nothing when the job ended first.
  bool restarted() {
    if constexpr (requires { store_->restarted(); }) return active() && store_->restarted();
    else return false;
  }
  /// For a restart (restarted()): waits for the workers' next join point, then returns the
  /// step to go on from; nothing when the job ended first, or where the store takes no
  /// restarted worker back.
  std::optional<std::int64_t> rejoin() {
    std::optional<std::int64_t> at;
    if constexpr (requires { store_->rejoin_job(); }) on_worker([&] { at = store_->rejoin_job(); });
    return at;
  }

  /// Before the backward pass: this step's learning rate to a store that applies it.
  void begin_step() {
    if constexpr (requires { store_->set_learning_rate(1.0); }) {
      const double lr = step_.learning_rate();
      worker_.submit([this, lr] { store_->set_learning_rate(lr); });
    }
  }

  /// Gradient i is final (called from the backward pass): pushed on the communicator's thread.
  void arrived(std::size_t i, const gradient_buffer& g) {
    if (g.sparse()) {
      push_rows(i, g);
      return;
    }
    queue_copy_to_host<backend>(grad_host_[i].data(), g.data, grad_host_[i].size());
    grad_ready_[i].record();
    worker_.submit([this, i, key = Step::variable_names()[i]] {
      grad_ready_[i].wait();  // the copy out of the device (queued: the backward pass goes on)
      with_grad_span(i, [&](auto sp) { store_->push(key, as_const(sp)); });
    });
  }

  /// After the backward pass: this worker's step done on the store, every variable pulled
  /// back into the session (the store's optimizer has applied the update; the pull waits as
  /// the store's mode says), and the session's global step advanced by one. Rethrows a failed
  /// push or pull.
  void end_step() {
    worker_.submit([this] { store_->step_done(); });
    pull_all();
    auto& s = step_.owner();
    s.set_global_step(s.global_step() + 1);
  }

  /// The servers' variables and optimizer state into this worker's session, between two
  /// barriers (data_parallel_step::pull_state); the second is a join point where the store
  /// has them (every worker at one step, no collective in flight: a lost worker's restart
  /// comes back there). Returns the ranks that came back.
  std::vector<int> pull_state() {
    if (!active() || !on_server_) return {};
    const auto bound = step_.owner().bind();
    std::vector<int> back;
    on_worker([&] {
      comm_.barrier();
      snapshot_on_worker();
      if constexpr (requires { store_->join_point(); }) back = store_->join_point();
      else comm_.barrier();
    });
    to_device_with_state();
    return back;
  }

  /// Every worker waits for the others (a barrier), then pulls the variables
  /// (data_parallel_step::pull_variables).
  void pull_variables() {
    if (!active() || !on_server_) return;
    const auto bound = step_.owner().bind();
    on_worker([this] { comm_.barrier(); });
    pull_all();
  }

  /// Whether the store moves sparse rows (push_rows, pull_rows): an embedding's gradient
  /// then goes as its rows and indices only.
  bool moves_rows() {
    if (!active()) return false;
    if constexpr (requires { store_->has_rows(); }) return store_->has_rows();
    else return row_store<Store>;
  }

 private:
  template <class F>
  void on_worker(F&& f) {
    worker_.submit(std::forward<F>(f));
    worker_.wait();
  }
  template <class T>
  static std::span<const T> as_const(std::span<T> x) {
    return {x.data(), x.size()};
  }
  /// f(span of the host copy of variable i / of its gradient), typed by the variable's dtype
  template <class F>
  void with_span(std::size_t i, F&& f) {
    typed_at(i, host_[i], f);
  }
  template <class F>
  void with_grad_span(std::size_t i, F&& f) {
    typed_at(i, grad_host_[i], f);
  }
  template <class F, class Buffer>
  static void typed_at(std::size_t i, Buffer& b, F& f) {
    if (Step::variable_dtypes()[i] == element_type::f64)
      f(std::span<double>(reinterpret_cast<double*>(b.data()), b.size() / 8));
    else
      f(std::span<float>(reinterpret_cast<float*>(b.data()), b.size() / 4));
  }
  void locate_storage() {
    auto entries = step_.owner().entries();
    const auto& names = Step::variable_names();
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t bytes = static_cast<std::size_t>(Step::variable_sizes()[i]) * size_of(Step::variable_dtypes()[i]);
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
  /// A sparse-row gradient (rows, sorted and unique; their values) to the servers.
  void push_rows(std::size_t i, const gradient_buffer& g) {
    if constexpr (row_store<Store>) {
      if (!moves_rows()) throw error("gradus: data_parallel: a sparse gradient ('" + std::string(g.name) + "') for a communicator that moves no rows");
      const std::size_t elem = size_of(Step::variable_dtypes()[i]);
      const auto rows = static_cast<std::size_t>(g.rows), L = static_cast<std::size_t>(g.row_len);
      backend::copy_to_host(grad_host_[i].data(), g.data, rows * L * elem);
      rows_host_[i].assign(g.indices, g.indices + rows);
      worker_.submit([this, i, rows, L, key = Step::variable_names()[i]] {
        with_grad_span(i, [&](auto sp) {
          store_->push_rows(key, std::span<const std::int64_t>(rows_host_[i]), as_const(sp.subspan(0, rows * L)));
        });
      });
    } else {
      throw error("gradus: data_parallel: a sparse gradient ('" + std::string(g.name) + "') for a communicator that moves no rows");
    }
  }
  /// Every variable and its optimizer state from the store into the host copies (on the
  /// communicator's thread).
  void snapshot_on_worker() {
    const auto& names = Step::variable_names();
    for (std::size_t i = 0; i < n; ++i)
      with_span(i, [&](auto sp) {
        using T = typename decltype(sp)::element_type;
        if constexpr (requires { store_->snapshot(names[i], sp, std::vector<std::span<T>>{}); }) {
          std::vector<std::span<T>> slots;
          for (auto& b : slot_host_[i]) slots.emplace_back(reinterpret_cast<T*>(b.data()), b.size() / sizeof(T));
          (void)store_->snapshot(names[i], sp, std::move(slots));
        } else {
          store_->pull(names[i], sp);
        }
      });
  }
  void to_device_with_state() {
    for (std::size_t i = 0; i < n; ++i) {
      backend::copy_to_device(storage_[i], host_[i].data(), host_[i].size());
      for (std::size_t k = 0; k < slot_names_.size(); ++k)
        backend::copy_to_device(slot_storage_[i][k], slot_host_[i][k].data(), slot_host_[i][k].size());
    }
  }
  void snapshot_all() {
    on_worker([this] { snapshot_on_worker(); });
    to_device_with_state();
  }
  void pull_all() {
    const auto& names = Step::variable_names();
    for (std::size_t i = 0; i < n; ++i)
      worker_.submit([this, i, key = names[i]] {
        with_span(i, [&](auto sp) {
          if constexpr (requires { store_->pull_rows(key, sp); })
            if (on_server_ && Step::variable_row_lengths()[i] > 0 && moves_rows()) return store_->pull_rows(key, sp);
          store_->pull(key, sp);
        });
      });
    worker_.wait(wait_seconds_);
    for (std::size_t i = 0; i < n; ++i) backend::copy_to_device(storage_[i], host_[i].data(), host_[i].size());
  }

  Store* store_;
  Comm& comm_;  ///< the workers' barriers (pull_state, pull_variables)
  Step& step_;
  comm_worker& worker_;
  double& wait_seconds_;
  bool on_server_ = false;
  std::vector<std::string> slot_names_;  ///< the optimizer's state tensors: "<variable>/<slot>" in the session
  bool warned_push_type_ = false;        ///< start() said that the store's pushes stay float32
  /// each variable's storage, its host copy and its gradient's
  std::array<void*, n> storage_{};
  std::array<std::vector<std::byte>, n> host_{};
  std::array<host_buffer<backend>, n> grad_host_{};       ///< pinned on a GPU: pushed from there
  std::array<backend_event<backend>, n> grad_ready_{};  ///< after each one's copy out of the device
  std::array<std::vector<std::int64_t>, n> rows_host_{};  ///< a sparse gradient's rows
  std::array<std::vector<void*>, n> slot_storage_{};
  std::array<std::vector<std::vector<std::byte>>, n> slot_host_{};  ///< the optimizer's state, offered and snapshotted
};

/// The data-parallel step's stand-in where the communicator can hold no variables: never
/// active, so the step's store branches fold away at compile time.
struct no_ps_worker {
  /// false: no store.
  static constexpr bool active() { return false; }
  /// false: never started.
  static constexpr bool started() { return false; }
  /// false: sparse gradients are reduced densely.
  static constexpr bool moves_rows() { return false; }
  /// Nothing (never called: not active()).
  template <class Fields>
  void start(const Fields&, bool = false) {}
  /// Nothing (never called: not active()).
  void begin_step() {}
  /// Nothing (never called: not active()).
  template <class Gradient>
  void arrived(std::size_t, const Gradient&) {}
  /// Nothing (never called: not active()).
  void end_step() {}
  /// No state to pull: no rank came back.
  static std::vector<int> pull_state() { return {}; }
  /// Nothing: every rank already holds the same variables.
  void pull_variables() {}
  /// false: no store takes restarts back.
  static constexpr bool restarted() { return false; }
  /// Nothing to rejoin.
  static std::optional<std::int64_t> rejoin() { return std::nullopt; }
};

}  // namespace gradus::parallel
