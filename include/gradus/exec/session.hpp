#pragma once
// session<Backend>: owns variable storage (keyed by name) and the compiled graphs of the
// output sets it has run. run(outputs..., feeds...) plans an output set on its first run
// and reuses the plan (and every buffer) afterwards.
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include "gradus/exec/graph.hpp"
#include "gradus/graph/ops/precision_scope.hpp"

namespace gradus {

/// Whether X is a feed binding (a type with a `feed_tag` member: a placeholder's `feed`, a
/// pipeline's `stage_input`): the arguments of a session's run that bind data, not expressions.
template <class X>
inline constexpr bool is_feed_v = false;
/// A named concept, not `if constexpr (requires {...})`: inside a generic lambda nvcc's front
/// end compiles such a branch even where the requirement fails.
template <class B>
concept has_before_run = requires { B::before_run(); };
template <class X>
  requires requires { typename X::feed_tag; }
inline constexpr bool is_feed_v<X> = true;  ///< by the tag: see is_variable_v

namespace detail {
/// A session's backend context (exec/backend.hpp's backend_context), or nothing.
template <class B>
struct context_of {
  struct none {};
  using type = none;
};
template <backend_context B>
struct context_of<B> {
  using type = typename B::context;
};
struct session_access;  ///< the free functions' way to session's implementation (below)
struct no_binding {  // a guard that guards nothing (user-provided destructor: no unused-variable warning)
  ~no_binding() {}
};
}  // namespace detail

/// Owns the variables (and optimizer state) of a model on Backend, by name, and the compiled
/// graph of every output set it has run: `s.run(outputs..., feeds...)` plans an output set
/// on its first run and reuses the plan and its buffers afterwards. Its operations are the
/// free functions taking it first: gradus::assign, declare and value (below), initialize,
/// minimize, the checkpoint and weights functions. Not copyable, and not thread-safe (its
/// graph cache and buffers): one thread at a time, or a session per thread.
///
/// Precision is the policy its compute-heavy ops run under (core/precision.hpp):
/// full_precision (the default, every op in the model's own type) or a mixed one such as
/// mixed_bf16; a session<B, P> is a session<with_precision<B, P>>, so every function taking a
/// session<Backend>& takes it, with Backend = with_precision<B, P>.
template <class Backend, class Precision = full_precision>
class session : private variable_source {
  static_assert(std::is_same_v<Precision, full_precision>, "gradus: session<B, P>: see the specialization below");

 public:
  using backend_type = Backend;  ///< the compute backend, e.g. cpu_simd or cuda
  session() = default;
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  virtual ~session() {  // virtual: session<B, P> derives from it (below)
    const auto bound = bind();
    graphs_.clear();
    for (auto& [name, v] : variables_) Backend::deallocate(v.data);
  }

  /// Makes this session's backend context (a GPU backend's stream) current on the calling
  /// thread until the returned guard goes away: the backend calls made meanwhile are queued
  /// with the session's own work. Every session operation binds itself; code that calls the
  /// backend on the session's buffers from outside (a training step, data_parallel,
  /// checkpoints) binds too. Nothing for a backend without a context.
  [[nodiscard]] auto bind() const {
    if constexpr (backend_context<Backend>) return Backend::bind(context_);
    else return detail::no_binding{};
  }

  /// run(outputs..., feeds...): evaluates the outputs; returns a tensor_view of each
  /// (one view, or a tuple of views), valid until the next run of the same outputs.
  template <class... Args>
  auto run(const Args&... args) {
    static_assert(precision_of_backend_t<Backend>::scales_loss || !(has_f16_scope<Args>() || ...),
                  "gradus: session::run: in_precision<g::f16>(e) needs a session whose policy scales the loss (small "
                  "gradients underflow fp16's 2^-24): g::session<B, g::mixed_fp16>");
    return run_hooked(no_output_hook{}, args...);
  }

  /// run_hooked(on_ready, outputs..., feeds...): run, calling on_ready(i, data) as soon as
  /// output i is final, while the rest of the graph still runs (its buffer: device memory on a
  /// GPU backend, as run_hooked_on_device returns it). The hook must not run this session.
  template <class Hook, class... Args>
  auto run_hooked(Hook&& on_ready, const Args&... args) {
    return run_impl<true>(on_ready, args...);
  }
  /// run_hooked, with results left where the backend computed them: views of the session's
  /// buffers (device memory on a GPU backend, to be read with Backend::copy_to_host), valid
  /// until the next run of the same outputs. What a training step uses for its gradients.
  template <class Hook, class... Args>
  auto run_hooked_on_device(Hook&& on_ready, const Args&... args) {
    return run_impl<false>(on_ready, args...);
  }

 private:
  template <bool ToHost, class Hook, class... Args>
  auto run_impl(Hook& on_ready, const Args&... args) {
    constexpr std::size_t n_out = count_outputs<Args...>();
    static_assert(n_out > 0, "gradus: session::run needs at least one output expression");
    static_assert(((is_feed_v<Args> || expression<Args>) && ...),
                  "gradus: session::run takes expressions, then feeds (placeholder = tensor)");
    auto all = std::forward_as_tuple(args...);
    return [&]<std::size_t... O, std::size_t... F>(std::index_sequence<O...>, std::index_sequence<F...>) {
      static_assert((is_feed_v<std::remove_cvref_t<std::tuple_element_t<n_out + F, decltype(all)>>> && ...),
                    "gradus: session::run: every feed must come after the outputs");
      using outs = std::tuple<std::remove_cvref_t<std::tuple_element_t<O, decltype(all)>>...>;
      const auto bound = bind();
      auto& g = graph_for<outs>(std::get<O>(all)...);
      last_ = &g;
      if constexpr (has_before_run<Backend>) Backend::before_run();  // e.g. size the thread team
      return g.template run_hooked<ToHost>(static_cast<const variable_source&>(*this), on_ready,
                                           std::get<n_out + F>(all)...);
    }(std::make_index_sequence<n_out>{}, std::make_index_sequence<sizeof...(Args) - n_out>{});
  }

 public:
  /// Deprecated alias of gradus::assign(s, v, x), the spelling of 0.1: the free functions
  /// gradus::assign, declare and value (below) are what every session operation now uses
  /// (initialize, minimize, checkpoints, weights). Kept for one release; removed in 0.2.
  template <fixed_string Name, class T, index_t... E, tensor_like X>
  [[deprecated("gradus 0.2 removes session::assign: write gradus::assign(s, v, x)")]]
  void assign(const variable<Name, T, E...>& v, const X& x) { assign_impl(v, x); }
  /// Deprecated alias of gradus::declare(s, v), removed in 0.2.
  template <fixed_string Name, class T, index_t... E>
  [[deprecated("gradus 0.2 removes session::declare: write gradus::declare(s, v)")]]
  void declare(const variable<Name, T, E...>& v) { declare_impl(v); }
  /// Deprecated alias of gradus::value(s, v), removed in 0.2.
  template <fixed_string Name, class T, index_t... E>
  [[deprecated("gradus 0.2 removes session::value: write gradus::value(s, v)")]]
  tensor_view<const T> value(const variable<Name, T, E...>& v) const { return value_impl(v); }

  /// The session as a graph's variable source: what a graph run outside run() reads the
  /// variables through (a pipeline stage's graphs, parallel/pipeline/).
  const variable_source& variables() const { return *this; }

  /// What the last run executed (steps by kind, and the kernel trace).
  const graph_stats& stats() const {
    if (!last_) throw error("gradus: session::stats: nothing has run yet");
    return last_->stats();
  }

  /// The training step counter: optimizers read it (Adam's bias correction, learning-rate
  /// schedules) and advance it; checkpoints save and restore it.
  std::int64_t global_step() const override { return global_step_; }
  /// Sets the step counter: training steps advance it by one, restore_checkpoint sets the
  /// saved one.
  void set_global_step(std::int64_t s) { global_step_ = s; }

  /// check_numerics (tf.debugging.check_numerics for every node): every run scans its feeds,
  /// variables and each step's result for NaN and infinity, and the first one found throws
  /// a numerics_error naming the node, its inputs, the outputs it reaches and the global
  /// step; a training step also scans the variables it updated. Off by default: it costs a
  /// pass over every buffer.
  void set_check_numerics(bool on) { check_numerics_ = on; }
  bool check_numerics() const override { return check_numerics_; }  ///< whether set_check_numerics(true) is in force

  /// Storage by name, for optimizers (their per-variable state) and checkpoints. A state
  /// tensor is created zero-filled and initialised; asking again with another dtype or
  /// shape is an error naming both.
  template <class T>
  T* state(std::string_view name, const dims& d) {
    const auto bound = bind();
    auto& st = storage<T>(name, d);
    if (!st.initialized) {
      std::vector<T> zeros(static_cast<std::size_t>(d.numel()), T(0));
      Backend::copy_to_device(st.data, zeros.data(), zeros.size() * sizeof(T));
      st.initialized = true;
    }
    return static_cast<T*>(st.data);
  }
  /// The device storage of an initialised tensor, by name and dtype.
  template <class T>
  T* data(std::string_view name) {
    auto it = variables_.find(name);
    if (it == variables_.end() || !it->second.initialized)
      throw feed_error("gradus: variable '" + std::string(name) + "' has no value in this session; assign, " +
                       "initialise or restore it first");
    if (it->second.dtype != element_type_of<T>)
      throw feed_error("gradus: variable '" + std::string(name) + "' holds " + std::string(name_of(it->second.dtype)) +
                       ", not " + std::string(dtype_name<T>()));
    return static_cast<T*>(it->second.data);
  }

  /// Every tensor the session holds (variables and optimizer state), by name.
  struct entry {
    std::string_view name;   ///< "w", or an optimizer's "w/adam_m"; valid while the session holds it
    element_type dtype;      ///< the elements' type (name_of: "float32", ...)
    dims shape;              ///< the tensor's dims
    void* data;  ///< device memory
    bool initialized;        ///< false for a tensor declared but not yet assigned or restored
  };
  /// Every tensor the session holds, sorted by name (an entry per variable and state tensor).
  std::vector<entry> entries() const {
    std::vector<entry> r;
    for (const auto& [name, v] : variables_) r.push_back({name, v.dtype, v.d, v.data, v.initialized});
    return r;
  }
  /// Marks a tensor as holding a value (after a restore wrote it through entries()).
  void mark_initialized(std::string_view name) {
    auto it = variables_.find(name);
    if (it == variables_.end()) throw feed_error("gradus: session holds no tensor named '" + std::string(name) + "'");
    it->second.initialized = true;
  }

  /// How many compiled graphs the session caches (one per distinct output set it has run).
  std::size_t graph_count() const {
    std::size_t n = 0;
    for (const auto& [t, v] : graphs_) n += v.size();
    return n;
  }

 private:
  friend struct detail::session_access;
  /// assign(v, tensor): set a variable's value (allocated on first assignment).
  template <fixed_string Name, class T, index_t... E, tensor_like X>
  void assign_impl(const variable<Name, T, E...>&, const X& x) {
    static_assert(std::is_same_v<tensor_elem_t<X>, T>, "gradus: assign: the tensor's dtype differs from the variable's");
    const dims want = static_dims<shape<E...>>();
    const dims got = dims_of(x, "assign to variable", Name.view());
    if (!(want == got))
      throw feed_error("gradus: assign to variable '" + std::string(Name.view()) + "': expected shape " +
                       to_string(want) + ", got " + to_string(got));
    const auto bound = bind();
    auto& st = storage<T>(Name.view(), want);
    Backend::copy_to_device(st.data, x.data(), static_cast<std::size_t>(want.numel()) * sizeof(T));
    st.initialized = true;
  }

  /// declare(v): make v known to the session (its name, dtype and shape) without giving it
  /// a value: checkpoints list it, restore() fills it, and a run that reads it before it is
  /// assigned, initialised or restored is an error naming it.
  template <fixed_string Name, class T, index_t... E>
  void declare_impl(const variable<Name, T, E...>&) {
    storage<T>(Name.view(), static_dims<shape<E...>>());
  }

  /// value(v): a host view of a variable's current value: the storage itself where the
  /// backend's memory is the host's, else a copy made now (valid until the next value() of v).
  template <fixed_string Name, class T, index_t... E>
  tensor_view<const T> value_impl(const variable<Name, T, E...>&) const {
    auto it = variables_.find(Name.view());
    if (it == variables_.end())
      throw feed_error("gradus: variable '" + std::string(Name.view()) + "' has no value in this session");
    if constexpr (backend_host_memory<Backend>) {
      return {static_cast<const T*>(it->second.data), it->second.d};
    } else {
      const auto bound = bind();
      auto& host = host_values_[std::string(Name.view())];
      const std::size_t bytes = static_cast<std::size_t>(it->second.d.numel()) * sizeof(T);
      host.resize(bytes);
      Backend::copy_to_host(host.data(), it->second.data, bytes);
      return {reinterpret_cast<const T*>(host.data()), it->second.d};
    }
  }

  template <class Outs>
  struct graph_of;
  template <class... O>
  struct graph_of<std::tuple<O...>> {
    using type = compiled_graph<Backend, O...>;
  };

  template <class... Args>
  static constexpr std::size_t count_outputs() {
    std::size_t n = 0;
    bool done = false;
    ((done = done || is_feed_v<Args>, n += done ? 0 : 1), ...);
    return n;
  }

  template <class Outs, class... O>
  auto& graph_for(const O&... outs) {
    using graph_t = typename graph_of<Outs>::type;
    auto& list = graphs_[typeid(Outs)];
    const Outs key{outs...};
    for (auto& g : list)
      if (static_cast<graph_t*>(g.get())->same_outputs(key)) return *static_cast<graph_t*>(g.get());
    list.push_back(std::make_unique<graph_t>(key));
    return *static_cast<graph_t*>(list.back().get());
  }

  template <class T>
  variable_storage& storage(std::string_view name, const dims& d) {
    auto it = variables_.find(name);
    if (it != variables_.end()) {
      if (!(it->second.d == d) || it->second.dtype != element_type_of<T>)
        throw feed_error("gradus: variable '" + std::string(name) + "' already holds " + to_string(it->second.d) +
                         " " + std::string(name_of(it->second.dtype)) + ", not " + to_string(d) + " " +
                         std::string(dtype_name<T>()));
      return it->second;
    }
    const auto bound = bind();
    variable_storage st;
    st.d = d;
    st.dtype = element_type_of<T>;
    st.data = Backend::allocate(std::max<std::size_t>(static_cast<std::size_t>(d.numel()) * sizeof(T), sizeof(T)));
    return variables_.emplace(std::string(name), st).first->second;
  }

  const variable_storage* find_variable(std::string_view name) const override {
    auto it = variables_.find(name);
    return it == variables_.end() ? nullptr : &it->second;
  }

  /// first: destroyed last, after every buffer queued on its stream has been given back
  mutable typename detail::context_of<Backend>::type context_;
  std::map<std::string, variable_storage, std::less<>> variables_;
  mutable std::map<std::string, std::vector<unsigned char>> host_values_;  ///< value()'s copies (device backends)
  std::int64_t global_step_ = 0;
  bool check_numerics_ = false;
  std::unordered_map<std::type_index, std::vector<std::unique_ptr<graph_base>>> graphs_;
  const graph_base* last_ = nullptr;
};

namespace detail {
struct session_access {
  template <class S, class V, class X>
  static void assign(S& s, const V& v, const X& x) { s.assign_impl(v, x); }
  template <class S, class V>
  static void declare(S& s, const V& v) { s.declare_impl(v); }
  template <class S, class V>
  static auto value(const S& s, const V& v) { return s.value_impl(v); }
};
}  // namespace detail

// Session operations are free functions taking the session first — assign, declare, value
// here; initialize (nn/init.hpp), minimize (train/), save_checkpoint / restore (io/) and
// save_weights / load_weights (io/weights.hpp) — and `s.run(...)` is the one member an
// ordinary program calls (TensorFlow's sess.run).

/// assign(s, v, tensor): set v's value in s (allocated on first assignment). The tensor's
/// dtype must be v's (a compile error otherwise) and its shape v's (a feed_error naming v).
/// The documented spelling; the member s.assign(v, x) is a deprecated alias (removed in 0.2).
template <class Backend, fixed_string Name, class T, index_t... E, tensor_like X>
void assign(session<Backend>& s, const variable<Name, T, E...>& v, const X& x) {
  detail::session_access::assign(s, v, x);
}

/// declare(s, v): make v known to s (its name, dtype and shape) without giving it a value:
/// checkpoints list it, restore() fills it, and a run that reads it before it is assigned,
/// initialised or restored is an error naming it. The member s.declare(v) is a deprecated alias.
template <class Backend, fixed_string Name, class T, index_t... E>
void declare(session<Backend>& s, const variable<Name, T, E...>& v) {
  detail::session_access::declare(s, v);
}

/// value(s, v): a host view of v's current value in s: the storage itself where the
/// backend's memory is the host's, else a copy made now (valid until the next value() of v).
/// Throws feed_error where s holds no v. The member s.value(v) is a deprecated alias.
template <class Backend, fixed_string Name, class T, index_t... E>
tensor_view<const T> value(const session<Backend>& s, const variable<Name, T, E...>& v) {
  return detail::session_access::value(s, v);
}


/// session<Backend, Precision> for a policy other than full_precision: a session over
/// with_precision<Backend, Precision>, whose graphs run each compute-precision op in the
/// policy's compute type (exec/compute_kernels.hpp).
template <class Backend, class Precision>
  requires(!std::is_same_v<Precision, full_precision>)
class session<Backend, Precision> final : public session<with_precision<Backend, Precision>> {
 public:
  using session<with_precision<Backend, Precision>>::session;
};

/// The session of Backend under Precision spelled as the type it is: session<Backend> for
/// full_precision, else session<with_precision<Backend, Precision>>. Generic code that picks
/// the policy as a template parameter declares its sessions with it: nvcc's front end does not
/// deduce a function's session<Backend>& from session<B, P> (through its base), g++ and
/// clang++ do.
template <class Backend, class Precision>
using session_of = std::conditional_t<std::is_same_v<Precision, full_precision>, session<Backend>,
                                      session<with_precision<Backend, Precision>>>;

}  // namespace gradus
