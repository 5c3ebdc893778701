#pragma once
// Derivative rules of the recurrent layers: every operand's adjoint is read from one
// backward kernel (rnn_grad_node: backpropagation through time, run once however many
// operands' gradients are asked for); the input's is a GEMM over its dG (run only when
// asked for).
#include "gradus/autodiff/grad.hpp"
#include "gradus/graph/ops/rnn.hpp"

namespace gradus {

/// lstm / gru: operand I's gradient from one backward kernel (rnn_grad_node) over g, the
/// adjoint of hs: xs's through rnn_input_grad_node, a weight's or bias's a part of the
/// kernel's buffer (rnn_grad_part).
template <std::size_t I, class Fwd, class G>
auto vjp(const rnn_seq_node<Fwd>& n, const G& g) {
  using grad_t = rnn_grad_node<Fwd, G>;
  const grad_t bptt{{}, n.fwd, g};
  if constexpr (I == 0) return rnn_input_grad_node<grad_t>{{}, bptt};
  else return rnn_grad_part<I, grad_t>{{}, bptt};
}

}  // namespace gradus
