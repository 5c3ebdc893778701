// "Buffers are planned on the first run; later runs allocate nothing": every global
// operator new / delete (plain, array, nothrow, aligned) is replaced by a counting one,
// and runs after the first of an expression mixing a fused elementwise chain, a matmul,
// reductions and a softmax must not allocate. The first run must allocate, which proves
// the counter sees the backend's buffers. oneDNN (float convolutions, where gradus is built
// with it) allocates inside each of its execute calls: the last test counts those, which
// must be the same every step.
#define BOOST_TEST_MODULE exec_alloc
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace {

std::atomic<long> allocations{0};

// Out of line: g++ would otherwise inline malloc/free into the callers of new/delete and
// report a free of memory from operator new (-Wmismatched-new-delete).
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }

[[gnu::noinline]] void* counted(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
[[gnu::noinline]] void* counted_aligned(std::size_t n, std::align_val_t al) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto a = static_cast<std::size_t>(al);
  const std::size_t rounded = (n + a - 1) / a * a;  // aligned_alloc wants a multiple
  return std::aligned_alloc(a, rounded ? rounded : a);
}

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = counted(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = counted(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted(n); }
void* operator new(std::size_t n, std::align_val_t al) {
  if (void* p = counted_aligned(n, al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t al) {
  if (void* p = counted_aligned(n, al)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted_aligned(n, al);
}
void* operator new[](std::size_t n, std::align_val_t al, const std::nothrow_t&) noexcept {
  return counted_aligned(n, al);
}
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { release(p); }

namespace g = gradus;

namespace {

template <class T, std::size_t R>
xt::xtensor<T, R> filled(const std::array<std::size_t, R>& shape, double scale) {
  xt::xtensor<T, R> t(shape);
  std::size_t i = 0;
  for (auto& v : t) v = static_cast<T>(scale * std::sin(0.37 * static_cast<double>(++i)));
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_counter_counts) {
  // Direct calls: a new-expression whose memory does not escape may be elided (clang).
  const long before = allocations.load();
  void* p = ::operator new(16);
  void* q = ::operator new[](40);
  void* r = ::operator new(64, std::align_val_t{64});
  const long after = allocations.load();
  ::operator delete(p);
  ::operator delete[](q);
  ::operator delete(r, std::align_val_t{64});
  BOOST_TEST(after - before == 3);
}

BOOST_AUTO_TEST_CASE(runs_after_the_first_allocate_nothing) {
  g::placeholder<"x", float, g::dyn, 64> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::variable<"w", float, 64, 32> w;
  g::variable<"b", float, 32> b;
  g::session<g::cpu_simd> s;
  g::assign(s, w, filled<float, 2>({64, 32}, 0.1));
  g::assign(s, b, filled<float, 1>({32}, 0.1));

  // fused chain (bias add, relu, scaling) around a matmul; reductions; a softmax and a loss
  const auto h = g::relu(g::matmul(x, w) + b) * 0.5f - g::sigmoid(g::mean<1, true>(x));
  const auto probs = g::softmax(h);
  const auto loss = g::mean(g::softmax_cross_entropy(h, y));
  const auto stats = g::sum<0>(g::square(h)) + g::max<0>(h);

  const auto xv = filled<float, 2>({100, 64}, 1.0);  // 6400 elements, 3200 per matmul output
  xt::xtensor<std::int32_t, 1> yv(std::array<std::size_t, 1>{100});
  for (std::size_t i = 0; i < 100; ++i) yv(i) = static_cast<std::int32_t>(i % 32);
  const auto big = filled<float, 2>({2048, 64}, 1.0);  // threaded passes (> 2^15 elements)
  xt::xtensor<std::int32_t, 1> ybig(std::array<std::size_t, 1>{2048});
  for (std::size_t i = 0; i < 2048; ++i) ybig(i) = static_cast<std::int32_t>((i * 7) % 32);

  const long a0 = allocations.load();
  auto first = s.run(probs, loss, stats, x = xv, y = yv);
  const long a1 = allocations.load();
  BOOST_TEST(a1 - a0 > 0, "the first run plans and allocates buffers");
  const float loss_first = std::get<1>(first)[0];

  long later = 0;
  float loss_later = 0;
  for (int i = 0; i < 5; ++i) {
    const long c0 = allocations.load();
    auto again = s.run(probs, loss, stats, x = xv, y = yv);
    later += allocations.load() - c0;
    loss_later = std::get<1>(again)[0];
  }
  BOOST_TEST(later == 0, later << " allocations in 5 runs after the first");
  BOOST_TEST(loss_later == loss_first);  // and the same answer each time

  // A larger batch grows the buffers once (threaded paths on the first big run too);
  // then big and small batches alike allocate nothing.
  s.run(probs, loss, stats, x = big, y = ybig);
  long mixed = 0;
  for (int i = 0; i < 3; ++i) {
    const long c0 = allocations.load();
    s.run(probs, loss, stats, x = big, y = ybig);
    s.run(probs, loss, stats, x = xv, y = yv);
    mixed += allocations.load() - c0;
  }
  BOOST_TEST(mixed == 0, mixed << " allocations in 6 runs of known sizes");
}

BOOST_AUTO_TEST_CASE(a_single_output_run_allocates_nothing_after_the_first) {
  // The simplest case: one fused pass over one feed with a long placeholder name.
  g::placeholder<"a_rather_long_placeholder_name", double, g::dyn> x;
  g::session<g::cpu_simd> s;
  const auto xv = filled<double, 1>({1000}, 1.0);
  s.run(g::exp(x) + 1.0, x = xv);
  const long c0 = allocations.load();
  for (int i = 0; i < 3; ++i) s.run(g::exp(x) + 1.0, x = xv);
  const long n = allocations.load() - c0;
  BOOST_TEST(n == 0, n << " allocations in 3 runs after the first");
}

BOOST_AUTO_TEST_CASE(a_training_step_allocates_nothing_after_the_first) {
  // Forward, backward, global-norm clipping and the Adam update of a 2-layer MLP, at a
  // threaded size (784x128 weights, batch 64), and an SGD-momentum step whose gradient is
  // another trained variable (the aliasing copy's scratch buffer is kept too).
  g::placeholder<"x", float, g::dyn, 784> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::variable<"w1", float, 784, 128> w1;
  g::variable<"b1", float, 128> b1;
  g::variable<"w2", float, 128, 10> w2;
  g::variable<"b2", float, 10> b2;
  g::session<g::cpu_simd> s;
  g::initialize(s, w1, g::init::he_normal{}, 1);
  g::initialize(s, b1, g::init::zeros{}, 1);
  g::initialize(s, w2, g::init::glorot_uniform{}, 1);
  g::initialize(s, b2, g::init::zeros{}, 1);
  const auto logits = g::matmul(g::relu(g::matmul(x, w1) + b1), w2) + b2;
  const auto loss = g::mean(g::softmax_cross_entropy(logits, y));
  auto step = g::minimize(s, loss, g::adam{.lr = 1e-3, .clip_global_norm = 1}, w1, b1, w2, b2);

  const auto xv = filled<float, 2>({64, 784}, 1.0);
  xt::xtensor<std::int32_t, 1> yv(std::array<std::size_t, 1>{64});
  for (std::size_t i = 0; i < 64; ++i) yv(i) = static_cast<std::int32_t>(i % 10);

  const long a0 = allocations.load();
  const float l0 = step.run(x = xv, y = yv);
  BOOST_TEST(allocations.load() - a0 > 0, "the first step plans and allocates");
  long later = 0;
  float l = l0;
  for (int i = 0; i < 5; ++i) {
    const long c0 = allocations.load();
    l = step.run(x = xv, y = yv);
    later += allocations.load() - c0;
  }
  BOOST_TEST(later == 0, later << " allocations in 5 training steps after the first");
  BOOST_TEST(l < l0);  // and it trains
  BOOST_TEST(s.global_step() == 6);

  g::variable<"a", double, 5000> a;
  g::variable<"c", double, 5000> c;
  g::initialize(s, a, g::init::normal{}, 2);
  g::initialize(s, c, g::init::normal{}, 3);
  auto aliased = g::minimize(s, g::sum(a * c), g::sgd{.lr = 0.01, .momentum = 0.9}, a, c);
  aliased.run();
  const long c0 = allocations.load();
  for (int i = 0; i < 3; ++i) aliased.run();
  const long n = allocations.load() - c0;
  BOOST_TEST(n == 0, n << " allocations in 3 aliased steps after the first");
}

// A convolutional training step (LeNet's two convolutions, pooling, a dense layer, SGD with
// momentum) in double, where the convolutions run im2col + GEMM with the columns in
// cpu_simd's per-thread scratch: nothing after the first step. In float, through oneDNN
// where gradus was built with it, each of a step's five convolution calls (conv1's data
// gradient is not needed) costs the small allocations inside oneDNN's execute (its
// argument lists and execution context: 166 a step on 2 threads), counted here so that a
// change is seen.
template <class T>
std::vector<long> conv_step_allocations(int steps) {
  g::placeholder<"x", T, g::dyn, 1, 28, 28> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::conv2d<"c1", 1, 6, 5, 1, 0, T> c1;
  g::nn::conv2d<"c2", 6, 16, 5, 1, 0, T> c2;
  g::nn::dense<"d", 16 * 4 * 4, 10, T> d;
  const auto h = g::max_pool2d<2>(g::relu(c2(g::max_pool2d<2>(g::relu(c1(x))))));
  const auto loss = g::nn::softmax_cross_entropy_loss(d(g::flatten(h)), y);
  g::session<g::cpu_simd> s;
  c1.initialize(s, 3);
  c2.initialize(s, 3);
  d.initialize(s, 3);
  auto step = g::minimize(s, loss, g::sgd{.lr = 0.01, .momentum = 0.9});
  const auto xv = filled<T, 4>({64, 1, 28, 28}, 1.0);
  xt::xtensor<std::int32_t, 1> yv(std::array<std::size_t, 1>{64});
  for (std::size_t i = 0; i < 64; ++i) yv(i) = static_cast<std::int32_t>(i % 10);
  const long a0 = allocations.load();
  const T l0 = step.run(x = xv, y = yv);
  BOOST_TEST(allocations.load() - a0 > 0, "the first step plans and allocates");
  std::vector<long> later;
  later.reserve(static_cast<std::size_t>(steps));
  T l = l0;
  for (int i = 0; i < steps; ++i) {
    const long c0 = allocations.load();
    l = step.run(x = xv, y = yv);
    later.push_back(allocations.load() - c0);
  }
  BOOST_TEST(l < l0);  // and it trains
  return later;
}

BOOST_AUTO_TEST_CASE(a_conv_training_step_allocates_nothing_after_the_first) {
  for (long n : conv_step_allocations<double>(4)) BOOST_TEST(n == 0, n << " allocations in a double conv step");
  const auto f = conv_step_allocations<float>(6);
  for (long n : f) {
    BOOST_TEST_MESSAGE("float conv step: " << n << " allocations" << (g::cpu_dnnl::enabled() ? " (oneDNN)" : ""));
    // without oneDNN none; with it, oneDNN's own in each execute (five calls a step, each
    // one conv and up to three reorders per slice), the same each step: nothing accumulates
    if (!g::cpu_dnnl::enabled()) BOOST_TEST(n == 0);
    else BOOST_TEST((n == f.front() && n <= 40 * 5 * g::cpu_simd::threads()), n << " allocations in a float conv step");
  }
}
