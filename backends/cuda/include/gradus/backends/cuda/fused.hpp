#pragma once
// cuda: fused passes. assign() evaluates one elementwise plan (exec/plan.hpp) with one
// thread per output element: the plan is a by-value struct of pointers, strides and
// scalars (mshadow's MapPlan idea), copied into the kernel, positioned on the element's
// row (set_row) and evaluated as a scalar (eval) — the same plan code cpu_simd runs, so a
// new elementwise op is written once. for_each() runs an optimizer's or an RNN cell's rule
// per element over its arrays.
#include <type_traits>
#include <utility>

#include "gradus/backends/cuda/memory.hpp"
#include "gradus/exec/plan.hpp"

namespace gradus {

namespace cuda_kernels {

template <class T, class Plan>
struct assign_fn {
  T* out;
  loop_shape ls;
  Plan plan;
  GRADUS_HD void operator()(index_t i) const {
    const index_t inner = ls.d[ls.rank - 1];
    const index_t row = i / inner, j = i - row * inner;
    index_t idx[max_rank] = {};
    ls.row_index(row, idx);
    Plan p = plan;
    p.set_row(idx, ls.rank - 1);
    out[i] = static_cast<T>(p.eval(j));
  }
};

// rule(v0, v1, ...) on element i of every array; arrays marked in `writes` are stored back.
template <class F, class T, std::size_t N, unsigned long long Writes>
struct for_each_fn {
  F rule;
  T* p[N];
  GRADUS_HD void operator()(index_t i) const { apply(i, std::make_index_sequence<N>{}); }
  template <std::size_t... I>
  GRADUS_HD void apply(index_t i, std::index_sequence<I...>) const {
    T v[N] = {p[I][i]...};
    rule(v[I]...);
    ((((Writes >> I) & 1ull) ? (void)(p[I][i] = v[I]) : (void)0), ...);
  }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct fused_section : memory_section {
  template <class T, class Plan>
  static void assign(T* out, const loop_shape& ls, const Plan& plan) {
    for_n(ls.rows() * ls.inner(), cuda_kernels::assign_fn<T, Plan>{out, ls, plan});
  }

  template <class F, class P0, class... P>
  static void for_each(index_t n, const F& rule, P0* p0, P*... p) {
    using T = std::remove_const_t<P0>;
    static_assert((std::is_same_v<std::remove_const_t<P>, T> && ...), "gradus: for_each: arrays of one dtype");
    constexpr std::size_t N = 1 + sizeof...(P);
    static_assert(N <= 64, "gradus: for_each: at most 64 arrays");
    constexpr unsigned long long writes = [] {
      const bool w[N] = {!std::is_const_v<P0>, !std::is_const_v<P>...};
      unsigned long long m = 0;
      for (std::size_t k = 0; k < N; ++k)
        if (w[k]) m |= 1ull << k;
      return m;
    }();
    for_n(n, cuda_kernels::for_each_fn<F, T, N, writes>{rule, {const_cast<T*>(p0), const_cast<T*>(p)...}});
  }
};

}  // namespace cuda_sections
}  // namespace gradus
