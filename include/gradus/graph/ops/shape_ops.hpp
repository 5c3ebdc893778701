#pragma once
// permute / transpose (materialised copies, or folded into a GEMM's flags by matmul) and
// reshape (a view of its operand's buffer: no copy).
#include <array>
#include <string>
#include <tuple>

#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

namespace op {
template <std::size_t... P>
struct permute {
  static constexpr const char* name = "permute";
  template <class S, class Unused>
  static constexpr bool fits = [] {
    if (sizeof...(P) != S::rank) return false;
    std::array<bool, sizeof...(P) + 1> seen{};
    for (std::size_t p : {std::size_t(P)..., std::size_t(0)}) {
      if (p >= S::rank) return false;
    }
    for (std::size_t p : std::array<std::size_t, sizeof...(P)>{P...}) {
      if (seen[p]) return false;
      seen[p] = true;
    }
    return true;
  }();
};
struct reshape {
  static constexpr const char* name = "reshape";
  template <class From, class To>
  static constexpr bool fits = [] {
    index_t nf = 1, nt = 1;
    bool df = false;
    int dt = 0;
    for (auto e : From::extents) e == dyn ? (void)(df = true) : (void)(nf *= e);
    for (auto e : To::extents) e == dyn ? (void)++dt : (void)(nt *= e);
    if (dt > 1) return false;                 // at most one extent is inferred
    if (!df && dt == 0) return nf == nt;      // fully static: sizes must agree
    if (!df && dt == 1) return nt != 0 && nf % nt == 0;
    return true;                              // checked when the feed binds
  }();
};
}  // namespace op

namespace detail {
template <class S, std::size_t... P>
struct permuted_extents {
  static constexpr std::array<index_t, sizeof...(P)> value{S::extents[P % (S::rank ? S::rank : 1)]...};
};
}  // namespace detail

template <class A, std::size_t... P>
struct permute_node : expr_base {
  static_assert(check_shapes<op::permute<P...>, shape_t<A>, shape<>>::value);
  using value_type = value_t<A>;
  using shape_type = shape_of_array<detail::permuted_extents<shape_t<A>, P...>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "permute";
  static constexpr std::array<std::size_t, sizeof...(P)> perm{P...};
  A a;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tie(a); }
  dims infer(const dims& in) const {
    dims r;
    r.rank = in.rank;
    for (std::size_t i = 0; i < perm.size(); ++i) r.d[i] = in.d[perm[i]];
    return r;
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> in) const {
    std::array<std::size_t, max_rank> p{};
    for (std::size_t i = 0; i < perm.size(); ++i) p[i] = perm[i];
    Backend::permute(in.data(), in.shape(), p, out);
  }
  bool operator==(const permute_node&) const = default;
};

/// permute<P...>(a): a's axes reordered, output axis k being a's axis P[k] (NumPy's
/// transpose(a, P)); P must be a permutation of a's axes (checked at compile time). A copy,
/// except where matmul reads a swap of the last two axes through its GEMM's transpose flag.
/// Gradient: g permuted back by the inverse permutation.
template <std::size_t... P, expression A>
auto permute(const A& a) {
  return permute_node<A, P...>{{}, a};
}

namespace detail {
template <expression A, std::size_t... I>
auto reversed(const A& a, std::index_sequence<I...>) {
  return permute<(sizeof...(I) - 1 - I)...>(a);
}
template <expression A, std::size_t... I>
auto swap_last(const A& a, std::index_sequence<I...>) {
  constexpr std::size_t R = sizeof...(I);
  return permute<(I + 2 < R ? I : (I == R - 1 ? R - 2 : R - 1))...>(a);
}
}  // namespace detail

/// transpose(a): all axes reversed, as NumPy's a.T. Gradient: transpose(g).
template <expression A>
auto transpose(const A& a) {
  return detail::reversed(a, std::make_index_sequence<rank_v<A>>{});
}
/// matrix_transpose(a): the last two axes swapped (batched matrices); rank >= 2. Gradient:
/// matrix_transpose(g).
template <expression A>
auto matrix_transpose(const A& a) {
  static_assert(rank_v<A> >= 2, "gradus: matrix_transpose needs rank >= 2");
  return detail::swap_last(a, std::make_index_sequence<rank_v<A>>{});
}

/// The extents of reshape<E...>(a) for a static shape of a: E..., with a `dyn` extent
/// replaced by a's element count over the product of the others (0 where that is 0).
template <class A, index_t... E>
struct reshape_static_extents {
  /// Those extents, the array shape_of_array reads.
  static constexpr std::array<index_t, sizeof...(E)> value = [] {
    std::array<index_t, sizeof...(E)> r{E...};
    index_t n = 1, known = 1;
    for (auto e : shape_t<A>::extents) n *= e;
    for (auto e : r) if (e != dyn) known *= e;
    for (auto& e : r) if (e == dyn) e = known ? n / known : 0;
    return r;
  }();
};

template <class A, index_t... E>
struct reshape_node : expr_base {
  static_assert(check_shapes<op::reshape, shape_t<A>, shape<E...>>::value);
  using value_type = value_t<A>;
  using target = shape<E...>;
  static constexpr node_kind kind = node_kind::view;
  static constexpr const char* op_name = "reshape";
  A a;
  /// The target shape, with a static -1/dyn extent filled in from the operand's dims.
  using shape_type = std::conditional_t<shape_t<A>::is_static,
                                        shape_of_array<reshape_static_extents<A, E...>>, target>;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tie(a); }
  dims infer(const dims& in) const {
    dims r(target::extents);
    index_t known = 1;
    int hole = -1;
    for (std::size_t i = 0; i < r.rank; ++i) r.d[i] == dyn ? (void)(hole = int(i)) : (void)(known *= r.d[i]);
    const index_t n = in.numel();
    if (hole >= 0) {
      if (known == 0 || n % known != 0)
        throw shape_error("gradus: reshape: cannot reshape " + to_string(in) + " to " +
                          to_string(static_dims<target>()));
      r.d[static_cast<std::size_t>(hole)] = n / known;
    } else if (known != n) {
      throw shape_error("gradus: reshape: cannot reshape " + to_string(in) + " to " +
                        to_string(static_dims<target>()));
    }
    return r;
  }
  bool operator==(const reshape_node&) const = default;
};

/// reshape<E...>(a): same elements, new extents; one extent may be dyn (inferred). A view,
/// no copy. The element counts must agree: at compile time where the shapes say, else a
/// shape_error at run time. Gradient: g reshaped back to a's dims.
template <index_t... E, expression A>
auto reshape(const A& a) {
  return reshape_node<A, E...>{{}, a};
}

}  // namespace gradus
