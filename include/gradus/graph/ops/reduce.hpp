#pragma once
// Reductions: sum / mean / max / min / argmax over one axis (keepdims optional) or over
// all axes. Materialised; the backend sees them as [outer, n, inner] with n reduced.
#include <cstdint>
#include <string>
#include <tuple>

#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

/// What a reduction combines its elements with (argmax is a max that answers the index).
enum class reduce_kind { sum, mean, max, min };

inline constexpr int all_axes = 1000;  ///< the Axis of a reduction over every axis

namespace detail {
template <class S, int Axis, bool Keep>
struct reduced_extents {
  static constexpr std::size_t ax = [] {
    if constexpr (Axis == all_axes) return std::size_t(0);
    else return normalize_axis<Axis, S::rank>();
  }();
  static constexpr std::size_t out_rank = Axis == all_axes ? (Keep ? S::rank : 0) : (Keep ? S::rank : S::rank - 1);
  static constexpr std::array<index_t, out_rank> value = [] {
    std::array<index_t, out_rank> r{};
    std::size_t j = 0;
    for (std::size_t i = 0; i < S::rank; ++i) {
      const bool reduced = Axis == all_axes || i == ax;
      if (!reduced) r[j++] = S::extents[i];
      else if (Keep) r[j++] = 1;
    }
    return r;
  }();
};

/// [outer, n, inner] view of a reduction over `axis` (or everything).
struct reduce_geometry {
  index_t outer = 1, n = 1, inner = 1;
};
inline reduce_geometry reduce_split(const dims& d, int axis) {
  reduce_geometry g;
  if (axis == all_axes) {
    g.n = d.numel();
    return g;
  }
  const auto a = static_cast<std::size_t>(axis);
  for (std::size_t i = 0; i < a; ++i) g.outer *= d.d[i];
  g.n = d.d[a];
  for (std::size_t i = a + 1; i < d.rank; ++i) g.inner *= d.d[i];
  return g;
}
}  // namespace detail

template <reduce_kind K, bool Arg, int Axis, bool Keep, class A>
struct reduce_node : expr_base {
  static_assert(Arg || real_dtype<value_t<A>>, "gradus: reductions need a float or double operand");
  static_assert(Axis == all_axes || rank_v<A> > 0, "gradus: an axis reduction needs rank >= 1");
  using geometry = detail::reduced_extents<shape_t<A>, Axis, Keep>;
  using value_type = std::conditional_t<Arg, std::int32_t, value_t<A>>;
  using shape_type = shape_of_array<geometry>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = Arg ? "argmax"
                                         : K == reduce_kind::sum  ? "sum"
                                         : K == reduce_kind::mean ? "mean"
                                         : K == reduce_kind::max  ? "max"
                                                                  : "min";
  static constexpr int axis = Axis == all_axes ? all_axes : int(geometry::ax);
  static constexpr bool keepdims = Keep;
  A a;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tie(a); }
  dims infer(const dims& in) const {
    dims r;
    r.rank = geometry::out_rank;
    std::size_t j = 0;
    for (std::size_t i = 0; i < in.rank; ++i) {
      const bool reduced = axis == all_axes || int(i) == axis;
      if (!reduced) r.d[j++] = in.d[i];
      else if (Keep) r.d[j++] = 1;
    }
    if ((Arg || K == reduce_kind::max || K == reduce_kind::min) && detail::reduce_split(in, axis).n == 0 &&
        r.numel() != 0)
      throw shape_error(std::string("gradus: ") + op_name + ": reduction of zero elements (operand " +
                        to_string(in) + ") has no identity");
    return r;
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_t<A>> in) const {
    const auto g = detail::reduce_split(in.shape(), axis);
    if constexpr (Arg) Backend::argmax(in.data(), g.outer, g.n, g.inner, out);
    else Backend::reduce(K, in.data(), g.outer, g.n, g.inner, out);
  }
  bool operator==(const reduce_node&) const = default;
};

/// Defines the reduction NAME: NAME<Axis, Keep>(a) over one axis and NAME(a) over all of
/// them, for sum, mean, max, min and argmax below. Undefined after its uses.
#define GRADUS_REDUCTION(NAME, KIND, ARG)                               \
  template <int Axis, bool Keep = false, expression A>                  \
  auto NAME(const A& a) {                                               \
    return reduce_node<reduce_kind::KIND, ARG, Axis, Keep, A>{{}, a};   \
  }                                                                     \
  template <expression A>                                               \
  auto NAME(const A& a) {                                               \
    return reduce_node<reduce_kind::KIND, ARG, all_axes, false, A>{{}, a}; \
  }
// NAME<Axis, Keep = false>(a) reduces axis Axis (a negative one counts from the end), which
// the result drops, or keeps with extent 1 where Keep is true; NAME(a) reduces every axis to
// a rank-0 result. The operand is float or double (argmax also takes int32).
// sum: the sum. Gradient: g spread back over the reduced axes.
GRADUS_REDUCTION(sum, sum, false)
// mean: the mean. Gradient: g / n spread back, n the reduced count (read at run time).
GRADUS_REDUCTION(mean, mean, false)
// max: the largest element. Gradient: g spread back to the elements equal to the maximum,
// split evenly among ties (k tied elements get g / k each). Nothing to reduce: a shape_error.
GRADUS_REDUCTION(max, max, false)
// min: the smallest element. Gradient: as max's, to the elements equal to the minimum.
GRADUS_REDUCTION(min, min, false)
// argmax: the int32 index of the largest element along Axis (of all, in row-major order,
// for argmax(a)); ties go to the first, a NaN never wins over a number. No gradient.
// Nothing to reduce: a shape_error.
GRADUS_REDUCTION(argmax, max, true)
#undef GRADUS_REDUCTION

}  // namespace gradus
