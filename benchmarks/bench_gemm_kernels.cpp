// cpu_simd's register-blocked kernels (cpu_simd/gemm_kernels.hpp) against their two peers,
// one thread each, on mnist_deep_mlp's products (784-512x8-10) at the rows a batch of 64
// and its micro-batches give (8, 16, 32, 64):
//   - OpenBLAS (cblas_sgemm), which gradus ran on every product before;
//   - oneDNN's matmul on its own packed weight layout (the weights reordered once, outside
//     the timing: its best case), which pipeline stages used before, at the price of a copy of
//     every weight matrix refilled after every update.
// Each sample runs the product over eight distinct weight matrices (8 MB in all, out of L2
// as in a training step). GFLOP/s are medians over interleaved rounds; every result is
// checked against OpenBLAS's.
//
//   bench_gemm_kernels [rounds = 15]
// CBLAS comes declared by cpu_simd.hpp (xtensor-blas's declarations, linked to OpenBLAS)
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "bench_common.hpp"

namespace {
using dt = dnnl::memory::data_type;
using idx = dnnl::memory::dim;
constexpr int layers = 8;

struct product {
  const char* what;
  bool ta, tb;
  idx m, n, k;
};
}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  gradus::cpu_simd::set_threads(1);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream st(eng);
  std::printf("one thread, %s, %d rounds; GFLOP/s over %d distinct operands of each product\n\n", openblas_get_config(), rounds,
              layers);
  std::printf("| product | m x n x k | kernels | OpenBLAS | oneDNN, packed weights | kernels / OpenBLAS | kernels / oneDNN |\n");
  std::printf("|---|---|---:|---:|---:|---:|---:|\n");
  std::vector<product> ps;
  for (const idx m : {8, 16, 32, 64}) {
    ps.push_back({"forward", false, false, m, 512, 512});
    ps.push_back({"input gradient", false, true, m, 512, 512});
  }
  ps.push_back({"first layer forward", false, false, 8, 512, 784});
  ps.push_back({"weight gradient", true, false, 512, 512, 64});
  ps.push_back({"first layer weight gradient", true, false, 784, 512, 64});
  bool ok = true;
  const bench::background_load load;
  for (const product& p : ps) {
    if (!gradus::cpu_gemm::takes(p.ta, p.tb, p.m, p.n, p.k)) {
      std::printf("| %s | %ld x %ld x %ld | not taken (OpenBLAS's) | | | | |\n", p.what, static_cast<long>(p.m),
                  static_cast<long>(p.n), static_cast<long>(p.k));
      continue;
    }
    const idx am = p.ta ? p.k : p.m, ak = p.ta ? p.m : p.k, bk = p.tb ? p.n : p.k, bn = p.tb ? p.k : p.n;
    std::vector<float> a(static_cast<std::size_t>(am * ak));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
    std::vector<std::vector<float>> b(layers, std::vector<float>(static_cast<std::size_t>(bk * bn)));
    for (int l = 0; l < layers; ++l)
      for (std::size_t i = 0; i < b[0].size(); ++i) b[l][i] = std::cos(0.11f * static_cast<float>(i) + static_cast<float>(l));
    std::vector<float> ck(static_cast<std::size_t>(p.m * p.n)), cb(ck.size()), cd(ck.size());
    // oneDNN: the weights reordered into its layout once, here
    const dnnl::memory::desc a_md({p.m, p.k}, dt::f32, p.ta ? dnnl::memory::dims{1, ak} : dnnl::memory::dims{ak, 1});
    const dnnl::memory::desc b_md({p.k, p.n}, dt::f32, p.tb ? dnnl::memory::dims{1, bn} : dnnl::memory::dims{bn, 1});
    const dnnl::memory::desc c_md({p.m, p.n}, dt::f32, dnnl::memory::dims{p.n, 1});
    const dnnl::memory::desc any({p.k, p.n}, dt::f32, dnnl::memory::format_tag::any);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, any, c_md), eng);
    const dnnl::matmul mm(pd);
    std::vector<dnnl::memory> packed;
    for (int l = 0; l < layers; ++l) {
      dnnl::memory src(b_md, eng, b[l].data()), dst(pd.weights_desc(), eng);
      dnnl::reorder(src, dst).execute(st, src, dst);
      packed.push_back(dst);
    }
    st.wait();
    dnnl::memory ma(a_md, eng, a.data()), mc(c_md, eng, cd.data());
    const auto kernels = [&] {
      for (int l = 0; l < layers; ++l)
        gradus::cpu_simd::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.f, a.data(), ak, 0, b[l].data(), bn, 0, 0.f, ck.data(), p.n, 0, 1);
    };
    const auto blas = [&] {
      for (int l = 0; l < layers; ++l)
        cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, static_cast<CBLAS_INT>(p.m),
                    static_cast<CBLAS_INT>(p.n), static_cast<CBLAS_INT>(p.k), 1.f, a.data(), static_cast<CBLAS_INT>(ak),
                    b[l].data(), static_cast<CBLAS_INT>(bn), 0.f, cb.data(), static_cast<CBLAS_INT>(p.n));
    };
    const auto onednn = [&] {
      for (int l = 0; l < layers; ++l)
        mm.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, packed[static_cast<std::size_t>(l)]}, {DNNL_ARG_DST, mc}});
      st.wait();
    };
    const int calls = 20;
    std::vector<bench::candidate> v;
    v.push_back({"kernels", [&] { for (int r = 0; r < calls; ++r) kernels(); }});
    v.push_back({"OpenBLAS", [&] { for (int r = 0; r < calls; ++r) blas(); }});
    v.push_back({"oneDNN", [&] { for (int r = 0; r < calls; ++r) onednn(); }});
    bench::run_interleaved(v, rounds, 1);
    const double flop = 2.0 * static_cast<double>(p.m * p.n * p.k) * layers * calls;
    double gf[3];
    for (std::size_t i = 0; i < 3; ++i) gf[i] = flop / bench::median(v[i].seconds) * 1e-9;
    double e = 0;
    for (std::size_t i = 0; i < ck.size(); ++i)
      e = std::max({e, std::abs(double(ck[i]) - cb[i]) / (1.0 + std::abs(double(cb[i]))),
                    std::abs(double(cd[i]) - cb[i]) / (1.0 + std::abs(double(cb[i])))});
    if (!(e < 1e-3)) {
      std::printf("%s: results differ from OpenBLAS's by %g\n", p.what, e);
      ok = false;
    }
    std::printf("| %s | %ld x %ld x %ld | %.1f | %.1f | %.1f | %.2f | %.2f |\n", p.what, static_cast<long>(p.m),
                static_cast<long>(p.n), static_cast<long>(p.k), gf[0], gf[1], gf[2], gf[0] / gf[1], gf[0] / gf[2]);
  }
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
  return ok ? 0 : 1;
}
