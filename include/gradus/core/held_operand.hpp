#pragma once
// An optional section of the backend interface for ops that read one operand in many GEMMs:
//
//   auto held = hold_operand<Backend>(p, n);   the n values at p stay unchanged while `held` lives
//
// A backend whose low-precision GEMM converts its operands on every call (cpu_simd's bf16:
// exec/compute_kernels.hpp, cpu_simd/low_precision.hpp) converts that region once and its GEMMs
// read the copy for as long as the token lives. The RNN cells hold W_h over their time loops:
// seq_mnist_lstm's cell multiplies by all of W_h at each of its 28 steps, forward and backward.
// A graph run under a mixed policy holds every float variable it reads (exec/graph_engine.hpp),
// and a pipeline stage its variables over its step's micro-batches, so a weight matrix is
// converted once per step. Any other backend, and any other precision, gets a token that does
// nothing.
#include <cstddef>

namespace gradus {

/// What hold_operand returns where nothing is held.
struct nothing_held {
  /// (holds nothing more)
  void add(const void*, std::size_t) const {}
};

/// Backend::hold_operand(p, n)'s token where the backend offers it, else nothing_held.
template <class Backend, class T>
auto hold_operand(const T* p, std::size_t n) {
  if constexpr (requires { Backend::hold_operand(p, n); }) return Backend::hold_operand(p, n);
  else return nothing_held{};
}

}  // namespace gradus
