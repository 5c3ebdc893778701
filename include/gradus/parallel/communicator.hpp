#pragma once
// The communicator policy: how replicas of one model agree. A trainer (an estimator, or a
// hand-written loop) is written once against this concept; `local` (a world of one) is the
// trivial policy, and ring all-reduce or a parameter server replace it without changing
// the trainer:
//
//   step.compute_gradients(feeds...);
//   g::parallel::reduce_gradients(comm, step);   // average every gradient over the world
//   step.apply_gradients();
//
// (parallel::data_parallel_step does this with buckets on a background thread.)
// allreduce_sum / allreduce_average / broadcast work in place on host-visible buffers of float or double
// (broadcast also of raw bytes: run fingerprints, serialized state); any length, including 0. A policy that cannot finish (a dead peer) throws an error naming
// the peer and the operation; it never blocks forever.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/exec/backend.hpp"

namespace gradus::parallel {

template <class C>
concept communicator = requires(C& c, std::span<float> f, std::span<double> d, std::span<std::byte> b) {
  { c.rank() } -> std::convertible_to<int>;
  { c.world_size() } -> std::convertible_to<int>;
  c.allreduce_sum(f);
  c.allreduce_sum(d);
  c.allreduce_average(f);
  c.allreduce_average(d);
  c.broadcast(f, 0);
  c.broadcast(d, 0);
  c.broadcast(b, 0);
  c.barrier();
};

// A communicator that holds the variables itself — a parameter server (the policy of the
// next issue: sharded servers, BSP / bounded-staleness / asynchronous modes). The
// data-parallel step (data_parallel.hpp) sees it and, instead of averaging the gradients
// and applying them locally, pushes each gradient under its variable's name as soon as it
// is final, ends its step, and pulls every variable back; the server's optimizer applies
// the updates. `initialize` offers a variable's first value (the server keeps the first it
// gets: rank 0's). When and what `pull` waits for is the mode: BSP waits for every
// worker's push of this step, bounded staleness for all but the last few steps, async for
// nothing. The collectives above stay available (barrier, broadcast of other state).
template <class C>
concept parameter_server_policy =
    communicator<C> && requires(C& c, std::string_view key, std::span<const float> gf, std::span<float> wf,
                                std::span<const double> gd, std::span<double> wd) {
      c.initialize(key, gf);
      c.initialize(key, gd);
      c.push(key, gf);
      c.push(key, gd);
      c.step_done();
      c.pull(key, wf);
      c.pull(key, wd);
    };

// Whether c holds the variables (a parameter server) at run time: any_communicator
// answers for the policy it wraps.
template <class C>
bool holds_variables(C& c) {
  if constexpr (requires { c.holds_variables(); }) return c.holds_variables();
  else return parameter_server_policy<C>;
}

// A world of one: every collective is the identity.
struct local {
  static constexpr const char* name = "local";
  int rank() const { return 0; }
  int world_size() const { return 1; }
  template <class T>
  void allreduce_sum(std::span<T>) {}
  template <class T>
  void allreduce_average(std::span<T>) {}
  template <class T>
  void broadcast(std::span<T>, int root) {
    if (root != 0) throw error("gradus: local communicator: broadcast from rank " + std::to_string(root) + " of a world of 1");
  }
  void barrier() {}
};
static_assert(communicator<local>);

// A communicator chosen at run time (a program's --comm option): any policy behind one
// virtual call per collective, so the trainer is compiled once for all of them.
//   auto comm = parallel::any_communicator::make<ring_allreduce>(options);
class any_communicator {
  struct iface {
    virtual ~iface() = default;
    virtual int rank() = 0;
    virtual int world_size() = 0;
    virtual const char* name() = 0;
    virtual void allreduce_sum(std::span<float>) = 0;
    virtual void allreduce_sum(std::span<double>) = 0;
    virtual void allreduce_average(std::span<float>) = 0;
    virtual void allreduce_average(std::span<double>) = 0;
    virtual void broadcast(std::span<float>, int) = 0;
    virtual void broadcast(std::span<double>, int) = 0;
    virtual void broadcast(std::span<std::byte>, int) = 0;
    virtual void barrier() = 0;
    // a parameter server's interface (holds_variables(): the others throw)
    virtual bool holds_variables() = 0;
    virtual void initialize(std::string_view, std::span<const float>) = 0;
    virtual void initialize(std::string_view, std::span<const double>) = 0;
    virtual void push(std::string_view, std::span<const float>) = 0;
    virtual void push(std::string_view, std::span<const double>) = 0;
    virtual void pull(std::string_view, std::span<float>) = 0;
    virtual void pull(std::string_view, std::span<double>) = 0;
    virtual void initialize(std::string_view, std::span<const float>, std::vector<std::span<const float>>, std::int64_t) = 0;
    virtual void initialize(std::string_view, std::span<const double>, std::vector<std::span<const double>>, std::int64_t) = 0;
    virtual std::int64_t snapshot(std::string_view, std::span<float>, std::vector<std::span<float>>) = 0;
    virtual std::int64_t snapshot(std::string_view, std::span<double>, std::vector<std::span<double>>) = 0;
    virtual void step_done() = 0;
    virtual void set_optimizer(std::string, std::map<std::string, std::string>) = 0;
    virtual void set_learning_rate(double) = 0;
    // sparse rows (a parameter server that moves rows: has_rows())
    virtual bool has_rows() = 0;
    virtual void set_rows(std::string_view, std::size_t) = 0;
    virtual void push_rows(std::string_view, std::span<const std::int64_t>, std::span<const float>) = 0;
    virtual void push_rows(std::string_view, std::span<const std::int64_t>, std::span<const double>) = 0;
    virtual void pull_rows(std::string_view, std::span<float>) = 0;
    virtual void pull_rows(std::string_view, std::span<double>) = 0;
  };
  template <class C>
  struct holder final : iface {
    C c;
    template <class... A>
    explicit holder(A&&... a) : c(std::forward<A>(a)...) {}
    int rank() override { return c.rank(); }
    int world_size() override { return c.world_size(); }
    const char* name() override { return C::name; }
    void allreduce_sum(std::span<float> x) override { c.allreduce_sum(x); }
    void allreduce_sum(std::span<double> x) override { c.allreduce_sum(x); }
    void allreduce_average(std::span<float> x) override { c.allreduce_average(x); }
    void allreduce_average(std::span<double> x) override { c.allreduce_average(x); }
    void broadcast(std::span<float> x, int root) override { c.broadcast(x, root); }
    void broadcast(std::span<double> x, int root) override { c.broadcast(x, root); }
    void broadcast(std::span<std::byte> x, int root) override { c.broadcast(x, root); }
    void barrier() override { c.barrier(); }
    bool holds_variables() override { return parameter_server_policy<C>; }
    template <class F>
    void on_server(const char* what, F&& f) {
      if constexpr (parameter_server_policy<C>) f(c);
      else throw error(std::string("gradus: ") + C::name + " is not a parameter server (" + what + ")");
    }
    void initialize(std::string_view k, std::span<const float> x) override { on_server("initialize", [&](auto& p) { p.initialize(k, x); }); }
    void initialize(std::string_view k, std::span<const double> x) override { on_server("initialize", [&](auto& p) { p.initialize(k, x); }); }
    void push(std::string_view k, std::span<const float> x) override { on_server("push", [&](auto& p) { p.push(k, x); }); }
    void push(std::string_view k, std::span<const double> x) override { on_server("push", [&](auto& p) { p.push(k, x); }); }
    void pull(std::string_view k, std::span<float> x) override { on_server("pull", [&](auto& p) { p.pull(k, x); }); }
    void pull(std::string_view k, std::span<double> x) override { on_server("pull", [&](auto& p) { p.pull(k, x); }); }
    void step_done() override { on_server("step_done", [](auto& p) { p.step_done(); }); }
    template <class T>
    void init_state(std::string_view k, std::span<const T> x, std::vector<std::span<const T>> sl, std::int64_t step) {
      on_server("initialize", [&](auto& p) {
        if constexpr (requires { p.initialize(k, x, std::move(sl), step); }) p.initialize(k, x, std::move(sl), step);
        else p.initialize(k, x);
      });
    }
    template <class T>
    std::int64_t snap(std::string_view k, std::span<T> x, std::vector<std::span<T>> sl) {
      std::int64_t r = -1;
      on_server("snapshot", [&](auto& p) {
        if constexpr (requires { p.snapshot(k, x, std::move(sl)); }) r = p.snapshot(k, x, std::move(sl));
        else p.pull(k, x);
      });
      return r;
    }
    void initialize(std::string_view k, std::span<const float> x, std::vector<std::span<const float>> sl, std::int64_t step) override {
      init_state(k, x, std::move(sl), step);
    }
    void initialize(std::string_view k, std::span<const double> x, std::vector<std::span<const double>> sl, std::int64_t step) override {
      init_state(k, x, std::move(sl), step);
    }
    std::int64_t snapshot(std::string_view k, std::span<float> x, std::vector<std::span<float>> sl) override { return snap(k, x, std::move(sl)); }
    std::int64_t snapshot(std::string_view k, std::span<double> x, std::vector<std::span<double>> sl) override { return snap(k, x, std::move(sl)); }
    void set_optimizer(std::string n, std::map<std::string, std::string> s) override {
      if constexpr (requires { c.set_optimizer(std::move(n), std::move(s)); }) c.set_optimizer(std::move(n), std::move(s));
    }
    void set_learning_rate(double lr) override {
      if constexpr (requires { c.set_learning_rate(lr); }) c.set_learning_rate(lr);
    }
    static constexpr bool rows_v = requires(C& x, std::span<const std::int64_t> r, std::span<const float> v, std::span<float> t) {
      x.set_rows(std::string_view(), std::size_t{});
      x.push_rows(std::string_view(), r, v);
      x.pull_rows(std::string_view(), t);
    };
    template <class F>
    void on_rows(const char* what, F&& f) {
      if constexpr (rows_v) f(c);
      else throw error(std::string("gradus: ") + C::name + " does not move sparse rows (" + what + ")");
    }
    bool has_rows() override { return rows_v; }
    void set_rows(std::string_view k, std::size_t n) override { on_rows("set_rows", [&](auto& p) { p.set_rows(k, n); }); }
    void push_rows(std::string_view k, std::span<const std::int64_t> r, std::span<const float> v) override {
      on_rows("push_rows", [&](auto& p) { p.push_rows(k, r, v); });
    }
    void push_rows(std::string_view k, std::span<const std::int64_t> r, std::span<const double> v) override {
      on_rows("push_rows", [&](auto& p) { p.push_rows(k, r, v); });
    }
    void pull_rows(std::string_view k, std::span<float> t) override { on_rows("pull_rows", [&](auto& p) { p.pull_rows(k, t); }); }
    void pull_rows(std::string_view k, std::span<double> t) override { on_rows("pull_rows", [&](auto& p) { p.pull_rows(k, t); }); }
  };
  std::unique_ptr<iface> p_;
  explicit any_communicator(std::unique_ptr<iface> p) : p_(std::move(p)) {}

 public:
  any_communicator() : p_(std::make_unique<holder<local>>()) {}
  template <class C, class... A>
  static any_communicator make(A&&... args) {
    return any_communicator(std::make_unique<holder<C>>(std::forward<A>(args)...));
  }
  int rank() const { return p_->rank(); }
  int world_size() const { return p_->world_size(); }
  const char* name() const { return p_->name(); }
  template <class T>
  void allreduce_sum(std::span<T> x) {
    p_->allreduce_sum(x);
  }
  template <class T>
  void allreduce_average(std::span<T> x) {
    p_->allreduce_average(x);
  }
  template <class T>
  void broadcast(std::span<T> x, int root) {
    p_->broadcast(x, root);
  }
  void barrier() { p_->barrier(); }
  bool holds_variables() const { return p_->holds_variables(); }
  template <class T>
  void initialize(std::string_view key, std::span<const T> x) {
    p_->initialize(key, x);
  }
  template <class T>
  void push(std::string_view key, std::span<const T> x) {
    p_->push(key, x);
  }
  template <class T>
  void pull(std::string_view key, std::span<T> x) {
    p_->pull(key, x);
  }
  template <class T>
  void initialize(std::string_view key, std::span<const T> x, std::vector<std::span<const T>> slots, std::int64_t step) {
    p_->initialize(key, x, std::move(slots), step);
  }
  template <class T>
  std::int64_t snapshot(std::string_view key, std::span<T> x, std::vector<std::span<T>> slots) {
    return p_->snapshot(key, x, std::move(slots));
  }
  void step_done() { p_->step_done(); }
  void set_optimizer(std::string name, std::map<std::string, std::string> settings) { p_->set_optimizer(std::move(name), std::move(settings)); }
  void set_learning_rate(double lr) { p_->set_learning_rate(lr); }
  bool has_rows() const { return p_->has_rows(); }
  void set_rows(std::string_view key, std::size_t row_elements) { p_->set_rows(key, row_elements); }
  template <class T>
  void push_rows(std::string_view key, std::span<const std::int64_t> rows, std::span<const T> values) {
    p_->push_rows(key, rows, values);
  }
  template <class T>
  void pull_rows(std::string_view key, std::span<T> table) {
    p_->pull_rows(key, table);
  }
};
static_assert(communicator<any_communicator>);
static_assert(parameter_server_policy<any_communicator>);

namespace detail {
// f(span) over the n values of type T at p, a session's tensor: p itself where the backend's
// memory is the host's; else a host copy (on the session's stream, bound by the caller),
// copied back to p after f when write_back. A communicator reads and writes what it is given
// on the host: a device pointer handed to it faults on a GPU.
template <class Backend, class T, class F>
void with_host_span(T* p, std::size_t n, bool write_back, F&& f) {
  if constexpr (backend_host_memory<Backend>) {
    f(std::span<T>(p, n));
  } else {
    std::vector<T> h(n);
    if (n) Backend::copy_to_host(h.data(), p, n * sizeof(T));
    f(std::span<T>(h));
    if (write_back && n) Backend::copy_to_device(p, h.data(), n * sizeof(T));
  }
}
}  // namespace detail

// Average every gradient of a train step's last compute_gradients() over the world.
template <communicator Comm, class Step>
void reduce_gradients(Comm& comm, Step& step) {
  if (comm.world_size() == 1) return;
  using backend = typename std::remove_cvref_t<decltype(step.owner())>::backend_type;
  const auto bound = step.owner().bind();
  for (auto& g : step.gradients()) {
    if (g.sparse())
      throw error("gradus: reduce_gradients: the gradient of '" + std::string(g.name) +
                  "' is sparse (embedding_lookup): call set_sparse_as_dense(true) on the step to all-reduce it");
    const auto n = static_cast<std::size_t>(g.size);
    if (g.dtype == std::string_view("float32"))
      detail::with_host_span<backend>(static_cast<float*>(g.data), n, true, [&](auto sp) { comm.allreduce_average(sp); });
    else if (g.dtype == std::string_view("float64"))
      detail::with_host_span<backend>(static_cast<double*>(g.data), n, true, [&](auto sp) { comm.allreduce_average(sp); });
    else
      throw error("gradus: reduce_gradients: gradient of '" + std::string(g.name) + "' has dtype " + std::string(g.dtype));
  }
}

// Every tensor of the session (variables and optimizer state) from rank 0 to all, in name
// order, and then its global step: the replicas start identical, and a job that only rank 0
// could restore a checkpoint for resumes from rank 0's step on every rank.
template <communicator Comm, class Session>
void broadcast_variables(Comm& comm, Session& s) {
  if (comm.world_size() == 1) return;
  using backend = typename Session::backend_type;
  const auto bound = s.bind();
  const bool receives = comm.rank() != 0;
  auto entries = s.entries();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& e : entries) {
    const auto n = static_cast<std::size_t>(e.shape.numel());
    if (e.dtype == std::string_view("float32"))
      detail::with_host_span<backend>(static_cast<float*>(e.data), n, receives, [&](auto sp) { comm.broadcast(sp, 0); });
    else if (e.dtype == std::string_view("float64"))
      detail::with_host_span<backend>(static_cast<double*>(e.data), n, receives, [&](auto sp) { comm.broadcast(sp, 0); });
    else throw error("gradus: broadcast_variables: '" + std::string(e.name) + "' has dtype " + std::string(e.dtype));
  }
  double step = static_cast<double>(s.global_step());  // exact below 2^53
  comm.broadcast(std::span<double>(&step, 1), 0);
  s.set_global_step(static_cast<std::int64_t>(step));
}

}  // namespace gradus::parallel

namespace gradus {
// gradus::dist: the old name of gradus::parallel (include/gradus/dist/ until 0.1), kept for
// one release.
namespace dist = parallel;
}  // namespace gradus
