// Mixed precision's GEMM on the CPU (core/precision.hpp, cpu_simd/low_precision.hpp): square
// products of 256 to 4096 four ways, each round running all of them (bench_common.hpp):
//   gradus fp32     cpu_simd::gemm (blocks of one-thread OpenBLAS calls)
//   gradus bf16     cpu_simd::gemm_low(bf16): both operands converted to bf16, then the same
//                   blocks as one-thread oneDNN bf16 matmuls (what a mixed_bf16 session runs)
//   oneDNN bf16     oneDNN's matmul primitive called directly on bf16 operands converted
//                   beforehand (untimed), created once, on its own threads: the peer
//   oneDNN fp32     the same primitive in fp32
// The bf16 result is checked against the fp32 one within bf16's bound (2^-7 of sum |a||b|).
//
//   bench_precision [rounds = 7] [largest = 4096]
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "bench_common.hpp"

namespace g = gradus;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const g::index_t largest = argc > 2 ? std::atol(argv[2]) : 4096;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  std::printf("%d threads, %d rounds, medians; bf16 native: %s\n\n", omp_get_max_threads(), rounds,
              g::cpu_dnnl::bf16_native() ? "yes" : "no");
  const bench::background_load load;
  std::printf("| n | gradus fp32 ms | gradus bf16 ms | oneDNN bf16 ms | oneDNN fp32 ms | bf16 / fp32 (gradus) | "
              "gradus bf16 / oneDNN bf16 |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  bool ok = true;
  for (g::index_t n = 256; n <= largest; n *= 2) {
    std::vector<float> a(static_cast<std::size_t>(n * n)), b(a.size()), c32(a.size()), c16(a.size()), cd(a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = std::sin(0.013f * static_cast<float>(i % 9973));
      b[i] = std::cos(0.007f * static_cast<float>(i % 7919));
    }
    std::vector<std::uint16_t> ab(a.size()), bb(b.size());
    g::cpu_dnnl::to_bf16(a.data(), ab.data(), a.size());
    g::cpu_dnnl::to_bf16(b.data(), bb.data(), b.size());
    const dnnl::memory::desc a16({n, n}, dt::bf16, tag::ab), b16({n, n}, dt::bf16, tag::ab), cf({n, n}, dt::f32, tag::ab);
    const dnnl::memory::desc a32({n, n}, dt::f32, tag::ab), b32({n, n}, dt::f32, tag::ab);
    dnnl::matmul mm16(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a16, b16, cf), eng));
    dnnl::matmul mm32(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a32, b32, cf), eng));
    dnnl::memory ma16(a16, eng, ab.data()), mb16(b16, eng, bb.data()), ma32(a32, eng, a.data()), mb32(b32, eng, b.data()),
        mc(cf, eng, cd.data());
    std::vector<bench::candidate> cs{
        {"gradus fp32", [&] { g::cpu_simd::gemm(false, false, n, n, n, 1.f, a.data(), n, 0, b.data(), n, 0, 0.f, c32.data(), n, 0, 1); }},
        {"gradus bf16", [&] {
           g::cpu_simd::gemm_low(g::element_type::bf16, false, false, n, n, n, 1.f, a.data(), n, 0, b.data(), n, 0, 0.f,
                                 c16.data(), n, 0, 1);
         }},
        {"oneDNN bf16", [&] {
           mm16.execute(st, {{DNNL_ARG_SRC, ma16}, {DNNL_ARG_WEIGHTS, mb16}, {DNNL_ARG_DST, mc}});
           st.wait();
         }},
        {"oneDNN fp32", [&] {
           mm32.execute(st, {{DNNL_ARG_SRC, ma32}, {DNNL_ARG_WEIGHTS, mb32}, {DNNL_ARG_DST, mc}});
           st.wait();
         }},
    };
    bench::run_interleaved(cs, n >= 2048 ? std::max(3, rounds / 2) : rounds, 1);
    // the bf16 product against the fp32 one: |a|, |b| <= 1, so sum |a||b| <= n
    double worst = 0;
    for (std::size_t i = 0; i < c32.size(); ++i) worst = std::max(worst, std::abs(double(c16[i]) - double(c32[i])));
    const double bound = std::ldexp(1.0, -7) * static_cast<double>(n);
    if (worst > bound) {
      std::printf("n = %ld: bf16 differs from fp32 by %g > %g\n", static_cast<long>(n), worst, bound);
      ok = false;
    }
    double ms[4];
    for (int i = 0; i < 4; ++i) ms[i] = 1e3 * bench::median(cs[static_cast<std::size_t>(i)].seconds);
    std::printf("| %ld | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", static_cast<long>(n), ms[0], ms[1], ms[2], ms[3],
                ms[1] / ms[0], ms[1] / ms[2]);
  }
  std::printf("\nother processes' load during the run: %.0f%% of the cores\n", load.percent());
  return ok ? 0 : 1;
}
