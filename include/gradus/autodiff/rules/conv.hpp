#pragma once
// Derivative rules of the image ops. conv2d's adjoints are its data and weight gradients,
// kernels of their own (grad() takes no gradients of gradients, so those need no rules).
// col2im is im2col's adjoint and the other way round. Pooling's adjoints are kernels of
// their own (pool2d_grad_node).
#include "gradus/autodiff/grad.hpp"
#include "gradus/graph/ops/conv.hpp"

namespace gradus {

/// y = conv2d(x, w): dx = conv2d_data_grad(g, w), dw = conv2d_weight_grad(x, g)
template <std::size_t I, class X, class W, window2d Win, class G>
auto vjp(const conv2d_node<X, W, Win>& n, const G& g) {
  if constexpr (I == 0) return conv2d_data_grad<Win>(g, n.w, n.x);
  else return conv2d_weight_grad<Win>(n.x, g, n.w);
}
/// im2col: col2im(g) into x's shape.
template <std::size_t I, class X, window2d Win, class G>
auto vjp(const im2col_node<X, Win>& n, const G& g) {
  return col2im<Win>(g, n.x);
}
/// col2im: im2col(g) to the columns.
template <std::size_t I, class Col, class Like, window2d Win, class G>
auto vjp(const col2im_node<Col, Like, Win>&, const G& g) {
  return im2col<Win>(g);
}
/// max_pool2d / avg_pool2d: the pooling gradient kernel (pool2d_grad_node): max gives each
/// output's g to the first maximum of its window, avg spreads it over the window.
template <std::size_t I, pool_kind K, class X, window2d Win, class G>
auto vjp(const pool2d_node<K, X, Win>& n, const G& g) {
  return pool2d_grad_node<K, X, G, Win>{{}, n.x, g};
}

}  // namespace gradus
