#pragma once
// cpu_simd's bf16 GEMM through oneDNN's matmul (bf16 operands, fp32 accumulation, an fp32
// result: oneDNN's AVX512_BF16 / AMX kernels), where CMake found oneDNN (GRADUS_HAVE_DNNL) and
// the CPU has AVX512_BF16; cpu_simd/low_precision.hpp decides.
//
// Threads: cpu_simd/low_precision.hpp cuts a product into threads() slices along its larger
// operand (rows of A or columns of B, so each slice packs only its share of it into oneDNN's
// bf16 layout) and runs them as one-thread oneDNN calls on the team (cpu_dnnl::on_team, as the
// convolutions do): the bits follow threads() and the shape, never the team the governor
// picks, and a core another process holds slows a step by its share of the work instead of
// stalling every oneDNN barrier (one two-thread call per product took 8-17x as long as the
// fp32 step with a compiler running beside it).
//
// Why oneDNN rather than OpenBLAS: Debian's OpenBLAS 0.3.21 has sbgemm only for
// DYNAMIC_ARCH=cooperlake builds and none that takes fp32 operands; oneDNN is what PyTorch's
// CPU bf16 matmul runs on.
#include <cstdint>
#include <vector>

#include "gradus/core/half.hpp"
#include "gradus/core/shape.hpp"

#include "gradus/core/intrinsics.hpp"

namespace gradus::cpu_dnnl {

/// dst[i] = bf16(src[i]) bits, round to nearest even, for n values (AVX512_BF16's VCVTNE2PS2BF16
/// where compiled for it: 32 per instruction, the same bits).
inline void to_bf16(const float* src, std::uint16_t* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__AVX512BF16__)
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(v));
  }
#endif
  for (; i < n; ++i) dst[i] = half_bits::bf16_from_float(src[i]);
}

}  // namespace gradus::cpu_dnnl

#if defined(GRADUS_HAVE_DNNL) && GRADUS_HAVE_DNNL
#include <omp.h>

#include <memory>
#include <oneapi/dnnl/dnnl.hpp>

#include "gradus/backends/cpu_simd/dnnl.hpp"

namespace gradus::cpu_dnnl {

/// Whether oneDNN runs bf16 matmuls on this CPU's own instructions (AVX512_BF16 or AMX), not
/// its emulation (3-4x slower than fp32).
inline bool bf16_native() {
  static const bool native = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core_bf16;
  return native;
}

/// One product: C[m, n] = alpha * A[m, k] B[k, n] + beta * C, A and B bf16 as stored
/// (transposes as strides), C fp32 with leading dimension ldc.
struct matmul_key {
  index_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool ta = false, tb = false;
  float alpha = 1, beta = 0;
  bool operator==(const matmul_key&) const = default;
};

struct matmul_plan {
  matmul_key key;
  dnnl::matmul prim;
  dnnl::memory a, b, c, scratchpad;
  dnnl::stream stream;
};

inline matmul_plan build_matmul(const matmul_key& k) {
  using dt = dnnl::memory::data_type;
  const auto& eng = engine();
  const dnnl::memory::desc a_md({k.m, k.k}, dt::bf16, k.ta ? dnnl::memory::dims{1, k.lda} : dnnl::memory::dims{k.lda, 1});
  const dnnl::memory::desc b_md({k.k, k.n}, dt::bf16, k.tb ? dnnl::memory::dims{1, k.ldb} : dnnl::memory::dims{k.ldb, 1});
  const dnnl::memory::desc c_md({k.m, k.n}, dt::f32, dnnl::memory::dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (k.alpha != 1) attr.set_output_scales(0, {k.alpha});
  if (k.beta != 0) {
    dnnl::post_ops po;
    po.append_sum(k.beta);
    attr.set_post_ops(po);
  }
  const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, eng);
  matmul_plan p;
  p.key = k;
  p.prim = dnnl::matmul(pd);
  p.a = dnnl::memory(a_md, eng, DNNL_MEMORY_NONE);
  p.b = dnnl::memory(b_md, eng, DNNL_MEMORY_NONE);
  p.c = dnnl::memory(c_md, eng, DNNL_MEMORY_NONE);
  p.scratchpad = dnnl::memory(pd.scratchpad_desc(), eng);
  p.stream = dnnl::stream(eng);
  return p;
}

/// Runs one product on the calling thread (OpenMP's count there is 1: cpu_dnnl::on_team), with
/// the calling thread's plan for the key, made on first use.
inline void matmul_bf16(const matmul_key& k, const std::uint16_t* a, const std::uint16_t* b, float* c) {
  thread_local std::vector<std::unique_ptr<matmul_plan>> plans;
  matmul_plan* p = nullptr;
  for (auto& q : plans)
    if (q->key == k) p = q.get();
  if (!p) {
    if (plans.size() >= max_plans) plans.erase(plans.begin(), plans.begin() + max_plans / 2);  // oldest first
    plans.push_back(std::make_unique<matmul_plan>(build_matmul(k)));
    p = plans.back().get();
  }
  p->a.set_data_handle(const_cast<std::uint16_t*>(a));
  p->b.set_data_handle(const_cast<std::uint16_t*>(b));
  p->c.set_data_handle(c);
  p->prim.execute(p->stream, {{DNNL_ARG_SRC, p->a},
                              {DNNL_ARG_WEIGHTS, p->b},
                              {DNNL_ARG_DST, p->c},
                              {DNNL_ARG_SCRATCHPAD, p->scratchpad}});
  p->stream.wait();
}
}  // namespace gradus::cpu_dnnl

#else
namespace gradus::cpu_dnnl {
inline bool bf16_native() { return false; }
struct matmul_key {
  index_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool ta = false, tb = false;
  float alpha = 1, beta = 0;
};
template <class F>
void on_team(int slices, F&& run_slice) {
  for (int i = 0; i < slices; ++i) run_slice(i);
}
inline void matmul_bf16(const matmul_key&, const std::uint16_t*, const std::uint16_t*, float*) {}
}  // namespace gradus::cpu_dnnl
#endif
