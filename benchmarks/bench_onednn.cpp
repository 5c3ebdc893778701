// gradus' CPU kernels against oneDNN 2.6 (Debian's libdnnl-dev, what PyTorch runs its CPU
// convolutions on), built only where oneDNN is found. Two tables:
//
// 1. LeNet-5's two convolutions (mnist_cnn, batch 64) four ways: cpu_simd's entry points
// (conv2d, conv2d_backward_weights, conv2d_backward_data) on their im2col + GEMM path
// (GRADUS_DNNL's switch off) and on their oneDNN path (batch slices, one thread each,
// cpu_simd/dnnl.hpp), and oneDNN called directly on its own threads, with plain NCHW
// tensors and with the formats it picks (blocked; the reorders from and to NCHW are timed
// with it). Each pass is checked against the im2col path's values.
// 2. mnist_mlp's eight GEMMs of a training step (784-256-128-10, batch 64): cpu_simd::gemm
// (blocks of one-thread OpenBLAS calls), oneDNN's matmul primitive called directly (created
// once, its own threads), and OpenBLAS on its own threads.
//
//   bench_onednn [rounds = 21]
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <oneapi/dnnl/dnnl.hpp>
#include <vector>

#include "bench_common.hpp"

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;
namespace g = gradus;
using idx = g::index_t;

struct conv { const char* name; idx n, c, h, w, o, k; bool need_dx; };

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 21;
  const conv cs[] = {{"conv1", 64, 1, 28, 28, 6, 5, false}, {"conv2", 64, 6, 12, 12, 16, 5, true}};
  bool ok = true;
  engine eng(engine::kind::cpu, 0);
  stream st(eng);
  std::printf("%d threads, %d rounds, 20 calls per sample, medians\n\n", omp_get_max_threads(), rounds);
  const bench::background_load load;
  std::printf("| conv | pass | gradus im2col us | gradus oneDNN slices us | oneDNN nchw us | oneDNN blocked+reorders us | slices / best oneDNN |\n|---|---|---:|---:|---:|---:|---:|\n");
  for (const conv& c : cs) {
    const idx oh = c.h - c.k + 1, ow = c.w - c.k + 1, P = oh * ow, ckk = c.c * c.k * c.k;
    std::vector<float> x(c.n * c.c * c.h * c.w), wt(c.o * ckk), y(c.n * c.o * P), dy(y.size()), dx(x.size()), dw(wt.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * i);
    for (size_t i = 0; i < wt.size(); ++i) wt[i] = std::cos(0.3f * i) * 0.2f;
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = std::sin(0.7f * i) * 0.01f;
    // gradus: cpu_simd's three entry points, on either path
    std::vector<float> yg(y.size()), dxg(x.size()), dwg(wt.size()), yi(y.size()), dxi(x.size()), dwi(wt.size());
    const g::conv_geometry geo{c.n, c.c, c.h, c.w, c.o, {c.k, c.k, 1, 0}};
    auto fwd_g = [&](float* out) { g::cpu_simd::conv2d(x.data(), wt.data(), geo, out); };
    auto bwdw_g = [&](float* out) { g::cpu_simd::conv2d_backward_weights(x.data(), dy.data(), geo, out); };
    auto bwdd_g = [&](float* out) { g::cpu_simd::conv2d_backward_data(dy.data(), wt.data(), geo, out); };
    // oneDNN: plain NCHW descriptors, or `any` (its own formats) with reorders in the timing
    memory::dims src{c.n, c.c, c.h, c.w}, wd{c.o, c.c, c.k, c.k}, dst{c.n, c.o, oh, ow}, s1{1, 1}, p0{0, 0};
    auto plain = [&](bool blocked, double out[3]) {
      auto any = [&](const memory::dims& d, tag t) { return memory::desc(d, dt::f32, blocked ? tag::any : t); };
      auto fd = convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, any(src, tag::nchw), any(wd, tag::oihw), any(dst, tag::nchw), s1, p0, p0);
      auto fpd = convolution_forward::primitive_desc(fd, eng);
      auto dd = convolution_backward_data::desc(algorithm::convolution_direct, any(src, tag::nchw), any(wd, tag::oihw), any(dst, tag::nchw), s1, p0, p0);
      auto dpd = convolution_backward_data::primitive_desc(dd, eng, fpd);
      auto wdsc = convolution_backward_weights::desc(algorithm::convolution_direct, any(src, tag::nchw), any(wd, tag::oihw), any(dst, tag::nchw), s1, p0, p0);
      auto wpd = convolution_backward_weights::primitive_desc(wdsc, eng, fpd);
      memory ux({src, dt::f32, tag::nchw}, eng, x.data()), uw({wd, dt::f32, tag::oihw}, eng, wt.data()),  uy({dst, dt::f32, tag::nchw}, eng, y.data()), udy({dst, dt::f32, tag::nchw}, eng, dy.data()), udx({src, dt::f32, tag::nchw}, eng, dx.data()),
          udw({wd, dt::f32, tag::oihw}, eng, dw.data());
      auto conv_to = [&](memory& u, const memory::desc& want) { return want == u.get_desc() ? u : memory(want, eng); };
      memory fx = conv_to(ux, fpd.src_desc()), fw = conv_to(uw, fpd.weights_desc()), fy = conv_to(uy, fpd.dst_desc());
      memory bdy = conv_to(udy, dpd.diff_dst_desc()), bw = conv_to(uw, dpd.weights_desc()), bdx = conv_to(udx, dpd.diff_src_desc());
      memory wx = conv_to(ux, wpd.src_desc()), wdy = conv_to(udy, wpd.diff_dst_desc()), wdw = conv_to(udw, wpd.diff_weights_desc());
      auto rin = [&](memory& u, memory& m) { if (m.get(true) != u.get(true)) reorder(u, m).execute(st, u, m); };
      convolution_forward fp(fpd); convolution_backward_data dp(dpd); convolution_backward_weights wp(wpd);
      std::vector<bench::candidate> v;
      v.push_back({"fwd", [&] { for (int r = 0; r < 20; ++r) { rin(ux, fx); rin(uw, fw); fp.execute(st, {{DNNL_ARG_SRC, fx}, {DNNL_ARG_WEIGHTS, fw}, {DNNL_ARG_DST, fy}}); rin(fy, uy); st.wait(); } }});
      v.push_back({"bwdw", [&] { for (int r = 0; r < 20; ++r) { rin(ux, wx); rin(udy, wdy); wp.execute(st, {{DNNL_ARG_SRC, wx}, {DNNL_ARG_DIFF_DST, wdy}, {DNNL_ARG_DIFF_WEIGHTS, wdw}}); rin(wdw, udw); st.wait(); } }});
      v.push_back({"bwdd", [&] { for (int r = 0; r < 20; ++r) { rin(udy, bdy); rin(uw, bw); dp.execute(st, {{DNNL_ARG_DIFF_DST, bdy}, {DNNL_ARG_WEIGHTS, bw}, {DNNL_ARG_DIFF_SRC, bdx}}); rin(bdx, udx); st.wait(); } }});
      bench::run_interleaved(v, rounds, 2);
      for (int i = 0; i < 3; ++i) out[i] = bench::median(v[i].seconds) / 20 * 1e6;
      std::fprintf(stderr, "%s %s: fwd %s, bwd data %s, bwd weights %s\n", c.name, blocked ? "any" : "plain", fpd.impl_info_str(), dpd.impl_info_str(), wpd.impl_info_str());
    };
    double on[3], ob[3], gi[3], gd[3];
    plain(false, on);
    plain(true, ob);
    const auto path = [](bool dnnl) { return [dnnl] { g::cpu_dnnl::set_enabled(dnnl); }; };
    std::vector<bench::candidate> v;
    v.push_back({"fwd im2col", [&] { for (int r = 0; r < 20; ++r) fwd_g(yi.data()); }, {}, path(false)});
    v.push_back({"bwdw im2col", [&] { for (int r = 0; r < 20; ++r) bwdw_g(dwi.data()); }, {}, path(false)});
    v.push_back({"bwdd im2col", [&] { for (int r = 0; r < 20; ++r) bwdd_g(dxi.data()); }, {}, path(false)});
    v.push_back({"fwd slices", [&] { for (int r = 0; r < 20; ++r) fwd_g(yg.data()); }, {}, path(true)});
    v.push_back({"bwdw slices", [&] { for (int r = 0; r < 20; ++r) bwdw_g(dwg.data()); }, {}, path(true)});
    v.push_back({"bwdd slices", [&] { for (int r = 0; r < 20; ++r) bwdd_g(dxg.data()); }, {}, path(true)});
    bench::run_interleaved(v, rounds, 2);
    g::cpu_dnnl::set_enabled(true);
    for (int i = 0; i < 3; ++i) {
      gi[i] = bench::median(v[static_cast<std::size_t>(i)].seconds) / 20 * 1e6;
      gd[i] = bench::median(v[static_cast<std::size_t>(i + 3)].seconds) / 20 * 1e6;
    }
    // the largest difference from the im2col path's values, per pass: oneDNN direct, the slices
    double e[3] = {0, 0, 0};
    for (size_t i = 0; i < y.size(); ++i) e[0] = std::max({e[0], double(std::abs(y[i] - yi[i])), double(std::abs(yg[i] - yi[i]))});
    for (size_t i = 0; i < dw.size(); ++i) e[1] = std::max({e[1], double(std::abs(dw[i] - dwi[i])), double(std::abs(dwg[i] - dwi[i]))});
    for (size_t i = 0; i < dx.size(); ++i) e[2] = std::max({e[2], double(std::abs(dx[i] - dxi[i])), double(std::abs(dxg[i] - dxi[i]))});
    const char* pass[3] = {"forward", "weight gradient", "data gradient"};
    for (int i = 0; i < 3; ++i) {
      if (i == 2 && !c.need_dx) continue;
      std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.2f |\n", c.name, pass[i], gi[i], gd[i], on[i], ob[i],
                  gd[i] / std::min(on[i], ob[i]));
      if (!(e[i] < 1e-4)) {
        std::printf("%s %s: the paths differ by %g\n", c.name, pass[i], e[i]);
        ok = false;
      }
    }
  }

  // ---- mnist_mlp's GEMMs -------------------------------------------------------------------
  struct prod {
    const char* what;
    bool ta, tb;
    idx m, n, k;
  };
  const prod ps[] = {{"fc1 forward", false, false, 64, 256, 784}, {"fc1 dW", true, false, 784, 256, 64},
                     {"fc2 forward", false, false, 64, 128, 256}, {"fc2 dx", false, true, 64, 256, 128},
                     {"fc2 dW", true, false, 256, 128, 64},       {"fc3 forward", false, false, 64, 10, 128},
                     {"fc3 dx", false, true, 64, 128, 10},        {"fc3 dW", true, false, 128, 10, 64}};
  std::printf("\nmnist_mlp's GEMMs (a training step's eight), us per call\n\n| product | m x n x k | gradus blocks | oneDNN matmul | OpenBLAS %d threads | gradus / oneDNN |\n|---|---|---:|---:|---:|---:|\n", omp_get_max_threads());
  double tot[3] = {0, 0, 0};
  const int nt = omp_get_max_threads();
  for (const prod& p : ps) {
    const idx am = p.ta ? p.k : p.m, ak = p.ta ? p.m : p.k, bk = p.tb ? p.n : p.k, bn = p.tb ? p.k : p.n;
    std::vector<float> a(static_cast<std::size_t>(am * ak)), b(static_cast<std::size_t>(bk * bn)), cg(static_cast<std::size_t>(p.m * p.n)), cd(cg.size()), cb(cg.size());
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i));
    memory::desc a_md({p.m, p.k}, dt::f32, p.ta ? tag::ba : tag::ab), b_md({p.k, p.n}, dt::f32, p.tb ? tag::ba : tag::ab),
        c_md({p.m, p.n}, dt::f32, tag::ab);
    matmul::primitive_desc mpd(matmul::desc(a_md, b_md, c_md), eng);
    matmul mm(mpd);
    memory ma(a_md, eng, a.data()), mb(b_md, eng, b.data()), mc(c_md, eng, cd.data());
    auto once_g = [&] { g::cpu_simd::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.f, a.data(), ak, 0, b.data(), bn, 0, 0.f, cg.data(), p.n, 0, 1); };
    auto once_d = [&] { mm.execute(st, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}}); st.wait(); };
    auto once_b = [&] {
      cblas_sgemm(CblasRowMajor, p.ta ? CblasTrans : CblasNoTrans, p.tb ? CblasTrans : CblasNoTrans, static_cast<CBLAS_INT>(p.m),
                  static_cast<CBLAS_INT>(p.n), static_cast<CBLAS_INT>(p.k), 1.f, a.data(), static_cast<CBLAS_INT>(ak), b.data(),
                  static_cast<CBLAS_INT>(bn), 0.f, cb.data(), static_cast<CBLAS_INT>(p.n));
    };
    std::vector<bench::candidate> v;
    v.push_back({"gradus", [&] { for (int r = 0; r < 50; ++r) once_g(); }, {}, [nt] { omp_set_num_threads(nt); }});
    v.push_back({"oneDNN", [&] { for (int r = 0; r < 50; ++r) once_d(); }, {}, [nt] { omp_set_num_threads(nt); }});
    v.push_back({"OpenBLAS", [&] { for (int r = 0; r < 50; ++r) once_b(); }, {}, [nt] { omp_set_num_threads(nt); }});
    bench::run_interleaved(v, rounds, 2);
    double us[3];
    for (int i = 0; i < 3; ++i) tot[i] += us[i] = bench::median(v[static_cast<std::size_t>(i)].seconds) / 50 * 1e6;
    double e = 0;
    for (std::size_t i = 0; i < cg.size(); ++i) e = std::max(e, std::abs(double(cg[i]) - cd[i]) / (1.0 + std::abs(double(cg[i]))));
    if (!(e < 1e-4)) {
      std::printf("%s: oneDNN differs from gradus by %g\n", p.what, e);
      ok = false;
    }
    std::printf("| %s | %ld x %ld x %ld | %.1f | %.1f | %.1f | %.2f |\n", p.what, static_cast<long>(p.m), static_cast<long>(p.n),
                static_cast<long>(p.k), us[0], us[1], us[2], us[0] / us[1]);
  }
  std::printf("| all eight | | %.1f | %.1f | %.1f | %.2f |\n", tot[0], tot[1], tot[2], tot[0] / tot[1]);
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
  return ok ? 0 : 1;
}
