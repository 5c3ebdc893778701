#pragma once
// to_dot(outputs...): the graph the compiler built, as Graphviz DOT (`dot -Tsvg`).
// Boxes are materialised nodes (leaves, kernels, views), ellipses are elementwise nodes,
// and each fused pass is a cluster: everything inside it runs as one loop. Nodes that
// the planner would share (same type, equal parameters) are drawn once, as they run.
#include <sstream>
#include <string>
#include <typeindex>
#include <vector>

#include "gradus/exec/node_registry.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

namespace detail {

template <class S>
std::string static_shape_label() {
  return to_string(static_dims<S>());
}

class dot_writer {
 public:
  template <class N>
  int root(const N& n) {
    if (int id = seen_.find(n); id >= 0) return id;
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
    for (int c = -1; c < clusters_; ++c) {
      if (c >= 0) o << "  subgraph cluster_" << c << " {\n    label=\"fused pass " << c << "\";\n    style=dashed;\n";
      for (const auto& n : nodes_)
        if (n.cluster == c)
          o << (c >= 0 ? "    " : "  ") << "n" << n.id << " [label=\"" << n.label << "\", shape="
            << (n.stored ? "box" : "ellipse") << "];\n";
      if (c >= 0) o << "  }\n";
    }
    for (const auto& [a, b] : edges_) o << "  n" << a << " -> n" << b << ";\n";
    o << "}\n";
    return o.str();
  }

 private:
  struct node_rec {
    int id;
    int cluster;
    bool stored;
    std::string label;
  };
  std::vector<node_rec> nodes_;
  std::vector<std::pair<int, int>> edges_;
  node_registry seen_;
  int clusters_ = 0;

  template <class N>
  int add(const N& n, int cluster, bool stored) {
    std::string label = N::op_name;
    if constexpr (requires { N::name.view(); }) label += " '" + std::string(N::name.view()) + "'";
    if constexpr (N::kind == node_kind::scalar) {
      std::ostringstream v;
      v << n.value;
      label += " " + v.str();
    }
    label += "\\n" + static_shape_label<shape_t<N>>() + " " + std::string(dtype_name<value_t<N>>());
    const int id = static_cast<int>(nodes_.size());
    nodes_.push_back({id, cluster, stored, label});
    return id;
  }
  void edge(int from, int to) { edges_.emplace_back(from, to); }

  // An elementwise subtree: its nodes join `cluster`; stored nodes under it are roots.
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

// Graphviz DOT of the forward (and, with gradients among the outputs, backward) graph.
template <expression... Outs>
std::string to_dot(const Outs&... outs) {
  detail::dot_writer w;
  (w.root(outs), ...);
  return w.str();
}

}  // namespace gradus
