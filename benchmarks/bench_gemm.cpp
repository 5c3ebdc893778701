// sgemm through gradus against OpenBLAS called directly, in one process, plus the
// machine's measured FMA peak for scale. Two tables:
//   1. C = A B, square, through a session (s.run(matmul(A, B))) against cblas_sgemm on
//      OpenBLAS's own threads;
//   2. the models' GEMMs (mnist_mlp's layers forward and backward, mnist_cnn's convolutions,
//      seq_mnist_lstm's gate products as a batch of 4) through cpu_simd::gemm, which cuts
//      them into blocks of single-threaded OpenBLAS calls by threads() (the same bits on any
//      team), against OpenBLAS's own threads, and against OpenBLAS on one thread.
//
//   bench_gemm [rounds = 21] [n ...]   (default n: 256 512 1024 2048)
//
// Each sample repeats the call until it has run at least ~50 ms, so small products are not
// timed at the clock's resolution; the tables show medians over rounds.
// CBLAS comes declared by cpu_simd.hpp (xtensor-blas's declarations, linked to OpenBLAS)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
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

// OpenBLAS's OpenMP build runs on omp_get_max_threads() threads (it resets its own count
// to OpenMP's on every call outside a parallel region): a peer's thread count is set there.
void blas_threads(int n) {
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
}

struct shape {
  const char* what;
  bool ta, tb;
  long m, n, k, batch;
};

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  std::vector<long> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atol(argv[i]));
  if (sizes.empty()) sizes = {256, 512, 1024, 2048};
  const int nt = omp_get_max_threads();

  std::printf("sgemm, %d threads (OpenMP and OpenBLAS's peers), %s, %d rounds\n", nt, openblas_get_config(), rounds);
  const bench::background_load load;
  std::printf("measured FMA peak: %.0f GFLOP/s\n\n", fma_peak_gflops());
  // Calls per sample: enough for ~50 ms, measured on a warmed-up call.
  auto calls_for = [](const std::function<void()>& f) {
    f();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return std::max(1, static_cast<int>(0.05 / std::max(one, 1e-7)));
  };
  bool ok = true;

  std::printf("C = A B, n x n, through a session\n\n| n | gradus GFLOP/s | OpenBLAS (%d threads) GFLOP/s | ratio |\n|---:|---:|---:|---:|\n", nt);
  g::placeholder<"A", float, g::dyn, g::dyn> ga;
  g::placeholder<"B", float, g::dyn, g::dyn> gbm;
  const auto expr = g::matmul(ga, gbm);
  g::session<g::cpu_simd> sess;
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
    once_gradus();
    blas_threads(nt);
    const int calls = calls_for(once_blas);
    std::vector<bench::candidate> cs;
    cs.push_back({"gradus", [&] { for (int i = 0; i < calls; ++i) once_gradus(); }, {}, [&] { blas_threads(nt); }});
    cs.push_back({"OpenBLAS", [&] { for (int i = 0; i < calls; ++i) once_blas(); }, {}, [&] { blas_threads(nt); }});
    bench::run_interleaved(cs, rounds, 1);
    blas_threads(nt);
    const double flop = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) * calls;
    const double gg = flop / bench::median(cs[0].seconds) * 1e-9, gb = flop / bench::median(cs[1].seconds) * 1e-9;
    // The same products, cut differently: equal to float rounding.
    double worst = 0;
    for (long i = 0; i < n * n; ++i) worst = std::max(worst, std::abs(double(cg[i]) - c.data()[i]) / (1.0 + std::abs(double(c.data()[i]))));
    const bool same = worst < 1e-4;
    ok = ok && same;
    std::printf("| %ld | %.1f | %.1f | %.3f |%s\n", n, gg, gb, gg / gb, same ? "" : " RESULTS DIFFER");
  }

  const shape shapes[] = {
      {"mlp fc1 forward", false, false, 64, 256, 784, 1},  {"mlp fc1 dx", false, true, 64, 784, 256, 1},
      {"mlp fc1 dW", true, false, 784, 256, 64, 1},        {"mlp fc2 forward", false, false, 64, 128, 256, 1},
      {"mlp fc2 dW", true, false, 256, 128, 64, 1},        {"cnn conv1 forward", false, false, 6, 36864, 25, 1},
      {"cnn conv2 forward", false, false, 16, 4096, 150, 1}, {"cnn conv2 dx", true, false, 150, 4096, 16, 1},
      {"cnn fc1 forward", false, false, 64, 120, 256, 1},  {"lstm gates x4", false, false, 64, 128, 128, 4},
  };
  std::printf("\nThe models' GEMMs through cpu_simd::gemm (blocks of one-thread OpenBLAS calls)\n\n"
              "| product | m x n x k (batch) | gradus us | OpenBLAS %d threads us | OpenBLAS 1 thread us | gradus / OpenBLAS %d |\n"
              "|---|---|---:|---:|---:|---:|\n", nt, nt);
  for (const shape& p : shapes) {
    const long am = p.ta ? p.k : p.m, ak = p.ta ? p.m : p.k, bk = p.tb ? p.n : p.k, bn = p.tb ? p.k : p.n;
    std::vector<float> a(static_cast<std::size_t>(p.batch * am * ak)), b(static_cast<std::size_t>(p.batch * bk * bn));
    std::vector<float> cg(static_cast<std::size_t>(p.batch * p.m * p.n)), cb(cg.size());
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 104729) % 997) * 1e-3f - 0.5f;
    auto once_gradus = [&] {
      g::cpu_simd::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, a.data(), ak, am * ak, b.data(), bn, bk * bn, 0.0f, cg.data(),
                        p.n, p.m * p.n, p.batch);
    };
    auto once_blas = [&] {
      for (long i = 0; i < p.batch; ++i)
        cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans,
                    static_cast<CBLAS_INT>(p.m), static_cast<CBLAS_INT>(p.n), static_cast<CBLAS_INT>(p.k), 1.0f,
                    a.data() + i * am * ak, static_cast<CBLAS_INT>(ak), b.data() + i * bk * bn,
                    static_cast<CBLAS_INT>(bn), 0.0f, cb.data() + i * p.m * p.n, static_cast<CBLAS_INT>(p.n));
    };
    blas_threads(nt);
    const int calls = calls_for(once_gradus);
    std::vector<bench::candidate> cs;
    cs.push_back({"gradus", [&] { for (int i = 0; i < calls; ++i) once_gradus(); }, {}, [&] { blas_threads(nt); }});
    cs.push_back({"OpenBLAS", [&] { for (int i = 0; i < calls; ++i) once_blas(); }, {}, [&] { blas_threads(nt); }});
    cs.push_back({"OpenBLAS 1", [&] { for (int i = 0; i < calls; ++i) once_blas(); }, {}, [&] { blas_threads(1); }});
    bench::run_interleaved(cs, rounds, 1);
    blas_threads(nt);
    double worst = 0;
    for (std::size_t i = 0; i < cg.size(); ++i) worst = std::max(worst, std::abs(double(cg[i]) - cb[i]) / (1.0 + std::abs(double(cb[i]))));
    const bool same = worst < 1e-4;
    ok = ok && same;
    const double us[3] = {bench::median(cs[0].seconds) / calls * 1e6, bench::median(cs[1].seconds) / calls * 1e6,
                          bench::median(cs[2].seconds) / calls * 1e6};
    std::printf("| %s | %ld x %ld x %ld (%ld) | %.1f | %.1f | %.1f | %.3f |%s\n", p.what, p.m, p.n, p.k, p.batch, us[0], us[1],
                us[2], us[0] / us[1], same ? "" : " RESULTS DIFFER");
  }
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
  return ok ? 0 : 1;
}
