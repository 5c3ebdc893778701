#pragma once
// cuda: fused passes. assign() evaluates one elementwise plan (exec/plan.hpp): the plan is
// a by-value struct of pointers, strides and scalars (mshadow's MapPlan idea), copied into
// the kernel, positioned on the element's row (set_row) and evaluated per element — the
// same plan code cpu_simd runs, so a new elementwise op is written once. Where every row
// of the output and of each leaf starts 16-byte aligned and is contiguous (or broadcast),
// and the rows are a multiple of 16 bytes long, each thread takes 16 bytes of the output
// (4 floats, 2 doubles: eval_lanes, one vector load per leaf and one vector store). Other
// rows of at least rows_min elements are spread over a multiple of 32 threads, each taking
// rows_per_thread elements of one row (assign_rows_fn: the row found once per thread, and
// every leaf's loads for all its elements in flight before the first store: 0.89x a device
// copy's bandwidth on an H200 for rows of 4099 floats, where one element per thread, one
// load per leaf in flight and the row found per element, moved 0.47x). Short rows take one
// thread per element (eval); a flat pass (one row) there skips the row arithmetic.
// for_each() runs an optimizer's or an RNN cell's rule per element over its arrays.
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "gradus/backends/cuda/memory.hpp"
#include "gradus/exec/plan.hpp"

namespace gradus {

namespace cuda_kernels {

/// i / d for i >= 0, d > 0: a 32-bit division where both fit (a 64-bit one is a long
/// software sequence on a GPU).
GRADUS_HD inline index_t quotient(index_t i, index_t d) {
  return (static_cast<std::uint64_t>(i) | static_cast<std::uint64_t>(d)) >> 32 == 0
             ? static_cast<index_t>(static_cast<std::uint32_t>(i) / static_cast<std::uint32_t>(d))
             : i / d;
}

/// The plan positioned on row `row`.
template <class Plan>
GRADUS_HD Plan at_row(const Plan& plan, const loop_shape& ls, index_t row) {
  Plan p = plan;
  index_t idx[max_rank] = {};
  if (ls.rank > 1) ls.row_index(row, idx);
  p.set_row(idx, ls.rank - 1);
  return p;
}

/// The plan positioned on the row of flat element i; j is i's place in the row.
template <class Plan>
GRADUS_HD Plan on_row(const Plan& plan, const loop_shape& ls, index_t i, index_t& j) {
  if (ls.rank == 1) {
    j = i;
    return at_row(plan, ls, 0);
  }
  const index_t inner = ls.inner();
  const index_t row = quotient(i, inner);
  j = i - row * inner;
  return at_row(plan, ls, row);
}

template <class T, class Plan>
struct assign_fn {  // one element per thread
  T* out;
  loop_shape ls;
  Plan plan;
  GRADUS_HD void operator()(index_t i) const {
    index_t j = 0;
    const Plan p = on_row(plan, ls, i, j);
    out[i] = static_cast<T>(p.eval(j));
  }
};

template <class T, class Plan, int V>
struct assign_lanes_fn {  // V elements (16 bytes) per thread
  T* out;
  loop_shape ls;
  Plan plan;
  GRADUS_HD void operator()(index_t t) const {
    const index_t i = t * V;
    index_t j = 0;
    const Plan p = on_row(plan, ls, i, j);
    const auto r = p.template eval_lanes<V>(j);
#if defined(__CUDA_ARCH__)
    struct alignas(sizeof(T) * V) chunk {
      T v[V];
    } c;
    for (int k = 0; k < V; ++k) c.v[k] = static_cast<T>(r.v[k]);
    *reinterpret_cast<chunk*>(out + i) = c;  // one 16-byte store
#else
    for (int k = 0; k < V; ++k) out[i + k] = static_cast<T>(r.v[k]);
#endif
  }
};

/// How fused_section::assign strides a row that the 16-byte kernel cannot take.
inline constexpr int rows_per_thread = 8;  ///< 0.89x a copy on an H200; 4: 0.86x, 2: 0.70x (rows of 4099)
inline constexpr index_t rows_min = 128;  ///< shorter rows: one element per thread (rows of 130: 0.78x, against 0.47x)

/// `width` threads to a row (a multiple of 32, so that a warp stays in one row and its loads
/// coalesce), thread `lane` taking elements lane, lane + width, ... (rows_per_thread of them,
/// width * rows_per_thread >= the row's length): every leaf's loads are issued before the
/// first store, so a thread has rows_per_thread loads per leaf in flight.
template <class T, class Plan, int U = rows_per_thread>
struct assign_rows_fn {
  T* out;
  loop_shape ls;
  Plan plan;
  index_t width;
  GRADUS_HD void operator()(index_t t) const {
    const index_t row = quotient(t, width), lane = t - row * width, inner = ls.inner();
    const Plan p = at_row(plan, ls, row);
    T r[U] = {};
    GRADUS_UNROLL
    for (int k = 0; k < U; ++k) {
      const index_t j = lane + k * width;
      if (j < inner) r[k] = static_cast<T>(p.eval(j));
    }
    T* o = out + row * inner;
    GRADUS_UNROLL
    for (int k = 0; k < U; ++k) {
      const index_t j = lane + k * width;
      if (j < inner) o[j] = r[k];
    }
  }
};

/// rule(v0, v1, ...) on element i of every array; arrays marked in `writes` are stored back.
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

/// How many fused passes took each kernel (tests check that each runs).
struct fused_counts {
  std::size_t by_lanes = 0, by_rows = 0, by_element = 0;
};

struct fused_section : memory_section {
  template <class T, class Plan>
  static void assign(T* out, const loop_shape& ls, const Plan& plan) {
    const index_t n = ls.rows() * ls.inner();
    if (n <= 0) return;
    expect_device(out, static_cast<std::size_t>(n) * sizeof(T), "assign", "the output");
    constexpr int V = sizeof(T) == 4 || sizeof(T) == 8 ? static_cast<int>(16 / sizeof(T)) : 1;
    if (V > 1 && ls.inner() % V == 0 && reinterpret_cast<std::uintptr_t>(out) % 16 == 0 && plan.lanes_ok(ls.rank, V)) {
      ++counters().by_lanes;
      for_n(n / V, cuda_kernels::assign_lanes_fn<T, Plan, V>{out, ls, plan});
    } else if (ls.inner() >= cuda_kernels::rows_min) {
      ++counters().by_rows;
      constexpr index_t u = cuda_kernels::rows_per_thread;
      const index_t width = ((ls.inner() + u - 1) / u + 31) / 32 * 32;
      for_n(ls.rows() * width, cuda_kernels::assign_rows_fn<T, Plan>{out, ls, plan, width});
    } else {
      ++counters().by_element;
      for_n(n, cuda_kernels::assign_fn<T, Plan>{out, ls, plan});
    }
  }
  static fused_counts fused_stats() {
    return {counters().by_lanes.load(), counters().by_rows.load(), counters().by_element.load()};
  }

  template <class F, class P0, class... P>
  static void for_each(index_t n, const F& rule, P0* p0, P*... p) {
    using T = std::remove_const_t<P0>;
    static_assert((std::is_same_v<std::remove_const_t<P>, T> && ...), "gradus: for_each: arrays of one dtype");
    constexpr std::size_t N = 1 + sizeof...(P);
    static_assert(N <= 64, "gradus: for_each: at most 64 arrays");
    const auto bytes = static_cast<std::size_t>(n > 0 ? n : 0) * sizeof(T);
    expect_device(p0, bytes, "for_each", "an array");
    (expect_device(p, bytes, "for_each", "an array"), ...);
    constexpr unsigned long long writes = [] {
      const bool w[N] = {!std::is_const_v<P0>, !std::is_const_v<P>...};
      unsigned long long m = 0;
      for (std::size_t k = 0; k < N; ++k)
        if (w[k]) m |= 1ull << k;
      return m;
    }();
    for_n(n, cuda_kernels::for_each_fn<F, T, N, writes>{rule, {const_cast<T*>(p0), const_cast<T*>(p)...}});
  }

 private:
  struct atomic_counts {
    std::atomic<std::size_t> by_lanes{0}, by_rows{0}, by_element{0};
  };
  static atomic_counts& counters() {
    static atomic_counts c;
    return c;
  }
};

}  // namespace cuda_sections
}  // namespace gradus
