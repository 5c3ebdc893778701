#pragma once
// The compiled form of a set of outputs: what a session runs.
//
// Planning happens once, on the first run of an output set. A walk over the expression
// finds every node that needs a buffer (leaves, kernels such as matmul or reductions,
// views, and the root of each fused elementwise subtree) and gives it a slot, in
// topological order; structurally equal nodes (same type, equal parameters) share one
// slot, so a repeated subexpression is computed once. Each materialised node becomes a
// step: a function pointer instantiated for its type, the node, its slot, and the slots
// it reads, listed in the order the typed code will ask for them.
//
// Each run: bind feeds, infer dims (a `dyn` mismatch throws here, naming op and shapes),
// grow buffers that are too small (so the same shapes allocate nothing), run the steps.
//
// A pipeline stage's graph is the same class with a cut (graph/ops/placement.hpp): nodes
// placed on other stages become leaves fed with stage_input, and run_part runs the forward
// and the backward steps of one micro-batch at different times, its buffers kept between.
//
// compiled_graph<Backend, Outs...> holds only what depends on its outputs; the tables, the
// planner, the step functions and the checks are graph_engine<Backend>'s
// (exec/graph_engine.hpp), compiled once per backend however many graphs share a node type.
// The interface a session sees is exec/graph_types.hpp.
#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "gradus/exec/graph_engine.hpp"

namespace gradus {

/// The plan and buffers of one output set on Backend: what session::run builds on an output
/// set's first run and reuses afterwards (a pipeline stage builds its own, with a cut). Not
/// thread-safe: one run at a time, and each run overwrites the buffers the last returned.
template <class Backend, class... Outs>
class compiled_graph final : public graph_engine<Backend> {
  using engine = graph_engine<Backend>;

 public:
  /// cut_stage >= 0: the graph of that pipeline stage (graph/ops/placement.hpp): a node placed
  /// on another stage is a leaf, fed with stage_input(node, data, dims) on each run.
  explicit compiled_graph(const std::tuple<Outs...>& outs, int cut_stage = -1) : engine(cut_stage), outs_(outs) {
    this->out_slots_.resize(sizeof...(Outs));
    std::apply(
        [&](const auto&... o) {
          std::size_t i = 0;
          ((this->out_slots_[i] = this->plan_root(o),
            this->first_part_steps_ = i++ == 0 ? this->steps_.size() : this->first_part_steps_),
           ...);
        },
        outs_);
    this->finish_plan();
  }

  /// Whether o is the output set this graph was planned for (its nodes compared with `==`).
  bool same_outputs(const std::tuple<Outs...>& o) const { return outs_ == o; }

  /// Binds the feeds (placeholder = tensor, or stage_input) and the variables of vars, runs
  /// every step and returns a host view of each output (one view, or a tuple), valid until
  /// the next run. Throws feed_error for a placeholder left unfed, fed twice or fed the wrong
  /// shape, or a variable without a value; numerics_error where vars asks for check_numerics.
  template <class... Feeds>
  auto run(const variable_source& vars, const Feeds&... feeds) {
    return run_hooked(vars, no_output_hook{}, feeds...);
  }

  /// run, calling on_ready(i, data) as soon as output i's value is final — while later
  /// steps are still to run (a data-parallel trainer starts reducing a gradient there).
  /// The views returned are host memory (copied out of a device backend's), or with
  /// ToHost = false the backend's own buffers (device memory on a GPU: what a training step
  /// hands to the optimizer without a round trip through the host).
  template <bool ToHost = true, class Hook, class... Feeds>
  auto run_hooked(const variable_source& vars, Hook&& on_ready, const Feeds&... feeds) {
    this->unbind_feeds();
    (this->bind(feeds), ...);
    this->check_fed(vars);
    [[maybe_unused]] const auto held = this->hold_variables();  // each weight converted once (mixed policies)
    if constexpr (std::is_same_v<std::remove_cvref_t<Hook>, no_output_hook>) {
      this->run_steps(vars);
    } else {
      auto& steps = this->steps_;
      const auto ready = [&](const std::vector<std::size_t>& outs) {
        for (std::size_t i : outs) on_ready(i, this->slots_[static_cast<std::size_t>(this->out_slots_[i])].data);
      };
      const bool checked = vars.check_numerics();  // the same run, each result scanned before anyone sees it
      if (checked) this->check_leaves(vars.global_step());
      util::trace_sink* const trace = util::active_trace();
      ready(this->ready_first_);
      for (std::size_t k = 0; k < steps.size(); ++k) {
        this->run_step(k, trace);
        if (checked) this->check_step(k, vars.global_step());
        ready(this->ready_after_[k]);
      }
    }
    return results<ToHost>(std::index_sequence_for<Outs...>{});
  }

  /// A run in two parts, the buffers kept between them: part 0 runs the steps the first output
  /// needs (planned first), part 1 the rest. A pipeline stage runs a micro-batch's forward
  /// pass (its output) as part 0, and its backward pass (the gradients, which read the
  /// forward's buffers) as part 1 once the next stage has sent the output's adjoint; a graph
  /// per micro-batch in flight keeps each one's activations. Part 0 unbinds every feed and
  /// needs those its steps read; part 1 binds its own feeds beside them. The results are the
  /// backend's buffers (device memory on a GPU), valid until the graph runs again.
  template <class... Feeds>
  void run_part(const variable_source& vars, int part, const Feeds&... feeds) {
    if (part == 0) this->unbind_part();
    (this->bind(feeds), ...);
    this->run_bound_part(vars, part);
  }

  /// Output I's buffer after run_part (the backend's memory).
  template <std::size_t I>
  tensor_view<const value_t<std::tuple_element_t<I, std::tuple<Outs...>>>> output() const {
    return this->template view_of<value_t<std::tuple_element_t<I, std::tuple<Outs...>>>>(this->out_slots_[I]);
  }

 private:
  std::tuple<Outs...> outs_;

  template <bool ToHost, std::size_t... I>
  auto results(std::index_sequence<I...>) {
    if constexpr (sizeof...(I) == 1)
      return this->template fetch<value_t<std::tuple_element_t<0, std::tuple<Outs...>>>, ToHost>(0);
    else
      return std::tuple{this->template fetch<value_t<std::tuple_element_t<I, std::tuple<Outs...>>>, ToHost>(I)...};
  }
};

}  // namespace gradus
