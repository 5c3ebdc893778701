#pragma once
// The interface between a session and its compiled graphs (exec/graph.hpp): the storage a
// session owns per variable and how a graph asks for it (variable_storage, variable_source),
// what a run executes (graph_stats), the type-erased graph a session caches (graph_base),
// and a pipeline stage's input from another stage (stage_input).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/shape.hpp"

namespace gradus {

/// Storage the session owns for one variable.
struct variable_storage {
  void* data = nullptr;     ///< the backend's memory (device memory on a GPU), d.numel() elements
  dims d;                   ///< the variable's shape
  element_type dtype = element_type::none;  ///< its elements' type
  bool initialized = false;  ///< declared storage has no value until assigned or restored
};

namespace detail {
/// prefix + 'name' (appended piecewise: g++ 12 warns falsely, -Wrestrict, on the same
/// concatenation written with operator+ once inlined)
inline std::string quoted(std::string_view prefix, std::string_view name) {
  std::string r;
  r.reserve(prefix.size() + name.size() + 2);
  r.append(prefix).append(1, '\'').append(name).append(1, '\'');
  return r;
}
}  // namespace detail

/// What a graph asks of its session: variables by name, and how to run.
struct variable_source {
  /// The storage of the variable or state tensor called name, or null where there is none.
  virtual const variable_storage* find_variable(std::string_view name) const = 0;
  /// check_numerics: after every step, the step's result is scanned for NaN and infinity
  /// (and every feed and variable before the first step); the first one found stops the
  /// run with a numerics_error. global_step: named in that error.
  virtual bool check_numerics() const { return false; }
  /// The training step counter, named in a numerics_error (0 unless overridden).
  virtual std::int64_t global_step() const { return 0; }

 protected:
  ~variable_source() = default;
};

/// What one run of a compiled graph executes: its steps in order, counted by kind, and
/// the op of each (a kernel trace, e.g. for counting GEMMs).
struct graph_stats {
  std::size_t slots = 0;         ///< buffers and bound leaves
  std::size_t fused_passes = 0;  ///< elementwise roots: one pass each
  std::size_t kernels = 0;       ///< materialised ops (matmul, reductions, softmax, ...)
  std::size_t views = 0;         ///< reshapes and other no-copy steps
  std::vector<const char*> trace;  ///< op name of every step, in execution order

  /// How many steps of the trace ran op (an op name such as "matmul").
  std::size_t count(std::string_view op) const {
    return static_cast<std::size_t>(std::count_if(trace.begin(), trace.end(), [&](const char* o) { return op == o; }));
  }
};

/// run()'s hook type when no one listens for outputs.
struct no_output_hook {
  /// Ignores output i's buffer.
  void operator()(std::size_t, void*) const {}
};

/// A compiled graph with its output types erased: what a session caches and asks for
/// stats (every compiled_graph derives from it).
struct graph_base {
  virtual ~graph_base() = default;
  /// What one run of this graph executes (fixed when it is planned).
  virtual const graph_stats& stats() const = 0;
};

/// The binding of a node placed on another stage, for one run of a stage's graph (a cut
/// graph's leaf): the node (found by structure), its data (host memory) and dims.
template <class N, class T>
struct stage_input {
  using feed_tag = void;  ///< is_feed_v (exec/session.hpp)
  const N& node;  ///< the placed node whose value this is (matched by structure, not address)
  const T* data;  ///< its value, d.numel() elements of host memory, read during the run
  dims d;         ///< its dims (checked against the node's static shape)
};

}  // namespace gradus
