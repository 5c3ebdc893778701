#pragma once
// Index ops: one_hot (int32 labels -> 0/1 rows) and gather (rows of a table by index).
// Out-of-range indices are an index_error naming the op, the position and the value.
#include <cstdint>
#include <string>

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

// one_hot<Depth, T = float>(labels): [..., Depth] with 1 at each label.
template <index_t Depth, class T = float, expression Y>
auto one_hot(const Y& y) {
  return one_hot_node<T, Depth, Y>{{}, y};
}

template <class Tab, class Idx>
struct gather_node : expr_base {
  static_assert(std::is_same_v<value_t<Idx>, std::int32_t>, "gradus: gather: indices must be int32");
  static_assert(rank_v<Tab> >= 1, "gradus: gather: the table needs rank >= 1");
  using value_type = value_t<Tab>;
  using shape_type = shape_of_array<detail::gather_extents<shape_t<Tab>, shape_t<Idx>>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "gather";
  Tab table;
  Idx idx;
  auto operands() const { return std::tie(table, idx); }
  auto children() const { return std::tie(table, idx); }
  dims infer(const dims& t, const dims& i) const {
    dims r = i;
    for (std::size_t k = 1; k < t.rank; ++k) r.d[r.rank++] = t.d[k];
    return r;
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> t,
               tensor_view<const std::int32_t> i) const {
    const index_t row = t.shape.d[0] ? t.size() / t.shape.d[0] : 0;
    Backend::gather(t.data(), t.shape.d[0], row, i.data(), i.size(), out);
  }
  bool operator==(const gather_node&) const = default;
};

// gather(table, idx): out[i, ...] = table[idx[i], ...].
template <expression Tab, expression Idx>
auto gather(const Tab& table, const Idx& idx) {
  return gather_node<Tab, Idx>{{}, table, idx};
}

}  // namespace gradus
