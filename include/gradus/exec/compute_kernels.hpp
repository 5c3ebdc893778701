#pragma once
// The kernels an op of compute precision (core/precision.hpp: matmul, the convolutions, the RNN
// cells) runs on under a low-precision policy: Backend's sections, with its GEMM and
// convolutions taking float operands rounded to Compute (bf16 or f16) and summing their
// products in fp32 into float results. The executor picks them per node
// (exec/graph_engine.hpp's run_kernel: kernel_backend_t), so an op kept in fp32 never sees them.
//
// A backend with low-precision kernels of its own offers them as an optional section,
//   gemm_low(compute, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
//            stride_c, batch)                        float in, float out, `compute` inside
//   conv2d_low(compute, pass, a, b, geometry, out)   the three convolution passes, the same
//   hold_low(compute, p, n)                          a token: the n floats at p converted once
//                                                    for the GEMMs while it lives (core/held_operand.hpp)
// (cpu_simd: oneDNN's bf16 GEMM where the CPU has AVX512_BF16; cuda: cuBLAS on tensor
// cores). Without them, a host-memory backend rounds the operands into scratch buffers and
// runs its fp32 kernels: the numbers of a low-precision kernel (rounded operands, fp32 sums),
// none of its speed. double models are untouched: a policy applies to float.
#include <cstddef>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/held_operand.hpp"
#include "gradus/core/precision.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/graph/ops/precision_scope.hpp"

namespace gradus {

/// Which convolution pass a low-precision convolution runs (conv2d_low's `pass`).
enum class conv_pass_kind { forward, data, weights };

template <class B>
concept backend_gemm_low = requires(const float* a, float* c, index_t n, float s) {
  B::gemm_low(element_type::bf16, true, false, n, n, n, s, a, n, n, a, n, n, s, c, n, n, n);
};
template <class B>
concept backend_hold_low = requires(const float* a, std::size_t n) {
  B::hold_low(element_type::bf16, a, n);
  B::hold_low(element_type::bf16).add(a, n);
};
template <class B>
concept backend_conv_low = requires(const float* a, float* c, const conv_geometry& g) {
  B::conv2d_low(element_type::bf16, conv_pass_kind::forward, a, a, g, c);
};

/// The element counts of a convolution pass's two operands (forward: x, w; data: dy, w;
/// weights: x, dy).
inline std::pair<index_t, index_t> conv_operand_sizes(conv_pass_kind pass, const conv_geometry& g) {
  const index_t x = g.n * g.c * g.h * g.w, w = g.o * g.patch(), dy = g.n * g.o * g.pixels();
  if (pass == conv_pass_kind::forward) return {x, w};
  if (pass == conv_pass_kind::data) return {dy, w};
  return {x, dy};
}

namespace detail {
/// x rounded to Compute, back in float: what a low-precision kernel reads of x.
template <class Compute>
float round_to(float x) {
  return static_cast<float>(Compute(x));
}
/// n floats from src rounded to Compute, in this thread's scratch buffer `which`.
template <class Compute>
const float* rounded_copy(const float* src, std::size_t n, int which) {
  thread_local std::vector<float> scratch[2];
  auto& s = scratch[which];
  s.resize(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = round_to<Compute>(src[i]);
  return s.data();
}
/// Elements a strided operand spans: `batch` items `stride` apart (0: one shared item), each
/// `rows` rows of leading dimension ld, the last row `cols` long.
inline std::size_t span_of(index_t batch, index_t stride, index_t rows, index_t cols, index_t ld) {
  if (rows == 0 || cols == 0) return 0;
  const index_t item = (rows - 1) * ld + cols;
  return static_cast<std::size_t>((stride == 0 ? 0 : (batch - 1) * stride) + item);
}
}  // namespace detail

/// Backend's kernels for an op of compute precision under a policy computing in Compute.
template <class Backend, class Compute>
struct compute_kernels : Backend {
  /// Backend::gemm's contract, float operands rounded to Compute (double: Backend::gemm).
  template <class T>
  static void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                   index_t stride_a, const T* b, index_t ldb, index_t stride_b, T beta, T* c, index_t ldc,
                   index_t stride_c, index_t batch) {
    if constexpr (!std::is_same_v<T, float>) {
      Backend::gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
    } else if constexpr (backend_gemm_low<Backend>) {
      Backend::gemm_low(element_type_of<Compute>, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                        ldc, stride_c, batch);
    } else {
      static_assert(backend_host_memory<Backend>,
                    "gradus: this backend has no low-precision GEMM (gemm_low) and its memory is not the host's");
      const float* ar = detail::rounded_copy<Compute>(
          a, detail::span_of(batch, stride_a, ta ? k : m, ta ? m : k, lda), 0);
      const float* br = detail::rounded_copy<Compute>(
          b, detail::span_of(batch, stride_b, tb ? n : k, tb ? k : n, ldb), 1);
      Backend::gemm(ta, tb, m, n, k, alpha, ar, lda, stride_a, br, ldb, stride_b, beta, c, ldc, stride_c, batch);
    }
  }
  /// core/held_operand.hpp: the n floats at p converted once to Compute for the GEMMs that
  /// read them while the token lives, where Backend can hold them (hold_low).
  template <class T>
  static auto hold_operand(const T* p, std::size_t n) {
    if constexpr (std::is_same_v<T, float> && backend_hold_low<Backend>) return Backend::hold_low(element_type_of<Compute>, p, n);
    else return nothing_held{};
  }
  /// A token holding nothing yet, whose add(p, n) holds regions as hold_operand(p, n) does
  /// (a run's variables: exec/graph_engine.hpp).
  static auto hold_operands() {
    if constexpr (backend_hold_low<Backend>) return Backend::hold_low(element_type_of<Compute>);
    else return nothing_held{};
  }
  /// Backend::conv2d's contract, x and w rounded to Compute.
  template <class T>
  static void conv2d(const T* x, const T* w, const conv_geometry& g, T* y) {
    conv<conv_pass_kind::forward>(x, w, g, y);
  }
  /// Backend::conv2d_backward_data's contract, dy and w rounded to Compute.
  template <class T>
  static void conv2d_backward_data(const T* dy, const T* w, const conv_geometry& g, T* dx) {
    conv<conv_pass_kind::data>(dy, w, g, dx);
  }
  /// Backend::conv2d_backward_weights's contract, x and dy rounded to Compute.
  template <class T>
  static void conv2d_backward_weights(const T* x, const T* dy, const conv_geometry& g, T* dw) {
    conv<conv_pass_kind::weights>(x, dy, g, dw);
  }

 private:
  template <conv_pass_kind P, class T>
  static void conv(const T* a, const T* b, const conv_geometry& g, T* out) {
    const auto fp32 = [&](const T* x, const T* y) {
      if constexpr (P == conv_pass_kind::forward) Backend::conv2d(x, y, g, out);
      else if constexpr (P == conv_pass_kind::data) Backend::conv2d_backward_data(x, y, g, out);
      else Backend::conv2d_backward_weights(x, y, g, out);
    };
    if constexpr (!std::is_same_v<T, float>) {
      fp32(a, b);
    } else if constexpr (backend_conv_low<Backend>) {
      Backend::conv2d_low(element_type_of<Compute>, P, a, b, g, out);
    } else {
      static_assert(backend_host_memory<Backend>,
                    "gradus: this backend has no low-precision convolution (conv2d_low) and its memory is not the host's");
      const auto [a_size, b_size] = conv_operand_sizes(P, g);
      fp32(detail::rounded_copy<Compute>(a, static_cast<std::size_t>(a_size), 0),
           detail::rounded_copy<Compute>(b, static_cast<std::size_t>(b_size), 1));
    }
  }
};

/// The precision scopes (graph/ops/precision_scope.hpp) the planner is inside, innermost
/// first; empty: the session's policy alone.
template <class... Cs>
struct precision_stack {};
/// The stack under a precision_scope_node<C, E>: C pushed, or (outer_precision) the innermost popped.
template <class Stack, class C>
struct enter_scope;
/// (C pushed)
template <class... Cs, class C>
struct enter_scope<precision_stack<Cs...>, C> {
  using type = precision_stack<C, Cs...>;  ///< C innermost
};
/// (outer_precision: the innermost popped)
template <class Top, class... Rest>
struct enter_scope<precision_stack<Top, Rest...>, outer_precision> {
  using type = precision_stack<Rest...>;  ///< the scope around it
};
/// (outer_precision outside every scope: the policy)
template <>
struct enter_scope<precision_stack<>, outer_precision> {
  using type = precision_stack<>;  ///< still the policy
};
/// enter_scope<Stack, C>::type.
template <class Stack, class C>
using enter_scope_t = typename enter_scope<Stack, C>::type;

/// What compute-precision ops run in under Backend's policy inside the scopes Stack: the
/// innermost scope's type, else the policy's compute type.
template <class Backend, class Stack>
struct scope_compute {
  using type = typename precision_of_backend_t<Backend>::compute;  ///< the policy's
};
/// (inside a scope: its type)
template <class Backend, class Top, class... Rest>
struct scope_compute<Backend, precision_stack<Top, Rest...>> {
  using type = Top;  ///< the innermost scope's
};
/// scope_compute<Backend, Stack>::type.
template <class Backend, class Stack>
using scope_compute_t = typename scope_compute<Backend, Stack>::type;

/// The backend node N's kernels run on under Backend's policy, inside the precision scopes
/// Stack: compute_kernels where N runs in compute precision and that precision is bf16 or
/// f16, else Backend itself (whose kernels are fp32's).
template <class Backend, class N, class Stack = precision_stack<>>
using kernel_backend_t =
    std::conditional_t<op_precision_of<N> == op_precision::compute && !std::is_same_v<scope_compute_t<Backend, Stack>, float>,
                       compute_kernels<Backend, scope_compute_t<Backend, Stack>>, Backend>;

}  // namespace gradus
