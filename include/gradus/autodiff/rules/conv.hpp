#pragma once
// Derivative rules of the image ops. conv2d is im2col + matmul + layout ops, so only
// im2col needs a rule of its own; col2im (its adjoint) is linear, with im2col as its
// adjoint in turn. Pooling's adjoints are kernels of their own (pool2d_grad_node).
#include "gradus/autodiff/grad.hpp"
#include "gradus/graph/ops/conv.hpp"

namespace gradus {

template <std::size_t I, class X, window2d Win, class G>
auto vjp(const im2col_node<X, Win>& n, const G& g) {
  return col2im<Win>(g, n.x);
}
template <std::size_t I, class Col, class Like, window2d Win, class G>
auto vjp(const col2im_node<Col, Like, Win>&, const G& g) {
  return im2col<Win>(g);
}
template <std::size_t I, pool_kind K, class X, window2d Win, class G>
auto vjp(const pool2d_node<K, X, Win>& n, const G& g) {
  return pool2d_grad_node<K, X, G, Win>{{}, n.x, g};
}

}  // namespace gradus
