#pragma once
// cpu_simd: xtensor interop (a result as an xt::xarray / xt::xtensor copy, or a zero-copy view).
#include <xtensor/xadapt.hpp>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include "gradus/core/error.hpp"
#include "gradus/graph/leaves.hpp"

namespace gradus {

// ---- xtensor interop ---------------------------------------------------------------------

/// A copy of a result as an xt::xarray.
template <class T>
xt::xarray<std::remove_const_t<T>> to_xarray(const tensor_view<T>& v) {
  const std::vector<std::size_t> shape(v.shape().begin(), v.shape().end());
  xt::xarray<std::remove_const_t<T>> r(shape);
  std::copy(v.begin(), v.end(), r.begin());
  return r;
}

/// A copy of a result as an xt::xtensor of rank R (the rank must match).
template <std::size_t R, class T>
xt::xtensor<std::remove_const_t<T>, R> to_xtensor(const tensor_view<T>& v) {
  if (v.shape().rank != R)
    throw shape_error("gradus: to_xtensor<" + std::to_string(R) + ">: the result has shape " + to_string(v.shape()));
  std::array<std::size_t, R> shape{};
  for (std::size_t i = 0; i < R; ++i) shape[i] = static_cast<std::size_t>(v.shape().d[i]);
  xt::xtensor<std::remove_const_t<T>, R> r(shape);
  std::copy(v.begin(), v.end(), r.begin());
  return r;
}

/// A zero-copy xtensor view of a result (valid until the buffer's next run).
template <class T>
auto adapt(const tensor_view<T>& v) {
  const std::vector<std::size_t> shape(v.shape().begin(), v.shape().end());
  return xt::adapt(v.data(), static_cast<std::size_t>(v.size()), xt::no_ownership(), shape);
}

}  // namespace gradus
