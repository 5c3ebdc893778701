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

/// Anything with contiguous data() and shape(): xt::xtensor, xt::xarray, xt::adapt(...),
/// std::mdspan-like wrappers. Non-contiguous strides are refused when they can be seen.
template <class X>
inline constexpr bool is_tensor_view_v = false;
template <class T>
inline constexpr bool is_tensor_view_v<tensor_view<T>> = true;

template <class X>
concept tensor_like = is_tensor_view_v<std::remove_cvref_t<X>> || requires(const X& x) {
  { x.data() };
  { x.shape() };
};

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

template <class T, std::size_t R>
tensor_view<const T> view(const T* data, const std::array<index_t, R>& shape) {
  return {data, dims(shape)};
}
template <class T>
tensor_view<const T> view(const T* data, std::initializer_list<index_t> shape) {
  return {data, dims(shape)};
}

/// The binding of one placeholder for one run: a pointer and the fed dims.
template <fixed_string Name, class T, class S>
struct feed {
  using feed_tag = void;  ///< is_feed_v (exec/session.hpp)
  static constexpr auto name = Name;
  using value_type = T;
  using shape_type = S;
  const T* data;
  dims d;
};

template <fixed_string Name, class T, index_t... E>
struct placeholder : expr_base {
  static_assert(dtype<T>, "gradus: placeholder dtype must be float, double or int32_t");
  static_assert(sizeof...(E) <= max_rank, "gradus: placeholder rank above max_rank");
  static_assert(((E >= 0 || E == dyn) && ...), "gradus: placeholder extents must be >= 0 or dyn");
  using value_type = T;
  using shape_type = shape<E...>;
  static constexpr node_kind kind = node_kind::placeholder;
  static constexpr auto name = Name;
  static constexpr const char* op_name = "placeholder";

  /// `x = tensor` binds a feed for one run. Dtype is checked here, extents when bound.
  template <tensor_like X>
  feed<Name, T, shape_type> operator=(const X& x) const {
    static_assert(std::is_same_v<tensor_elem_t<X>, T>,
                  "gradus: a feed's dtype differs from its placeholder's (see the placeholder type above)");
    return {x.data(), dims_of(x, "feed of placeholder", Name.view())};
  }
  bool operator==(const placeholder&) const = default;
};

template <fixed_string Name, class T, index_t... E>
struct variable : expr_base {
  static_assert(real_dtype<T>, "gradus: variable dtype must be float or double");
  static_assert(((E >= 0) && ...), "gradus: variable extents must all be static (no dyn)");
  using value_type = T;
  using shape_type = shape<E...>;
  static constexpr node_kind kind = node_kind::variable;
  static constexpr auto name = Name;
  static constexpr const char* op_name = "variable";
  using variable_tag = void;  ///< is_variable_v (train/train_step.hpp)
  bool operator==(const variable&) const = default;
};

/// A tensor held by the expression (shared, immutable: copies of the expression share it).
template <class T, std::size_t R>
struct constant_tensor : expr_base {
  using value_type = T;
  using shape_type = dyn_shape_t<R>;
  static constexpr node_kind kind = node_kind::constant;
  static constexpr const char* op_name = "constant";
  std::shared_ptr<const std::vector<T>> values;
  dims d;
  bool operator==(const constant_tensor& o) const { return values == o.values; }
};

template <class T>
struct scalar : expr_base {
  using value_type = T;
  using shape_type = shape<>;
  static constexpr node_kind kind = node_kind::scalar;
  static constexpr const char* op_name = "scalar";
  T value;
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
