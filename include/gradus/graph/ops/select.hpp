#pragma once
// select(x, i): x[i] along the leading axis, as PyTorch's x.select(0, i) — a view of
// x's buffer from element i * (row size) on, no copy. A negative i counts from the end
// (select(hs, -1): the last time step). Its adjoint, select_backward(g, i, like), is
// zeros of like's shape with g written at entry i.
#include <string>
#include <tuple>

#include "gradus/core/device.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

namespace detail {
/// x = v, as a for_each rule. At namespace scope, not nested in a node: a GPU kernel's type
/// names its rule, and nvcc cannot spell a kernel over a type nested in an expression type.
template <class T>
struct fill_rule {
  T v;
  template <class X>
  GRADUS_HD void operator()(X& x) const {
    x = X(v);
  }
};
}  // namespace detail

namespace detail {
template <class S>
struct tail_extents {
  static constexpr std::array<index_t, (S::rank > 0 ? S::rank - 1 : 0)> value = [] {
    std::array<index_t, (S::rank > 0 ? S::rank - 1 : 0)> r{};
    for (std::size_t k = 1; k < S::rank; ++k) r[k - 1] = S::extents[k];
    return r;
  }();
};
/// i in [-n, n) as an entry of [0, n), or an index_error naming the op and the shape.
inline index_t leading_index(const char* op, index_t i, const dims& d) {
  const index_t n = d.rank ? d.d[0] : 0;
  if (i < -n || i >= n)
    throw index_error(std::string("gradus: ") + op + ": index " + std::to_string(i) + " is outside [" +
                      std::to_string(-n) + ", " + std::to_string(n) + ") of the leading axis of shape " +
                      to_string(d));
  return i < 0 ? i + n : i;
}
inline dims tail_dims(const dims& d) {
  dims r;
  r.rank = d.rank - 1;
  for (std::size_t k = 1; k < d.rank; ++k) r.d[k - 1] = d.d[k];
  return r;
}
}  // namespace detail

template <class A>
struct select_node : expr_base {
  static_assert(rank_v<A> >= 1, "gradus: select: the operand needs rank >= 1");
  using value_type = value_t<A>;
  using shape_type = shape_of_array<detail::tail_extents<shape_t<A>>>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "select";
  A a;
  index_t index;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tie(a); }
  dims infer(const dims& in) const {
    detail::leading_index(op_name, index, in);
    return detail::tail_dims(in);
  }
  index_t offset(const dims& in) const {
    const index_t i = detail::leading_index(op_name, index, in);
    return i * detail::tail_dims(in).numel();
  }
  bool operator==(const select_node&) const = default;
};

/// select(a, i): a[i] (the leading axis dropped); i < 0 counts from the end. A view, no
/// copy; rank >= 1; an i outside [-n, n) is an index_error at run time. Gradient:
/// select_backward(g, i, a), zeros of a's shape with g at entry i.
template <expression A>
auto select(const A& a, index_t i) {
  return select_node<A>{{}, a, i};
}

/// zeros shaped like `like`, with g at like[i]; `like` lends its dims only.
template <class G, class Like>
struct select_backward_node : expr_base {
  static_assert(rank_v<Like> == rank_v<G> + 1, "gradus: select_backward: g must have the rank of like[i]");
  static_assert(std::is_same_v<value_t<G>, value_t<Like>>, "gradus: select_backward: g and like differ in dtype");
  using value_type = value_t<Like>;
  using shape_type = shape_t<Like>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "select_backward";
  G g;
  Like like;
  index_t index;
  auto operands() const { return std::tie(g, like); }
  auto children() const { return std::tie(g); }  // like's values are not read
  dims infer(const dims& gd, const dims& ld) const {
    detail::leading_index(op_name, index, ld);
    if (!(gd == detail::tail_dims(ld)))
      throw shape_error("gradus: select_backward: g of shape " + to_string(gd) + " is not an entry of shape " +
                        to_string(ld));
    return ld;
  }
  template <class Backend>
  void compute(value_type* out, const dims& d, tensor_view<const value_type> g_in, tensor_view<const value_type>) const {
    Backend::for_each(d.numel(), detail::fill_rule<value_type>{value_type(0)}, out);
    const index_t row = g_in.size();
    Backend::copy(out + detail::leading_index(op_name, index, d) * row, g_in.data(),
                  static_cast<std::size_t>(row) * sizeof(value_type));
  }
  bool operator==(const select_backward_node&) const = default;

};

/// select_backward(g, i, like): zeros shaped like `like` with g written at like[i] (i < 0
/// counts from the end); like lends its dims only. g has like[i]'s rank and dtype (checked
/// at compile time) and dims (a shape_error otherwise). Gradient: select(g, i).
template <expression G, expression Like>
auto select_backward(const G& g, index_t i, const Like& like) {
  return select_backward_node<G, Like>{{}, g, like, i};
}

}  // namespace gradus
