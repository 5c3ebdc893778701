#pragma once
// Index ops: one_hot (int32 labels -> 0/1 rows), gather (rows of a table by index) and
// scatter_add (rows added into zeros at an index: gather's adjoint w.r.t. the table).
// embedding_lookup is gather whose table gradient is marked sparse (tf.nn.embedding_lookup,
// PyTorch's Embedding(sparse=True)): evaluated, that gradient is the same dense
// scatter_add; a train_step (train/train_step.hpp) instead fetches its rows and indices
// and updates only the rows the batch named.
// Out-of-range indices are an index_error naming the op, the position and the value.
#include <cstdint>
#include <string>
#include <tuple>

#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

namespace detail {
template <class S, index_t Depth>
struct one_hot_extents {
  static constexpr std::array<index_t, S::rank + 1> value = [] {
    std::array<index_t, S::rank + 1> r{};
    for (std::size_t i = 0; i < S::rank; ++i) r[i] = S::extents[i];
    r[S::rank] = Depth;
    return r;
  }();
};
template <class ST, class SI>
struct gather_extents {
  static constexpr std::array<index_t, SI::rank + ST::rank - 1> value = [] {
    std::array<index_t, SI::rank + ST::rank - 1> r{};
    for (std::size_t i = 0; i < SI::rank; ++i) r[i] = SI::extents[i];
    for (std::size_t i = 1; i < ST::rank; ++i) r[SI::rank + i - 1] = ST::extents[i];
    return r;
  }();
};
/// SA's static extents and b agree wherever both are known (dyn fits any extent).
template <class SA, std::size_t N>
constexpr bool extents_agree(const std::array<index_t, N>& b) {
  if constexpr (SA::rank != N) {
    return false;
  } else {
    for (std::size_t k = 0; k < N; ++k)
      if (SA::extents[k] != dyn && b[k] != dyn && SA::extents[k] != b[k]) return false;
    return true;
  }
}
/// The run-time dims of gather(table, idx): idx's, then the table's after its first.
inline dims gather_dims(const dims& t, const dims& i) {
  dims r = i;
  for (std::size_t k = 1; k < t.rank; ++k) r.d[r.rank++] = t.d[k];
  return r;
}
}  // namespace detail

template <class T, index_t Depth, class Y>
struct one_hot_node : expr_base {
  static_assert(std::is_same_v<value_t<Y>, std::int32_t>, "gradus: one_hot: indices must be int32");
  static_assert(Depth > 0, "gradus: one_hot: depth must be positive");
  using value_type = T;
  using shape_type = shape_of_array<detail::one_hot_extents<shape_t<Y>, Depth>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "one_hot";
  Y y;
  auto operands() const { return std::tie(y); }
  auto children() const { return std::tie(y); }
  dims infer(const dims& in) const {
    dims r = in;
    r.d[r.rank++] = Depth;
    return r;
  }
  template <class Backend>
  void compute(T* out, const dims&, tensor_view<const std::int32_t> in) const {
    Backend::one_hot(in.data(), in.size(), Depth, out);
  }
  bool operator==(const one_hot_node&) const = default;
};

/// one_hot<Depth, T = float>(labels): [..., Depth] with 1 at each label, 0 elsewhere;
/// labels int32 of any shape, a label outside [0, Depth) is an index_error. No gradient.
template <index_t Depth, class T = float, expression Y>
auto one_hot(const Y& y) {
  return one_hot_node<T, Depth, Y>{{}, y};
}

template <class Tab, class Idx, bool SparseGrad = false>
struct gather_node : expr_base {
  static_assert(std::is_same_v<value_t<Idx>, std::int32_t>, "gradus: gather: indices must be int32");
  static_assert(rank_v<Tab> >= 1, "gradus: gather: the table needs rank >= 1");
  using value_type = value_t<Tab>;
  using shape_type = shape_of_array<detail::gather_extents<shape_t<Tab>, shape_t<Idx>>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = SparseGrad ? "embedding_lookup" : "gather";
  static constexpr bool sparse_grad = SparseGrad;
  Tab table;
  Idx idx;
  auto operands() const { return std::tie(table, idx); }
  auto children() const { return std::tie(table, idx); }
  dims infer(const dims& t, const dims& i) const {
    return detail::gather_dims(t, i);
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> t,
               tensor_view<const std::int32_t> i) const {
    const index_t row = t.shape().d[0] ? t.size() / t.shape().d[0] : 0;
    Backend::gather(t.data(), t.shape().d[0], row, i.data(), i.size(), out);
  }
  bool operator==(const gather_node&) const = default;
};

/// gather(table, idx): out[i, ...] = table[idx[i], ...]. idx is int32 of any shape; the
/// result's extents are idx's, then the table's after its first. An index outside [0, rows)
/// is an index_error. Gradient: scatter_add(g, idx, table) to the table (a repeated index
/// accumulates), none to idx.
template <expression Tab, expression Idx>
auto gather(const Tab& table, const Idx& idx) {
  return gather_node<Tab, Idx>{{}, table, idx};
}

/// embedding_lookup(table, idx): gather, with a sparse-row gradient w.r.t. the table
/// (sparse_rows(g, idx, table): a train_step updates only the rows idx names).
template <expression Tab, expression Idx>
auto embedding_lookup(const Tab& table, const Idx& idx) {
  return gather_node<Tab, Idx, true>{{}, table, idx};
}

/// out = zeros shaped like `like`; out[idx[i], ...] += updates[i, ...] for every position i
/// of idx, in order (a repeated index accumulates). The adjoint of gather w.r.t. its table.
/// `like` lends its dims only: its values are never read. Sparse marks the gradient of an
/// embedding_lookup: the same values, but a train_step reads the updates and indices
/// instead (a sparse-row gradient, as TensorFlow's IndexedSlices).
template <class Upd, class Idx, class Like, bool Sparse = false>
struct scatter_add_node : expr_base {
  static_assert(std::is_same_v<value_t<Idx>, std::int32_t>, "gradus: scatter_add: indices must be int32");
  static_assert(rank_v<Like> >= 1, "gradus: scatter_add: the target needs rank >= 1");
  static_assert(std::is_same_v<value_t<Upd>, value_t<Like>>,
                "gradus: scatter_add: the updates and the target have different dtypes");
  static_assert(detail::extents_agree<shape_t<Upd>>(detail::gather_extents<shape_t<Like>, shape_t<Idx>>::value),
                "gradus: scatter_add: the updates must have the shape gather(target, idx) would have");
  using value_type = value_t<Like>;
  using shape_type = shape_t<Like>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "scatter_add";
  static constexpr bool sparse = Sparse;
  Upd updates;
  Idx idx;
  Like like;
  auto operands() const { return std::tie(updates, idx, like); }
  auto children() const { return std::tie(updates, idx); }  // like's values are not read
  dims infer(const dims& u, const dims& i, const dims& t) const {
    if (!(u == detail::gather_dims(t, i)))
      throw shape_error("gradus: scatter_add: updates of shape " + to_string(u) + " do not fit indices of shape " +
                        to_string(i) + " into a target of shape " + to_string(t) + " (expected " +
                        to_string(detail::gather_dims(t, i)) + ")");
    return t;
  }
  template <class Backend>
  void compute(value_type* out, const dims& d, tensor_view<const value_type> u, tensor_view<const std::int32_t> i,
               tensor_view<const value_type>) const {
    const index_t rows = d.d[0], row = rows ? d.numel() / rows : 0;
    Backend::scatter_add(u.data(), i.data(), i.size(), row, out, rows);
  }
  bool operator==(const scatter_add_node&) const = default;
};

/// scatter_add(updates, idx, like): zeros of like's shape with updates' rows added at idx;
/// updates has gather(like, idx)'s shape (checked at compile time where static, else a
/// shape_error), an index outside [0, rows) is an index_error. Gradient: gather(g, idx) to
/// the updates, none to idx.
template <expression Upd, expression Idx, expression Like>
auto scatter_add(const Upd& updates, const Idx& idx, const Like& like) {
  return scatter_add_node<Upd, Idx, Like>{{}, updates, idx, like};
}
/// The same, marked as a sparse-row gradient (what embedding_lookup's rule returns).
template <expression Upd, expression Idx, expression Like>
auto sparse_rows(const Upd& updates, const Idx& idx, const Like& like) {
  return scatter_add_node<Upd, Idx, Like, true>{{}, updates, idx, like};
}

}  // namespace gradus
