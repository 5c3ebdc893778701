// sgemm (C = A B, square, row-major) through gradus' session against OpenBLAS called
// directly, in one process, plus the machine's measured FMA peak for scale.
//
//   bench_gemm [rounds = 21] [n ...]   (default n: 256 512 1024 2048)
//
// Each sample repeats the call until it has run at least ~50 ms, so small n are not
// timed at the clock's resolution; the table shows the median over rounds.
// CBLAS comes declared by cpu_simd.hpp (xtensor-blas's declarations, linked to OpenBLAS)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <vector>
#include <xsimd/xsimd.hpp>
#include <xtensor/xtensor.hpp>

#include "bench_common.hpp"

namespace g = gradus;

namespace {

// Peak single-precision FMA throughput: each thread runs independent chains of
// fused multiply-adds on the widest xsimd batch (enough chains to cover FMA latency
// times the FMA ports), so nothing but the FMA units limits it.
double fma_peak_gflops() {
  using B = xsimd::batch<float>;
  constexpr int chains = 16;
  constexpr long iters = 20'000'000;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    float sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sink)
    {
      B acc[chains];
      for (int k = 0; k < chains; ++k) acc[k] = B(1.0f + 1e-3f * static_cast<float>(k + omp_get_thread_num()));
      const B m(0.999999f), a(1e-7f);
      for (long i = 0; i < iters; ++i)
        for (int k = 0; k < chains; ++k) acc[k] = xsimd::fma(acc[k], m, a);
      B s(0.0f);
      for (int k = 0; k < chains; ++k) s += acc[k];
      sink += xsimd::hadd(s);
    }
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double flops = 2.0 * B::size * chains * static_cast<double>(iters) * omp_get_max_threads();
    best = std::max(best, flops / t * 1e-9);
    if (sink == 0.123f) std::printf(" ");  // keeps the chains alive
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  std::vector<long> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atol(argv[i]));
  if (sizes.empty()) sizes = {256, 512, 1024, 2048};

  std::printf("sgemm C = A B (row-major, n x n), %d OpenMP threads, OpenBLAS %d threads (%s), %d rounds\n",
              omp_get_max_threads(), openblas_get_num_threads(), openblas_get_config(), rounds);
  const bench::background_load load;
  std::printf("measured FMA peak: %.0f GFLOP/s\n\n", fma_peak_gflops());
  std::printf("| n | gradus GFLOP/s | OpenBLAS GFLOP/s | ratio |\n|---:|---:|---:|---:|\n");

  g::placeholder<"A", float, g::dyn, g::dyn> ga;
  g::placeholder<"B", float, g::dyn, g::dyn> gbm;
  const auto expr = g::matmul(ga, gbm);
  g::session<g::cpu_simd> sess;
  bool ok = true;
  for (const long n : sizes) {
    const std::size_t un = static_cast<std::size_t>(n);
    xt::xtensor<float, 2> a(std::array<std::size_t, 2>{un, un}), b(a.shape()), c(a.shape(), 0.f);
    for (std::size_t i = 0; i < a.size(); ++i) {
      a.data()[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
      b.data()[i] = static_cast<float>((i * 104729) % 997) * 1e-3f - 0.5f;
    }
    const CBLAS_INT bn = static_cast<CBLAS_INT>(n);
    const float* cg = nullptr;
    auto once_gradus = [&] { cg = sess.run(expr, ga = a, gbm = b).data(); };
    auto once_blas = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bn, bn, bn, 1.0f, a.data(), bn, b.data(), bn, 0.0f,
                  c.data(), bn);
    };
    // Calls per sample: enough for ~50 ms, measured on the warmed-up OpenBLAS call.
    once_gradus();
    once_blas();
    const auto t0 = std::chrono::steady_clock::now();
    once_blas();
    const double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int calls = std::max(1, static_cast<int>(0.05 / std::max(one, 1e-7)));
    std::vector<bench::candidate> cs;
    cs.push_back({"gradus", [&] { for (int i = 0; i < calls; ++i) once_gradus(); }});
    cs.push_back({"OpenBLAS", [&] { for (int i = 0; i < calls; ++i) once_blas(); }});
    bench::run_interleaved(cs, rounds, 1);
    const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * calls;
    const double gg = flop / bench::median(cs[0].seconds) * 1e-9, gb = flop / bench::median(cs[1].seconds) * 1e-9;
    // Same library, same call: the results must agree exactly.
    const bool same = std::equal(cg, cg + n * n, c.data());
    ok = ok && same;
    std::printf("| %ld | %.1f | %.1f | %.3f |%s\n", n, gg, gb, gg / gb, same ? "" : " RESULT DIFFERS");
  }
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
  return ok ? 0 : 1;
}
