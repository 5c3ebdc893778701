// gradus::cuda on Thrust's OpenMP system (label cuda-omp), the parts a GPU run depends on
// besides the kernels (test_cuda_omp.cpp): the gradient rules of every non-elementwise op
// through the executor (every backend section once), a training step with a sparse
// embedding and batch norm, constant
// tensors, each session's own context (stream) and the allocator's handling of blocks
// between streams, the two fused kernels (16 bytes per thread, one element per thread), and
// the build's memory-space checks (a host pointer where the device's is expected).
#define BOOST_TEST_MODULE cuda_omp_graph
#include "../support/check.hpp"

#include <gradus/backends/cuda.hpp>

#include <thread>

namespace g = gradus;
using namespace gradus_test;

namespace {

// every element within tol * (|want| + 1); the first three misses named
void same_values(const std::vector<std::vector<double>>& want, const std::vector<std::vector<double>>& got, double tol) {
  BOOST_REQUIRE_EQUAL(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    BOOST_REQUIRE_EQUAL(want[i].size(), got[i].size());
    int bad = 0;
    for (std::size_t k = 0; k < want[i].size(); ++k)
      if (!(std::abs(got[i][k] - want[i][k]) <= tol * (std::abs(want[i][k]) + 1)) && bad++ < 3)
        BOOST_ERROR("output " << i << " element " << k << ": " << got[i][k] << " vs " << want[i][k]);
  }
}

// f() throws E whose message holds `needle`
template <class E, class F>
void check_throws(F f, const std::string& needle) {
  try {
    f();
    BOOST_ERROR("no error; expected one saying '" << needle << "'");
  } catch (const E& e) {
    BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos, e.what());
  }
}

template <class R>
std::vector<std::vector<double>> all_host(const R& r) {
  std::vector<std::vector<double>> out;
  std::apply([&](const auto&... v) { (out.push_back(host(v)), ...); }, r);
  return out;
}

}  // namespace

// The adjoint of every op that is not elementwise, through one loss: reductions over each
// axis and over everything, the softmax family, matmul with both operands transposed,
// permute, reshape, expand_dims, select, gather, a constant tensor; double precision, so
// cpu_simd and the per-element kernels agree to 1e-12.
BOOST_AUTO_TEST_CASE(gradients_of_the_other_ops_against_cpu) {
  g::placeholder<"x", double, g::dyn, 6> x;  // [4, 6]
  g::variable<"w", double, 6, 5> w;
  g::variable<"v", double, 4, 5> v;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  const auto cv = uniform<double>(4 * 5, -1, 1);
  const auto c = g::constant(tensor<double, 2>({4, 5}, cv));
  const auto h = g::matmul(x, w);                                                  // [4, 5]
  const auto p = g::permute<1, 0>(h * c);                                          // [5, 4]
  const auto ht = g::matmul(g::matrix_transpose(v), g::matrix_transpose(g::tanh(p)));  // [5, 5]
  const auto e = g::expand_dims<1>(g::sum<1>(h));                                  // [4, 1]
  const auto loss = g::sum(g::softmax(h) * v) + g::mean(g::log_softmax(h + e) * c) +
                    g::sum(g::softmax_cross_entropy(h, y)) + g::sum(g::max<0>(p)) - g::sum(g::min<1>(p)) +
                    g::mean<0>(g::sum<1>(g::square(ht))) * 0.1 + g::max(g::reshape<20>(h)) +
                    g::sum(g::select(h, 2) * g::select(v, 1)) + g::sum(g::square(g::gather(w, y)));
  const auto grads = g::grad(loss, x, w, v);
  const auto xv = uniform<double>(4 * 6, -1, 1);
  const auto wv = uniform<double>(6 * 5, -1, 1);
  const auto vv = uniform<double>(4 * 5, -1, 1);
  const std::vector<std::int32_t> yv{4, 0, 2, 4};
  auto run_all = [&](auto& s) {
    g::assign(s, w, g::view(wv.data(), {6, 5}));
    g::assign(s, v, g::view(vv.data(), {4, 5}));
    const auto fx = x = g::view(xv.data(), {4, 6});
    const auto fy = y = g::view(yv.data(), {4});
    return all_host(s.run(loss, std::get<0>(grads), std::get<1>(grads), std::get<2>(grads), fx, fy));
  };
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  const auto want = run_all(cpu);
  const auto got = run_all(gpu);
  same_values(want, got, 1e-12);
  double norm = 0;
  for (double d : want[1]) norm += d * d;
  BOOST_TEST(norm > 0);  // the gradient with respect to x is not identically zero
}

// The sections the case above leaves out, once each through a graph (test_cuda_omp covers
// them in depth; this unit is the one CI's clang++ stage builds): a convolution with both
// gradients, both poolings, im2col / col2im, one-hot and dropout, in double.
BOOST_AUTO_TEST_CASE(images_one_hot_and_dropout_through_the_graph) {
  g::placeholder<"x", double, g::dyn, 2, 7, 6> x;
  g::variable<"k", double, 3, 2, 3, 3> k;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  constexpr g::window2d win{2, 2, 1, 0};
  g::nn::dropout drop(0.25, 17);
  const auto h = g::conv2d<1, 1>(x, k);  // [N, 3, 7, 6]
  const auto loss = g::sum(g::square(g::max_pool2d<2>(h))) + g::sum(g::avg_pool2d<3, 2, 1>(g::tanh(h))) +
                    g::sum(g::col2im<win>(g::im2col<win>(x) * 0.5, x) * x) +
                    g::sum(g::one_hot<4, double>(y) * g::expand_dims<1>(g::sum<1>(g::flatten(drop(h)))));
  const auto grads = g::grad(loss, x, k);
  const auto xv = uniform<double>(3 * 2 * 7 * 6, -1, 1);
  const auto kv = uniform<double>(3 * 2 * 3 * 3, -0.5, 0.5);
  const std::vector<std::int32_t> yv{3, 0, 2};
  auto run_all = [&](auto& s) {
    drop.set_draws(0);  // the same mask on both backends (the site counts its draws)
    g::assign(s, k, g::view(kv.data(), {3, 2, 3, 3}));
    const auto fx = x = g::view(xv.data(), {3, 2, 7, 6});
    return all_host(s.run(loss, std::get<0>(grads), std::get<1>(grads), fx, y = g::view(yv.data(), {3})));
  };
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  same_values(run_all(cpu), run_all(gpu), 1e-12);
}

// A sparse-row embedding (its update gathers, updates and scatters the named rows on the
// device; the indices go to the host and back), batch norm (its moving averages are
// updated by a kernel during the run), dense, softmax cross-entropy, Adam; 4 steps.
BOOST_AUTO_TEST_CASE(training_step_embedding_batch_norm_against_cpu) {
  auto build = [](auto& s) {
    g::placeholder<"ids", std::int32_t, g::dyn> ids;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::embedding<"emb", 50, 12, float, true> emb;
    g::nn::batch_norm<"bn", 12> bn;
    g::nn::dense<"fc", 12, 5> fc;
    const auto loss = g::nn::softmax_cross_entropy_loss(fc(g::relu(bn.train(emb(ids)))), y);
    emb.initialize(s, 1);
    bn.initialize(s);
    fc.initialize(s, 3);
    auto step = g::minimize(s, loss, g::adam{.lr = 1e-2});
    std::vector<double> losses;
    for (int i = 0; i < 4; ++i) {
      const auto iv = uniform_int(10, 0, 49);
      const auto yv = uniform_int(10, 0, 4);
      losses.push_back(step.run(ids = g::view(iv.data(), {10}), y = g::view(yv.data(), {10})));
    }
    std::vector<std::vector<double>> out{losses};
    for (const auto& t : {host(g::value(s, emb.table)), host(g::value(s, bn.gamma)), host(g::value(s, bn.beta)),
                          host(g::value(s, bn.moving_mean)), host(g::value(s, bn.moving_var)), host(g::value(s, fc.w))})
      out.push_back(t);
    return out;
  };
  rng().seed(10);
  g::session<g::cpu_simd> cpu;
  const auto want = build(cpu);
  rng().seed(10);
  g::session<g::cuda> gpu;
  const auto got = build(gpu);
  same_values(want, got, 1e-4);
  BOOST_TEST(want[0].back() < want[0].front());  // it trains
}

// Each session has its own context (a GPU's stream), bound to the thread for the length of
// its run — as the hook a data-parallel step reduces from sees it — and nowhere else; a
// session used from another thread binds it there. A block one session freed goes to
// another only through cross_stream_reuses (a GPU then makes the taker's stream wait).
BOOST_AUTO_TEST_CASE(each_session_runs_on_its_own_context) {
  g::placeholder<"x", float, g::dyn> x;
  const auto e = g::exp(x) * 2.0f;
  const std::vector<float> xv{0.5f, -1, 2};
  std::uint64_t in_a = 0, in_b = 0, in_a_elsewhere = 0;
  BOOST_TEST(g::cuda::current_context_id() == 0u);
  auto a = std::make_unique<g::session<g::cuda>>();
  g::session<g::cuda> b;
  a->run_hooked([&](std::size_t, const void*) { in_a = g::cuda::current_context_id(); }, e, x = g::view(xv.data(), {3}));
  b.run_hooked([&](std::size_t, const void*) { in_b = g::cuda::current_context_id(); }, e, x = g::view(xv.data(), {3}));
  std::thread([&] {
    const auto r = a->run_hooked([&](std::size_t, const void*) { in_a_elsewhere = g::cuda::current_context_id(); }, e,
                                 x = g::view(xv.data(), {3}));
    BOOST_TEST(std::abs(r[2] - 2 * std::exp(2.0f)) < 1e-5f);
  }).join();
  BOOST_TEST(in_a != 0u);
  BOOST_TEST(in_b != 0u);
  BOOST_TEST(in_a != in_b);
  BOOST_TEST(in_a_elsewhere == in_a);
  BOOST_TEST(g::cuda::current_context_id() == 0u);  // unbound again after each run
  {
    const auto bound = b.bind();
    BOOST_TEST(g::cuda::current_context_id() == in_b);
    {
      const auto inner = a->bind();  // bindings nest
      BOOST_TEST(g::cuda::current_context_id() == in_a);
    }
    BOOST_TEST(g::cuda::current_context_id() == in_b);
  }
  // a's blocks, freed on a's stream, taken by a new session of the same graph
  const auto before = g::cuda::memory_stats();
  a.reset();
  g::session<g::cuda> c;
  c.run(e, x = g::view(xv.data(), {3}));
  const auto after = g::cuda::memory_stats();
  BOOST_TEST(after.cross_stream_reuses > before.cross_stream_reuses);
  BOOST_TEST(after.device_allocations == before.device_allocations);  // all of them from the cache
}

// Passes whose rows are 16-byte multiples take 16 bytes per thread; other rows of at least
// 128 elements a few elements per thread, strided; shorter ones one element; all give
// cpu_simd's values (the lengths end in a SIMD tail on the CPU side too).
BOOST_AUTO_TEST_CASE(fused_passes_by_lanes_by_rows_and_by_element) {
  g::placeholder<"a", float, g::dyn, g::dyn> a;
  g::placeholder<"b", float, g::dyn> b;
  const auto e = g::sigmoid(a) * b - g::square(a - 0.5f) + g::where(a > b, a, b);
  g::session<g::cpu_simd> cpu;
  g::session<g::cuda> gpu;
  for (const long n : {4L, 6L, 12L, 13L, 127L, 128L, 129L, 131L, 1027L}) {
    const auto av = uniform<float>(static_cast<std::size_t>(5 * n), -2, 2);
    const auto bv = uniform<float>(static_cast<std::size_t>(n), -2, 2);
    const auto fa = a = g::view(av.data(), {5, n});
    const auto fb = b = g::view(bv.data(), {n});
    const auto want = host(cpu.run(e, fa, fb));
    const auto before = g::cuda::fused_stats();
    const auto got = host(gpu.run(e, fa, fb));
    const auto after = g::cuda::fused_stats();
    same_values({want}, {got}, 2e-6);
    const bool lanes = n % 4 == 0;  // rows of [5, n] and of the broadcast b start 16-byte aligned
    const bool rows = !lanes && n >= 128;
    BOOST_TEST(after.by_lanes - before.by_lanes == (lanes ? 1u : 0u), "n = " << n);
    BOOST_TEST(after.by_rows - before.by_rows == (rows ? 1u : 0u), "n = " << n);
    BOOST_TEST(after.by_element - before.by_element == (!lanes && !rows ? 1u : 0u), "n = " << n);
  }
}

BOOST_AUTO_TEST_CASE(a_mixed_precision_session_runs_the_backends_low_precision_gemm) {
  // session<cuda, mixed_bf16>: the matmuls (forward and gradient) through cuda's gemm_low (in
  // the cuda-omp build cpu_simd's: the same bits as session<cpu_simd, mixed_bf16>; on a GPU
  // cuBLAS's bf16 tensor-core path, the same rounded operands summed in another order),
  // everything else through cuda's fp32 kernels; not the bits of an fp32 session.
  g::placeholder<"x", float, g::dyn, 24> x;
  g::variable<"w", float, 24, 7> w;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  const auto loss = g::nn::softmax_cross_entropy_loss(g::matmul(x, w), y);
  const auto xv = uniform<float>(40 * 24, -2, 2), wv = uniform<float>(24 * 7, -1, 1);
  const auto yv = uniform_int(40, 0, 6);
  auto run = [&](auto& s) {
    gradus::assign(s, w, g::view(wv.data(), {24, 7}));
    return all_host(s.run(loss, g::grad(loss, w), x = g::view(xv.data(), {40, 24}), y = g::view(yv.data(), {40})));
  };
  g::session_of<g::cuda, g::mixed_bf16> on_cuda;  // session<cuda, mixed_bf16>, spelled for nvcc
  g::session_of<g::cpu_simd, g::mixed_bf16> on_cpu;
  g::session<g::cpu_simd> full;
  const auto a = run(on_cuda), b = run(on_cpu), c = run(full);
  for (std::size_t i = 0; i < a.size(); ++i) {
#if GRADUS_CUDA_GPU
    same_values({b[i]}, {a[i]}, 1e-4);
#else
    BOOST_TEST(a[i] == b[i], "output " << i << ": cuda's bf16 is cpu_simd's");
#endif
    BOOST_TEST(a[i] != c[i], "output " << i << ": bf16 is not fp32");
  }
  same_values(c, a, 0.05);  // within bf16's few per cent of the fp32 values
}

BOOST_AUTO_TEST_CASE(a_mixed_precision_sessions_convolutions_round_their_operands_on_the_device) {
  // the three convolution passes through cuda's conv2d_low: operands rounded to bf16 in device
  // scratch, then the fp32 pass (in the cuda-omp build the same bits as cpu_simd's rounding path)
  g::placeholder<"x", float, g::dyn, 2, 9, 9> x;
  g::variable<"k", float, 4, 2, 3, 3> k;
  const auto loss = g::sum(g::square(g::conv2d(x, k)));
  const auto xv = uniform<float>(3 * 2 * 9 * 9, -2, 2), kv = uniform<float>(4 * 2 * 3 * 3, -1, 1);
  auto run = [&](auto& s) {
    gradus::assign(s, k, g::view(kv.data(), {4, 2, 3, 3}));
    return all_host(s.run(loss, g::grad(loss, k), g::grad(loss, x), x = g::view(xv.data(), {3, 2, 9, 9})));
  };
  g::session_of<g::cuda, g::mixed_bf16> on_cuda;
  g::session_of<g::cpu_simd, g::mixed_bf16> on_cpu;
  g::session<g::cpu_simd> full;
  const auto a = run(on_cuda), b = run(on_cpu), c = run(full);
  same_values(b, a, 1e-5);  // the same rounded operands (the loss's sum may add in another order)
  for (std::size_t i = 0; i < a.size(); ++i) {
    // bf16's bound: 2^-7 of the sum of |products| (up to ~18 x 2 x 1 per output here), so
    // scaled by the output's largest value rather than each element's
    double largest = 0, worst = 0;
    std::size_t differ = 0;
    for (std::size_t k = 0; k < c[i].size(); ++k) {
      largest = std::max(largest, std::abs(c[i][k]));
      worst = std::max(worst, std::abs(a[i][k] - c[i][k]));
      differ += a[i][k] != c[i][k];
    }
    BOOST_TEST(differ > 0u, "output " << i << ": bf16 convolutions gave fp32's values");
    BOOST_TEST(worst <= 0.02 * (largest + 1), "output " << i << ": " << worst << " from fp32 (largest " << largest << ")");
  }
}

#if !GRADUS_CUDA_GPU
// The build keeps host and device memory apart as a GPU does, so that code handing a host
// pointer to a kernel or a device copy fails here, by name, instead of on a GPU. (Not in
// the GPU build of this file: there the hardware is the check.)
BOOST_AUTO_TEST_CASE(host_pointers_where_device_memory_belongs_are_refused) {
  std::vector<float> h(8, 1.0f), h2(8);
  check_throws<g::error>([&] { g::cuda::copy_to_host(h2.data(), h.data(), 32); },
                         "copy_to_host: the source (32 bytes) is not device memory");
  auto* d = static_cast<float*>(g::cuda::allocate(32));
  check_throws<g::error>([&] { g::cuda::copy_to_device(d, d, 32); }, "copy_to_device: the source (32 bytes) is device memory");
  check_throws<g::error>([&] { g::cuda::copy_to_device(d + 4, h.data(), 1024); },
                         "copy_to_device: the destination (1024 bytes) is not device memory");  // past the block
  g::cuda::copy_to_device(d, h.data(), 32);
  check_throws<g::error>([&] { g::cuda::for_each(8, [](float& a, const float& b) { a += b; }, d, h.data()); },
                         "for_each: an array (32 bytes) is not device memory");
  g::cuda::copy_to_host(h2.data(), d, 32);
  BOOST_TEST(h2 == h);
  g::cuda::deallocate(d);
  check_throws<g::error>([&] { g::cuda::copy_to_host(h2.data(), d, 32); },
                         "copy_to_host: the source (32 bytes) is not device memory");  // freed
}
#endif

#if GRADUS_CUDA_GPU  // the GPU build of this file (GRADUS_CUDA_DEVICE_SUITE): skipped without a device
#include "../support/device_main.hpp"
#endif
