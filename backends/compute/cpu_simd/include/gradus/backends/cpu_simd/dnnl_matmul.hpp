#pragma once
// cpu_simd's float GEMMs of few rows against held weights, through oneDNN's matmul on its
// own weight layout (where CMake found oneDNN: GRADUS_HAVE_DNNL; GRADUS_DNNL=0 or
// cpu_dnnl::set_enabled(false) switch it off with the convolutions).
//
// Why: a pipeline stage (parallel/pipeline/) runs each of its M micro-batches — 8 rows at
// batch 64 and M = 8 — against the same weights, which change only at the step's update.
// OpenBLAS spends much of a call of few rows packing the weight matrix, every call.
// Single-threaded on an AMD EPYC (Zen 4), [m, 512] x [512, 512] in GFLOP/s, OpenBLAS /
// oneDNN's matmul on the row-major operands / oneDNN on its own weight layout, the weights
// reordered once (29 us for 512 x 512):
//   m =  8: 45.8 /  67.7 / 111.9      m = 32: 78.8 /  98.0 / 115.0
//   m = 16: 72.9 /  85.5 / 113.7      m = 64: 94.8 / 106.3 / 115.7
// (the transposed right operand of a backward pass alike: 44.0 / 66.3 at m = 8). A stage
// holds its weights for the step (hold_weights) and releases them before its update
// (release_weights); a product whose right operand lies in a held region reorders it into
// oneDNN's layout once per step and operand (transposed or not), and every micro-batch
// reuses the copy. After its update the stage refills its copies (refill_weights), while
// each variable is still in cache, so the next step's first micro-batch does not reorder
// cold weights (15-17% of a step at batch 64, benchmarks/results/issue31_*); it packs them
// itself (cpu_simd/panel_pack.hpp: 0.6-0.7 of oneDNN's reorders' time, streaming stores)
// where oneDNN's layout is the panels that code knows, else reorders with oneDNN. The copies stay
// fresh past the release only while weights_epoch() — bumped by every release on the
// thread — is what the stage read after refilling, and the stage also checks that nothing
// wrote its session's variables meanwhile (session::write_epoch); else it releases first.
// Products against anything else stay with OpenBLAS: oneDNN's matmul on GEMM blocks in the
// row-major layout was tried before and not kept (docs/design.md: the LSTM's 64 x 128 x 128
// products ran 15% slower), and its execute allocates (argument lists), which
// tests/exec/test_alloc.cpp keeps out of a plain step. The packed and the
// row-major kernels gave the same bits on every shape tried (6-64 rows, k 16-784, either
// transpose).
//
// Only the calling thread's own products use held copies (not a parallel GEMM's blocks on
// other threads), so the bits follow threads() and the shape as every GEMM's; holds are per
// thread (an in-process pipeline's stages each hold their own). A plan (primitive, memory
// objects with their handles set per call, scratchpad, the reorder) is made once per shape
// and thread at one OpenMP thread and run at one, as the convolutions' (cpu_simd/dnnl.hpp).
//
// small_matmul(...) runs C = A B (alpha 1, beta 0; A [m, k] or its transpose, B [k, n] or
// its transpose, row-major with leading dimensions) and returns true, or returns false
// (nothing written) where the caller's OpenBLAS path must run: oneDNN off or absent, B not
// held, more than small_rows rows, n or k below min_edge, or a shape oneDNN refused.
#include <cstddef>
#include <cstdint>

#if defined(GRADUS_HAVE_DNNL) && GRADUS_HAVE_DNNL
#include <omp.h>

#include <atomic>
#include <memory>
#include <unordered_map>
#include <vector>

#include "gradus/backends/cpu_simd/dnnl.hpp"
#include "gradus/backends/cpu_simd/panel_pack.hpp"

namespace gradus::cpu_dnnl {

/// The products taken: at most small_rows rows, n and k at least min_edge() (64: below it
/// OpenBLAS's packing costs little; tests lower it to reach this path with small models).
constexpr std::int64_t small_rows = 64;
inline std::atomic<std::int64_t>& min_edge() {
  static std::atomic<std::int64_t> e{64};
  return e;
}

struct matmul_plan {
  bool ta = false, tb = false;
  dim m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool usable = false;
  dnnl::primitive prim;
  dnnl::memory a, b, c, scratchpad;
  std::unordered_map<int, dnnl::memory> args;
  dnnl::stream stream;
  /// the weights' layout, and the reorder of the row-major weights (b) into it
  dnnl::memory::desc weights_md;
  dnnl::primitive reorder;
  bool same(bool ta_, bool tb_, dim m_, dim n_, dim k_, dim lda_, dim ldb_, dim ldc_) const {
    return ta == ta_ && tb == tb_ && m == m_ && n == n_ && k == k_ && lda == lda_ && ldb == ldb_ && ldc == ldc_;
  }
};

inline matmul_plan& matmul_plan_for(bool ta, bool tb, dim m, dim n, dim k, dim lda, dim ldb, dim ldc) {
  thread_local std::vector<std::unique_ptr<matmul_plan>> plans;
  for (auto& p : plans)
    if (p->same(ta, tb, m, n, k, lda, ldb, ldc)) return *p;
  auto p = std::make_unique<matmul_plan>();
  p->ta = ta, p->tb = tb, p->m = m, p->n = n, p->k = k, p->lda = lda, p->ldb = ldb, p->ldc = ldc;
  try {
    cpu_threads::blas_on_one_thread([&] {  // created at one OpenMP thread, run at one
      using dt = dnnl::memory::data_type;
      const auto& eng = engine();
      // row-major operands as strided descriptors: a transpose is a swap of the strides
      const dnnl::memory::desc a_md({m, k}, dt::f32, ta ? dnnl::memory::dims{1, lda} : dnnl::memory::dims{lda, 1});
      const dnnl::memory::desc b_md({k, n}, dt::f32, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
      const dnnl::memory::desc c_md({m, n}, dt::f32, dnnl::memory::dims{ldc, 1});
      dnnl::primitive_attr attr;
      attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
      const dnnl::memory::desc w_md({k, n}, dt::f32, dnnl::memory::format_tag::any);  // oneDNN's layout
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_md, c_md), attr, eng);
      p->prim = dnnl::matmul(pd);
      p->a = dnnl::memory(a_md, eng, DNNL_MEMORY_NONE);
      p->b = dnnl::memory(b_md, eng, DNNL_MEMORY_NONE);
      p->c = dnnl::memory(c_md, eng, DNNL_MEMORY_NONE);
      p->scratchpad = dnnl::memory(pd.scratchpad_desc(), eng);
      p->args = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}, {DNNL_ARG_SCRATCHPAD, p->scratchpad}};
      p->stream = dnnl::stream(eng);
      p->weights_md = pd.weights_desc();
      p->reorder = dnnl::reorder(dnnl::reorder::primitive_desc(eng, b_md, eng, p->weights_md));
    });
    p->usable = true;
  } catch (const dnnl::error&) {
    p->prim = {};  // no primitive for this shape: the caller's path, from now on at once
  }
  if (plans.size() >= max_plans) plans.erase(plans.begin(), plans.begin() + max_plans / 2);  // oldest first
  plans.push_back(std::move(p));
  return *plans.back();
}

/// The calling thread's held weight regions, and their packed copies (one per operand —
/// start, transposed or not, leading dimension — and layout; `fresh` until the next release:
/// a square matrix and its transpose have the same packed layout, not the same copy).
struct held_weights {
  struct region {
    const char* p;
    std::size_t bytes;
  };
  struct copy {  // of b read as p's plan reads it (transposed or not, its leading dimension)
    const void* p;
    bool tb;
    dim ldb;
    dnnl::memory::desc md;
    dnnl::memory mem;
    dnnl::primitive reorder;  ///< of the row-major b (src) into mem, the plan's
    dnnl::memory src;         ///< b as the plan reads it
    bool fresh = false;
    dim k = 0, n = 0;               ///< B's shape
    cpu_pack::panel_layout panels;  ///< md as cpu_pack's panels (refill_weights packs them), or none
  };
  std::vector<region> regions;
  std::vector<copy> copies;
  std::uint64_t epoch = 0;  ///< release_weights() calls on this thread
  /// copies filled by a product that found them stale, and by refill_weights (what tests count)
  std::uint64_t filled_on_use = 0, refilled = 0;
  dnnl::stream stream;      ///< refill_weights()'s, made on first use
  bool holds(const void* b) const {
    const auto* q = static_cast<const char*>(b);
    for (const auto& r : regions)
      if (q >= r.p && q < r.p + r.bytes) return true;
    return false;
  }
};
inline held_weights& held() {
  thread_local held_weights h;
  return h;
}
/// [p, p + bytes) will not change until release_weights() (see the top of this file).
inline void hold_weights(const void* p, std::size_t bytes) {
  if (enabled()) held().regions.push_back({static_cast<const char*>(p), bytes});
}
/// The holds end; the packed copies are kept (their buffers reused) but refilled on next use.
inline void release_weights() {
  auto& h = held();
  h.regions.clear();
  for (auto& c : h.copies) c.fresh = false;
  ++h.epoch;
}
/// How many releases this thread has made: a holder that refilled its copies reads it, and
/// finds them still its own at its next hold only if it has not changed.
inline std::uint64_t weights_epoch() { return held().epoch; }
/// md as cpu_pack's panels (k padded to a block, n cut in panels of nb), or none.
inline cpu_pack::panel_layout panels_of(const dnnl::memory::desc& md, dim k, dim n) {
  const dnnl_memory_desc_t& d = md.data;
  if (!cpu_pack::packs_fast || d.format_kind != dnnl_blocked || d.ndims != 2 || d.offset0 != 0 || d.extra.flags != 0 ||
      d.dims[0] != k || d.dims[1] != n || d.padded_offsets[0] != 0 || d.padded_offsets[1] != 0)
    return {};
  const auto& b = d.format_desc.blocking;
  if (b.inner_nblks != 2 || b.inner_idxs[0] != 0 || b.inner_idxs[1] != 1) return {};
  const dim kb = b.inner_blks[0], nb = b.inner_blks[1], kp = (k + kb - 1) / kb * kb;
  if (d.padded_dims[0] != kp || d.padded_dims[1] != (n + nb - 1) / nb * nb || b.strides[0] != kb * nb ||
      b.strides[1] != kp * nb)
    return {};
  return {nb, kp};
}
/// [p, p + bytes) was written (the holder's update): the packed copies of operands inside it
/// are filled from it now — by cpu_pack where it knows the copy's layout, else by oneDNN's
/// reorder — and fresh until the next release.
inline void refill_weights(const void* p, std::size_t bytes) {
  auto& h = held();
  const auto* lo = static_cast<const char*>(p);
  for (auto& c : h.copies) {
    const auto* q = static_cast<const char*>(c.p);
    if (q < lo || q >= lo + bytes) continue;
    if (c.panels) {
      cpu_pack::pack_rows(c.panels, c.tb, c.k, c.n, static_cast<const float*>(c.p), c.ldb, 0, c.tb ? c.n : c.k,
                          static_cast<float*>(c.mem.get_data_handle()));
    } else {
      cpu_threads::blas_on_one_thread([&] {
        if (!h.stream) h.stream = dnnl::stream(engine());
        c.reorder.execute(h.stream, {{DNNL_ARG_FROM, c.src}, {DNNL_ARG_TO, c.mem}});
        h.stream.wait();
      });
    }
    c.fresh = true;
    ++h.refilled;
  }
}

/// See the top of this file.
inline bool small_matmul(bool ta, bool tb, dim m, dim n, dim k, const float* a, dim lda, const float* b, dim ldb, float* c,
                         dim ldc) {
  if (m > small_rows || n < min_edge() || k < min_edge() || omp_in_parallel() || !held().holds(b) || !enabled()) return false;
  matmul_plan& p = matmul_plan_for(ta, tb, m, n, k, lda, ldb, ldc);
  if (!p.usable) return false;
  auto& h = held();
  held_weights::copy* cp = nullptr;
  for (auto& x : h.copies)
    if (x.p == b && x.tb == tb && x.ldb == ldb && x.md == p.weights_md) cp = &x;
  if (!cp) {
    if (h.copies.size() >= max_plans) h.copies.erase(h.copies.begin(), h.copies.begin() + max_plans / 2);
    // filled below by oneDNN's reorder, which writes (zeroes) the padding that pack_rows skips
    h.copies.push_back({b, tb, ldb, p.weights_md, dnnl::memory(p.weights_md, engine()), p.reorder,
                        dnnl::memory(p.b.get_desc(), engine(), const_cast<float*>(b)), false, k, n,
                        panels_of(p.weights_md, k, n)});
    cp = &h.copies.back();
  }
  p.a.set_data_handle(const_cast<float*>(a));
  p.b.set_data_handle(const_cast<float*>(b));
  p.c.set_data_handle(c);
  p.args[DNNL_ARG_WEIGHTS] = cp->mem;
  cpu_threads::blas_on_one_thread([&] {
    if (!cp->fresh) cp->reorder.execute(p.stream, {{DNNL_ARG_FROM, cp->src}, {DNNL_ARG_TO, cp->mem}});
    p.prim.execute(p.stream, p.args);
    p.stream.wait();
  });
  if (!cp->fresh) ++h.filled_on_use;
  cp->fresh = true;
  return true;
}

}  // namespace gradus::cpu_dnnl

#else
/// Built without oneDNN: every product takes OpenBLAS.
namespace gradus::cpu_dnnl {
inline void hold_weights(const void*, std::size_t) {}
inline void release_weights() {}
inline std::uint64_t weights_epoch() { return 0; }
inline void refill_weights(const void*, std::size_t) {}
inline bool small_matmul(bool, bool, std::int64_t, std::int64_t, std::int64_t, const float*, std::int64_t, const float*,
                         std::int64_t, float*, std::int64_t) {
  return false;
}
}  // namespace gradus::cpu_dnnl
#endif
