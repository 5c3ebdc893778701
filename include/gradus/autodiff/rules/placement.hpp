#pragma once
// Derivative rule of a placement (graph/ops/placement.hpp): the identity. A placed node
// only says where its operand runs, so its adjoint passes through unchanged; across a
// pipeline's cut, the adjoint of the previous stage's output is what this stage sends back.
#include "gradus/autodiff/grad.hpp"
#include "gradus/graph/ops/placement.hpp"

namespace gradus {

/// on<P>(e): g unchanged.
template <std::size_t I, class P, class E, class G>
auto vjp(const placed_node<P, E>&, const G& g) {
  return g;
}

}  // namespace gradus
