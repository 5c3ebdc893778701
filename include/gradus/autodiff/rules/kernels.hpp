#pragma once
// Derivative rules of the materialised ops: reductions, matmul, softmax family, layout.
#include "gradus/autodiff/grad.hpp"
#include "gradus/graph/ops/index.hpp"
#include "gradus/graph/ops/matmul.hpp"
#include "gradus/graph/ops/select.hpp"
#include "gradus/graph/ops/softmax.hpp"
#include "gradus/graph/ops/stored.hpp"

namespace gradus {

// ---- reductions ----------------------------------------------------------------------------
namespace ad {
/// g (the reduction's adjoint) spread back over the operand's shape.
template <int Axis, bool Keep, class G, class A>
auto spread(const G& g, const A& a) {
  if constexpr (Axis == all_axes || Keep) return broadcast_like(g, a);
  else return broadcast_like(expand_dims<static_cast<std::size_t>(Axis)>(g), a);
}
}  // namespace ad

/// sum: g spread back over the reduced axes.
template <std::size_t I, int Axis, bool Keep, class A, class G>
auto vjp(const reduce_node<reduce_kind::sum, false, Axis, Keep, A>& n, const G& g) {
  constexpr int ax = std::remove_cvref_t<decltype(n)>::axis;
  return ad::spread<ax, Keep>(g, n.a);
}
/// mean: g / n spread back over the reduced axes, n the reduced count read from the
/// operand's dims at run time (inv_count).
template <std::size_t I, int Axis, bool Keep, class A, class G>
auto vjp(const reduce_node<reduce_kind::mean, false, Axis, Keep, A>& n, const G& g) {
  constexpr int ax = std::remove_cvref_t<decltype(n)>::axis;
  return ad::spread<ax, Keep>(g, n.a) * inv_count<value_t<A>, ax>(n.a);
}
/// max/min: the adjoint is split evenly among the elements equal to the extreme, as
/// TensorFlow's reduce_max/reduce_min gradient and PyTorch's amax/amin do: with k tied
/// elements each gets g/k, so the shares add up to g, and when the tied elements move
/// together (a broadcast operand) the result is the derivative that finite differences
/// see. (Giving each tied element the whole g, as this rule once did, multiplied the
/// gradient by k.) The mask compares the operand and the result as the forward reduction
/// left them in their buffers (stored()): recomputing the operand inside the backward
/// pass could round differently from the forward's evaluation (another code path, a
/// contracted multiply-add), match no element, and lose the gradient.
template <std::size_t I, reduce_kind K, int Axis, bool Keep, class A, class G>
  requires(K == reduce_kind::max || K == reduce_kind::min)
auto vjp(const reduce_node<K, false, Axis, Keep, A>& n, const G& g) {
  constexpr int ax = std::remove_cvref_t<decltype(n)>::axis;
  const auto a = stored(n.a);
  const auto hit = equal(a, ad::spread<ax, Keep>(n, a));
  return ad::spread<ax, Keep>(g / sum<ax, Keep>(hit), a) * hit;
}
/// argmax: none (an index is piecewise constant).
template <std::size_t I, reduce_kind K, int Axis, bool Keep, class A, class G>
no_grad vjp(const reduce_node<K, true, Axis, Keep, A>&, const G&) {
  return {};
}

// ---- matmul ---------------------------------------------------------------------------------
/// C = A B: dA = G B^T, dB = A^T G. A 2-D operand broadcast over the other's batch gets
/// its adjoint summed over the batch. Transposes fold into GEMM flags (ad::mt).
template <std::size_t I, class A, class B, class G>
auto vjp(const matmul_node<A, B>& n, const G& g) {
  if constexpr (I == 0) {
    auto d = matmul(g, ad::mt(n.b));
    if constexpr (rank_v<A> == 2 && rank_v<decltype(d)> == 3) return sum<0>(d);
    else return d;
  } else {
    auto d = matmul(ad::mt(n.a), g);
    if constexpr (rank_v<B> == 2 && rank_v<decltype(d)> == 3) return sum<0>(d);
    else return d;
  }
}

// ---- softmax family ---------------------------------------------------------------------------
/// y = softmax(a): da = y * (g - sum(g * y, last axis))
template <std::size_t I, class A, class G>
auto vjp(const softmax_node<false, A>& n, const G& g) {
  return n * (g - sum<-1, true>(g * n));
}
/// y = log_softmax(a): da = g - softmax(a) * sum(g, last axis)
template <std::size_t I, class A, class G>
auto vjp(const softmax_node<true, A>& n, const G& g) {
  return g - exp(n) * sum<-1, true>(g);
}
/// loss_i = -log softmax(l_i)[y_i]: dl = (softmax(l) - one_hot(y)) * g_i, one fused pass.
template <std::size_t I, class L, class Y, class G>
auto vjp(const softmax_xent_node<L, Y>& n, const G& g) {
  if constexpr (I == 0) {
    constexpr index_t classes = shape_t<L>::extents[1];
    static_assert(classes != dyn, "gradus: grad of softmax_cross_entropy needs a static class count");
    return (softmax(n.logits) - one_hot<classes, value_t<L>>(n.labels)) * expand_dims<1>(g);
  } else {
    return no_grad{};
  }
}

// ---- layout and index ops ------------------------------------------------------------------
/// The permutation that undoes P...: inv[P[i]] = i (I... is 0 .. sizeof...(P) - 1).
template <std::size_t... P, std::size_t... I>
constexpr auto inverse_permutation(std::index_sequence<I...>) {
  constexpr std::array<std::size_t, sizeof...(P)> p{P...};
  std::array<std::size_t, sizeof...(P)> inv{};
  for (std::size_t i = 0; i < p.size(); ++i) inv[p[i]] = i;
  return inv;
}
/// permute<P...>: g permuted by the inverse permutation (a permute of a permute that undoes
/// it folds away).
template <std::size_t I, class A, std::size_t... P, class G>
auto vjp(const permute_node<A, P...>&, const G& g) {
  constexpr auto inv = inverse_permutation<P...>(std::make_index_sequence<sizeof...(P)>{});
  return [&]<std::size_t... K>(std::index_sequence<K...>) {
    return ad::permute_folded<inv[K]...>(g);
  }(std::make_index_sequence<sizeof...(P)>{});
}
/// reshape: g seen with the operand's dims.
template <std::size_t I, class A, index_t... E, class G>
auto vjp(const reshape_node<A, E...>& n, const G& g) {
  return reshape_like(g, n.a);
}
/// expand_dims: g seen with the operand's dims.
template <std::size_t I, std::size_t Axis, class A, class G>
auto vjp(const expand_dims_node<Axis, A>& n, const G& g) {
  return reshape_like(g, n.a);
}
/// one_hot: none (its operand is int32 labels).
template <std::size_t I, class T, index_t D, class Y, class G>
no_grad vjp(const one_hot_node<T, D, Y>&, const G&) {
  return {};
}
/// out = select(a, i): da = g written at entry i of zeros shaped like a; and back.
template <std::size_t I, class A, class G>
auto vjp(const select_node<A>& n, const G& g) {
  return select_backward(g, n.index, n.a);
}
/// stored: g unchanged.
template <std::size_t I, class A, class G>
auto vjp(const stored_node<A>&, const G& g) {
  return g;
}
/// select_backward(gs, i, like): select(g, i) to gs.
template <std::size_t I, class Gs, class Like, class G>
auto vjp(const select_backward_node<Gs, Like>& n, const G& g) {
  return select(g, n.index);
}
/// out = gather(table, idx): dtable = scatter_add(g, idx) into zeros of the table's shape
/// (a repeated index accumulates its rows); idx is int32 and gets no adjoint. For an
/// embedding_lookup the same scatter_add, marked sparse (see sparse_rows).
template <std::size_t I, class Tab, class Idx, bool S, class G>
auto vjp(const gather_node<Tab, Idx, S>& n, const G& g) {
  if constexpr (I != 0) return no_grad{};
  else if constexpr (S) return sparse_rows(g, n.idx, n.table);
  else return scatter_add(g, n.idx, n.table);
}
/// scatter_add is linear in its updates: dupdates = gather(g, idx) (seen with the updates'
/// dims where the static shapes differ, e.g. a `dyn` extent on one side only).
template <std::size_t I, class U, class Idx, class Like, bool S, class G>
auto vjp(const scatter_add_node<U, Idx, Like, S>& n, const G& g) {
  if constexpr (I == 0) {
    auto d = gather(g, n.idx);
    if constexpr (std::is_same_v<shape_t<decltype(d)>, shape_t<U>>) return d;
    else return reshape_like(d, n.updates);
  } else {
    return no_grad{};
  }
}

}  // namespace gradus
