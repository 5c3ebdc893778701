// The main demo for now: typed tensor expressions evaluated as fused SIMD passes, a
// matmul through BLAS, a reduction and a softmax, checked against plain loops.
#include <chrono>
#include <cstdio>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <random>
#include <xtensor/xio.hpp>
#include <xtensor/xview.hpp>

namespace g = gradus;

int main() {
  g::placeholder<"x", float, g::dyn, 784> x;       // a batch of flattened images
  g::variable<"w", float, 784, 10> w;              // weights, owned by the session
  g::variable<"b", float, 10> b;

  auto logits = g::matmul(x, w) + b;                // matmul via BLAS, bias add fused
  auto probs = g::softmax(logits);                  // stable softmax over the last axis
  auto pred = g::argmax<1>(logits);
  auto gelu_ish = x * g::sigmoid(1.702f * x);       // one fused SIMD pass, no temporaries

  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 0.05f);
  xt::xtensor<float, 2> wv({784, 10});
  for (auto& v : wv) v = nd(rng);
  xt::xtensor<float, 1> bv = xt::zeros<float>({10});
  xt::xtensor<float, 2> xb({64, 784});
  for (auto& v : xb) v = std::uniform_real_distribution<float>(0.f, 1.f)(rng);

  g::session<g::cpu_simd> s;
  g::assign(s, w, wv);
  g::assign(s, b, bv);

  auto [p, k] = s.run(probs, pred, x = xb);
  std::printf("softmax of a 64x784 batch through a 784x10 layer: shape (%ld, %ld), row 0 sums to %.6f\n",
              p.shape()[0], p.shape()[1], static_cast<double>(xt::sum(xt::view(g::adapt(p), 0))()));
  std::printf("argmax of the first 8 rows:");
  for (int i = 0; i < 8; ++i) std::printf(" %d", k[i]);
  std::printf("\n");

  // Check the fused pass against a plain loop and time both runs of the same plan.
  auto t0 = std::chrono::steady_clock::now();
  auto y = s.run(gelu_ish, x = xb);
  auto t1 = std::chrono::steady_clock::now();
  y = s.run(gelu_ish, x = xb);
  auto t2 = std::chrono::steady_clock::now();
  double max_err = 0;
  for (std::size_t i = 0; i < xb.size(); ++i) {
    const float v = xb.data()[i];
    max_err = std::max(max_err, static_cast<double>(std::abs(y[static_cast<g::index_t>(i)] - v / (1.f + std::exp(-1.702f * v)))));
  }
  std::printf("x * sigmoid(1.702 x) over %zu elements: max |error| vs loop %.2e; first run (plans, allocates) %.1f us, "
              "second %.1f us\n",
              xb.size(), max_err, std::chrono::duration<double, std::micro>(t1 - t0).count(),
              std::chrono::duration<double, std::micro>(t2 - t1).count());
  return max_err < 1e-5 ? 0 : 1;
}
