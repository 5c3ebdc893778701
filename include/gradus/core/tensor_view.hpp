#pragma once
// tensor_view: a non-owning view of a contiguous row-major tensor. It is what
// session::run returns (one per output) and what a feed or an assignment can be.
//
//   auto y = s.run(out, x = input);   // y: tensor_view<const float>
//   y.shape()                         // dims: y.shape()[0], y.shape().size() (the rank)
//   y(i, j)                           // element (i, j), index-checked (gradus::error)
//   y[k]                              // element k in row-major order, unchecked
//   std::cout << y;                   // numpy-like: [[1 2 3]\n [4 5 6]], elided past 1000
//   gradus::to_xarray(y)              // an owning copy (to_xtensor<R>: rank R); adapt(y): a view
//                                     //   (backends/cpu_simd/xtensor.hpp)
//
// A result's bytes belong to the session: they stay valid until the next run of the same
// outputs (which writes into the same buffers), so copy what must outlive it (to_xarray,
// or std::vector(y.begin(), y.end())).
#include <algorithm>
#include <array>
#include <charconv>
#include <concepts>
#include <cstddef>
#include <ostream>
#include <string>
#include <type_traits>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"

namespace gradus {

/// A non-owning view of a contiguous row-major tensor: a pointer to T (const T for a
/// run's results) and the dims. What session::run returns, one per output; copying it
/// copies the pointer, not the elements. A result's elements belong to the session and stay
/// valid until the next run of the same outputs: copy what must outlive that.
template <class T>
class tensor_view {
 public:
  using value_type = std::remove_cv_t<T>;  ///< the element type, without const

  /// An empty view: no data, rank 0.
  tensor_view() = default;
  /// The numel() elements at `data`, row-major with dims `shape` (the caller keeps them alive).
  tensor_view(T* data, const dims& shape) : ptr_(data), shape_(shape) {}
  /// A view of T is a view of const T.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  tensor_view(const tensor_view<U>& v) : ptr_(v.data()), shape_(v.shape()) {}  // NOLINT(google-explicit-constructor)

  /// The first element.
  T* data() const { return ptr_; }
  /// The extents: shape()[k], shape().size() (the rank).
  const dims& shape() const { return shape_; }
  /// The number of dimensions.
  std::size_t rank() const { return shape_.rank; }
  /// The number of elements (the product of the extents).
  index_t size() const { return shape_.numel(); }

  /// Element k in row-major order (flat), unchecked.
  T& operator[](index_t k) const { return ptr_[k]; }

  /// Element (i, j, ...): one index per dimension, each checked against its extent (a
  /// wrong number of indices or an index out of range throws gradus::error).
  template <std::integral... I>
  T& operator()(I... index) const {
    const std::array<index_t, sizeof...(I)> ix{static_cast<index_t>(index)...};
    if (ix.size() != shape_.rank) [[unlikely]]
      throw error("gradus: tensor_view(" + list(ix) + "): " + std::to_string(ix.size()) + " indices for a tensor of shape " +
                  to_string(shape_) + " (rank " + std::to_string(shape_.rank) + "); give one index per dimension, or [k] for flat index k");
    index_t offset = 0;
    for (std::size_t k = 0; k < ix.size(); ++k) {
      if (ix[k] < 0 || ix[k] >= shape_.d[k]) [[unlikely]]
        throw error("gradus: tensor_view(" + list(ix) + "): index " + std::to_string(ix[k]) + " of dimension " +
                    std::to_string(k) + " is out of range for shape " + to_string(shape_) + " (0 to " +
                    std::to_string(shape_.d[k] - 1) + ")");
      offset = offset * shape_.d[k] + ix[k];
    }
    return ptr_[offset];
  }

  /// The first element: begin() to end() are the elements in row-major order, so
  /// `std::vector(v.begin(), v.end())` copies them.
  T* begin() const { return ptr_; }
  /// Past the last element.
  T* end() const { return ptr_ + size(); }

 private:
  template <std::size_t N>
  static std::string list(const std::array<index_t, N>& ix) {
    std::string r;
    for (std::size_t k = 0; k < N; ++k) r += (k ? ", " : "") + std::to_string(ix[k]);
    return r;
  }

  T* ptr_ = nullptr;
  dims shape_;
};

namespace detail {

/// One element as numpy prints it: integers in decimal (bytes too, not as characters),
/// floating point in the shortest general form at the stream's precision.
template <class T>
std::string format_element(T v, std::streamsize precision) {
  std::array<char, 64> buf{};
  std::to_chars_result r{};
  if constexpr (std::is_floating_point_v<T>)
    r = std::to_chars(buf.data(), buf.data() + buf.size(), v, std::chars_format::general, static_cast<int>(precision));
  else if constexpr (sizeof(T) == 1)
    r = std::to_chars(buf.data(), buf.data() + buf.size(), static_cast<int>(v));
  else
    r = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return std::string(buf.data(), r.ptr);
}

/// numpy's rules: past 1000 elements, each dimension longer than 6 shows its first and last
/// 3 entries around "..."; rows of a matrix on their own lines, matrices apart by a blank line.
template <class T>
class tensor_printer {
 public:
  static constexpr index_t threshold = 1000, edge = 3;

  tensor_printer(const T* p, const dims& s, std::streamsize precision) : p_(p), s_(s), precision_(precision) {
    elide_ = s.numel() > threshold;
    index_t stride = 1;
    for (std::size_t k = s.rank; k-- > 0;) {
      stride_[k] = stride;
      stride *= s.d[k];
    }
  }

  void print(std::ostream& os) {
    if (s_.rank == 0) {
      os << format_element(p_[0], precision_);
      return;
    }
    if (s_.numel() == 0) {  // numpy prints any empty array as []
      os << "[]";
      return;
    }
    walk(0, 0, [&](index_t off) { width_ = std::max(width_, format_element(p_[off], precision_).size()); });
    emit(os, 0, 0);
  }

 private:
  /// The indices of dimension k shown, with -1 where "..." stands.
  std::vector<index_t> shown(std::size_t k) const {
    std::vector<index_t> r;
    const index_t n = s_.d[k];
    if (elide_ && n > 2 * edge) {
      for (index_t i = 0; i < edge; ++i) r.push_back(i);
      r.push_back(-1);
      for (index_t i = n - edge; i < n; ++i) r.push_back(i);
    } else {
      for (index_t i = 0; i < n; ++i) r.push_back(i);
    }
    return r;
  }
  template <class F>
  void walk(std::size_t k, index_t off, F&& f) const {
    for (index_t i : shown(k)) {
      if (i < 0) continue;
      if (k + 1 == s_.rank) f(off + i * stride_[k]);
      else walk(k + 1, off + i * stride_[k], f);
    }
  }
  void emit(std::ostream& os, std::size_t k, index_t off) const {
    os << '[';
    const auto idx = shown(k);
    const std::string apart = k + 1 == s_.rank ? std::string(" ") : std::string(s_.rank - k - 1, '\n') + std::string(k + 1, ' ');
    for (std::size_t n = 0; n < idx.size(); ++n) {
      if (n) os << apart;
      if (idx[n] < 0) {
        os << "...";
        continue;
      }
      if (k + 1 == s_.rank) {
        const std::string e = format_element(p_[off + idx[n] * stride_[k]], precision_);
        os << std::string(width_ - e.size(), ' ') << e;
      } else {
        emit(os, k + 1, off + idx[n] * stride_[k]);
      }
    }
    os << ']';
  }

  const T* p_;
  dims s_;
  std::streamsize precision_;
  bool elide_ = false;
  std::array<index_t, max_rank> stride_{};
  std::size_t width_ = 0;
};

}  // namespace detail

/// numpy-like printing (numpy's str()): `[[1 2 3]\n [4 5 6]]`, floating point at the stream's
/// precision (std::setprecision), elided with "..." past 1000 elements.
template <class T>
std::ostream& operator<<(std::ostream& os, const tensor_view<T>& v) {
  detail::tensor_printer<std::remove_cv_t<T>>(v.data(), v.shape(), os.precision()).print(os);
  return os;
}

}  // namespace gradus
