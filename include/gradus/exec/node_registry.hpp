#pragma once
// Nodes seen while walking an expression, found again by structure: same type and equal
// parameters (`==`). The planner shares a buffer between such nodes; to_dot draws them once.
#include <typeindex>
#include <vector>

namespace gradus::detail {

class node_registry {
 public:
  /// The id remembered for a node equal to n in context `context`, or -1.
  template <class N>
  int find(const N& n, int context = 0) const {
    for (const auto& e : entries_)
      if (e.type == typeid(N) && e.context == context && e.equal(e.node, &n)) return e.id;
    return -1;
  }
  /// Remember n (which must outlive the registry) under id, in context `context` (the planner's:
  /// the precision a node's kernels run in, so that one node under two precision scopes is two
  /// steps).
  template <class N>
  void add(const N& n, int id, int context = 0) {
    entries_.push_back({typeid(N), &n, [](const void* a, const void* b) {
                          return *static_cast<const N*>(a) == *static_cast<const N*>(b);
                        },
                        id, context});
  }

 private:
  struct entry {
    std::type_index type;
    const void* node;
    bool (*equal)(const void*, const void*);
    int id;
    int context;
  };
  std::vector<entry> entries_;
};

}  // namespace gradus::detail
