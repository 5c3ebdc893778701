// gradus::cuda on a real GPU (label gpu), built by nvcc. Without a CUDA device the program
// says why and exits with 77, which CTest reports as skipped. On a device: elementwise
// plans (both fused kernels), GEMM (cuBLAS), convolution (cuDNN) and the softmax loss
// against double loops on the host, dropout masks against the host's counter hash bit for
// bit, the caching allocator's steady state, an MLP that learns, and two sessions training
// side by side on their own streams.
#define BOOST_TEST_MODULE cuda_gpu
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <gradus/backends/cuda.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace g = gradus;

namespace {

std::vector<float> uniform(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = d(r);
  return v;
}

double worst(const g::tensor_view<const float>& got, const std::vector<double>& want) {
  double w = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    w = std::max(w, std::abs(static_cast<double>(got[static_cast<g::index_t>(i)]) - want[i]) / (std::abs(want[i]) + 1));
  return w;
}

}  // namespace

BOOST_AUTO_TEST_CASE(elementwise_gemm_and_loss_against_host_loops) {
  const int m = 67, k = 129, n = 33;  // no size a multiple of a warp or a tile
  g::placeholder<"a", float, g::dyn, k> a;
  g::variable<"b", float, k, n> b;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  const auto av = uniform(m * k, -1, 1, 1), bv = uniform(k * n, -1, 1, 2);
  std::vector<std::int32_t> yv(m);
  for (int i = 0; i < m; ++i) yv[i] = (i * 7) % n;
  const auto prod = g::matmul(a, b);
  const auto act = g::tanh(prod) * 2.0f + g::exp(-g::abs(prod));
  const auto loss = g::softmax_cross_entropy(prod, y);
  g::session<g::cuda> s;
  g::assign(s, b, g::view(bv.data(), {k, n}));
  const auto [p, q, l] = s.run(prod, act, loss, a = g::view(av.data(), {m, k}), y = g::view(yv.data(), {m}));
  std::vector<double> pw(m * n), qw(m * n), lw(m);
  for (int i = 0; i < m; ++i) {
    double mx = -1e300;
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int t = 0; t < k; ++t) acc += double(av[i * k + t]) * double(bv[t * n + j]);
      pw[i * n + j] = acc;
      qw[i * n + j] = std::tanh(acc) * 2 + std::exp(-std::abs(acc));
      mx = std::max(mx, acc);
    }
    double se = 0;
    for (int j = 0; j < n; ++j) se += std::exp(pw[i * n + j] - mx);
    lw[i] = std::log(se) + mx - pw[i * n + yv[i]];
  }
  BOOST_TEST(worst(p, pw) < 1e-4);  // cuBLAS in FP32 (no TF32: the default math mode)
  BOOST_TEST(worst(q, qw) < 1e-4);
  BOOST_TEST(worst(l, lw) < 1e-4);
}

BOOST_AUTO_TEST_CASE(convolution_through_cudnn_against_host_loops) {
  const int nb = 3, c = 2, h = 9, w = 8, o = 5, kk = 3, st = 2, pd = 1;
  g::placeholder<"x", float, g::dyn, c, h, w> x;
  g::variable<"w", float, o, c, kk, kk> wt;
  const auto xv = uniform(nb * c * h * w, -1, 1, 3), wv = uniform(o * c * kk * kk, -1, 1, 4);
  g::session<g::cuda> s;
  g::assign(s, wt, g::view(wv.data(), {o, c, kk, kk}));
  const auto r = s.run(g::conv2d<st, pd>(x, wt), x = g::view(xv.data(), {nb, c, h, w}));
  const int oh = (h + 2 * pd - kk) / st + 1, ow = (w + 2 * pd - kk) / st + 1;
  std::vector<double> want(nb * o * oh * ow, 0.0);
  for (int b = 0; b < nb; ++b)
    for (int q = 0; q < o; ++q)
      for (int i = 0; i < oh; ++i)
        for (int j = 0; j < ow; ++j) {
          double acc = 0;
          for (int ch = 0; ch < c; ++ch)
            for (int u = 0; u < kk; ++u)
              for (int v = 0; v < kk; ++v) {
                const int yy = i * st - pd + u, xx = j * st - pd + v;
                if (yy >= 0 && yy < h && xx >= 0 && xx < w)
                  acc += double(xv[((b * c + ch) * h + yy) * w + xx]) * double(wv[((q * c + ch) * kk + u) * kk + v]);
              }
          want[((b * o + q) * oh + i) * ow + j] = acc;
        }
  BOOST_TEST(worst(r, want) < 1e-4);
}

BOOST_AUTO_TEST_CASE(dropout_mask_matches_the_host_hash_bit_for_bit) {
  const g::index_t n = 100003;
  float* d = static_cast<float*>(g::cuda::allocate(n * sizeof(float)));
  g::cuda::dropout_mask(d, n, 0.7, 42, 3);
  std::vector<float> got(n);
  g::cuda::copy_to_host(got.data(), d, n * sizeof(float));
  g::cuda::deallocate(d);
  const std::uint64_t base = g::counter_hash::stream(42, 3);
  int differ = 0;
  for (g::index_t i = 0; i < n; ++i)
    differ += got[i] != g::counter_hash::dropout_value(base, static_cast<std::uint64_t>(i), 0.7, static_cast<float>(1 / 0.7));
  BOOST_TEST(differ == 0);
}

BOOST_AUTO_TEST_CASE(mlp_learns_and_allocates_nothing_after_the_first_step) {
  g::placeholder<"x", float, g::dyn, 20> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"fc1", 20, 32> fc1;
  g::nn::dense<"fc2", 32, 4> fc2;
  const auto loss = g::nn::softmax_cross_entropy_loss(fc2(g::relu(fc1(x))), y);
  g::session<g::cuda> s;
  fc1.initialize(s, 1);
  fc2.initialize(s, 2);
  auto step = g::minimize(s, loss, g::adam{.lr = 1e-2});
  const auto xv = uniform(64 * 20, -1, 1, 5);
  std::vector<std::int32_t> yv(64);
  for (int i = 0; i < 64; ++i) yv[i] = (xv[i * 20] > 0) * 2 + (xv[i * 20 + 1] > 0);  // learnable labels
  const float first = step.run(x = g::view(xv.data(), {64, 20}), y = g::view(yv.data(), {64}));
  const auto warm = g::cuda::memory_stats();
  float last = first;
  for (int i = 0; i < 200; ++i) last = step.run(x = g::view(xv.data(), {64, 20}), y = g::view(yv.data(), {64}));
  BOOST_TEST(g::cuda::memory_stats().device_allocations == warm.device_allocations);
  BOOST_TEST(last < 0.5f * first, "loss " << first << " -> " << last);
}

// The three fused kernels (16 bytes per thread where rows allow it, a few elements of a
// long row per thread, one element per thread elsewhere) against a loop on the host, at
// row lengths on both sides of each rule.
BOOST_AUTO_TEST_CASE(fused_kernels_against_host_loops) {
  g::placeholder<"a", float, g::dyn, g::dyn> a;
  g::placeholder<"b", float, g::dyn> b;
  const auto e = g::sigmoid(a) * b - g::square(a - 0.5f);
  g::session<g::cuda> s;
  for (const int n : {4, 6, 127, 129, 1024, 1027, 4099}) {
    const auto av = uniform(5 * n, -2, 2, 7), bv = uniform(n, -2, 2, 8);
    const auto before = g::cuda::fused_stats();
    const auto r = s.run(e, a = g::view(av.data(), {5, n}), b = g::view(bv.data(), {n}));
    const auto after = g::cuda::fused_stats();
    std::vector<double> want(5 * n);
    for (int i = 0; i < 5 * n; ++i) {
      const double x = av[i];
      want[i] = 1 / (1 + std::exp(-x)) * bv[i % n] - (x - 0.5) * (x - 0.5);
    }
    BOOST_TEST(worst(r, want) < 1e-5, "n = " << n);
    BOOST_TEST(after.by_lanes - before.by_lanes == (n % 4 == 0 ? 1u : 0u), "n = " << n);
    BOOST_TEST(after.by_rows - before.by_rows == (n % 4 != 0 && n >= 128 ? 1u : 0u), "n = " << n);
  }
}

// Two sessions on two threads, each on its own stream, train the same model from the same
// start at the same time: both end where one session alone ends, bit for bit.
BOOST_AUTO_TEST_CASE(sessions_on_two_threads_run_side_by_side) {
  const auto xv = uniform(64 * 20, -1, 1, 9);
  std::vector<std::int32_t> yv(64);
  for (int i = 0; i < 64; ++i) yv[i] = (xv[i * 20] > 0) * 2 + (xv[i * 20 + 1] > 0);
  auto train = [&](std::vector<float>& out) {
    g::placeholder<"x", float, g::dyn, 20> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::dense<"fc1", 20, 64> fc1;
    g::nn::dense<"fc2", 64, 4> fc2;
    const auto loss = g::nn::softmax_cross_entropy_loss(fc2(g::relu(fc1(x))), y);
    g::session<g::cuda> s;
    fc1.initialize(s, 1);
    fc2.initialize(s, 2);
    auto step = g::minimize(s, loss, g::sgd{.lr = 0.1, .momentum = 0.9});
    for (int i = 0; i < 100; ++i) step.run(x = g::view(xv.data(), {64, 20}), y = g::view(yv.data(), {64}));
    const auto w = g::value(s, fc1.w);
    out.assign(w.begin(), w.end());
  };
  std::vector<float> alone, t1, t2;
  train(alone);
  std::thread a([&] { train(t1); }), b([&] { train(t2); });
  a.join();
  b.join();
  BOOST_TEST(t1 == alone);
  BOOST_TEST(t2 == alone);
}

#include "../support/device_main.hpp"
