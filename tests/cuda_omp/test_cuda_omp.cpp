// gradus::cuda built against Thrust's OpenMP device system (the cuda-omp label): every
// kernel of the CUDA backend runs on host threads, with the executor staging feeds and
// results exactly as on a GPU (cuda::host_memory is false). Each op, each gradient rule
// and a training step of the MNIST-shaped MLP, CNN and LSTM are compared with cpu_simd
// (itself tested against independent references in tests/graph and tests/autodiff);
// dropout masks must agree bit for bit; the caching allocator must not go to the device
// again once a step has run.
//
// The same source is the GPU's suite: built by nvcc (tests/cuda_omp/CMakeLists.txt,
// GRADUS_CUDA_DEVICE_SUITE) it runs every case on a device, against cpu_simd on the host.
#define BOOST_TEST_MODULE cuda_omp
#include "../support/check.hpp"

#include <gradus/backends/cuda.hpp>

#include "device_array.hpp"

#include <cstring>

namespace g = gradus;
using namespace gradus_test;

static_assert(g::backend<g::cuda> && !g::backend_host_memory<g::cuda> && g::backend_host_memory<g::cpu_simd>);

namespace {

// |a - b| <= tol * (|b| + 1): cpu_simd's SIMD functions and the scalar ones the per-element
// kernels call may differ in the last bits
template <class T>
boost::test_tools::predicate_result agree(const g::tensor_view<const T>& got, const std::vector<double>& want,
                                          double tol) {
  return close(got, want, tol, std::vector<double>(want.size(), 1.0));
}

template <class T>
constexpr double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

using real_types = std::tuple<float, double>;

}  // namespace

// Every elementwise functor, broadcasting on both sides, at lengths that end in a SIMD tail
// on the CPU (1, 7, 17, 33) and one that does not (64).
BOOST_AUTO_TEST_CASE_TEMPLATE(elementwise_every_op_against_cpu, T, real_types) {
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn> b;
  const auto e1 = g::exp(a) + g::log(g::abs(a) + T(1)) * g::sqrt(g::abs(b)) - g::tanh(a) / (g::sigmoid(b) + T(0.5));
  const auto e2 = g::relu(a) * g::softplus(b) + g::leaky_relu(a, 0.2) - g::elu(b, 0.7) + g::clamp(a, -0.3, 0.4);
  const auto e3 = g::maximum(a, b) - g::minimum(a, b) + g::pow(g::abs(a) + T(0.1), b) + g::square(a) * g::rsqrt(g::abs(b) + T(1));
  const auto e4 = g::where(a < b, a, b) + (a >= b) * T(2) + g::equal(a, a) - g::not_equal(a, b) + g::log1p(g::abs(b)) - (-a);
  // and every functor's derivative rule: the gradients of one loss over all four
  const auto [ga, gb] = g::grad(g::sum(e1 * e2) + g::sum(e3 * e4), a, b);
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  for (const long n : {1L, 7L, 17L, 33L, 64L}) {
    const auto av = uniform<T>(static_cast<std::size_t>(3 * n), -2, 2);
    const auto bv = uniform<T>(static_cast<std::size_t>(n), -2, 2);
    const auto fa = a = g::view(av.data(), {3, n});
    const auto fb = b = g::view(bv.data(), {n});
    const auto [c1, c2, c3, c4] = cpu.run(e1, e2, e3, e4, fa, fb);
    const std::vector<std::vector<double>> want{host(c1), host(c2), host(c3), host(c4)};
    const auto [d1, d2, d3, d4] = gpu.run(e1, e2, e3, e4, fa, fb);
    BOOST_TEST(agree(d1, want[0], tol<T>()), "n = " << n);
    BOOST_TEST(agree(d2, want[1], tol<T>()), "n = " << n);
    BOOST_TEST(agree(d3, want[2], tol<T>()), "n = " << n);
    BOOST_TEST(agree(d4, want[3], tol<T>()), "n = " << n);
    const auto [cga, cgb] = cpu.run(ga, gb, fa, fb);
    const auto wa = host(cga), wb = host(cgb);
    const auto [dga, dgb] = gpu.run(ga, gb, fa, fb);
    BOOST_TEST(agree(dga, wa, 10 * tol<T>()), "d/da, n = " << n);
    BOOST_TEST(agree(dgb, wb, 10 * tol<T>()), "d/db, n = " << n);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reductions_softmax_and_layout_against_cpu, T, real_types) {
  g::placeholder<"x", T, 5, 7, 9> x;
  g::placeholder<"big", T, g::dyn> big;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  const auto xv = uniform<T>(5 * 7 * 9, -3, 3);
  const auto bv = uniform<T>(70000, -1, 1);  // one output from 70,000: the parallel tree
  const auto yv = uniform_int(5 * 7, 0, 8);
  auto run_all = [&](auto& s) {
    const auto fx = x = g::view(xv.data(), {5, 7, 9});
    const auto fb = big = g::view(bv.data(), {70000});
    const auto fy = y = g::view(yv.data(), {35});
    const auto flat = g::reshape<35, 9>(x);
    const auto r = s.run(g::sum<0>(x), g::mean<1>(x), g::max<2>(x), g::min<1>(x), g::sum(big), g::mean(big), g::max(big),
                         g::softmax(flat), g::log_softmax(flat), g::softmax_cross_entropy(flat, y),
                         g::transpose(x), g::permute<2, 0, 1>(x), fx, fb, fy);
    std::vector<std::vector<double>> out;
    std::apply([&](const auto&... v) { (out.push_back(host(v)), ...); }, r);
    const auto am = s.run(g::argmax<1>(x), g::argmax<2>(x), fx);
    out.push_back(host(std::get<0>(am)));
    out.push_back(host(std::get<1>(am)));
    return out;
  };
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  const auto want = run_all(cpu), got = run_all(gpu);
  BOOST_REQUIRE_EQUAL(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    BOOST_REQUIRE_EQUAL(want[i].size(), got[i].size());
    for (std::size_t k = 0; k < want[i].size(); ++k)
      BOOST_TEST(std::abs(got[i][k] - want[i][k]) <= (i == 4 || i == 5 ? 1e-3 : tol<T>()) * (std::abs(want[i][k]) + 1),
                 "output " << i << " element " << k << ": " << got[i][k] << " vs " << want[i][k]);
  }
}

BOOST_AUTO_TEST_CASE(index_ops_and_their_errors) {
  g::placeholder<"t", float, 10, 6> table;
  g::placeholder<"i", std::int32_t, g::dyn> idx;
  const auto tv = uniform<float>(60, -1, 1);
  const std::vector<std::int32_t> iv{3, 0, 9, 3, 3, 7, 0};
  const auto onehot = g::one_hot<10>(idx);
  const auto gathered = g::gather(table, idx);
  const auto loss = g::sum(g::square(gathered));
  const auto [dtable] = g::grad(loss, table);  // scatter_add of the rows, repeated indices summed
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  const auto ft = table = g::view(tv.data(), {10, 6});
  const auto fi = idx = g::view(iv.data(), {7});
  const auto [c1, c2, c3] = cpu.run(onehot, gathered, dtable, ft, fi);
  const auto w1 = host(c1), w2 = host(c2), w3 = host(c3);
  const auto [d1, d2, d3] = gpu.run(onehot, gathered, dtable, ft, fi);
  BOOST_TEST(agree(d1, w1, 0.0));
  BOOST_TEST(agree(d2, w2, 0.0));
  BOOST_TEST(agree(d3, w3, 0.0));  // the same sums in the same order: the same bits
  const std::vector<std::int32_t> bad{1, 2, 10};
  try {
    gpu.run(gathered, ft, idx = g::view(bad.data(), {3}));
    BOOST_FAIL("an index of 10 into 10 rows was accepted");
  } catch (const g::index_error& e) {
    BOOST_TEST(std::string(e.what()).find("gather: index 10 at position 2 is outside [0, 10)") != std::string::npos,
               e.what());
  }
}

// Convolutions (cpu_simd's, standing in for cuDNN), pooling of both kinds with stride and
// padding and their gradients (the cuda kernels), im2col / col2im through the graph.
BOOST_AUTO_TEST_CASE_TEMPLATE(images_and_their_gradients_against_cpu, T, real_types) {
  g::placeholder<"x", T, g::dyn, 3, 11, 9> x;
  g::variable<"w", T, 4, 3, 3, 3> w;
  const auto h = g::conv2d<2, 1>(x, w);  // [N, 4, 6, 5]
  const auto mp = g::max_pool2d<3, 2, 1>(h);
  const auto ap = g::avg_pool2d<2, 1, 1>(g::tanh(h));
  constexpr g::window2d win{3, 3, 1, 1};
  const auto cols = g::im2col<win>(x);
  const auto back = g::col2im<win>(cols * T(0.5), x);
  const auto loss = g::sum(g::square(mp)) + g::sum(ap * ap * ap) + g::sum(back * x);
  const auto grads = g::grad(loss, x, w);  // not a structured binding: clang++ 14 cannot capture one
  const auto& dx = std::get<0>(grads);
  const auto& dw = std::get<1>(grads);
  const auto xv = uniform<T>(2 * 3 * 11 * 9, -1, 1);
  const auto wv = uniform<T>(4 * 3 * 3 * 3, -0.5, 0.5);
  auto run_all = [&](auto& s) {
    g::assign(s, w, g::view(wv.data(), {4, 3, 3, 3}));
    const auto r = s.run(h, mp, ap, cols, back, loss, dx, dw, x = g::view(xv.data(), {2, 3, 11, 9}));
    std::vector<std::vector<double>> out;
    std::apply([&](const auto&... v) { (out.push_back(host(v)), ...); }, r);
    return out;
  };
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  const auto want = run_all(cpu), got = run_all(gpu);
  for (std::size_t i = 0; i < want.size(); ++i) {
    BOOST_REQUIRE_EQUAL(want[i].size(), got[i].size());
    int bad = 0;
    for (std::size_t k = 0; k < want[i].size(); ++k)
      if (!(std::abs(got[i][k] - want[i][k]) <= 10 * tol<T>() * (std::abs(want[i][k]) + 1)) && bad++ < 3)
        BOOST_ERROR("output " << i << " element " << k << ": " << got[i][k] << " vs " << want[i][k]);
  }
}

// The kernels directly, at shapes the graph tests above do not reach: im2col and col2im
// with stride 2 and padding 2, pooling windows that overhang the plane.
BOOST_AUTO_TEST_CASE(image_kernels_directly) {
  const g::conv_geometry geo{.n = 2, .c = 3, .h = 7, .w = 6, .window = {3, 3, 2, 2}};
  const auto x = uniform<float>(static_cast<std::size_t>(geo.n * geo.c * geo.h * geo.w), -1, 1);
  const device_array<float> x_d(x);
  std::vector<float> col_c(static_cast<std::size_t>(geo.patch() * geo.n * geo.pixels()));
  device_array<float> col_d(col_c.size());
  g::cpu_simd::im2col(x.data(), geo, col_c.data());
  g::cuda::im2col(x_d.get(), geo, col_d.get());
  BOOST_TEST(col_c == col_d.to_host());
  std::vector<float> x_c(x.size());
  const device_array<float> col_in(col_c);
  device_array<float> x_g(x.size());
  g::cpu_simd::col2im(col_c.data(), geo, x_c.data());
  g::cuda::col2im(col_in.get(), geo, x_g.get());
  BOOST_TEST(x_c == x_g.to_host());  // each pixel sums in cpu_simd's order
  for (const bool is_max : {true, false}) {
    g::conv_geometry pool = geo;
    pool.window = {3, 3, 2, 1};
    BOOST_TEST(pool.pixels() == 4 * 3);  // (7 + 2 - 3) / 2 + 1 by (6 + 2 - 3) / 2 + 1
    std::vector<float> y_c(static_cast<std::size_t>(pool.planes() * pool.pixels()));
    device_array<float> y_g(y_c.size());
    g::cpu_simd::pool2d(is_max, x.data(), pool, y_c.data());
    g::cuda::pool2d(is_max, x_d.get(), pool, y_g.get());
    BOOST_TEST(y_c == y_g.to_host());
    const auto gy = uniform<float>(y_c.size(), -1, 1);
    const device_array<float> gy_d(gy);
    std::vector<float> d_c(x.size());
    device_array<float> d_g(x.size());
    g::cpu_simd::pool2d_grad(is_max, x.data(), gy.data(), pool, d_c.data());
    g::cuda::pool2d_grad(is_max, x_d.get(), gy_d.get(), pool, d_g.get());
    BOOST_TEST(d_c == d_g.to_host());
  }
}

// The same seed and draw give the same mask on both backends, bit for bit, at lengths on
// both sides of cpu_simd's parallel threshold.
BOOST_AUTO_TEST_CASE(dropout_masks_bit_identical) {
  for (const g::index_t n : {g::index_t(1), g::index_t(37), g::index_t(100003)})
    for (const double keep : {0.5, 0.9}) {
      std::vector<float> a(static_cast<std::size_t>(n));
      device_array<float> b_d(a.size());
      g::cpu_simd::dropout_mask(a.data(), n, keep, 1234, 5);
      g::cuda::dropout_mask(b_d.get(), n, keep, 1234, 5);
      const std::vector<float> b = b_d.to_host();
      BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0, "n = " << n << ", keep = " << keep);
      std::size_t kept = 0;
      for (float v : b) kept += v != 0;
      if (n > 1000) BOOST_TEST(std::abs(static_cast<double>(kept) / static_cast<double>(n) - keep) < 0.01);
    }
  // and as a node of a training graph: two dropout sites with one seed, one per backend
  g::placeholder<"x", float, g::dyn, 50> x;
  g::nn::dropout d_cpu(0.3, 99), d_gpu(0.3, 99);
  const auto xv = uniform<float>(4 * 50, -1, 1);
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  for (int draw = 0; draw < 3; ++draw) {
    const auto want = host(cpu.run(d_cpu(x), x = g::view(xv.data(), {4, 50})));
    BOOST_TEST(agree(gpu.run(d_gpu(x), x = g::view(xv.data(), {4, 50})), want, 0.0));
  }
}

// sum_squares, first_nonfinite and index checks: the host-scalar kernels.
BOOST_AUTO_TEST_CASE(scalar_kernels) {
  auto v = uniform<double>(5000, -1, 1);
  double ss = 0;
  for (double e : v) ss += e * e;
  {
    const device_array<double> d(v);
    BOOST_TEST(std::abs(g::cuda::sum_squares(d.get(), 5000) - ss) <= 1e-12 * ss);
    BOOST_TEST(g::cuda::first_nonfinite(d.get(), 5000) == -1);
  }
  v[4321] = std::numeric_limits<double>::infinity();
  v[4999] = std::numeric_limits<double>::quiet_NaN();
  const device_array<double> d(v);
  BOOST_TEST(g::cuda::first_nonfinite(d.get(), 5000) == 4321);
  BOOST_TEST(g::cuda::first_nonfinite(d.get() + 4322, 678) == 677);
}

namespace {

// A few training steps of a model on both backends from the same initial values and
// batches: the loss of every step and every variable after the last.
struct trace {
  std::vector<double> losses;
  std::vector<std::vector<double>> vars;
};

template <class B, class Build>
trace train(Build build, int steps) {
  g::session<B> s;
  return build(s, steps);
}

void same_training(const trace& want, const trace& got, double tol, const char* model) {
  BOOST_REQUIRE_EQUAL(want.losses.size(), got.losses.size());
  for (std::size_t i = 0; i < want.losses.size(); ++i)
    BOOST_TEST(std::abs(got.losses[i] - want.losses[i]) <= tol * (std::abs(want.losses[i]) + 1),
               model << " step " << i << " loss " << got.losses[i] << " vs " << want.losses[i]);
  BOOST_REQUIRE_EQUAL(want.vars.size(), got.vars.size());
  for (std::size_t v = 0; v < want.vars.size(); ++v) {
    double worst = 0;
    for (std::size_t k = 0; k < want.vars[v].size(); ++k)
      worst = std::max(worst, std::abs(got.vars[v][k] - want.vars[v][k]) / (std::abs(want.vars[v][k]) + 1));
    BOOST_TEST(worst <= tol, model << " variable " << v << ": largest difference " << worst);
  }
}

template <class S, class... V>
std::vector<std::vector<double>> values(S& s, const V&... v) {
  return {host(s.run(v * 1.0f))...};
}

}  // namespace

// mnist_mlp's model (smaller): dense-relu-dropout-dense-relu-dense, softmax cross-entropy,
// SGD with momentum; 5 steps.
BOOST_AUTO_TEST_CASE(training_step_mlp_against_cpu) {
  auto build = [](auto& s, int steps) {
    g::placeholder<"x", float, g::dyn, 40> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::dense<"fc1", 40, 32> fc1;
    g::nn::dense<"fc2", 32, 16> fc2;
    g::nn::dense<"fc3", 16, 10> fc3;
    g::nn::dropout drop(0.2, 11);
    const auto logits = fc3(g::relu(fc2(drop(g::relu(fc1(x))))));
    const auto loss = g::nn::softmax_cross_entropy_loss(logits, y);
    fc1.initialize(s, 1);
    fc2.initialize(s, 2);
    fc3.initialize(s, 3);
    auto step = g::minimize(s, loss, g::sgd{.lr = 0.1, .momentum = 0.9});
    trace t;
    for (int i = 0; i < steps; ++i) {
      const auto xv = uniform<float>(24 * 40, -1, 1);
      const auto yv = uniform_int(24, 0, 9);
      t.losses.push_back(step.run(x = g::view(xv.data(), {24, 40}), y = g::view(yv.data(), {24})));
    }
    t.vars = values(s, fc1.w, fc1.b, fc2.w, fc2.b, fc3.w, fc3.b);
    return t;
  };
  rng().seed(7);
  const trace want = train<g::cpu_simd>(build, 5);
  rng().seed(7);
  const trace got = train<g::cuda>(build, 5);
  same_training(want, got, 1e-5, "mlp");
}

// mnist_cnn's model (smaller): conv-relu-pool twice, dense; Adam; 4 steps.
BOOST_AUTO_TEST_CASE(training_step_cnn_against_cpu) {
  auto build = [](auto& s, int steps) {
    g::placeholder<"x", float, g::dyn, 1, 14, 14> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::conv2d<"conv1", 1, 4, 3, 1, 1> conv1;
    g::nn::conv2d<"conv2", 4, 6, 3> conv2;
    g::nn::dense<"fc", 6 * 2 * 2, 10> fc;
    const auto h1 = g::max_pool2d<2>(g::relu(conv1(x)));   // [N,4,7,7]
    const auto h2 = g::avg_pool2d<2>(g::relu(conv2(h1)));  // [N,6,2,2]
    const auto loss = g::nn::softmax_cross_entropy_loss(fc(g::flatten(h2)), y);
    conv1.initialize(s, 1);
    conv2.initialize(s, 2);
    fc.initialize(s, 3);
    auto step = g::minimize(s, loss, g::adam{.lr = 1e-2});
    trace t;
    for (int i = 0; i < steps; ++i) {
      const auto xv = uniform<float>(8 * 196, 0, 1);
      const auto yv = uniform_int(8, 0, 9);
      t.losses.push_back(step.run(x = g::view(xv.data(), {8, 1, 14, 14}), y = g::view(yv.data(), {8})));
    }
    t.vars = values(s, conv1.w, conv1.b, conv2.w, conv2.b, fc.w, fc.b);
    return t;
  };
  rng().seed(8);
  const trace want = train<g::cpu_simd>(build, 4);
  rng().seed(8);
  const trace got = train<g::cuda>(build, 4);
  same_training(want, got, 1e-4, "cnn");
}

// seq_mnist_lstm's model (smaller), and a GRU: the cells' fused rules run per element.
BOOST_AUTO_TEST_CASE(training_step_lstm_and_gru_against_cpu) {
  auto build = [](auto& s, int steps) {
    g::placeholder<"x", float, g::dyn, 30> x;  // [N, T*I]
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::lstm<"lstm", 5, 12> lstm;
    g::nn::gru<"gru", 12, 8> gru;
    g::nn::dense<"fc", 8, 4> fc;
    const auto loss = g::nn::softmax_cross_entropy_loss(fc(g::last_step(gru(lstm(g::time_major<6, 5>(x))))), y);
    lstm.initialize(s, 1);
    gru.initialize(s, 2);
    fc.initialize(s, 3);
    auto step = g::minimize(s, loss, g::adam{.lr = 1e-2});
    trace t;
    for (int i = 0; i < steps; ++i) {
      const auto xv = uniform<float>(9 * 30, -1, 1);
      const auto yv = uniform_int(9, 0, 3);
      t.losses.push_back(step.run(x = g::view(xv.data(), {9, 30}), y = g::view(yv.data(), {9})));
    }
    t.vars = values(s, lstm.wx, lstm.wh, lstm.b, gru.wx, gru.wh, fc.w);
    return t;
  };
  rng().seed(9);
  const trace want = train<g::cpu_simd>(build, 4);
  rng().seed(9);
  const trace got = train<g::cuda>(build, 4);
  same_training(want, got, 1e-4, "lstm+gru");
}

// The caching allocator: once a training step has run, further steps take every buffer
// from the free lists (no cudaMalloc), and blocks go back to the pool with the session.
BOOST_AUTO_TEST_CASE(no_device_allocation_after_the_first_step) {
  g::cuda::empty_cache();  // blocks the earlier cases left cached
  const auto before = g::cuda::memory_stats();
  BOOST_TEST(before.bytes_reserved == before.bytes_in_use);
  {
    g::session<g::cuda> s;
    g::placeholder<"x", float, g::dyn, 30> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::dense<"fc1", 30, 20> fc1;
    g::nn::dense<"fc2", 20, 5> fc2;
    const auto loss = g::nn::softmax_cross_entropy_loss(fc2(g::relu(fc1(x))), y);
    fc1.initialize(s, 1);
    fc2.initialize(s, 2);
    auto step = g::minimize(s, loss, g::adam{.lr = 1e-3});
    const auto xv = uniform<float>(16 * 30, -1, 1);
    const auto yv = uniform_int(16, 0, 4);
    step.run(x = g::view(xv.data(), {16, 30}), y = g::view(yv.data(), {16}));
    const auto warm = g::cuda::memory_stats();
    BOOST_TEST(warm.device_allocations > before.device_allocations);  // the first step did allocate
    for (int i = 0; i < 5; ++i) step.run(x = g::view(xv.data(), {16, 30}), y = g::view(yv.data(), {16}));
    const auto after = g::cuda::memory_stats();
    BOOST_TEST(after.device_allocations == warm.device_allocations);
    BOOST_TEST(after.bytes_in_use == warm.bytes_in_use);
    BOOST_TEST(warm.peak_bytes_reserved >= warm.bytes_reserved);  // the peak: never below what is held
    // value(v) on a device backend is a host copy, equal to the variable read through a run
    const auto w = host(g::value(s, fc1.w));
    BOOST_TEST(agree(s.run(fc1.w * 1.0f), w, 0.0));
    BOOST_TEST(g::value(s, fc1.w).data() != nullptr);
  }
  const auto end = g::cuda::memory_stats();
  BOOST_TEST(end.bytes_in_use == before.bytes_in_use);  // the session gave every block back
  g::cuda::empty_cache();  // the blocks go back to the device; the peak stays what it was
  const auto emptied = g::cuda::memory_stats();
  BOOST_TEST(emptied.bytes_reserved < end.bytes_reserved);
  BOOST_TEST(emptied.peak_bytes_reserved == end.peak_bytes_reserved);
  BOOST_TEST(end.peak_bytes_reserved >= end.bytes_reserved);
}

#if GRADUS_CUDA_GPU
#include "../support/device_main.hpp"
#endif
