#pragma once
// What a compiled graph (exec/graph.hpp) does that depends on its backend alone: the slot
// and step tables, the planner that fills them (a slot per node that needs a buffer, shared by
// structurally equal nodes), the step functions that run each node's kernel or fused pass,
// feeding, check_numerics' scans, and moving results to the host.
//
// compiled_graph<Backend, Outs...> adds only its outputs. Everything here is a member of
// graph_engine<Backend>, not of compiled_graph, so a node type that several graphs share (a
// model's evaluation graph, its training step, each pipeline stage's graph, a gradient check's
// loss and gradient) has its planning and step code compiled once per backend rather than once
// per graph; the non-template parts (binding variables, the numerics checks, the destructor)
// once per backend per translation unit. In a test unit of 78 graphs that halved its object
// code (5.07 MB to 2.30 MB; docs/compile-time.md).
//
// About 690 lines, as one concept: the planner, the step functions and the checks all read and
// write the same private slot and step tables; split across files, each part would have to
// expose those tables to the others.
#include <algorithm>
#include <array>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <typeindex>
#include <utility>
#include <vector>

#include "gradus/exec/compute_kernels.hpp"
#include "gradus/core/error.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/exec/graph_types.hpp"
#include "gradus/exec/node_registry.hpp"
#include "gradus/exec/plan.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/placement.hpp"
#include "gradus/util/trace_span.hpp"

namespace gradus {

namespace detail {
/// Whether view node N (K operands) has an offset into its first input. Decided outside the
/// generic lambda that uses it: nvcc's front end compiles a discarded `if constexpr` branch
/// there when the condition depends on the lambda's own parameters.
template <class N, std::size_t K>
inline constexpr bool has_offset = []<std::size_t... I>(std::index_sequence<I...>) {
  return requires(const N& n, const dims& d) { n.offset((static_cast<void>(I), d)...); };
}(std::make_index_sequence<K>{});
}  // namespace detail

/// The part of a compiled graph that depends on its backend alone: the slot and step tables,
/// the planner that fills them, the step functions, feeding and the numerics checks.
/// compiled_graph derives from it and adds its outputs; its public members (stats,
/// for_each_step, owned_bytes) are compiled_graph's, the rest is the executor's own.
template <class Backend>
class graph_engine : public graph_base {
 public:
  graph_engine(const graph_engine&) = delete;
  graph_engine& operator=(const graph_engine&) = delete;

  /// Steps by kind and the op trace, as planned.
  const graph_stats& stats() const override { return stats_; }

  /// Each step's label (what it computes: "'matmul'", "the fused pass tanh(add(...))"), the
  /// dims of its last result, and its part (0: run_part 0's steps, the forward; 1: the rest):
  /// f(label, dims, part) in order. A placement log's list of what ran where.
  template <class F>
  void for_each_step(F&& f) const {
    for (std::size_t k = 0; k < steps_.size(); ++k) {
      const auto s = static_cast<std::size_t>(steps_[k].slot);
      f(std::string_view(slot_labels_[s]), slots_[s].d, k < first_part_steps_ ? 0 : 1);
    }
  }
  /// Bytes of the buffers this graph owns: all of them, or (first_part) those run_part 0
  /// writes — a micro-batch's activations, what a pipeline keeps from its forward pass to its
  /// backward.
  std::size_t owned_bytes(bool first_part = false) const {
    std::size_t n = 0;
    if (!first_part) {
      for (const auto& sl : slots_) n += sl.owned ? sl.capacity : 0;
      return n;
    }
    for (std::size_t k = 0; k < first_part_steps_; ++k) {  // each step has a slot of its own
      const slot& sl = slots_[static_cast<std::size_t>(steps_[k].slot)];
      n += sl.owned ? sl.capacity : 0;
    }
    return n;
  }

 protected:
  /// cut_stage >= 0: the graph of that pipeline stage (graph/ops/placement.hpp): a node placed
  /// on another stage is a leaf, fed with stage_input(node, data, dims) on each run.
  explicit graph_engine(int cut_stage) : cut_stage_(cut_stage) {}
  ~graph_engine() override {
    for (auto& s : slots_)
      if (s.owned && s.data) Backend::deallocate(s.data);
  }

  /// A buffer of the graph: a step's result, a fed leaf, a variable's storage or a view.
  struct slot {
    void* data = nullptr;  ///< the backend's memory; null while a leaf is unbound
    std::size_t capacity = 0;  ///< bytes owned (0: external or alias)
    bool owned = false;        ///< allocated by ensure and freed with the graph
    dims d;                    ///< dims of the value now held
  };
  /// index of the first NaN or infinity among n elements at p, or -1
  using scan_fn = index_t (*)(const void* p, index_t n);
  /// One materialised node: run_kernel, run_view or run_elementwise instantiated for it.
  struct step {
    void (*fn)(graph_engine&, const step&);  ///< runs the step
    const void* node;  ///< the node (of the type fn was instantiated for), owned by the outputs
    int slot;          ///< the slot it writes
    std::size_t first;  ///< first entry of `inputs_` this step reads
    scan_fn scan;       ///< null for views (their values were checked where they were made)
    element_type dtype;  ///< the result's element type
  };
  /// A placeholder or variable of the graph: one slot per name.
  struct named_leaf {
    std::string_view name;   ///< the leaf's name
    element_type dtype;      ///< its elements' type
    dims expected;  ///< static dims, `dyn` where bound by the feed
    int slot;              ///< its slot
    std::type_index type;  ///< its node type: two different leaves of one name are an error
    scan_fn scan;          ///< check_numerics' scan for its dtype
  };
  /// scan_fn for T: Backend::first_nonfinite for a real dtype, else -1 (nothing to find).
  template <class T>
  static index_t scan(const void* p, index_t n) {
    if constexpr (real_dtype<T>) return Backend::first_nonfinite(static_cast<const T*>(p), n);
    else return -1;
  }


  /// Where the backend's buffers are not host memory (backend_host_memory), feeds are copied
  /// into a device buffer per placeholder and outputs out into a host buffer per output.
  static constexpr bool host_memory = backend_host_memory<Backend>;
  std::map<int, device_buffer<Backend>> feed_buffers_;  ///< by placeholder slot
  std::vector<std::vector<unsigned char>> host_results_;  ///< by output

  int cut_stage_ = -1;                 ///< the pipeline stage this graph runs, or -1 (all of it)
  std::size_t first_part_steps_ = 0;   ///< run_part 0: the steps of the first output
  std::vector<char> first_part_reads_;  ///< per placeholder: whether those steps read it
  /// A node of another stage, fed by stage_input.
  struct boundary {                    // a node of another stage, fed by stage_input
    int slot;                ///< its slot
    dims expected;           ///< static dims, `dyn` where bound by the feed
    element_type dtype;      ///< its elements' type
  };
  std::vector<boundary> boundaries_;  ///< a cut graph's inputs from other stages
  std::vector<int> out_slots_;                         ///< per output
  std::vector<std::vector<std::size_t>> ready_after_;  ///< per step: the outputs it finishes
  std::vector<std::size_t> ready_first_;               ///< outputs no step writes (leaves)
  std::vector<slot> slots_;  ///< in topological order
  std::vector<step> steps_;  ///< in execution order
  std::vector<int> inputs_;  ///< the slots each step reads, step after step (step::first)
  detail::node_registry registry_;  ///< node to slot, by structure: equal nodes share a slot
  /// The placeholders, which a run binds from its feeds.
  std::vector<named_leaf> placeholders_, variables_;  ///< the variables, bound from the session's storage
  std::vector<std::string> slot_labels_;  ///< what each slot holds, for errors
  graph_stats stats_;  ///< filled while planning

  /// After the outputs are planned (out_slots_ and first_part_steps_ set): the tables derived
  /// from the plan.
  void finish_plan() {
    stats_.slots = slots_.size();
    host_results_.resize(out_slots_.size());
    // which placeholders run_part 0's steps read (the others may be fed in part 1)
    std::vector<bool> read(slots_.size(), false);
    const std::size_t reads_end = first_part_steps_ < steps_.size() ? steps_[first_part_steps_].first : inputs_.size();
    for (std::size_t j = 0; j < reads_end; ++j) read[static_cast<std::size_t>(inputs_[j])] = true;
    for (const auto& p : placeholders_) first_part_reads_.push_back(read[static_cast<std::size_t>(p.slot)]);
    // when each output is final: after the step that writes its slot (or before any step)
    ready_after_.resize(steps_.size());
    for (std::size_t i = 0; i < out_slots_.size(); ++i) {
      std::size_t k = steps_.size();
      for (std::size_t j = 0; j < steps_.size(); ++j)
        if (steps_[j].slot == out_slots_[i]) k = j;
      (k < steps_.size() ? ready_after_[k] : ready_first_).push_back(i);
    }
  }

  // ---- one run ------------------------------------------------------------------------

  /// Before a whole run's feeds are bound: every placeholder unbound.
  void unbind_feeds() {
    for (auto& p : placeholders_) slots_[p.slot].data = nullptr;
  }
  /// After they are: every placeholder fed, every variable bound to the session's storage.
  void check_fed(const variable_source& vars) {
    for (auto& p : placeholders_)
      if (!slots_[p.slot].data) throw not_fed(p);
    bind_variables(vars);
  }
  /// The error for placeholder p left unfed: its name, shape and dtype.
  static feed_error not_fed(const named_leaf& p) {
    return feed_error("gradus: placeholder '" + std::string(p.name) + "' of shape " + to_string(p.expected) + " " +
                      std::string(name_of(p.dtype)) + " was not fed");
  }
  /// Every step, each result scanned where vars asks for check_numerics.
  void run_steps(const variable_source& vars) {
    if (vars.check_numerics()) check_leaves(vars.global_step());
    run_range(vars, 0, steps_.size());
  }
  /// Steps [from, to), each result scanned where vars asks for check_numerics, and each
  /// kernel's step a span named after its node where a trace is recorded (util/trace_span.hpp).
  void run_range(const variable_source& vars, std::size_t from, std::size_t to) {
    util::trace_sink* const trace = util::active_trace();
    if (!trace && !vars.check_numerics()) {
      for (std::size_t k = from; k < to; ++k) steps_[k].fn(*this, steps_[k]);
      return;
    }
    for (std::size_t k = from; k < to; ++k) {
      run_step(k, trace);
      if (vars.check_numerics()) check_step(k, vars.global_step());
    }
  }
  /// Step k, a span named after its node where `trace` is a recorder (a kernel's step: views
  /// cost nothing to trace).
  void run_step(std::size_t k, util::trace_sink* trace) {
    const step& st = steps_[k];
    if (trace && st.scan) {
      const std::int64_t t0 = trace->now_ns();
      st.fn(*this, st);
      trace->complete(slot_labels_[static_cast<std::size_t>(st.slot)], "compute", t0, trace->now_ns() - t0, {});
    } else {
      st.fn(*this, st);
    }
  }
  /// run_part's halves (compiled_graph::run_part): before part 0's feeds are bound, and the
  /// part's steps once they are.
  void unbind_part() {
    for (auto& p : placeholders_) slots_[p.slot].data = nullptr;
    for (auto& b : boundaries_) slots_[b.slot].data = nullptr;
  }
  /// Part 0 (the first output's steps) or part 1 (the rest), its feeds bound. Throws
  /// feed_error for a placeholder the part reads or a stage input that was not fed.
  void run_bound_part(const variable_source& vars, int part) {
    const std::size_t from = part == 0 ? 0 : first_part_steps_, to = part == 0 ? first_part_steps_ : steps_.size();
    for (std::size_t i = 0; i < placeholders_.size(); ++i) {
      const auto& p = placeholders_[i];
      if (!slots_[p.slot].data && (part != 0 || first_part_reads_[i])) throw not_fed(p);
    }
    for (const auto& b : boundaries_)
      if (!slots_[b.slot].data)
        throw feed_error("gradus: " + slot_labels_[static_cast<std::size_t>(b.slot)] + " " + to_string(b.expected) +
                         " was not fed (stage_input)");
    if (part == 0) bind_variables(vars);
    [[maybe_unused]] const auto held = hold_variables();
    if (part == 0 && vars.check_numerics()) check_leaves(vars.global_step());
    run_range(vars, from, to);
  }

  // ---- planning -----------------------------------------------------------------------

  /// A new slot for n, registered (for its twins, in `context`: scope_key) and labelled for errors.
  template <class N>
  int new_slot(const N& n, int context = 0) {
    slots_.push_back({});
    const int s = static_cast<int>(slots_.size()) - 1;
    registry_.add(n, s, context);
    if constexpr (N::kind == node_kind::placeholder) slot_labels_.push_back(detail::quoted("placeholder ", N::name.view()));
    else if constexpr (N::kind == node_kind::variable) slot_labels_.push_back(detail::quoted("variable ", N::name.view()));
    else slot_labels_.push_back(detail::quoted("", N::op_name));
    return s;
  }
  /// The slot of the leaf named like n in list (a new one the first time); what is
  /// "placeholder" or "variable". Throws gradus::error where two different leaves share the name.
  template <class N>
  int named(std::vector<named_leaf>& list, const N& n, const char* what) {
    for (const auto& l : list) {
      if (l.name != N::name.view()) continue;
      if (l.type != typeid(N))
        throw error(std::string("gradus: two different ") + what + "s are named '" + std::string(l.name) +
                    "' in one graph: " + to_string(l.expected) + " " + std::string(name_of(l.dtype)) + " and " +
                    to_string(static_dims<shape_t<N>>()) + " " + std::string(dtype_name<value_t<N>>()));
      return l.slot;
    }
    const int s = new_slot(n);
    list.push_back({N::name.view(), element_type_of<value_t<N>>, static_dims<shape_t<N>>(), s, typeid(N), &scan<value_t<N>>});
    return s;
  }

  /// The registry context of nodes planned inside the precision scopes Stack: the element
  /// type their compute-precision ops run in (a node under two precisions is two steps).
  template <class Stack>
  static constexpr int scope_key = static_cast<int>(element_type_of<scope_compute_t<Backend, Stack>>);

  /// A node whose value must be in a buffer: give it a slot (or find its twin's). Stack: the
  /// precision scopes (graph/ops/precision_scope.hpp) it is planned inside.
  template <class Stack = precision_stack<>, class N>
  int plan_root(const N& n) {
    constexpr node_kind k = N::kind;
    constexpr int key = scope_key<Stack>;
    if constexpr (is_stage_placed_v<N>) {
      if (cut_stage_ >= 0 && N::placement::index != cut_stage_) return plan_boundary(n);
    }
    if constexpr (is_precision_scope_v<N>) {
      return plan_root<enter_scope_t<Stack, typename N::compute>>(n.e);  // the same buffer: a scope only picks kernels
    } else if constexpr (k == node_kind::placeholder) {
      return named(placeholders_, n, "placeholder");
    } else if constexpr (k == node_kind::variable) {
      return named(variables_, n, "variable");
    } else {
      if (int s = registry_.find(n, key); s >= 0) return s;
      std::vector<int> reads;
      if constexpr (k == node_kind::constant) {
        const int s = new_slot(n, key);
        using T = typename N::value_type;
        if constexpr (host_memory) {
          slots_[s].data = const_cast<T*>(n.values->data());
          slots_[s].d = n.d;
        } else {  // a device backend: the values are copied to the device once, with the plan
          T* dst = ensure<T>(s, n.d);
          if (!n.values->empty()) Backend::copy_to_device(dst, n.values->data(), n.values->size() * sizeof(T));
        }
        return s;
      } else if constexpr (k == node_kind::scalar || k == node_kind::elementwise || k == node_kind::shape_scalar) {
        plan_fused<Stack>(n, reads);
        const int s = add_step(n, reads, &run_elementwise<N>, key);
        slot_labels_[static_cast<std::size_t>(s)] = "the fused pass " + fused_label(n);
        return s;
      } else {
        std::apply([&](const auto&... op) { (reads.push_back(plan_root<Stack>(op)), ...); }, n.operands());
        if constexpr (k == node_kind::view) return add_step(n, reads, &run_view<N>, key);
        else return add_step(n, reads, &run_kernel<N, Stack>, key);
      }
    }
  }
  /// Another stage's output in a stage's graph: a leaf fed from outside (what that stage sent).
  template <class N>
  int plan_boundary(const N& n) {
    if (int s = registry_.find(n); s >= 0) return s;
    const int s = new_slot(n);
    slot_labels_[static_cast<std::size_t>(s)] = "the output of stage " + std::to_string(N::placement::index);
    boundaries_.push_back({s, static_dims<shape_t<N>>(), element_type_of<value_t<N>>});
    return s;
  }
  /// A step that runs fn on n, reading the slots reads, into a new slot (registered in
  /// `context`); counted in stats_.
  template <class N>
  int add_step(const N& n, const std::vector<int>& reads, void (*fn)(graph_engine&, const step&), int context) {
    const int s = new_slot(n, context);
    steps_.push_back({fn, &n, s, inputs_.size(), N::kind == node_kind::view ? nullptr : &scan<value_t<N>>,
                      element_type_of<value_t<N>>});
    stats_.trace.push_back(N::op_name);
    constexpr node_kind k = N::kind;
    ++(k == node_kind::kernel ? stats_.kernels : k == node_kind::view ? stats_.views : stats_.fused_passes);
    inputs_.insert(inputs_.end(), reads.begin(), reads.end());
    return s;
  }
  /// A fused subtree as text for errors: "mul(log(x), w)", leaves by name, kernels by op.
  template <class N>
  static std::string fused_label(const N& n) {
    if constexpr (N::kind == node_kind::scalar) {
      std::ostringstream o;
      o << +n.value;
      return o.str();
    } else if constexpr (N::kind == node_kind::elementwise) {
      std::string r = std::string(N::op_name) + "(";
      std::apply([&](const auto&... c) {
        bool first = true;
        ((r += (first ? "" : ", ") + fused_label(c), first = false), ...);
      }, n.children());
      return r + ")";
    } else if constexpr (N::kind == node_kind::placeholder || N::kind == node_kind::variable) {
      return std::string(N::name.view());
    } else {
      return N::op_name;
    }
  }

  /// Walk a fused subtree; every node with storage under it is read through a slot.
  template <class Stack, class N>
  void plan_fused(const N& n, std::vector<int>& reads) {
    if constexpr (N::kind == node_kind::scalar) {
    } else if constexpr (N::kind == node_kind::shape_scalar) {
      reads.push_back(plan_root<Stack>(std::get<0>(n.operands())));
    } else if constexpr (N::kind == node_kind::elementwise) {
      std::apply([&](const auto&... c) { (plan_fused<Stack>(c, reads), ...); }, n.children());
    } else {
      reads.push_back(plan_root<Stack>(n));
    }
  }

  // ---- check_numerics -----------------------------------------------------------------

  /// "NaN at element i", "+Inf ..." or "-Inf ...": element i of the buffer at p (copied to
  /// the host), read as dtype (f32, or else double).
  static std::string nonfinite_at(const void* p, index_t i, element_type dtype) {
    double v = 0;
    if (dtype == element_type::f32) {
      float f = 0;
      Backend::copy_to_host(&f, static_cast<const float*>(p) + i, sizeof f);  // device memory on a GPU
      v = static_cast<double>(f);
    } else {
      Backend::copy_to_host(&v, static_cast<const double*>(p) + i, sizeof v);
    }
    return std::string(v != v ? "NaN" : v > 0 ? "+Inf" : "-Inf") + " at element " + std::to_string(i);
  }
  /// The first NaN or infinity in a placeholder or variable before the run: a
  /// numerics_error naming it.
  void check_leaves(std::int64_t global_step) const {
    for (const auto* list : {&placeholders_, &variables_})
      for (const auto& l : *list) {
        const slot& sl = slots_[static_cast<std::size_t>(l.slot)];
        const index_t i = l.scan(sl.data, sl.d.numel());
        if (i < 0) continue;
        throw numerics_error("gradus: check_numerics: " + slot_labels_[static_cast<std::size_t>(l.slot)] + " " +
                                 to_string(sl.d) + " holds " + nonfinite_at(sl.data, i, l.dtype) +
                                 " before the run at global step " + std::to_string(global_step),
                             {});
      }
  }
  /// The first NaN or infinity in step k's result: the op, its shape, its inputs, the
  /// outputs it reaches, the global step.
  void check_step(std::size_t k, std::int64_t global_step) const {
    const step& st = steps_[k];
    if (!st.scan) return;
    const slot& sl = slots_[static_cast<std::size_t>(st.slot)];
    const index_t i = st.scan(sl.data, sl.d.numel());
    if (i < 0) return;
    const std::size_t last = k + 1 < steps_.size() ? steps_[k + 1].first : inputs_.size();
    std::string ins;
    for (std::size_t j = st.first; j < last; ++j) {
      const auto in = static_cast<std::size_t>(inputs_[j]);
      ins += (ins.empty() ? "" : ", ") + slot_labels_[in] + " " + to_string(slots_[in].d);
    }
    // the outputs downstream of this step: slots marked as the later steps read them
    std::vector<bool> reached(slots_.size(), false);
    reached[static_cast<std::size_t>(st.slot)] = true;
    for (std::size_t j = k + 1; j < steps_.size(); ++j) {
      const std::size_t end = j + 1 < steps_.size() ? steps_[j + 1].first : inputs_.size();
      for (std::size_t q = steps_[j].first; q < end; ++q)
        if (reached[static_cast<std::size_t>(inputs_[q])]) reached[static_cast<std::size_t>(steps_[j].slot)] = true;
    }
    std::vector<std::size_t> outs;
    for (std::size_t o = 0; o < out_slots_.size(); ++o)
      if (reached[static_cast<std::size_t>(out_slots_[o])]) outs.push_back(o);
    throw numerics_error("gradus: check_numerics: the result of " + slot_labels_[static_cast<std::size_t>(st.slot)] +
                             " " + to_string(sl.d) + " (#" + std::to_string(k + 1) + " of the graph's " +
                             std::to_string(steps_.size()) + " steps) holds " +
                             nonfinite_at(sl.data, i, st.dtype) + " at global step " + std::to_string(global_step) +
                             "; its inputs: " + (ins.empty() ? std::string("none") : ins),
                         std::move(outs));
  }

  // ---- running ------------------------------------------------------------------------

  /// Each variable's slot pointed at the session's storage (checked: initialised, same shape).
  void bind_variables(const variable_source& vars) {
    for (auto& v : variables_) {
      if (slots_[v.slot].data) continue;
      const variable_storage* st = vars.find_variable(v.name);
      if (!st || !st->data || !st->initialized)
        throw feed_error("gradus: variable '" + std::string(v.name) + "' of shape " + to_string(v.expected) +
                         " has no value in this session; assign or initialise it first");
      if (!(st->d == v.expected) || st->dtype != v.dtype)
        throw feed_error("gradus: variable '" + std::string(v.name) + "' is " + to_string(v.expected) + " " +
                         std::string(name_of(v.dtype)) + " in this graph but " + to_string(st->d) + " " +
                         std::string(name_of(st->dtype)) + " in the session");
      slots_[v.slot].data = st->data;
      slots_[v.slot].d = st->d;
    }
  }

  /// Under a mixed policy whose backend converts its GEMMs' operands (compute_kernels::
  /// hold_operands): a token holding every bound float variable for as long as it lives, each
  /// converted at the first GEMM that reads it and then read by every other (forward and
  /// backward alike). No step writes a variable during a run. Otherwise a token that does nothing.
  auto hold_variables() const {
    using compute = typename precision_of_backend_t<Backend>::compute;
    if constexpr (!std::is_same_v<compute, float>) {
      auto held = compute_kernels<Backend, compute>::hold_operands();
      for (const auto& v : variables_) {
        const slot& sl = slots_[static_cast<std::size_t>(v.slot)];
        if (v.dtype == element_type::f32 && sl.data)
          held.add(static_cast<const float*>(sl.data), static_cast<std::size_t>(sl.d.numel()));
      }
      return held;
    } else {
      return nothing_held{};
    }
  }

  /// Binds feed f (placeholder = tensor) to the placeholder of its name (on a device backend,
  /// copied into that placeholder's device buffer). Throws feed_error where f names no
  /// placeholder, differs from it in dtype or static shape, has a shape that does not fit,
  /// or feeds it twice.
  template <class F>
  void bind(const F& f) {
    for (auto& p : placeholders_) {
      if (p.name != F::name.view()) continue;
      if (p.dtype != element_type_of<typename F::value_type> || !(p.expected == static_dims<typename F::shape_type>()))
        throw feed_error("gradus: feed '" + std::string(p.name) + "' was made for a placeholder of " +
                         to_string(static_dims<typename F::shape_type>()) + " " +
                         std::string(dtype_name<typename F::value_type>()) + " but the graph's is " +
                         to_string(p.expected) + " " + std::string(name_of(p.dtype)));
      if (!fits<typename F::shape_type>(f.d))
        throw feed_error("gradus: feed '" + std::string(p.name) + "': expected shape " + to_string(p.expected) +
                         ", got " + to_string(f.d));
      if (slots_[p.slot].data)
        throw feed_error("gradus: placeholder '" + std::string(p.name) + "' is fed twice");
      // A zero-size feed may have a null data(); any non-null address marks it bound.
      using T = typename F::value_type;
      if constexpr (host_memory) {
        slots_[p.slot].data = const_cast<T*>(f.data ? f.data : &zero_size_sentinel<T>);
        slots_[p.slot].d = f.d;
      } else {  // a device backend: the feed is copied into the placeholder's own buffer
        device_buffer<Backend>& st = feed_buffers_[p.slot];
        const std::size_t bytes = static_cast<std::size_t>(f.d.numel()) * sizeof(T);
        st.reserve(std::max(bytes, sizeof(T)));
        if (bytes) Backend::copy_to_device(st.data, f.data, bytes);
        slots_[p.slot].data = st.data;
        slots_[p.slot].d = f.d;
      }
      return;
    }
    throw feed_error("gradus: feed '" + std::string(F::name.view()) + "' names no placeholder of this graph");
  }
  /// The address a zero-size feed is bound to where its data() is null (bound, never read).
  template <class T>
  static inline T zero_size_sentinel{};
  /// A cut stage's input: the value of another stage's placed node for this run.
  template <class N, class T>
  void bind(const stage_input<N, T>& f) {
    const int s = registry_.find(f.node);
    const auto b = std::find_if(boundaries_.begin(), boundaries_.end(), [&](const boundary& x) { return x.slot == s; });
    if (s < 0 || b == boundaries_.end())
      throw feed_error("gradus: stage_input: the output of stage " + std::to_string(N::placement::index) +
                       " is not an input of this graph (cut at stage " + std::to_string(cut_stage_) + ")");
    if (!fits<shape_t<N>>(f.d))
      throw feed_error("gradus: stage_input: the output of stage " + std::to_string(N::placement::index) +
                       ": expected shape " + to_string(b->expected) + ", got " + to_string(f.d));
    slot& sl = slots_[static_cast<std::size_t>(s)];
    if (sl.data) throw feed_error("gradus: stage_input: the output of stage " + std::to_string(N::placement::index) + " is fed twice");
    if constexpr (host_memory) {
      sl.data = const_cast<T*>(f.data ? f.data : &zero_size_sentinel<T>);
    } else {
      device_buffer<Backend>& st = feed_buffers_[s];
      const std::size_t bytes = static_cast<std::size_t>(f.d.numel()) * sizeof(T);
      st.reserve(std::max(bytes, sizeof(T)));
      if (bytes) Backend::copy_to_device(st.data, f.data, bytes);
      sl.data = st.data;
    }
    sl.d = f.d;
  }

  /// Slot s as a buffer of d.numel() T (at least one), reallocated when too small; sets its
  /// dims to d.
  template <class T>
  T* ensure(int s, const dims& d) {
    slot& sl = slots_[static_cast<std::size_t>(s)];
    sl.d = d;
    const std::size_t bytes = static_cast<std::size_t>(d.numel()) * sizeof(T);
    if (bytes > sl.capacity || !sl.data) {
      if (sl.data) Backend::deallocate(sl.data);
      sl.data = nullptr;
      sl.data = Backend::allocate(std::max<std::size_t>(bytes, sizeof(T)));
      sl.capacity = std::max<std::size_t>(bytes, sizeof(T));
      sl.owned = true;
    }
    return static_cast<T*>(sl.data);
  }
  /// Slot s's data and dims as a view (the backend's memory).
  template <class T>
  tensor_view<const T> view_of(int s) const {
    const slot& sl = slots_[static_cast<std::size_t>(s)];
    return {static_cast<const T*>(sl.data), sl.d};
  }

  /// A kernel node's step: dims from infer over its operands' dims, the buffer ensured, then
  /// N::compute on Backend (skipped for an empty result), in the precision of the scopes Stack.
  template <class N, class Stack>
  static void run_kernel(graph_engine& g, const step& st) {
    const N& n = *static_cast<const N*>(st.node);
    using T = value_t<N>;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      using ops = decltype(n.operands());
      const dims d = n.infer(g.slots_[static_cast<std::size_t>(g.inputs_[st.first + I])].d...);
      T* out = g.template ensure<T>(st.slot, d);
      if (d.numel() == 0) return;
      // in the policy's compute type where N runs in compute precision (exec/compute_kernels.hpp)
      n.template compute<kernel_backend_t<Backend, N, Stack>>(
          out, d, g.template view_of<value_t<std::tuple_element_t<I, ops>>>(g.inputs_[st.first + I])...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(n.operands())>>{});
  }

  /// A view's data is its first operand's, from element offset(dims...) on where the view
  /// defines one (a part of a buffer that packs several results); the dims come from
  /// infer. Both see the dims of every operand.
  template <class N>
  static void run_view(graph_engine& g, const step& st) {
    const N& n = *static_cast<const N*>(st.node);
    constexpr std::size_t operands = std::tuple_size_v<decltype(n.operands())>;
    constexpr bool with_offset = detail::has_offset<N, operands>;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      slot& out = g.slots_[static_cast<std::size_t>(st.slot)];
      const auto& in = [&](std::size_t i) -> const dims& {
        return g.slots_[static_cast<std::size_t>(g.inputs_[st.first + i])].d;
      };
      out.d = n.infer(in(I)...);
      void* base = g.slots_[static_cast<std::size_t>(g.inputs_[st.first])].data;
      if constexpr (with_offset) {
        const index_t off = n.offset(in(I)...);
        if (off) base = static_cast<value_t<N>*>(base) + off;
      }
      out.data = base;
    }(std::make_index_sequence<std::tuple_size_v<decltype(n.operands())>>{});
  }

  /// The broadcast dims of fused subtree n, reading its slots' dims from inputs_[cursor] on
  /// (cursor advanced past them). Throws shape_error where operands do not broadcast.
  template <class N>
  dims fused_dims(const N& n, std::size_t& cursor) const {
    if constexpr (N::kind == node_kind::scalar) {
      return dims{};
    } else if constexpr (N::kind == node_kind::shape_scalar) {
      ++cursor;
      return dims{};
    } else if constexpr (N::kind == node_kind::elementwise) {
      return std::apply(
          [&](const auto&... c) {
            dims r{};
            bool first = true;
            auto combine = [&](const dims& d) {
              r = first ? d : broadcast_dims(N::op_name, r, d);
              first = false;
            };
            (combine(fused_dims(c, cursor)), ...);
            return r;
          },
          n.children());
    } else {
      return slots_[static_cast<std::size_t>(inputs_[cursor++])].d;
    }
  }

  /// The elementwise plan (exec/plan.hpp) of fused subtree n over output dims out: a
  /// leaf_plan per slot read (from inputs_[cursor] on), a scalar_plan per scalar (a
  /// shape_scalar's value taken from its operand's dims).
  template <class N>
  auto make_plan(const N& n, std::size_t& cursor, const dims& out) const {
    using T = value_t<N>;
    if constexpr (N::kind == node_kind::scalar) {
      return scalar_plan<T>{n.value};
    } else if constexpr (N::kind == node_kind::shape_scalar) {
      return scalar_plan<T>{n.value(slots_[static_cast<std::size_t>(inputs_[cursor++])].d)};
    } else if constexpr (N::kind == node_kind::elementwise) {
      return std::apply(
          [&](const auto&... c) {
            using F = std::remove_cvref_t<decltype(n.f)>;
            // braced init: children are planned left to right, as they were walked
            if constexpr (sizeof...(c) == 1) return unary_plan<F, decltype(make_plan(c, cursor, out))...>{n.f, make_plan(c, cursor, out)...};
            else if constexpr (sizeof...(c) == 2) return binary_plan<F, decltype(make_plan(c, cursor, out))...>{n.f, make_plan(c, cursor, out)...};
            else return ternary_plan<F, decltype(make_plan(c, cursor, out))...>{n.f, make_plan(c, cursor, out)...};
          },
          n.children());
    } else {
      const slot& sl = slots_[static_cast<std::size_t>(inputs_[cursor++])];
      return leaf_plan<T>{static_cast<const T*>(sl.data), broadcast_strides(sl.d, out), nullptr, 0};
    }
  }

  /// A fused elementwise subtree's step: its dims, its buffer, then one Backend::assign pass
  /// over its plan with loop axes collapsed.
  template <class N>
  static void run_elementwise(graph_engine& g, const step& st) {
    const N& n = *static_cast<const N*>(st.node);
    using T = value_t<N>;
    std::size_t cursor = st.first;
    const dims d = g.fused_dims(n, cursor);
    T* out = g.template ensure<T>(st.slot, d);
    if (d.numel() == 0) return;
    cursor = st.first;
    auto plan = g.make_plan(n, cursor, d);
    const loop_shape ls = collapse_loop(plan, d);
    Backend::assign(out, ls, plan);
  }

  /// Output i as a host view: the slot itself where the backend's memory is the host's,
  /// else a copy into the graph's host buffer for that output (grown, never shrunk). With
  /// ToHost = false, the slot itself on every backend.
  template <class T, bool ToHost>
  tensor_view<const T> fetch(std::size_t i) {
    if constexpr (host_memory || !ToHost) {
      return view_of<T>(out_slots_[i]);
    } else {
      const slot& sl = slots_[static_cast<std::size_t>(out_slots_[i])];
      const std::size_t n = static_cast<std::size_t>(sl.d.numel());
      auto& host = host_results_[i];
      if (host.size() < n * sizeof(T)) host.resize(n * sizeof(T));
      if (n) Backend::copy_to_host(host.data(), sl.data, n * sizeof(T));
      return {reinterpret_cast<const T*>(host.data()), sl.d};
    }
  }
};

}  // namespace gradus
