#pragma once
// Leaves: placeholder (fed per run), variable (owned by a session), constant (held by the
// expression), scalar (a number broadcast everywhere). A leaf's name is its identity.
#include <cstring>
#include <memory>
#include <ranges>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/fixed_string.hpp"
#include "gradus/core/tensor_view.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

/// Whether X is a tensor_view (of any element type).
template <class X>
inline constexpr bool is_tensor_view_v = false;
/// A tensor_view is one.
template <class T>
inline constexpr bool is_tensor_view_v<tensor_view<T>> = true;

/// Anything with contiguous data() and shape(): xt::xtensor, xt::xarray, xt::adapt(...),
/// std::mdspan-like wrappers. Non-contiguous strides are refused when they can be seen.
template <class X>
concept tensor_like = is_tensor_view_v<std::remove_cvref_t<X>> || requires(const X& x) {
  { x.data() };
  { x.shape() };
};

/// The element type of a tensor_like X: what its data() points to, without const.
template <class X>
using tensor_elem_t = std::remove_cv_t<std::remove_pointer_t<decltype(std::declval<const X&>().data())>>;

/// `what` and `name` describe the tensor in an error ("feed of placeholder 'x'"); the
/// message is only built when thrown, so binding a feed allocates nothing.
template <class X>
dims dims_of(const X& x, std::string_view what, std::string_view name = {}) {
  if constexpr (is_tensor_view_v<std::remove_cvref_t<X>>) {
    return x.shape();
  } else {
    const auto who = [&] {
      return std::string(what) + (name.empty() ? std::string() : " '" + std::string(name) + "'");
    };
    dims d;
    const auto& sh = x.shape();
    if (std::size(sh) > max_rank)
      throw feed_error("gradus: " + who() + ": rank " + std::to_string(std::size(sh)) +
                       " is above the supported maximum");
    d.rank = std::size(sh);
    std::size_t i = 0;
    for (auto v : sh) d.d[i++] = static_cast<index_t>(v);
    if constexpr (requires { x.strides(); }) {
      index_t expect = 1;
      const auto& st = x.strides();
      for (std::size_t k = d.rank; k-- > 0;) {
        if (d.d[k] > 1 && static_cast<index_t>(st[k]) != expect)
          throw feed_error("gradus: " + who() +
                           ": the tensor is not contiguous row-major; copy it into an xt::xtensor first");
        expect *= d.d[k];
      }
    }
    return d;
  }
}

/// Any tensor_like (an xt::xtensor, a result) as a view of its elements; `what` names it in
/// the error a non-contiguous or too high-ranked tensor gets.
template <tensor_like X>
tensor_view<const tensor_elem_t<X>> as_view(const X& x, std::string_view what) {
  return {x.data(), dims_of(x, what)};
}

/// The elements at `data` seen as a row-major tensor of extents `shape` (no copy: the
/// caller keeps them alive), e.g. to feed or assign from a plain buffer.
template <class T, std::size_t R>
tensor_view<const T> view(const T* data, const std::array<index_t, R>& shape) {
  return {data, dims(shape)};
}
/// The same with the extents listed: `view(p, {2, 3})`.
template <class T>
tensor_view<const T> view(const T* data, std::initializer_list<index_t> shape) {
  return {data, dims(shape)};
}

/// The binding of one placeholder for one run: a pointer and the fed dims.
template <fixed_string Name, class T, class S>
struct feed {
  using feed_tag = void;  ///< is_feed_v (exec/session.hpp)
  static constexpr auto name = Name;  ///< the placeholder's name, which the run matches the feed by
  using value_type = T;               ///< the placeholder's dtype
  using shape_type = S;               ///< the placeholder's static shape, which `d` must fit
  const T* data;                      ///< the fed elements, row-major (not owned: kept alive by the caller for the run)
  dims d;                             ///< the fed extents
};

/// An input fed for each run: `placeholder<"x", float, dyn, 784>` is named "x", has dtype
/// float, double or int32, and extents that are >= 0 or `dyn` (bound by the feed, at most
/// max_rank of them). `x = tensor` makes a run's feed; a run that needs x without one throws
/// feed_error, as does a feed whose extents do not fit.
template <fixed_string Name, class T, index_t... E>
struct placeholder : expr_base {
  static_assert(dtype<T>, "gradus: placeholder dtype must be float, double or int32_t");
  static_assert(sizeof...(E) <= max_rank, "gradus: placeholder rank above max_rank");
  static_assert(((E >= 0 || E == dyn) && ...), "gradus: placeholder extents must be >= 0 or dyn");
  using value_type = T;                                      ///< the dtype
  using shape_type = shape<E...>;                            ///< the static shape
  static constexpr node_kind kind = node_kind::placeholder;  ///< a leaf whose storage is the feed
  static constexpr auto name = Name;                         ///< the name feeds are matched by
  static constexpr const char* op_name = "placeholder";      ///< its label in errors, traces and graph drawings

  /// `x = tensor` binds a feed for one run. Dtype is checked here, extents when bound.
  template <tensor_like X>
  feed<Name, T, shape_type> operator=(const X& x) const {
    static_assert(std::is_same_v<tensor_elem_t<X>, T>,
                  "gradus: a feed's dtype differs from its placeholder's (see the placeholder type above)");
    return {x.data(), dims_of(x, "feed of placeholder", Name.view())};
  }
  /// Always true: a placeholder's name, dtype and shape are its type.
  bool operator==(const placeholder&) const = default;
};

/// A parameter held by a session, not by the expression: `variable<"w", float, 784, 256>` is
/// named "w", has dtype float or double and static extents. A session stores its value under
/// the name (assign, initialize, a checkpoint, an optimizer's update); a run that reads it
/// before it has one, or with other dims or dtype, throws feed_error.
template <fixed_string Name, class T, index_t... E>
struct variable : expr_base {
  static_assert(real_dtype<T>, "gradus: variable dtype must be float or double");
  static_assert(((E >= 0) && ...), "gradus: variable extents must all be static (no dyn)");
  using value_type = T;                                   ///< the dtype
  using shape_type = shape<E...>;                         ///< the shape (static)
  static constexpr node_kind kind = node_kind::variable;  ///< a leaf whose storage is the session's
  static constexpr auto name = Name;                      ///< the name the session stores the value under
  static constexpr const char* op_name = "variable";      ///< its label in errors, traces and graph drawings
  using variable_tag = void;  ///< is_variable_v (train/train_step.hpp)
  /// Always true: a variable's name, dtype and shape are its type.
  bool operator==(const variable&) const = default;
};

/// A tensor held by the expression (shared, immutable: copies of the expression share it).
template <class T, std::size_t R>
struct constant_tensor : expr_base {
  using value_type = T;                                   ///< the dtype
  using shape_type = dyn_shape_t<R>;                      ///< rank R, every extent `dyn`: the extents are `d`
  static constexpr node_kind kind = node_kind::constant;  ///< a leaf with storage of its own
  static constexpr const char* op_name = "constant";      ///< its label in errors, traces and graph drawings
  std::shared_ptr<const std::vector<T>> values;           ///< the elements, row-major
  dims d;                                                 ///< their extents
  /// The same storage (copies of one constant), not equal values.
  bool operator==(const constant_tensor& o) const { return values == o.values; }
};

/// A number of dtype T broadcast over any shape: rank 0, folded into the fused elementwise
/// passes. A plain number next to an expression (`x * 2`) becomes one of the expression's
/// dtype; constant(v) makes one.
template <class T>
struct scalar : expr_base {
  using value_type = T;                                 ///< the dtype
  using shape_type = shape<>;                           ///< rank 0
  static constexpr node_kind kind = node_kind::scalar;  ///< folded into the passes that read it
  static constexpr const char* op_name = "scalar";      ///< its label in errors, traces and graph drawings
  T value;                                              ///< the number
  /// Equal numbers.
  bool operator==(const scalar&) const = default;
};

/// constant(x): a copy of a tensor-like x (rank fixed at compile time, e.g. xt::xtensor).
template <tensor_like X>
  requires requires { std::tuple_size<std::remove_cvref_t<decltype(std::declval<const X&>().shape())>>::value; }
auto constant(const X& x) {
  using T = tensor_elem_t<X>;
  constexpr std::size_t R = std::tuple_size_v<std::remove_cvref_t<decltype(x.shape())>>;
  constant_tensor<T, R> c;
  c.d = dims_of(x, "constant");
  c.values = std::make_shared<const std::vector<T>>(x.data(), x.data() + c.d.numel());
  return c;
}

/// constant(v): a scalar.
template <dtype T>
scalar<T> constant(T v) {
  return {{}, v};
}

}  // namespace gradus
