// A pipeline stage's micro-batched step, cut into its parts, against the unsplit step it
// replaces (issue 31): mnist_deep_mlp's products (784-512x8-10, batch 64) and its SGD
// momentum update, called on cpu_simd's GEMM as the graph calls them, without the graph.
//
// - unsplit: each layer's forward, input-gradient and weight-gradient product on 64 rows,
//   then the update: what one process runs.
// - M = 2, 4, 8: each micro-batch's forward and input-gradient products on 64 / M rows
//   (every forward, then every backward, as GPipe orders one stage's work; M = 8 also in
//   1F1B's order), the weight gradients deferred to one product over the batch, the update:
//   a stage's work with no peers. Every product of these rows runs on cpu_simd's
//   register-blocked kernels (cpu_simd/gemm_kernels.hpp) on the weights as stored.
//
// Each part's time is the median over the rounds of its share of a sample; the ratios are
// the unsplit step's time over each row's.
//
//   bench_microbatch_step [rounds = 9] [steps per sample = 20]
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_common.hpp"

namespace {
using B = gradus::cpu_simd;
using clk = std::chrono::steady_clock;
double since(clk::time_point t) { return std::chrono::duration<double>(clk::now() - t).count(); }

struct model {
  static constexpr long batch = 64;
  std::vector<long> dims{784, 512, 512, 512, 512, 512, 512, 512, 512, 10};
  std::vector<std::vector<float>> w, v, g, x, d;  // weights, momentum, gradients; activations, their gradients
  std::size_t layers() const { return dims.size() - 1; }
  model() {
    for (std::size_t l = 0; l < layers(); ++l) {
      const auto n = static_cast<std::size_t>(dims[l] * dims[l + 1]);
      w.emplace_back(n), v.emplace_back(n, 0.0f), g.emplace_back(n, 0.0f);
      for (std::size_t i = 0; i < n; ++i) w[l][i] = 0.001f * static_cast<float>(i * 7919 % 201) - 0.1f;
    }
    for (std::size_t l = 0; l <= layers(); ++l) {
      x.emplace_back(static_cast<std::size_t>(batch * dims[l]), 0.5f);
      d.emplace_back(static_cast<std::size_t>(batch * dims[l]), 0.25f);
    }
  }
  // rows [r0, r0 + r) of layer l: forward (y = relu(x W) scaled down), input gradient (dx = dy W^T)
  void forward(std::size_t l, long r0, long r) {
    const long k = dims[l], n = dims[l + 1];
    float* y = x[l + 1].data() + r0 * n;
    B::gemm<float>(false, false, r, n, k, 1.0f, x[l].data() + r0 * k, k, 0, w[l].data(), n, 0, 0.0f, y, n, 0, 1);
    for (long i = 0; i < r * n; ++i) y[i] = y[i] > 0 ? 0.01f * y[i] : 0.0f;
  }
  void input_gradient(std::size_t l, long r0, long r) {
    const long k = dims[l], n = dims[l + 1];
    B::gemm<float>(false, true, r, k, n, 1.0f, d[l + 1].data() + r0 * n, n, 0, w[l].data(), n, 0, 0.0f,
                   d[l].data() + r0 * k, k, 0, 1);
  }
  void weight_gradient(std::size_t l) {
    const long k = dims[l], n = dims[l + 1];
    B::gemm<float>(true, false, k, n, batch, 1.0f, x[l].data(), k, 0, d[l + 1].data(), n, 0, 0.0f, g[l].data(), n, 0, 1);
  }
  void update(std::size_t l) {
    const gradus::sgd opt{.lr = 1e-6, .momentum = 0.9};
    float* slots[] = {v[l].data()};
    opt.apply<B>(static_cast<gradus::index_t>(w[l].size()), w[l].data(), g[l].data(), slots, 0, 1.0);
  }
};

struct parts {
  double forward = 0, input_gradient = 0, weight_gradient = 0, update = 0;
};
}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 9, steps = argc > 2 ? std::atoi(argv[2]) : 20;
  B::set_threads(1);
  model m;
  const std::size_t L = m.layers();
  const int ms[] = {2, 4, 8};
  std::vector<std::vector<parts>> split(5);  // unsplit, M = 2, 4, 8, M = 8 in 1F1B's order: each sample's parts
  parts now;
  const auto unsplit = [&] {
    for (int s = 0; s < steps; ++s) {
      auto t = clk::now();
      for (std::size_t l = 0; l < L; ++l) m.forward(l, 0, model::batch);
      now.forward += since(t), t = clk::now();
      for (std::size_t l = L; l-- > 0;) {
        m.input_gradient(l, 0, model::batch);
        m.weight_gradient(l);
      }
      now.input_gradient += since(t), t = clk::now();  // (both gradients: one pass)
      for (std::size_t l = 0; l < L; ++l) m.update(l);
      now.update += since(t);
    }
  };
  const auto micro = [&](int M, bool gpipe) {
    const long r = model::batch / M;
    for (int s = 0; s < steps; ++s) {
      // one stage: GPipe's order (every forward, then every backward) or 1F1B's (with one
      // stage, each micro-batch's forward and then its backward)
      for (int k = 0; k < M; ++k) {
        auto t = clk::now();
        for (std::size_t l = 0; l < L; ++l) m.forward(l, k * r, r);
        now.forward += since(t);
        if (gpipe) continue;
        t = clk::now();
        for (std::size_t l = L; l-- > 0;) m.input_gradient(l, k * r, r);
        now.input_gradient += since(t);
      }
      for (int k = 0; gpipe && k < M; ++k) {
        const auto t = clk::now();
        for (std::size_t l = L; l-- > 0;) m.input_gradient(l, k * r, r);
        now.input_gradient += since(t);
      }
      auto t = clk::now();
      for (std::size_t l = L; l-- > 0;) m.weight_gradient(l);
      now.weight_gradient += since(t), t = clk::now();
      for (std::size_t l = 0; l < L; ++l) m.update(l);
      now.update += since(t);
    }
  };
  std::vector<bench::candidate> cs;
  cs.push_back({"unsplit", unsplit});
  for (int M : ms) cs.push_back({"M = " + std::to_string(M), [&, M] { micro(M, true); }});
  cs.push_back({"M = 8, 1F1B", [&] { micro(8, false); }});
  // each sample's parts, recorded after it (run_interleaved times the whole sample)
  for (std::size_t i = 0; i < split.size(); ++i) {
    auto run = cs[i].run;
    cs[i].run = [&, run, i] {
      now = {};
      run();
      split[i].push_back(now);
    };
  }
  bench::background_load load;
  bench::run_interleaved(cs, rounds, 1);
  const auto med = [&](std::size_t i, double parts::*f) {
    std::vector<double> v;
    for (const auto& p : split[i]) v.push_back(p.*f);
    return bench::median(v) / steps * 1e3;
  };
  std::printf("mnist_deep_mlp's step, batch 64, one thread (%d rounds of %d steps; medians, ms a step)\n\n", rounds, steps);
  std::printf("| step | total | forward | input gradient | weight gradient | update | unsplit / this |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  const double base = bench::median(cs[0].seconds) / steps * 1e3;
  for (std::size_t i = 0; i < split.size(); ++i) {
    const double total = bench::median(cs[i].seconds) / steps * 1e3;
    if (i == 0)
      std::printf("| unsplit (64 rows) | %.2f | %.2f | %.2f (with the weight gradient) | | %.2f | 1 |\n", total,
                  med(i, &parts::forward), med(i, &parts::input_gradient), med(i, &parts::update));
    else
      std::printf("| M = %d (%ld rows)%s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", i < 4 ? ms[i - 1] : 8,
                  model::batch / (i < 4 ? ms[i - 1] : 8), i < 4 ? "" : ", 1F1B's order", total,
                  med(i, &parts::forward), med(i, &parts::input_gradient), med(i, &parts::weight_gradient),
                  med(i, &parts::update), base / total);
  }
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
}
