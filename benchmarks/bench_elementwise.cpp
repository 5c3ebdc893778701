// Fused elementwise passes over large float arrays: gradus against a plain OpenMP loop,
// xtensor and Eigen, all in one process, on the same input arrays, each writing into an
// output allocated (and faulted in) before timing.
//
//   bench_elementwise [log2(elements) = 25] [rounds = 21]
//
// Prints a Markdown table: median ms per pass, GB/s (4 bytes x arrays read and written
// x elements: what the expression must move, not counting the read-for-ownership of
// the output a cached store adds) and the ratio to the fastest of the three peers.
// gradus' backend first: it includes <immintrin.h> under a pragma that silences g++ 12's
// false -Wmaybe-uninitialized in the AVX-512 intrinsics, which only works if it is the
// first to include it (Eigen includes it too).
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>
#include <xsimd/xsimd.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>
#include <xtensor/xtensor.hpp>

#include "bench_common.hpp"

namespace g = gradus;
using vec = xt::xtensor<float, 1>;
using eigen_in = Eigen::Map<const Eigen::ArrayXf, Eigen::Aligned64>;

namespace {

// Eigen's array expressions run on one thread; its fastest form here is one contiguous
// block per OpenMP thread. Block starts are multiples of 16 floats, so every block stays
// 64-byte aligned like the whole array.
template <class F>
void omp_blocks(std::ptrdiff_t n, F f) {
#pragma omp parallel
  {
    const std::ptrdiff_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const std::ptrdiff_t per = (n / nt + 15) / 16 * 16;
    const std::ptrdiff_t lo = std::min(n, t * per), hi = t == nt - 1 ? n : std::min(n, lo + per);
    if (hi > lo) f(lo, hi - lo);
  }
}

// Deterministic inputs in [lo, hi), filled in parallel (cheap next to mt19937 on 2^25).
void fill(vec& v, std::uint32_t seed, float lo, float hi) {
  const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(v.size());
  float* p = v.data();
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    p[i] = lo + (hi - lo) * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  }
}

struct row {
  bench::candidate c;
  bool peer;                          // counts towards "best peer"
  std::function<const float*()> out;  // where its result lands, for the cross-check
};

// Largest |x - ref| / max(1, |ref|) over the arrays.
double max_rel_diff(const float* x, const float* ref, std::ptrdiff_t n) {
  double m = 0;
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const double r = ref[i];
    m = std::max(m, std::abs(static_cast<double>(x[i]) - r) / std::max(1.0, std::abs(r)));
  }
  return m;
}

// Times the rows interleaved and prints them; returns false if a result disagrees.
bool report(const char* expr, std::vector<row>& rows, int arrays, std::ptrdiff_t n, int rounds) {
  std::vector<bench::candidate> cs;
  for (auto& r : rows) cs.push_back(std::move(r.c));
  bench::run_interleaved(cs, rounds);
  const double bytes = 4.0 * arrays * static_cast<double>(n);
  double best_peer = 0;
  for (std::size_t i = 0; i < rows.size(); ++i)
    if (rows[i].peer) best_peer = std::max(best_peer, bytes / bench::median(cs[i].seconds));
  bool ok = true;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double med = bench::median(cs[i].seconds), gbs = bytes / med * 1e-9;
    const double diff = max_rel_diff(rows[i].out(), rows[0].out(), n);
    ok = ok && diff < 1e-5;
    std::printf("| %s | %s | %.2f | %.1f | %.3f%s |\n", i == 0 ? expr : "", cs[i].name.c_str(), med * 1e3, gbs,
                gbs * 1e9 / best_peer, rows[i].peer || i == 0 ? "" : " (not a peer)");
    if (diff >= 1e-5) std::printf("|   | ^ DIFFERS from gradus: max relative difference %.2e |  |  |  |\n", diff);
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const int log2n = argc > 1 ? std::atoi(argv[1]) : 25;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 21;
  const std::ptrdiff_t n = std::ptrdiff_t(1) << log2n;
  const std::size_t un = static_cast<std::size_t>(n);
  const float s = 1.5f;

  // Inputs shared by every implementation; outputs are per implementation, allocated
  // and written once before timing (gradus' is its session buffer, planned on the
  // first run).
  vec b(std::array<std::size_t, 1>{un}), c(b.shape()), d(b.shape());
  fill(b, 1, -2.f, 2.f);
  fill(c, 2, -1.f, 1.f);
  fill(d, 3, -1.f, 1.f);
  const eigen_in eb(b.data(), n), ec(c.data(), n), ed(d.data(), n);
  std::vector<float, xsimd::aligned_allocator<float, 64>> a_loop(un, 0.f);  // aligned like the others
  vec a_xt(b.shape(), 0.f), a_xt_tmp(b.shape(), 0.f);
  Eigen::ArrayXf a_eigen = Eigen::ArrayXf::Zero(n);
  const float *bp = b.data(), *cp = c.data(), *dp = d.data();

  g::placeholder<"b", float, g::dyn> gb;
  g::placeholder<"c", float, g::dyn> gc;
  g::placeholder<"d", float, g::dyn> gd;
  g::session<g::cpu_simd> sess;

  std::printf("%td float elements (%.0f MiB per array), %d OpenMP threads, %d rounds, median per pass\n\n", n,
              4.0 * static_cast<double>(n) / (1 << 20), omp_get_max_threads(), rounds);
  std::printf("| expression | implementation | median ms | GB/s | ratio to best peer |\n");
  std::printf("|---|---|---:|---:|---:|\n");

  bool ok = true;
  const bench::background_load load;
  {
    const auto expr = gb + s * gc;
    const float* a_gradus = sess.run(expr, gb = b, gc = c).data();
    float* al = a_loop.data();
    std::vector<row> rows;
    rows.push_back({{"gradus `s.run(b + s*c, ...)`", [&] { a_gradus = sess.run(expr, gb = b, gc = c).data(); }},
                    false, [&] { return a_gradus; }});
    rows.push_back({{"OpenMP loop `parallel for simd`",
                     [&] {
#pragma omp parallel for simd schedule(static)
                       for (std::ptrdiff_t i = 0; i < n; ++i) al[i] = bp[i] + s * cp[i];
                     }},
                    true, [=] { return al; }});
    rows.push_back({{"xtensor `noalias(a) = b + s*c`", [&] { xt::noalias(a_xt) = b + s * c; }}, true, [&] { return a_xt.data(); }});
    rows.push_back({{"Eigen, OpenMP over blocks",
                     [&] {
                       omp_blocks(n, [&](std::ptrdiff_t lo, std::ptrdiff_t len) {
                         a_eigen.segment(lo, len) = eb.segment(lo, len) + s * ec.segment(lo, len);
                       });
                     }},
                    true, [&] { return a_eigen.data(); }});
    rows.push_back({{"xtensor `a = b + s*c` (temporary)", [&] { a_xt_tmp = b + s * c; }}, false, [&] { return a_xt_tmp.data(); }});
    ok = report("`a = b + s*c`", rows, 3, n, rounds) && ok;
  }
  {
    const auto expr = g::exp(-gb * gb) * gc + gd;
    const float* a_gradus = sess.run(expr, gb = b, gc = c, gd = d).data();
    float* al = a_loop.data();
    std::vector<row> rows;
    rows.push_back({{"gradus `s.run(exp(-b*b)*c + d, ...)`",
                     [&] { a_gradus = sess.run(expr, gb = b, gc = c, gd = d).data(); }},
                    false, [&] { return a_gradus; }});
    rows.push_back({{"OpenMP loop `parallel for simd`",
                     [&] {
// Without -ffast-math the C library declares no vector expf, so this loop stays scalar
// (clang says so: -Wpass-failed, off for this file). That is the plain loop's speed.
#pragma omp parallel for simd schedule(static)
                       for (std::ptrdiff_t i = 0; i < n; ++i) al[i] = std::exp(-bp[i] * bp[i]) * cp[i] + dp[i];
                     }},
                    true, [=] { return al; }});
    rows.push_back(
        {{"xtensor `noalias(a) = exp(-b*b)*c + d`", [&] { xt::noalias(a_xt) = xt::exp(-b * b) * c + d; }}, true,
         [&] { return a_xt.data(); }});
    rows.push_back({{"Eigen, OpenMP over blocks",
                     [&] {
                       omp_blocks(n, [&](std::ptrdiff_t lo, std::ptrdiff_t len) {
                         a_eigen.segment(lo, len) =
                             (-eb.segment(lo, len) * eb.segment(lo, len)).exp() * ec.segment(lo, len) +
                             ed.segment(lo, len);
                       });
                     }},
                    true, [&] { return a_eigen.data(); }});
    rows.push_back({{"xtensor `a = exp(-b*b)*c + d` (temporary)", [&] { a_xt_tmp = xt::exp(-b * b) * c + d; }},
                    false, [&] { return a_xt_tmp.data(); }});
    ok = report("`a = exp(-b*b)*c + d`", rows, 4, n, rounds) && ok;
  }
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
  if (!ok) std::printf("\nFAILED: an implementation's result differs from gradus'\n");
  return ok ? 0 : 1;
}
