#pragma once
// cpu_simd: fused passes. assign() evaluates one elementwise plan (exec/plan.hpp) with
// xsimd batches; for_each() runs an optimizer's rule in place over its arrays.
#include "gradus/core/intrinsics.hpp"  // first: see there (and streaming stores)
#include "gradus/backends/cpu_simd/memory.hpp"

namespace gradus::cpu_simd_sections {

struct fused_section : memory_section {
  /// ---- fused elementwise pass ------------------------------------------------------------
  /// Rows are cut into pieces of `chunk` elements and dealt out statically, so each thread
  /// writes one contiguous range of the output. An output larger than the last-level
  /// cache cannot still be in cache when its consumer reads it, so it is written with
  /// streaming stores: they skip reading each output line before overwriting it, which
  /// on a memory-bound pass is a quarter (three arrays) to a fifth (four) of the traffic.
  template <class T, class Plan>
  static void assign(T* out, const loop_shape& ls, const Plan& plan) {
    const index_t rows = ls.rows(), inner = ls.inner();
    const index_t pieces = (inner + chunk - 1) / chunk;
    const index_t tasks = rows * pieces;
    const std::size_t nlead = ls.rank - 1;
    const bool par = rows * inner >= parallel_threshold && tasks > 1;
    const bool stream =
        can_stream<T>() && static_cast<std::size_t>(rows * inner) * sizeof(T) >= stream_threshold_bytes();
    struct cursor {  // a thread's copy of the plan, set to its current row
      Plan p;
      index_t idx[max_rank] = {};
      index_t row = -1;
    };
    const auto task = [&](cursor& c, index_t t) {
      const index_t row = t / pieces, piece = t % pieces;
      if (row != c.row) {
        ls.row_index(row, c.idx);
        c.p.set_row(c.idx, nlead);
        c.row = row;
      }
      const index_t j0 = piece * chunk, j1 = std::min(inner, j0 + chunk);
      if constexpr (can_stream<T>()) {
        if (stream) return span_streaming(out + row * inner, c.p, j0, j1);
      }
      span(out + row * inner, c.p, j0, j1);
    };
    // Streaming stores are weakly ordered: the fence makes them visible before anyone (after
    // the region's closing barrier) reads the output.
    if (!par) {  // on the calling thread, without a region: one of one thread still costs
      cursor c{plan};  // libgomp's team set-up (2-3% of a micro-batched step of small passes)
      for (index_t t = 0; t < tasks; ++t) task(c, t);
      if (stream) store_fence();
      return;
    }
#pragma omp parallel
    {
      cursor c{plan};
#pragma omp for schedule(static) nowait
      for (index_t t = 0; t < tasks; ++t) task(c, t);
      if (stream) store_fence();
    }
  }

  /// ---- in-place update passes (optimizers) ------------------------------------------------
  /// rule(x...) is called with one SIMD batch of every array, as lvalues; the arrays given
  /// as non-const pointers are written back. All arrays have n elements of one dtype. A
  /// chunk's last partial batch is padded (tail_batch), so every element goes through the
  /// rule's SIMD code: the same bits wherever it lands (see exec/plan.hpp).
  template <class F, class P0, class... P>
  static void for_each(index_t n, const F& rule, P0* p0, P*... p) {
    using T = std::remove_const_t<P0>;
    static_assert((std::is_same_v<std::remove_const_t<P>, T> && ...), "gradus: for_each: arrays of one dtype");
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    const index_t pieces = (n + chunk - 1) / chunk;
    const bool par = n >= parallel_threshold && pieces > 1;
    const auto piece = [&](index_t t) {
      const index_t j0 = t * chunk, j1 = std::min(n, j0 + chunk);
      index_t j = j0;
      for (; j + W <= j1; j += W) {
        auto v = std::tuple{B::load_unaligned(p0 + j), B::load_unaligned(p + j)...};
        std::apply(rule, v);
        store_back(v, j, p0, p...);
      }
      if (j < j1) {
        const index_t m = j1 - j;
        auto v = std::tuple{tail_batch<B>(p0 + j, m), tail_batch<B>(p + j, m)...};
        std::apply(rule, v);
        store_tail(v, j, m, p0, p...);
      }
    };
    if (!par) {  // (as assign's)
      for (index_t t = 0; t < pieces; ++t) piece(t);
      return;
    }
#pragma omp parallel for schedule(static)
    for (index_t t = 0; t < pieces; ++t) piece(t);
  }

 protected:
  template <class Tuple, class... P>
  static void store_back(const Tuple& v, index_t j, P*... p) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (store_one(std::get<I>(v), p + j), ...);
    }(std::index_sequence_for<P...>{});
  }
  template <class V, class T>
  static void store_one(const V& v, T* dst) {
    if constexpr (!std::is_const_v<T>) v.store_unaligned(dst);
  }
  template <class Tuple, class... P>
  static void store_tail(const Tuple& v, index_t j, index_t m, P*... p) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (store_first(std::get<I>(v), m, p + j), ...);
    }(std::index_sequence_for<P...>{});
  }
  /// The first m lanes of v to dst (nothing for a read-only array).
  template <class B, class T>
  static void store_first(const B& v, index_t m, T* dst) {
    if constexpr (!std::is_const_v<T>) {
      alignas(sizeof(B)) T lanes[B::size];
      v.store_aligned(lanes);
      std::copy(lanes, lanes + m, dst);
    }
  }
  /// The m < B::size elements at x as a batch; the other lanes repeat x[m - 1].
  template <class B, class T>
  static B tail_batch(const T* x, index_t m) {
    alignas(sizeof(B)) std::remove_const_t<T> lanes[B::size];
    for (std::size_t k = 0; k < B::size; ++k) lanes[k] = x[std::min<index_t>(static_cast<index_t>(k), m - 1)];
    return B::load_aligned(lanes);
  }

  /// Elements [j0, j1) of a row as SIMD batches. The part after the last full batch is one
  /// more batch: the batch ending at j1 where the row holds one (it overlaps the last full
  /// batch, whose lanes it recomputes with the same bits), else a padded one (load_tail).
  /// So every element, wherever it lies in its row, takes the SIMD code path.
  template <class T, class Plan>
  static void span(T* o, const Plan& p, index_t j0, index_t j1) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    index_t j = j0;
    for (; j + W <= j1; j += W) p.template load<B>(j).store_unaligned(o + j);
    if (j < j1) span_tail(o, p, j0, j, j1);
  }
  template <class T, class Plan>
  static void span_tail(T* o, const Plan& p, index_t j0, index_t j, index_t j1) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    if (j1 - j0 >= W) return p.template load<B>(j1 - W).store_unaligned(o + j1 - W);
    store_first(p.template load_tail<B>(j, j1 - j), j1 - j, o + j);
  }

  /// Outputs of at least this many bytes are written with streaming stores: the size of the
  /// last-level cache this process's first CPU sits behind, as Linux reports it
  /// (/sys/devices/system/cpu/cpuN/cache), else the C library's figure, else 32 MiB. Not the C
  /// library's first: on AMD EPYC glibc's _SC_LEVEL3_CACHE_SIZE adds up every CCX's L3 (320
  /// MiB on the 2-vCPU machine of benchmarks/README.md, where a core sees 32 MiB), which kept
  /// a 128 MiB output on cached stores and gradus at 0.76x of a plain OpenMP loop.
  static std::size_t stream_threshold_bytes() {
    static const std::size_t bytes = [] {
      std::size_t llc = cpu_threads::last_level_cache_bytes();
#if defined(_SC_LEVEL3_CACHE_SIZE)
      if (llc == 0) {
        long v = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (v <= 0) v = sysconf(_SC_LEVEL2_CACHE_SIZE);
        if (v > 0) llc = static_cast<std::size_t>(v);
      }
#endif
      return llc > 0 ? llc : std::size_t{32} << 20;
    }();
    return bytes;
  }

  /// span() with the batches stored by streaming stores, which need an aligned address.
  /// Every element still takes the same path as in span() (a batch's lanes do not depend
  /// on where the batch starts), so results are
  /// bit-identical: a cached batch at j0 covers the unaligned head, streamed batches
  /// follow from the first aligned element, and a cached batch ending at simd_end covers
  /// what is left. Head and last batch may overlap streamed ones: the same values are
  /// written twice, which is safe because a pass never writes a buffer it reads.
  template <class T, class Plan>
  static void span_streaming(T* o, const Plan& p, index_t j0, index_t j1) {
    using B = xsimd::batch<T>;
    constexpr index_t W = static_cast<index_t>(B::size);
    const index_t simd_end = j0 + (j1 - j0) / W * W;
    if (simd_end - j0 < 4 * W) return span(o, p, j0, j1);  // too short to pay for aligning
    const auto addr = reinterpret_cast<std::uintptr_t>(o + j0);
    index_t j = j0;
    if (addr % sizeof(B)) {
      p.template load<B>(j0).store_unaligned(o + j0);
      j = j0 + static_cast<index_t>((sizeof(B) - addr % sizeof(B)) / sizeof(T));
    }
    for (; j + W <= simd_end; j += W) stream_store(o + j, p.template load<B>(j));
    if (j < simd_end) p.template load<B>(simd_end - W).store_unaligned(o + simd_end - W);
    if (simd_end < j1) span_tail(o, p, j0, simd_end, j1);
  }

  /// Non-temporal store of one batch (AVX-512 or AVX register; the address is aligned to
  /// its size). can_stream<T>() says whether this target has one for T's batch.
  template <class T>
  static constexpr bool can_stream() {
    [[maybe_unused]] constexpr std::size_t bytes = sizeof(xsimd::batch<T>);
    if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double> && !std::is_same_v<T, std::int32_t>)
      return false;
#if defined(__AVX512F__)
    if (bytes == 64) return true;
#endif
#if defined(__AVX__)
    if (bytes == 32) return true;
#endif
    return false;
  }
  template <class T>
  static void stream_store([[maybe_unused]] T* o, [[maybe_unused]] const xsimd::batch<T>& v) {
    static_assert(can_stream<T>(), "gradus: cpu_simd: no streaming store for this batch type");
#if defined(__AVX512F__)
    if constexpr (sizeof(v) == 64) {
      if constexpr (std::is_same_v<T, float>) _mm512_stream_ps(o, v);
      else if constexpr (std::is_same_v<T, double>) _mm512_stream_pd(o, v);
      else _mm512_stream_si512(reinterpret_cast<__m512i*>(o), v);
      return;
    }
#endif
#if defined(__AVX__)
    if constexpr (sizeof(v) == 32) {
      if constexpr (std::is_same_v<T, float>) _mm256_stream_ps(o, v);
      else if constexpr (std::is_same_v<T, double>) _mm256_stream_pd(o, v);
      else _mm256_stream_si256(reinterpret_cast<__m256i*>(o), v);
    }
#endif
  }
  static void store_fence() {
#if defined(__AVX__)
    _mm_sfence();
#endif
  }
};

}  // namespace gradus::cpu_simd_sections
