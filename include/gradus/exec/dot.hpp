#pragma once
// to_dot(outputs...): the graph the compiler built, as Graphviz DOT (`dot -Tsvg`).
// Boxes are materialised nodes (leaves, kernels, views), ellipses are elementwise nodes,
// and each fused pass is a cluster: everything inside it runs as one loop. Nodes that
// the planner would share (same type, equal parameters) are drawn once, as they run.
// A placed graph (graph/ops/placement.hpp) draws each pipeline stage as a cluster around
// its nodes and fused passes (labelled with its device where the placement names one), and each edge that crosses stages through a transfer node
// (what the pipeline sends: the tensor's shape and dtype; its gradient goes back the same
// way in training).
#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <typeindex>
#include <vector>

#include "gradus/exec/node_registry.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/placement.hpp"

namespace gradus {

namespace detail {

template <class S>
std::string static_shape_label() {
  return to_string(static_dims<S>());
}

class dot_writer {
 public:
  /// Where a node is drawn: the stage of the nearest placed node above it, else (above every
  /// placement) the latest stage among its inputs; -1 in an unplaced graph.
  template <class N>
  int root(const N& n) {
    if (int id = seen_.find(n); id >= 0) return id;
    const int outer = stage_;
    if constexpr (is_stage_placed_v<N>) {
      placed_ = true;
      stage_ = N::placement::index;
      if (const std::string d = device::label<typename N::placement::device_type>(); !d.empty()) devices_[stage_] = d;
    } else if (stage_ < 0 && detail::latest_stage_below<N>() >= 0) {
      placed_ = true;
      stage_ = stage_of_v<N>;
    }
    const int id = root_here(n);
    stage_ = outer;
    return id;
  }
  template <class N>
  int root_here(const N& n) {
    constexpr node_kind k = N::kind;
    if constexpr (k == node_kind::scalar || k == node_kind::elementwise || k == node_kind::shape_scalar) {
      const int cluster = clusters_++;
      const int id = fused(n, cluster);
      seen_.add(n, id);
      return id;
    } else {
      std::vector<int> ins;
      if constexpr (requires { n.operands(); })
        std::apply([&](const auto&... o) { (ins.push_back(root(o)), ...); }, n.operands());
      const int id = add(n, -1, true);
      for (int i : ins) edge(i, id);
      seen_.add(n, id);
      return id;
    }
  }

  std::string str() const {
    std::ostringstream o;
    o << "digraph gradus {\n  rankdir=BT;\n  node [fontname=\"Helvetica\", fontsize=10];\n";
    int last_stage = -1;
    for (const auto& n : nodes_) last_stage = std::max(last_stage, n.stage);
    for (int st = placed_ ? 0 : -1; st <= (placed_ ? last_stage : -1); ++st) {
      const std::string in = placed_ ? "    " : "  ";
      if (placed_) {
        const auto d = devices_.find(st);
        o << "  subgraph cluster_stage_" << st << " {\n    label=\"stage " << st
          << (d == devices_.end() ? std::string() : " (" + d->second + ")") << "\";\n    style=rounded;\n";
      }
      for (int c = -1; c < clusters_; ++c) {
        bool any = false;
        for (const auto& n : nodes_) any = any || (n.cluster == c && n.stage == st);
        if (!any) continue;
        if (c >= 0) o << in << "subgraph cluster_" << c << " {\n" << in << "  label=\"fused pass " << c << "\";\n" << in << "  style=dashed;\n";
        for (const auto& n : nodes_)
          if (n.cluster == c && n.stage == st)
            o << in << (c >= 0 ? "  " : "") << "n" << n.id << " [label=\"" << n.label << "\", shape="
              << (n.stored ? "box" : "ellipse") << "];\n";
        if (c >= 0) o << in << "}\n";
      }
      if (placed_) o << "  }\n";
    }
    // an edge between stages goes through a transfer node (stage a sends, stage b receives)
    int transfers = 0;
    for (const auto& [a, b] : edges_) {
      const auto& from = nodes_[static_cast<std::size_t>(a)];
      const auto& to = nodes_[static_cast<std::size_t>(b)];
      if (!placed_ || from.stage == to.stage) {
        o << "  n" << a << " -> n" << b << ";\n";
        continue;
      }
      o << "  t" << transfers << " [label=\"transfer stage " << from.stage << " -> " << to.stage << "\\n" << from.shape
        << "\", shape=cds, style=filled, fillcolor=lightyellow];\n";
      o << "  n" << a << " -> t" << transfers << ";\n  t" << transfers << " -> n" << b << ";\n";
      ++transfers;
    }
    o << "}\n";
    return o.str();
  }

 private:
  struct node_rec {
    int id;
    int cluster;
    bool stored;
    std::string label;
    int stage;
    std::string shape;  // "(?, 16) float32"
  };
  std::vector<node_rec> nodes_;
  std::vector<std::pair<int, int>> edges_;
  node_registry seen_;
  int clusters_ = 0;
  int stage_ = -1;       ///< the stage of the node being drawn (-1: none)
  bool placed_ = false;  ///< a placement was seen
  std::map<int, std::string> devices_;  ///< a stage's device, where its placement names one

  template <class N>
  int add(const N& n, int cluster, bool stored) {
    std::string label = N::op_name;
    if constexpr (requires { N::name.view(); }) label += " '" + std::string(N::name.view()) + "'";
    if constexpr (N::kind == node_kind::scalar) {
      std::ostringstream v;
      v << n.value;
      label.append(" ").append(v.str());
    }
    // appended piecewise: g++ 12 warns falsely (-Wrestrict) on `label += " " + v.str()` once inlined
    std::string sh = static_shape_label<shape_t<N>>();
    sh.append(" ").append(dtype_name<value_t<N>>());
    label.append("\\n").append(sh);
    const int id = static_cast<int>(nodes_.size());
    nodes_.push_back({id, cluster, stored, label, stage_, sh});
    return id;
  }
  void edge(int from, int to) { edges_.emplace_back(from, to); }

  /// An elementwise subtree: its nodes join `cluster`; stored nodes under it are roots.
  template <class N>
  int fused(const N& n, int cluster) {
    std::vector<int> ins;
    if constexpr (N::kind == node_kind::elementwise) {
      std::apply([&](const auto&... c) { (ins.push_back(fused_child(c, cluster)), ...); }, n.children());
    } else if constexpr (N::kind == node_kind::shape_scalar) {
      ins.push_back(root(std::get<0>(n.operands())));
    }
    const int id = add(n, cluster, false);
    for (int i : ins) edge(i, id);
    return id;
  }
  template <class N>
  int fused_child(const N& n, int cluster) {
    if constexpr (N::kind == node_kind::scalar || N::kind == node_kind::elementwise ||
                  N::kind == node_kind::shape_scalar)
      return fused(n, cluster);
    else
      return root(n);
  }
};

}  // namespace detail

/// Graphviz DOT of the forward (and, with gradients among the outputs, backward) graph.
template <expression... Outs>
std::string to_dot(const Outs&... outs) {
  detail::dot_writer w;
  (w.root(outs), ...);
  return w.str();
}

}  // namespace gradus
