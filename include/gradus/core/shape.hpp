#pragma once
// Extents: static sizes mixed with `dyn` (known when a feed binds it), in the spirit of
// std::extents, plus the run-time dims that flow through an evaluation.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "gradus/core/error.hpp"

namespace gradus {

/// Extents, indices and element counts: signed 64-bit, so that `dyn` (-1) is one too.
using index_t = std::int64_t;
inline constexpr index_t dyn = -1;     ///< an extent known only at run time
inline constexpr std::size_t max_rank = 6;  ///< the highest rank a tensor can have (dims holds this many extents)

/// The static shape of an expression; `dyn` marks an extent bound at run time.
template <index_t... E>
struct shape {
  static constexpr std::size_t rank = sizeof...(E);          ///< the number of dimensions
  static constexpr std::array<index_t, rank> extents{E...};  ///< the extents, `dyn` where bound at run time
  static constexpr bool is_static = ((E != dyn) && ...);     ///< true when no extent is `dyn`
};

namespace detail {
template <class Holder, std::size_t... I>
auto shape_from_array(std::index_sequence<I...>) -> shape<Holder::value[I]...>;
}  // namespace detail

/// shape_of_array<H>: the shape whose extents are the constexpr array H::value.
template <class Holder>
using shape_of_array = decltype(detail::shape_from_array<Holder>(
    std::make_index_sequence<Holder::value.size()>{}));

namespace detail {
template <std::size_t R>
struct all_dyn {
  static constexpr std::array<index_t, R> value = [] {
    std::array<index_t, R> a{};
    a.fill(dyn);
    return a;
  }();
};
}  // namespace detail

/// A shape of rank R whose extents are all bound at run time.
template <std::size_t R>
using dyn_shape_t = shape_of_array<detail::all_dyn<R>>;

/// Run-time dims of one tensor (rank erased so buffers can be planned uniformly).
struct dims {
  std::size_t rank = 0;                ///< the number of dimensions (at most max_rank)
  std::array<index_t, max_rank> d{};   ///< the extents; the entries from `rank` on are unused

  /// Rank 0: a scalar's dims.
  constexpr dims() = default;
  /// The extents of a std::array (R at most max_rank, checked at compile time).
  template <std::size_t R>
  constexpr explicit dims(const std::array<index_t, R>& a) : rank(R) {
    static_assert(R <= max_rank, "gradus: rank above max_rank");
    std::copy(a.begin(), a.end(), d.begin());  // (a loop's `i < R` is nvcc's warning 186 at R = 0)
  }
  /// The listed extents: `dims{2, 3}` is a 2 x 3 shape. More than max_rank of them is a
  /// shape_error naming both counts.
  constexpr dims(std::initializer_list<index_t> l) : rank(l.size()) {
    if (l.size() > max_rank)
      throw shape_error("gradus: dims: " + std::to_string(l.size()) + " extents listed, but a tensor has at most " +
                        std::to_string(max_rank) + " (max_rank)");
    std::size_t i = 0;
    for (auto v : l) d[i++] = v;
  }
  /// Extent i (unchecked: i < rank).
  constexpr index_t operator[](std::size_t i) const { return d[i]; }
  /// Extent i, writable (unchecked: i < rank).
  constexpr index_t& operator[](std::size_t i) { return d[i]; }
  /// The extents as a range, like xtensor's shape(): size() is the rank.
  constexpr std::size_t size() const { return rank; }
  /// The first extent: begin() to end() are the `rank` extents.
  constexpr const index_t* begin() const { return d.data(); }
  /// Past the last extent.
  constexpr const index_t* end() const { return d.data() + rank; }
  /// The number of elements: the product of the extents (1 at rank 0).
  constexpr index_t numel() const {
    index_t n = 1;
    for (std::size_t i = 0; i < rank; ++i) n *= d[i];
    return n;
  }
  /// The same rank and extents (the unused entries are not compared).
  constexpr bool operator==(const dims& o) const {
    if (rank != o.rank) return false;
    for (std::size_t i = 0; i < rank; ++i)
      if (d[i] != o.d[i]) return false;
    return true;
  }
};

/// Dims as Python prints a tuple: "(2, 3)", "(4,)", "()"; a `dyn` extent prints as "?".
inline std::string to_string(const dims& s) {
  std::string r = "(";
  for (std::size_t i = 0; i < s.rank; ++i) {
    if (i) r += ", ";
    r += s.d[i] == dyn ? std::string("?") : std::to_string(s.d[i]);
  }
  if (s.rank == 1) r += ",";
  return r + ")";
}

/// The extents of static shape S as dims (a `dyn` extent stays `dyn`).
template <class S>
constexpr dims static_dims() {
  return dims(S::extents);
}

/// Does a run-time dims fit a static shape (same rank, equal wherever static)?
template <class S>
constexpr bool fits(const dims& s) {
  if (s.rank != S::rank) return false;
  for (std::size_t i = 0; i < S::rank; ++i)
    if (S::extents[i] != dyn && S::extents[i] != s.d[i]) return false;
  return true;
}

// ---- NumPy broadcasting on trailing dimensions --------------------------------------

/// Static: combine extents, returning -2 on a certain mismatch.
constexpr index_t broadcast_extent(index_t a, index_t b) {
  if (a == b) return a;
  if (a == 1) return b;
  if (b == 1) return a;
  if (a == dyn) return b;  // a must be 1 or b at run time
  if (b == dyn) return a;
  return -2;
}

/// The static shape of broadcasting SA with SB (NumPy's rules, trailing dimensions aligned):
/// an extent of 1 or `dyn` gives way to the other, equal extents stay, two different static
/// extents other than 1 do not fit.
template <class SA, class SB>
struct broadcast_result {
  static constexpr std::size_t rank = SA::rank > SB::rank ? SA::rank : SB::rank;  ///< the larger of the two ranks
  /// The broadcast extents; `ok` is set to false where two static extents do not fit (such
  /// an axis reads 1).
  static constexpr std::array<index_t, rank> compute(bool& ok) {
    std::array<index_t, rank> r{};
    ok = true;
    for (std::size_t i = 0; i != rank; ++i) {  // != and <=, not <: nvcc warns of `< 0` for a rank of 0
      // i counts from the trailing end
      const index_t a = i + 1 <= SA::rank ? SA::extents[SA::rank - 1 - i] : 1;
      const index_t b = i + 1 <= SB::rank ? SB::extents[SB::rank - 1 - i] : 1;
      const index_t e = broadcast_extent(a, b);
      if (e == -2) {
        ok = false;
        r[rank - 1 - i] = 1;
      } else {
        r[rank - 1 - i] = e;
      }
    }
    return r;
  }
  /// The first dimension, counted from the trailing end, whose extents do not broadcast
  /// (rank when all do).
  static constexpr std::size_t first_mismatch = [] {
    for (std::size_t i = 0; i != rank; ++i) {
      const index_t a = i + 1 <= SA::rank ? SA::extents[SA::rank - 1 - i] : 1;
      const index_t b = i + 1 <= SB::rank ? SB::extents[SB::rank - 1 - i] : 1;
      if (broadcast_extent(a, b) == -2) return i;
    }
    return rank;
  }();
  /// Whether SA and SB broadcast: what every elementwise op checks at compile time.
  static constexpr bool ok = first_mismatch == rank;
  /// The broadcast extents (compute's), the array shape_of_array reads.
  static constexpr std::array<index_t, rank> value = [] {
    bool o = true;
    return compute(o);
  }();
};

/// The static shape of broadcasting SA with SB (see broadcast_result).
template <class SA, class SB>
using broadcast_shape_t = shape_of_array<broadcast_result<SA, SB>>;

/// Run time: the broadcast of two dims, or a shape_error naming the op and both shapes.
inline dims broadcast_dims(const char* op, const dims& a, const dims& b) {
  dims r;
  r.rank = a.rank > b.rank ? a.rank : b.rank;
  for (std::size_t i = 0; i < r.rank; ++i) {
    const index_t x = i < a.rank ? a.d[a.rank - 1 - i] : 1;
    const index_t y = i < b.rank ? b.d[b.rank - 1 - i] : 1;
    index_t e;
    if (x == y || y == 1) e = x;
    else if (x == 1) e = y;
    else
      throw shape_error(std::string("gradus: ") + op + ": cannot broadcast shapes " + to_string(a) +
                        " and " + to_string(b));
    r.d[r.rank - 1 - i] = e;
  }
  return r;
}

/// Row-major strides of `s` seen from an output of dims `out` (rank right-aligned):
/// a broadcast axis gets stride 0.
inline std::array<index_t, max_rank> broadcast_strides(const dims& s, const dims& out) {
  std::array<index_t, max_rank> st{};
  index_t stride = 1;
  for (std::size_t i = 0; i < s.rank; ++i) {
    const std::size_t si = s.rank - 1 - i, oi = out.rank - 1 - i;
    st[oi] = s.d[si] == 1 && out.d[oi] != 1 ? 0 : stride;
    stride *= s.d[si];
  }
  return st;
}

/// Normalise a possibly negative axis against a rank, at compile time.
template <int Axis, std::size_t Rank>
constexpr std::size_t normalize_axis() {
  constexpr int r = static_cast<int>(Rank);
  static_assert(Axis >= -r && Axis < r, "gradus: axis out of range for the operand's rank");
  return static_cast<std::size_t>(Axis < 0 ? Axis + r : Axis);
}

}  // namespace gradus
