// Pipelines (parallel/pipeline/): the schedules, the stage cut found in the loss's type, and
// pipelined training on ranks that are threads (parallel/thread_world.hpp) against the
// unsplit model trained in one session — 2 and 3 stages, GPipe and 1F1B, M = 1, 2, 4, 7 (a
// batch of 10 not divisible by 4 or 7), with and without re-materialisation, and 2 stages x
// 2 replicas — plus the bytes across each cut, the activations held, the errors of
// mismatched ranks, checkpoints per stage (committed together, and killed at every point of a
// save) and device placements in one process.
// (About 960 lines: one translation unit for every pipeline test, because each unit that
// instantiates the pipeline for the shared test model costs ~95 s of g++ in CI; a second
// one would add that again to both compiler stages.)
#define BOOST_TEST_MODULE parallel_pipeline
#include <boost/test/unit_test.hpp>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/parallel/pipeline/partition.hpp>
#include <gradus/parallel/pipeline/in_process.hpp>
#include <gradus/parallel/pipeline/pipeline.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <chrono>
#include <cmath>
#include <numeric>
#include <cstdint>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <sstream>
#include <vector>

#include "../support/rank_harness.hpp"
#include <gradus/parallel/thread_world.hpp>

namespace g = gradus;
namespace gp = gradus::parallel;

BOOST_AUTO_TEST_CASE(schedules_order_and_memory) {
  using gp::pipeline_op;
  const auto gpipe = gp::schedule_for(gp::schedule_kind::gpipe, 1, 3, 3);
  const std::vector<pipeline_op> want_g{{true, 0}, {true, 1}, {true, 2}, {false, 0}, {false, 1}, {false, 2}};
  BOOST_TEST((gpipe == want_g));
  // 1F1B, stage 0 of 3, 5 micro-batches: 2 warm-up forwards, then F/B pairs, then 2 backwards
  const auto f0 = gp::schedule_for(gp::schedule_kind::one_f_one_b, 0, 3, 5);
  const std::vector<pipeline_op> want_0{{true, 0},  {true, 1},  {true, 2},  {false, 0}, {true, 3},
                                        {false, 1}, {true, 4},  {false, 2}, {false, 3}, {false, 4}};
  BOOST_TEST((f0 == want_0));
  // the last stage alternates from the start
  const auto f2 = gp::schedule_for(gp::schedule_kind::one_f_one_b, 2, 3, 3);
  const std::vector<pipeline_op> want_2{{true, 0}, {false, 0}, {true, 1}, {false, 1}, {true, 2}, {false, 2}};
  BOOST_TEST((f2 == want_2));
  for (int s = 0; s < 4; ++s) {
    BOOST_TEST(gp::max_in_flight(gp::schedule_for(gp::schedule_kind::one_f_one_b, s, 4, 16)) == 4 - s);
    BOOST_TEST(gp::max_in_flight(gp::schedule_for(gp::schedule_kind::gpipe, s, 4, 16)) == 16);
  }
  BOOST_TEST(gp::ideal_bubble(2, 8) == 1.0 / 9.0);
  const std::vector<long> sizes{3, 3, 2, 2};
  BOOST_TEST(gp::micro_batch_sizes(10, 4) == sizes);
  BOOST_CHECK_EXCEPTION(gp::micro_batch_sizes(3, 4), g::error, [](const g::error& e) {
    return std::string(e.what()).find("a batch of 3 rows cannot be split into 4 micro-batches") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(gp::parse_schedule("zigzag"), g::error, [](const g::error& e) {
    return std::string(e.what()).find("unknown schedule 'zigzag'") != std::string::npos;
  });
}

// The model of these tests: 6 -> 16 -> 12 -> 4 tanh MLP, softmax cross-entropy.
struct model {
  g::placeholder<"x", float, g::dyn, 6> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"p1", 6, 16> l1;
  g::nn::dense<"p2", 16, 12> l2;
  g::nn::dense<"p3", 12, 4> l3;
  g::variable<"t", float, 16> t;  // read by both stages of loss2_tied: tied weights
  auto loss2() const {  // 2 stages: l1 | l2, l3
    const auto h = g::on<g::stage<0>>(g::tanh(l1(x)));
    return g::on<g::stage<1>>(g::nn::softmax_cross_entropy_loss(l3(g::tanh(l2(h))), y));
  }
  auto loss3() const {  // 3 stages: l1 | l2 | l3 (the loss above stage 1's output inherits stage... 2 by its own placement)
    const auto h1 = g::on<g::stage<0>>(g::tanh(l1(x)));
    const auto h2 = g::on<g::stage<1>>(g::tanh(l2(h1)));
    return g::on<g::stage<2>>(g::nn::softmax_cross_entropy_loss(l3(h2), y));
  }
  auto loss2_tied() const {  // t added to layer 1's pre-activation (stage 0) and to layer 2's input (stage 1)
    const auto h = g::on<g::stage<0>>(g::tanh(l1(x) + t));
    return g::on<g::stage<1>>(g::nn::softmax_cross_entropy_loss(l3(g::tanh(l2(h + t))), y));
  }
  void init(g::session<g::cpu_simd>& s) const {
    l1.initialize(s, 7);
    l2.initialize(s, 7);
    l3.initialize(s, 7);
    std::vector<float> t0(16);
    for (std::size_t i = 0; i < t0.size(); ++i) t0[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
    g::assign(s, t, g::view(t0.data(), {16}));
  }
};

struct batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};
static std::vector<batch> make_batches(int steps, long rows, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0, 1);
  std::vector<batch> r(static_cast<std::size_t>(steps));
  for (auto& b : r) {
    for (long i = 0; i < rows * 6; ++i) b.x.push_back(n(rng));
    for (long i = 0; i < rows; ++i) b.y.push_back(static_cast<std::int32_t>(rng() % 4));
  }
  return r;
}

template <class V>
static std::vector<float> values(g::session<g::cpu_simd>& s, const V& v) {
  const auto t = g::value(s, v);
  return {t.data(), t.data() + t.size()};
}

// The unsplit model's weights and losses after training on the batches.
struct trained {
  std::vector<std::vector<float>> w;  // p1/w, p1/b, p2/w, p2/b, p3/w, p3/b
  std::vector<double> losses;
};
template <class Loss, class Opt>
static trained reference(const model& m, const Loss& loss, const Opt& opt, const std::vector<batch>& data, long rows) {
  g::session<g::cpu_simd> s;
  m.init(s);
  auto step = g::minimize(s, loss, opt);
  trained t;
  for (std::size_t i = 0; i < data.size(); ++i)
    t.losses.push_back(step.run(m.x = g::view(data[i].x.data(), {rows, 6}), m.y = g::view(data[i].y.data(), {rows})));
  t.w = {values(s, m.l1.w), values(s, m.l1.b), values(s, m.l2.w), values(s, m.l2.b), values(s, m.l3.w), values(s, m.l3.b)};
  return t;
}

static double max_rel(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    e = std::max(e, std::abs(static_cast<double>(a[i]) - b[i]) / (1e-3 + std::abs(static_cast<double>(b[i]))));
  return e;
}

// Trains `loss` as an S-stage pipeline on threads; each stage's weights checked against ref.
template <int S, class Loss, class Opt>
static std::vector<gp::pipeline_stats> pipelined(const model& m, const Loss& loss, const Opt& opt, const std::vector<batch>& data,
                                                 long rows, gp::pipeline_options o, const trained& ref, double tol,
                                                 int replicas = 1) {
  auto comms = gp::thread_world::world(S * replicas);
  std::vector<gp::pipeline_stats> stats(static_cast<std::size_t>(S * replicas));
  std::vector<std::vector<std::vector<float>>> weights(static_cast<std::size_t>(S * replicas));
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(S * replicas));
  const auto res = gradus_test::on_threads(S * replicas, [&](int r) {
    g::session<g::cpu_simd> s;
    m.init(s);
    auto step = gp::pipeline<S>(comms[static_cast<std::size_t>(r)], o, s, loss, opt);
    const int replica = r / S;
    const long shard = rows / replicas;
    for (const auto& b : data)
      losses[static_cast<std::size_t>(r)].push_back(step.run(m.x = g::view(b.x.data() + replica * shard * 6, {shard, 6}),
                                                             m.y = g::view(b.y.data() + replica * shard, {shard})));
    stats[static_cast<std::size_t>(r)] = step.stats();
    step.gather_variables();  // rank 0 then holds every stage's weights
    weights[static_cast<std::size_t>(r)] = {values(s, m.l1.w), values(s, m.l1.b), values(s, m.l2.w),
                                            values(s, m.l2.b), values(s, m.l3.w), values(s, m.l3.b)};
  });
  for (int r = 0; r < S * replicas; ++r) BOOST_TEST_REQUIRE(!res[static_cast<std::size_t>(r)].error, "rank " << r << ": " << res[static_cast<std::size_t>(r)].error.value_or(""));
  // stage k trains its own layers (the others stay as initialised in its session); rank 0
  // gathered every stage's
  const std::vector<std::vector<int>> layers = S == 2 ? std::vector<std::vector<int>>{{0}, {1, 2}}
                                                      : std::vector<std::vector<int>>{{0}, {1}, {2}};
  for (int r = 0; r < S * replicas; ++r) {
    const auto& w = weights[static_cast<std::size_t>(r)];
    for (int L : r == 0 ? std::vector<int>{0, 1, 2} : layers[static_cast<std::size_t>(r % S)])
      for (int part : {0, 1}) {
        const auto i = static_cast<std::size_t>(2 * L + part);
        BOOST_TEST(max_rel(w[i], ref.w[i]) <= tol, "rank " << r << " layer " << L << (part ? " bias" : " weights"));
        if (tol == 0) BOOST_TEST(w[i] == ref.w[i], "rank " << r << " layer " << L << " bit-identical");
      }
    if (replicas == 1)
      for (std::size_t i = 0; i < data.size(); ++i)
        BOOST_TEST(std::abs(losses[static_cast<std::size_t>(r)][i] - ref.losses[i]) <= 1e-5 * (1 + std::abs(ref.losses[i])));
  }
  return stats;
}

BOOST_AUTO_TEST_CASE(stage_cut_in_the_type) {
  model m;
  using L2 = decltype(m.loss2());
  using L3 = decltype(m.loss3());
  static_assert(g::stage_of_v<L2> == 1 && g::stage_of_v<L3> == 2);
  static_assert(std::is_same_v<gp::stage_variables_t<0, 2, L2>, std::tuple<decltype(m.l1.w), decltype(m.l1.b)>>);
  static_assert(std::tuple_size_v<gp::stage_variables_t<1, 2, L2>> == 4);
  static_assert(std::tuple_size_v<gp::stage_variables_t<1, 3, L3>> == 2);
  // a dense weight's gradient (X^T G over the rows) is deferred to one GEMM a step; a bias's is not
  using G0 = gp::stage_graph<g::cpu_simd, 0, 2, L2>;
  using G1 = gp::stage_graph<g::cpu_simd, 1, 2, L2>;
  static_assert(G0::deferred[0] && !G0::deferred[1] && G1::deferred[0] && !G1::deferred[1] && G1::deferred[2]);
  static_assert(G0::rows_output[0] == 3 && G1::rows_output[0] == 6 && G1::rows_output[2] == 7);
  // a placed graph run whole equals the unplaced one, bit for bit (the placement is an identity)
  const auto data = make_batches(1, 5, 3);
  g::session<g::cpu_simd> s;
  m.init(s);
  const auto unplaced = g::nn::softmax_cross_entropy_loss(m.l3(g::tanh(m.l2(g::tanh(m.l1(m.x))))), m.y);
  const auto fx = m.x = g::view(data[0].x.data(), {5, 6});
  const auto fy = m.y = g::view(data[0].y.data(), {5});
  const float a = s.run(unplaced, fx, fy)[0], b = s.run(m.loss3(), fx, fy)[0];
  BOOST_TEST(a == b);
}

BOOST_AUTO_TEST_CASE(two_stages_equal_the_unsplit_model) {
  model m;
  const auto data = make_batches(3, 10, 11);
  const g::sgd opt{.lr = 0.1, .momentum = 0.9};
  const trained ref = reference(m, m.loss2(), opt, data, 10);
  // M = 1: the same operations in the same order: bit-identical
  pipelined<2>(m, m.loss2(), opt, data, 10, {.micro_batches = 1}, ref, 0);
  for (int M : {2, 4, 7})
    for (auto sched : {gp::schedule_kind::gpipe, gp::schedule_kind::one_f_one_b}) {
      BOOST_TEST_CONTEXT("M = " << M << ", " << gp::schedule_name(sched)) {
        const auto st = pipelined<2>(m, m.loss2(), opt, data, 10, {.micro_batches = M, .schedule = sched}, ref, 2e-5);
        // the bytes across the cut: the [10, 16] activations forward, their gradient back
        BOOST_TEST(st[0].bytes_sent == 10u * 16 * 4);
        BOOST_TEST(st[0].bytes_received == 10u * 16 * 4);
        BOOST_TEST(st[1].bytes_sent == 10u * 16 * 4);
      }
    }
  for (auto sched : {gp::schedule_kind::gpipe, gp::schedule_kind::one_f_one_b})
    BOOST_TEST_CONTEXT(gp::schedule_name(sched) << " with re-materialisation") {
      pipelined<2>(m, m.loss2(), opt, data, 10, {.micro_batches = 4, .schedule = sched, .rematerialize = true}, ref, 2e-5);
    }
}

BOOST_AUTO_TEST_CASE(three_stages_with_adam) {
  model m;
  const auto data = make_batches(3, 10, 5);
  const g::adam opt{.lr = 0.01};
  const trained ref = reference(m, m.loss3(), opt, data, 10);
  pipelined<3>(m, m.loss3(), opt, data, 10, {.micro_batches = 1}, ref, 0);
  for (int M : {2, 7})
    for (auto sched : {gp::schedule_kind::gpipe, gp::schedule_kind::one_f_one_b})
      BOOST_TEST_CONTEXT("M = " << M << ", " << gp::schedule_name(sched)) {
        pipelined<3>(m, m.loss3(), opt, data, 10, {.micro_batches = M, .schedule = sched}, ref, 1e-4);
      }
}

// clip_global_norm: the norm spans every stage's gradients, so each stage scales by the same
// factor as the unsplit step (a stage clipping by its own norm would not match).
BOOST_AUTO_TEST_CASE(gradient_clipping_spans_the_stages) {
  model m;
  const auto data = make_batches(3, 10, 9);
  const g::sgd clipped{.lr = 0.1, .momentum = 0.9, .clip_global_norm = 0.05};
  const trained ref = reference(m, m.loss3(), clipped, data, 10);
  const trained unclipped = reference(m, m.loss3(), g::sgd{.lr = 0.1, .momentum = 0.9}, data, 10);
  BOOST_TEST(max_rel(ref.w[0], unclipped.w[0]) > 1e-2);  // the clip is active
  for (int M : {1, 4})
    BOOST_TEST_CONTEXT("M = " << M) {
      const auto st = pipelined<3>(m, m.loss3(), clipped, data, 10, {.micro_batches = M, .schedule = gp::schedule_kind::one_f_one_b},
                                   ref, 1e-4);
      for (const auto& s : st) {
        BOOST_TEST(s.gradient_norm > 0.05);
        BOOST_TEST(s.gradient_norm == st[0].gradient_norm);  // every stage the same norm, bit for bit
      }
    }
}

// Tied weights: t is read by both stages; each computes its part of t's gradient, the two
// sum them (in stage order), and both copies of t take the same update: the pipelined run
// equals the unsplit one, and the stages' copies of t stay bit-identical.
BOOST_AUTO_TEST_CASE(tied_weights_sum_their_stages_gradients) {
  model m;
  using L = decltype(m.loss2_tied());
  using G0 = gp::stage_graph<g::cpu_simd, 0, 2, L>;
  using G1 = gp::stage_graph<g::cpu_simd, 1, 2, L>;
  static_assert(G0::variable_count == 3 && G1::variable_count == 5);  // t in both
  // t read by stages 0 and 1 (mask 3); every other variable by its own stage alone
  constexpr auto count = [](const auto& a, std::uint32_t v) { return std::count(a.begin(), a.end(), v); };
  static_assert(count(G0::sharers, 3u) == 1 && count(G0::sharers, 1u) == 2);
  static_assert(count(G1::sharers, 3u) == 1 && count(G1::sharers, 2u) == 4);
  const auto data = make_batches(3, 10, 13);
  const g::sgd opt{.lr = 0.1, .momentum = 0.9, .clip_global_norm = 0.5};
  const trained ref = reference(m, m.loss2_tied(), opt, data, 10);
  g::session<g::cpu_simd> rs;  // the unsplit run's t
  m.init(rs);
  auto rstep = g::minimize(rs, m.loss2_tied(), opt);
  for (const auto& b : data) rstep.run(m.x = g::view(b.x.data(), {10, 6}), m.y = g::view(b.y.data(), {10}));
  const auto t_ref = values(rs, m.t);
  for (int M : {1, 4}) {
    BOOST_TEST_CONTEXT("M = " << M) {
      auto comms = gp::thread_world::world(2);
      std::vector<std::vector<float>> t(2);
      const auto res = gradus_test::on_threads(2, [&](int r) {
        g::session<g::cpu_simd> s;
        m.init(s);
        auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = M}, s, m.loss2_tied(), opt);
        for (const auto& b : data) step.run(m.x = g::view(b.x.data(), {10, 6}), m.y = g::view(b.y.data(), {10}));
        t[static_cast<std::size_t>(r)] = values(s, m.t);
      });
      for (int r = 0; r < 2; ++r) BOOST_TEST(!res[static_cast<std::size_t>(r)].error, "rank " << r << ": " << res[static_cast<std::size_t>(r)].error.value_or(""));
      BOOST_TEST_REQUIRE(!res[0].error);
      BOOST_TEST_REQUIRE(!res[1].error);
      BOOST_TEST(t[0] == t[1]);  // both stages' copies, bit for bit
      BOOST_TEST(max_rel(t[0], t_ref) <= 1e-4);
      BOOST_TEST(max_rel(t_ref, std::vector<float>(16, 0.f)) > 0);  // (t trained at all)
    }
  }
  // and the layers and losses, as every other equivalence test
  pipelined<2>(m, m.loss2_tied(), opt, data, 10, {.micro_batches = 4, .schedule = gp::schedule_kind::one_f_one_b}, ref, 1e-4);
}

// The placement log (TensorFlow's log_device_placement): each node of a stage's graph with the
// stage and rank it ran on, after the first step; the bytes sent across each cut, every step.
BOOST_AUTO_TEST_CASE(placement_log_names_nodes_ranks_and_bytes) {
  model m;
  const auto data = make_batches(2, 10, 21);
  auto comms = gp::thread_world::world(2);
  std::ostringstream logs[2];
  const auto res = gradus_test::on_threads(2, [&](int r) {
    g::session<g::cpu_simd> s;
    m.init(s);
    auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = 2, .placement_log = &logs[r]}, s, m.loss2(),
                                g::sgd{.lr = 0.1});
    for (const auto& b : data) step.run(m.x = g::view(b.x.data(), {10, 6}), m.y = g::view(b.y.data(), {10}));
  });
  for (const auto& e : res) BOOST_TEST_REQUIRE(!e.error, e.error.value_or(""));
  const std::string a = logs[0].str(), b = logs[1].str();
  BOOST_TEST_MESSAGE(a << b);
  // stage 0: its matmul forward ([5, 16] per micro-batch of 5 rows) and backward, on rank 0
  BOOST_TEST(a.find("gradus placement: 'matmul' (5, 16) (forward): stage 0 of 2 (rank 0, cpu_simd)") != std::string::npos);
  BOOST_TEST(a.find("(backward): stage 0 of 2 (rank 0, cpu_simd)") != std::string::npos);
  BOOST_TEST(a.find("gradus placement: the gradient of 'p1/w' (6, 16) (deferred: one GEMM over the batch's rows): stage 0 of 2 (rank 0, cpu_simd)") !=
             std::string::npos);
  BOOST_TEST(a.find("stage 1 of 2") == std::string::npos);
  BOOST_TEST(b.find("(forward): stage 1 of 2 (rank 1, cpu_simd)") != std::string::npos);
  // every step, the bytes across the cut: [10, 16] floats each way
  for (int k : {0, 1}) {
    BOOST_TEST(a.find("gradus placement: step " + std::to_string(k) +
                      ", stage 0 of 2 (rank 0, cpu_simd): sent 640 bytes of activations to rank 1 (stage 1)\n") != std::string::npos);
    BOOST_TEST(b.find("gradus placement: step " + std::to_string(k) +
                      ", stage 1 of 2 (rank 1, cpu_simd): sent 640 bytes of gradients to rank 0 (stage 0)\n") != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(one_f_one_b_holds_fewer_activations) {
  model m;
  const auto data = make_batches(1, 64, 2);
  const g::sgd opt{.lr = 0.1};
  const trained ref = reference(m, m.loss2(), opt, data, 64);
  const auto gpipe = pipelined<2>(m, m.loss2(), opt, data, 64, {.micro_batches = 8, .schedule = gp::schedule_kind::gpipe}, ref, 2e-5);
  const auto f1b = pipelined<2>(m, m.loss2(), opt, data, 64, {.micro_batches = 8}, ref, 2e-5);  // the default schedule
  const auto remat = pipelined<2>(m, m.loss2(), opt, data, 64, {.micro_batches = 8, .schedule = gp::schedule_kind::gpipe, .rematerialize = true},
                                  ref, 2e-5);
  const auto f1b_remat = pipelined<2>(m, m.loss2(), opt, data, 64, {.micro_batches = 8, .rematerialize = true}, ref, 2e-5);
  // stage 0: GPipe keeps 8 micro-batches' graphs, 1F1B 2, re-materialisation 1; stage 1 also
  // keeps each micro-batch's input until its backward (8 under GPipe, 1 under 1F1B)
  BOOST_TEST(f1b[0].peak_activation_bytes * 3 < gpipe[0].peak_activation_bytes);
  BOOST_TEST(remat[0].peak_activation_bytes * 4 < gpipe[0].peak_activation_bytes);
  BOOST_TEST(f1b_remat[0].peak_activation_bytes < f1b[0].peak_activation_bytes);
  BOOST_TEST(f1b_remat[1].peak_activation_bytes < remat[1].peak_activation_bytes);  // stage 1's inputs: 1 against 8
  for (const auto& s : gpipe) {
    BOOST_TEST(s.step_seconds > 0);
    BOOST_TEST(s.compute_seconds <= s.step_seconds);
  }
}

BOOST_AUTO_TEST_CASE(two_stages_times_two_replicas) {
  model m;
  const auto data = make_batches(3, 12, 9);
  const g::sgd opt{.lr = 0.1, .momentum = 0.9};
  // the replicas each take half of the batch: their average gradient is the whole batch's
  const trained ref = reference(m, m.loss2(), opt, data, 12);
  for (auto sched : {gp::schedule_kind::gpipe, gp::schedule_kind::one_f_one_b})
    pipelined<2>(m, m.loss2(), opt, data, 12, {.micro_batches = 3, .schedule = sched}, ref, 2e-5, 2);
}

BOOST_AUTO_TEST_CASE(mismatched_ranks_are_refused) {
  model m;
  const g::sgd opt{.lr = 0.1};
  {  // different micro-batch counts: refused at construction, naming both values and the peer
    auto comms = gp::thread_world::world(2, std::chrono::seconds(5));
    const auto res = gradus_test::on_threads(2, [&](int r) {
      g::session<g::cpu_simd> s;
      m.init(s);
      auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = r == 0 ? 4 : 2}, s, m.loss2(), opt);
    });
    BOOST_TEST(res[1].error.value_or("").find("pipeline stage 1 (rank 1): rank 0 runs the pipeline with micro-batches 4, this rank with 2") !=
               std::string::npos, res[1].error.value_or(""));
  }
  {  // another learning rate, or another batch size the program declares: the first run
     // refuses on every rank, naming the field and both values (the run fingerprint)
    const auto data = make_batches(1, 4, 1);
    for (const bool other_lr : {true, false}) {
      auto comms = gp::thread_world::world(2, std::chrono::seconds(5));
      std::array<std::string, 2> first_field;  // (Boost.Test's checks stay on this thread)
      const auto res = gradus_test::on_threads(2, [&](int r) {
        g::session<g::cpu_simd> s;
        m.init(s);
        auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = 2}, s, m.loss2(),
                                    g::sgd{.lr = other_lr && r == 1 ? 0.2 : 0.1});
        step.set_run_fingerprint({{"batch_size", !other_lr && r == 1 ? "8" : "4"}});
        first_field[static_cast<std::size_t>(r)] = step.run_fingerprint().front().name;
        step.run(m.x = g::view(data[0].x.data(), {4, 6}), m.y = g::view(data[0].y.data(), {4}));
      });
      const std::string want = other_lr ? "rank 1 has optimizer.lr = 0.2, rank 0 has optimizer.lr = 0.1"
                                        : "rank 1 has batch_size = 8, rank 0 has batch_size = 4";
      for (const auto& f : first_field) BOOST_TEST(f == "world_size");
      for (int r = 0; r < 2; ++r)
        BOOST_TEST(res[static_cast<std::size_t>(r)].error.value_or("").find("run fingerprint differs between ranks: " + want) !=
                       std::string::npos,
                   res[static_cast<std::size_t>(r)].error.value_or("(no error)"));
    }
  }
  {  // 2 stages on 3 ranks
    auto comms = gp::thread_world::world(3);
    g::session<g::cpu_simd> s;
    m.init(s);
    BOOST_CHECK_EXCEPTION(gp::pipeline<2>(comms[0], {}, s, m.loss2(), opt), g::error, [](const g::error& e) {
      return std::string(e.what()).find("2 stages do not divide the world of 3 ranks") != std::string::npos;
    });
  }
  // Stage 0 stops after `steps` batches, stage 1 runs one more: its wait ends, naming the stage
  // (and the micro-batch and the peer where a step's transfers wait).
  const auto peer_gone_after = [&](int steps) {
    auto comms = gp::thread_world::world(2, std::chrono::milliseconds(2000));
    const auto data = make_batches(1, 4, 1);
    return gradus_test::on_threads(2, [&](int r) {
      g::session<g::cpu_simd> s;
      m.init(s);
      auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = 2}, s, m.loss2(), opt);
      for (int k = 0; k < steps + r; ++k) step.run(m.x = g::view(data[0].x.data(), {4, 6}), m.y = g::view(data[0].y.data(), {4}));
    });
  };
  {  // gone before the first step: the run fingerprint's wait
    const auto res = peer_gone_after(0);
    BOOST_TEST(res[1].comm_error);
    BOOST_TEST(res[1].error.value_or("").find("pipeline stage 1 (rank 1): comparing the run fingerprint before the first step: ") !=
               std::string::npos, res[1].error.value_or(""));
  }
  {  // gone before the second step: the activations' wait
    const auto res = peer_gone_after(1);
    BOOST_TEST(res[1].comm_error);
    BOOST_TEST(res[1].error.value_or("").find("pipeline stage 1 (rank 1), micro-batch 0: waiting for activations from rank 0") !=
               std::string::npos, res[1].error.value_or(""));
  }
}

// Checkpoints of a pipelined run (pipeline/checkpoint.hpp): one file per stage, committed
// together. The ranks are threads over a fresh world for each run: fresh sessions,
// `f(rank, session, step)`, each rank's error if any.
namespace {
struct checkpoint_runs {
  model m;
  std::vector<batch> data = make_batches(4, 12, 21);
  g::adam opt{.lr = 0.01};
  using weights_t = std::vector<std::vector<float>>;
  template <int S, class Loss, class F>
  std::vector<gradus_test::rank_result> on_pipeline(const Loss& loss, int replicas, F f) {
    auto comms = gp::thread_world::world(S * replicas, std::chrono::seconds(5));
    return gradus_test::on_threads(S * replicas, [&](int r) {
      g::session<g::cpu_simd> s;
      m.init(s);
      auto step = gp::pipeline<S>(comms[static_cast<std::size_t>(r)],
                                  {.micro_batches = 3, .schedule = gp::schedule_kind::one_f_one_b}, s, loss, opt);
      f(r, comms[static_cast<std::size_t>(r)], s, step);
    });
  }
  // steps from .. to - 1 of the 2-stage model, each replica its shard of the batch
  template <class Step>
  void train(Step& step, int r, int replicas, int from, int to) {
    const long shard = 12 / replicas, at = (r / 2) * shard;
    for (int k = from; k < to; ++k) {
      const auto& b = data[static_cast<std::size_t>(k)];
      step.run(m.x = g::view(b.x.data() + at * 6, {shard, 6}), m.y = g::view(b.y.data() + at, {shard}));
    }
  }
  weights_t weights(g::session<g::cpu_simd>& s) {
    return {values(s, m.l1.w), values(s, m.l1.b), values(s, m.l2.w), values(s, m.l2.b), values(s, m.l3.w), values(s, m.l3.b)};
  }
  static void no_errors(const std::vector<gradus_test::rank_result>& res) {
    for (std::size_t r = 0; r < res.size(); ++r) BOOST_TEST_REQUIRE(!res[r].error, "rank " << r << ": " << res[r].error.value_or(""));
  }
  // every rank's error of a restore of `f` ("(no error)" where none)
  template <int S, class Loss>
  std::vector<std::string> restore_errors(const Loss& loss, const std::filesystem::path& f) {
    std::vector<std::string> e;
    for (const auto& r : on_pipeline<S>(loss, 1, [&](int, auto&, auto&, auto& step) { step.restore_checkpoint(f); }))
      e.push_back(r.error.value_or("(no error)"));
    return e;
  }
};
std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> r;
  for (const auto& e : std::filesystem::directory_iterator(dir)) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}
}  // namespace

// 2 steps, save, then fresh sessions restore and run 2 more: the weights equal 4 straight steps
// bit for bit (Adam: its slots are in the files), with 1 and 2 replicas per stage (replica 1
// takes replica 0's state by broadcast); a second save supersedes the first. Then what a bad
// checkpoint gives on every rank.
BOOST_AUTO_TEST_CASE(checkpoints_resume_the_pipeline) {
  checkpoint_runs c;
  auto& m = c.m;
  gradus_test::temp_dir dir;
  using weights_t = checkpoint_runs::weights_t;
  const auto ck = dir.path / "two" / "ckpt.npz", ck4 = dir.path / "four" / "ckpt.npz";
  for (const int replicas : {2, 1}) {
    BOOST_TEST_CONTEXT("2 stages x " << replicas << " replicas") {
      for (const auto& f : {ck, ck4}) {
        std::filesystem::remove_all(f.parent_path());
        std::filesystem::create_directories(f.parent_path());
      }
      const int n = 2 * replicas;
      std::vector<weights_t> straight(static_cast<std::size_t>(n)), resumed(static_cast<std::size_t>(n));
      std::vector<int> found_none(static_cast<std::size_t>(n), -1), restored(static_cast<std::size_t>(n), -1);
      std::vector<std::int64_t> step_after(static_cast<std::size_t>(n), -1);
      c.no_errors(c.on_pipeline<2>(m.loss2(), replicas, [&](int r, auto&, auto& s, auto& step) {
        c.train(step, r, replicas, 0, 4);
        step.save_checkpoint(ck4);
        step.gather_variables();
        straight[static_cast<std::size_t>(r)] = c.weights(s);
      }));
      c.no_errors(c.on_pipeline<2>(m.loss2(), replicas, [&](int r, auto&, auto&, auto& step) {
        found_none[static_cast<std::size_t>(r)] = step.restore_checkpoint(ck) ? 0 : 1;  // nothing there yet
        c.train(step, r, replicas, 0, 1);
        step.save_checkpoint(ck);  // save 1, superseded by save 2
        c.train(step, r, replicas, 1, 2);
        step.save_checkpoint(ck);
      }));
      c.no_errors(c.on_pipeline<2>(m.loss2(), replicas, [&](int r, auto&, auto& s, auto& step) {
        restored[static_cast<std::size_t>(r)] = step.restore_checkpoint(ck) ? 1 : 0;
        step_after[static_cast<std::size_t>(r)] = s.global_step();
        c.train(step, r, replicas, 2, 4);
        step.gather_variables();
        resumed[static_cast<std::size_t>(r)] = c.weights(s);
      }));
      for (std::size_t r = 0; r < static_cast<std::size_t>(n); ++r) {
        BOOST_TEST(found_none[r] == 1);
        BOOST_TEST(restored[r] == 1);
        BOOST_TEST(step_after[r] == 2);
        for (std::size_t i = 0; i < 6; ++i) BOOST_TEST(resumed[r][i] == straight[r][i], "rank " << r << " tensor " << i);
      }
      // rank 0 holds the whole model after the gather, trained: not the initial weights
      g::session<g::cpu_simd> init;
      m.init(init);
      const weights_t w0 = c.weights(init);
      for (std::size_t i = 0; i < 6; ++i) BOOST_TEST(resumed[0][i] != w0[i], "tensor " << i);
    }
  }
  // the files: the record and the second save's parts only, each part with its own
  // variables, their Adam slots and the layout
  BOOST_TEST((files_in(ck.parent_path()) ==
              std::vector<std::string>{"ckpt-2.stage-0-of-2.npz", "ckpt-2.stage-1-of-2.npz", "ckpt.commit"}));
  BOOST_TEST(g::committed_stage_file(ck, 1) == ck.parent_path() / "ckpt-2.stage-1-of-2.npz");
  const auto record = g::read_checkpoint_commit(ck);
  BOOST_TEST_REQUIRE(record.has_value());
  BOOST_TEST(record->save == 2);
  BOOST_TEST(record->global_step == 2);
  BOOST_TEST(record->bytes[1] == std::filesystem::file_size(g::committed_stage_file(ck, 1)));
  std::vector<std::string> names;
  for (const auto& a : g::io::read_npz(g::committed_stage_file(ck, 0))) names.push_back(a.name);
  std::sort(names.begin(), names.end());
  const std::vector<std::string> want{"global_step", "gradus/precision", "gradus/stage", "gradus/stages",
                                      "gradus/world_size", "p1/b", "p1/b/adam_m", "p1/b/adam_v", "p1/w",
                                      "p1/w/adam_m", "p1/w/adam_v"};
  BOOST_TEST(names == want, [&] { std::string t; for (auto& x : names) t += x + " "; return t; }());

  // every rank fails with the cause (the last stage's run of these; Boost.Test's checks here)
  for (const auto& e : c.restore_errors<3>(m.loss3(), ck))  // another stage count
    BOOST_TEST((gradus_test::contains(e, "the files there are a pipeline of 2 stages") && gradus_test::contains(e, "resume with --stages 2")),
               e);
  {  // a whole model's file given to a pipeline, and a stage's file to a plain session
    g::session<g::cpu_simd> s;
    m.init(s);
    auto plain = g::minimize(s, m.loss2(), c.opt);
    const auto whole = dir.path / "whole" / "ckpt.npz";
    std::filesystem::create_directories(whole.parent_path());
    g::save_checkpoint(s, whole);
    for (const auto& e : c.restore_errors<2>(m.loss2(), whole))
      BOOST_TEST(gradus_test::contains(e, "the file holds a whole model (a run without stages)"), e);
    BOOST_CHECK_EXCEPTION(g::restore_checkpoint(s, g::committed_stage_file(ck, 0)), g::error, [](const g::error& e) {
      return gradus_test::contains(e.what(), "the file holds one stage of a 2-stage pipeline, not a whole model; resume it as "
                                             "a pipeline of 2 stages (--stages 2)");
    });
  }
  // a committed set altered after its commit: a part of another step, cut, missing, corrupt
  const auto mixed = dir.path / "mixed" / "ckpt.npz";
  const auto part1 = [&] { return g::committed_stage_file(mixed, 1); };
  const auto recommit = [&] {  // the record made to agree with the parts' sizes again
    auto rec = *g::read_checkpoint_commit(mixed);
    for (int k = 0; k < 2; ++k) rec.bytes[static_cast<std::size_t>(k)] = std::filesystem::file_size(g::committed_stage_file(mixed, k));
    g::write_checkpoint_commit(mixed, rec);
  };
  std::filesystem::copy(ck.parent_path(), mixed.parent_path());
  std::filesystem::copy_file(g::committed_stage_file(ck4, 1), part1(), std::filesystem::copy_options::overwrite_existing);
  recommit();
  for (const auto& e : c.restore_errors<2>(m.loss2(), mixed))
    BOOST_TEST(gradus_test::contains(e, "the stages' files hold different global steps (stage 0 step 2, stage 1 step 4), "
                                        "the commit record step 2: a file was replaced after the commit"), e);
  std::filesystem::resize_file(part1(), std::filesystem::file_size(part1()) - 10);
  {
    const auto e = c.restore_errors<2>(m.loss2(), mixed);
    BOOST_TEST(gradus_test::contains(e[1], "its file '" + part1().string() + "' has "), e[1]);
    BOOST_TEST(gradus_test::contains(e[1], ": it was replaced or cut after the commit"), e[1]);
    BOOST_TEST(gradus_test::contains(e[0], "stage 1 (rank 1) could not restore its file"), e[0]);
  }
  {  // a corrupt file: its rank names the file, the other names the stage that failed
    std::ofstream(part1(), std::ios::trunc) << "not a zip file";
    recommit();
    const auto e = c.restore_errors<2>(m.loss2(), mixed);
    BOOST_TEST(gradus_test::contains(e[1], "read_npz '" + part1().string()), e[1]);
    BOOST_TEST(gradus_test::contains(e[0], "stage 1 (rank 1) could not restore its file"), e[0]);
  }
  const auto gone = part1();
  std::filesystem::remove(gone);
  for (const auto& e : c.restore_errors<2>(m.loss2(), mixed))  // a stage's file missing
    BOOST_TEST(gradus_test::contains(e, "incomplete: the file of stage(s) 1 is missing ('" + gone.string() +
                                            "'), stage(s) 0 have theirs (the commit record"), e);
  std::ofstream(g::checkpoint_commit_file(mixed), std::ios::trunc) << "gradus-checkpoint-commit 1\nsave 0\n";
  for (const auto& e : c.restore_errors<2>(m.loss2(), mixed))  // a malformed record
    BOOST_TEST((gradus_test::contains(e, "commit record '" + g::checkpoint_commit_file(mixed).string() + "'") &&
                (gradus_test::contains(e, "malformed: line 2 is not 'save N' (N >= 1)") ||
                 gradus_test::contains(e, "rank 0 could not use the commit record"))), e);

  // gradus 0.1's layout (one file per stage, no record): restored where whole and of one
  // step, refused where the steps differ; a save replaces it with a committed set
  const auto old = dir.path / "old" / "ckpt.npz";
  std::filesystem::create_directories(old.parent_path());
  for (int k = 0; k < 2; ++k) std::filesystem::copy_file(g::committed_stage_file(ck, k), g::stage_checkpoint_file(old, k, 2));
  std::vector<std::int64_t> old_step(2, -1);
  c.no_errors(c.on_pipeline<2>(m.loss2(), 1, [&](int r, auto&, auto& s, auto& step) {
    if (step.restore_checkpoint(old)) old_step[static_cast<std::size_t>(r)] = s.global_step();
  }));
  BOOST_TEST((old_step == std::vector<std::int64_t>{2, 2}));
  BOOST_TEST((g::stage_checkpoints_present(old) == std::vector<int>{2}));
  std::filesystem::copy_file(g::committed_stage_file(ck4, 1), g::stage_checkpoint_file(old, 1, 2),
                             std::filesystem::copy_options::overwrite_existing);
  for (const auto& e : c.restore_errors<2>(m.loss2(), old))
    BOOST_TEST(gradus_test::contains(e, "the stages' files hold different global steps (stage 0 step 2, stage 1 step 4): "
                                        "they were written at different times"), e);
  c.no_errors(c.on_pipeline<2>(m.loss2(), 1, [&](int, auto&, auto&, auto& step) { step.save_checkpoint(old); }));
  BOOST_TEST((files_in(old.parent_path()) ==
              std::vector<std::string>{"ckpt-1.stage-0-of-2.npz", "ckpt-1.stage-1-of-2.npz", "ckpt.commit"}));
}

// A save killed at any point (core/fault_point.hpp's points of io/checkpoint_set.hpp; here
// the hook ends the rank's work with an exception at the point and aborts its world, as a
// SIGKILL would end it and its neighbour's waits): a restart resumes from the newest complete
// set (the second save's once its record is renamed, else the first's; nothing when the first
// save dies before its commit), and its training equals 4 straight steps bit for bit. The
// kill tests of whole processes under gradus-run are the fault matrix's pipeline.save.* cases.
BOOST_AUTO_TEST_CASE(a_save_killed_at_any_point_resumes_from_the_newest_complete_set) {
  checkpoint_runs c;
  auto& m = c.m;
  gradus_test::temp_dir dir;
  std::vector<checkpoint_runs::weights_t> straight(2);
  c.no_errors(c.on_pipeline<2>(m.loss2(), 1, [&](int r, auto&, auto& s, auto& step) {
    c.train(step, r, 1, 0, 4);
    step.gather_variables();
    straight[static_cast<std::size_t>(r)] = c.weights(s);
  }));
  struct kill_at {
    std::string point;
    int rank, save;
    std::int64_t resumes_at;  // the restored global step; -1: nothing committed, a fresh start
  };
  const std::vector<kill_at> cases{
      {"checkpoint.part.before", 1, 2, 2},   {"checkpoint.part.written", 0, 2, 2}, {"checkpoint.part.written", 1, 2, 2},
      {"checkpoint.commit.before", 0, 2, 2}, {"checkpoint.commit.written", 0, 2, 4}, {"checkpoint.cleanup.before", 1, 2, 4},
      {"checkpoint.cleanup.done", 0, 2, 4},  {"checkpoint.part.written", 1, 1, -1}, {"checkpoint.commit.before", 0, 1, -1}};
  thread_local int rank_here = -1;
  thread_local gp::thread_world* world_here = nullptr;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& k = cases[i];
    BOOST_TEST_CONTEXT(k.point << " on rank " << k.rank << " in save " << k.save) {
      const auto ck = dir.path / std::to_string(i) / "ckpt.npz";
      std::filesystem::create_directories(ck.parent_path());
      int passed = 0;
      g::detail::fault_hook() = [&](std::string_view p) {
        if (p == k.point && rank_here == k.rank && ++passed == k.save) {
          world_here->abort("killed at " + k.point);
          throw std::runtime_error("killed at " + k.point);
        }
      };
      const auto killed = c.on_pipeline<2>(m.loss2(), 1, [&](int r, auto& comm, auto&, auto& step) {
        rank_here = r;
        world_here = &comm;
        c.train(step, r, 1, 0, 2);
        step.save_checkpoint(ck);
        c.train(step, r, 1, 2, 4);
        step.save_checkpoint(ck);
      });
      g::detail::fault_hook() = nullptr;
      BOOST_TEST(killed[static_cast<std::size_t>(k.rank)].error.value_or("") == "killed at " + k.point);
      std::vector<std::int64_t> at(2, -2);
      std::vector<checkpoint_runs::weights_t> resumed(2);
      c.no_errors(c.on_pipeline<2>(m.loss2(), 1, [&](int r, auto&, auto& s, auto& step) {
        const bool restored = step.restore_checkpoint(ck);
        at[static_cast<std::size_t>(r)] = restored ? s.global_step() : -1;
        c.train(step, r, 1, restored ? static_cast<int>(s.global_step()) : 0, 4);
        step.save_checkpoint(ck);
        step.gather_variables();
        resumed[static_cast<std::size_t>(r)] = c.weights(s);
      }));
      BOOST_TEST((at == std::vector<std::int64_t>(2, k.resumes_at)));
      for (std::size_t r = 0; r < 2; ++r)
        for (std::size_t t = 0; t < 6; ++t) BOOST_TEST(resumed[r][t] == straight[r][t], "rank " << r << " tensor " << t);
      // the restart's save left its own set alone: the record and its two parts
      const auto files = files_in(ck.parent_path());
      BOOST_TEST(files.size() == 3u);
      BOOST_TEST(g::read_checkpoint_commit(ck)->global_step == 4);
    }
  }
}

// A stage whose restore fails with an exception other than gradus::error (std::bad_alloc, a
// library's own): it still takes part in the ranks' agreement, so every rank fails at once
// with the cause (before, that rank threw past the agreement and the other waited for it
// until its deadline, blaming its silence). A stage that only restores, on the ranks' threads.
namespace {
struct restore_only final : gp::pipeline_base<gp::thread_world> {
  restore_only(gp::thread_world& c, bool fail) : pipeline_base(c, 2, {}, {}), fail(fail) {}
  double run_raw(std::span<const gp::detail::raw_feed>) override { return 0; }
  void gather_variables() override {}
  std::int64_t save_stage_file(const std::filesystem::path&) override { return 7; }
  std::int64_t restore_stage_file(const std::filesystem::path&) override {
    if (fail) throw std::length_error("vector::_M_default_append");
    return 7;
  }
  void broadcast_to_replicas() override {}
  bool fail;
};
}  // namespace

BOOST_AUTO_TEST_CASE(a_restore_failing_with_any_exception_fails_every_rank_at_once) {
  gradus_test::temp_dir dir;
  const auto ck = dir.path / "ckpt.npz";
  for (const int k : {0, 1}) std::ofstream(g::stage_checkpoint_file(ck, k, 2)) << "present";
  for (const int failing : {0, 1}) {
    BOOST_TEST_CONTEXT("stage " << failing << " fails") {
      auto comms = gp::thread_world::world(2, std::chrono::seconds(20));
      const auto t0 = std::chrono::steady_clock::now();
      const auto res = gradus_test::on_threads(2, [&](int r) {
        restore_only p(comms[static_cast<std::size_t>(r)], r == failing);
        gp::restore_pipeline_checkpoint(p, ck);
      });
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      BOOST_TEST(took < 10.0);  // no rank waited out its deadline (20 s)
      const std::string mine = res[static_cast<std::size_t>(failing)].error.value_or("(no error)");
      const std::string other = res[static_cast<std::size_t>(1 - failing)].error.value_or("(no error)");
      BOOST_TEST(gradus_test::contains(mine, "could not restore this stage's file '" +
                                                 g::stage_checkpoint_file(ck, failing, 2).string() +
                                                 "': vector::_M_default_append"),
                 mine);
      BOOST_TEST(gradus_test::contains(mine, "pipeline stage " + std::to_string(failing)), mine);
      const std::string who = std::to_string(failing);
      BOOST_TEST(gradus_test::contains(other, "stage " + who + " (rank " + who + ") could not restore its file"), other);
    }
  }
}

// Stage 0 computes its deferred weight gradient ahead over the micro-batches done while it
// waits for a gradient (pipeline_options::early_gradients; a layer 64 wide, so that the
// product runs on cpu_simd's kernels, which go on from partial sums): the weights after 3
// steps are those of the same pipeline without it, bit for bit, under 1F1B and GPipe, with
// the update fused and (clipping by the global norm) not; M = 4 over a batch of 30 (8, 8, 7,
// 7 rows). Four ways: off; a communicator whose probe never sees the gradient arrive (the
// work brought up to the rows stashed at every wait: the gradient summed in 2-4 parts);
// one that cannot probe (ahead of the last gradient only, for the last step's wait); the
// plain thread_world (until the gradient arrives, whenever that is). The stats say it ran
// on stage 0, never on the last stage.
namespace {
struct wide_model {
  g::placeholder<"x", float, g::dyn, 6> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"w1", 6, 64> l1;
  g::nn::dense<"w2", 64, 4> l2;
  auto loss() const {
    const auto h = g::on<g::stage<0>>(g::tanh(l1(x)));
    return g::on<g::stage<1>>(g::nn::softmax_cross_entropy_loss(l2(h), y));
  }
};
/// thread_world, but a message never seems to have arrived before recv waits for it
struct never_arrived : gp::thread_world {
  explicit never_arrived(gp::thread_world w) : gp::thread_world(std::move(w)) {}
  bool probe(int) { return false; }
};
/// thread_world without probe
struct cannot_probe : gp::thread_world {
  explicit cannot_probe(gp::thread_world w) : gp::thread_world(std::move(w)) {}
  bool probe(int) = delete;
};
static_assert(gp::probing<gp::thread_world> && gp::probing<never_arrived> && !gp::probing<cannot_probe>);

/// The weights after 3 steps on Comm's ranks, and each stage's stats().early_gradients.
template <class Comm>
std::pair<std::vector<std::vector<float>>, std::array<int, 2>> train_wide(const wide_model& m, const std::vector<batch>& data,
                                                                          gp::schedule_kind sched, const g::sgd& opt, bool early) {
  std::vector<std::vector<float>> w;
  std::array<int, 2> begun{};
  auto world = gp::thread_world::world(2);
  std::vector<Comm> comms;
  for (auto& c : world) comms.emplace_back(std::move(c));
  const auto res = gradus_test::on_threads(2, [&](int r) {
    g::session<g::cpu_simd> s;
    m.l1.initialize(s, 3);
    m.l2.initialize(s, 3);
    auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = 4, .schedule = sched, .early_gradients = early}, s,
                                m.loss(), opt);
    for (const auto& b : data) step.run(m.x = g::view(b.x.data(), {30, 6}), m.y = g::view(b.y.data(), {30}));
    begun[static_cast<std::size_t>(r)] = step.stats().early_gradients;
    step.gather_variables();
    if (r == 0) w = {values(s, m.l1.w), values(s, m.l1.b), values(s, m.l2.w), values(s, m.l2.b)};
  });
  for (const auto& r : res) BOOST_TEST_REQUIRE(!r.error, r.error.value_or(""));
  return {w, begun};
}
}  // namespace

BOOST_AUTO_TEST_CASE(early_weight_gradients_keep_the_bits) {
  const wide_model m;
  const auto data = make_batches(3, 30, 5);
  const int can = g::cpu_gemm::available ? 1 : 0;  // (cpu_simd's own kernels)
  for (const double clip : {0.0, 0.5})
    for (const auto sched : {gp::schedule_kind::one_f_one_b, gp::schedule_kind::gpipe}) {
      BOOST_TEST_CONTEXT(gp::schedule_name(sched) << ", clip " << clip) {
        const g::sgd opt{.lr = 0.1, .momentum = 0.9, .clip_global_norm = clip};
        const auto [off, none] = train_wide<gp::thread_world>(m, data, sched, opt, false);
        BOOST_TEST((none == std::array<int, 2>{0, 0}));
        const auto [always, a] = train_wide<never_arrived>(m, data, sched, opt, true);
        const auto [last, l] = train_wide<cannot_probe>(m, data, sched, opt, true);
        const auto [probed, p] = train_wide<gp::thread_world>(m, data, sched, opt, true);
        for (std::size_t i = 0; i < 4; ++i) {
          BOOST_TEST(always[i] == off[i], "tensor " << i << " bit for bit, probe never true");
          BOOST_TEST(last[i] == off[i], "tensor " << i << " bit for bit, without probe");
          BOOST_TEST(probed[i] == off[i], "tensor " << i << " bit for bit, probed");
        }
        BOOST_TEST((a == std::array<int, 2>{can, 0}));  // w1's gradient, on stage 0; the last stage waits for no gradient
        BOOST_TEST((l == std::array<int, 2>{can, 0}));
        BOOST_TEST((p[0] <= can && p[1] == 0));
      }
    }
}

// Devices in one process (pipeline_in_process): a chain of device placements numbers its
// own stages and to_dot labels them; two cpu_simd stages on threads equal the unsplit model
// (M = 1 bit for bit) and log their device; a failing stage fails the step at once, naming
// itself; across processes, a rank whose session cannot run its stage's device is refused.
BOOST_AUTO_TEST_CASE(devices_in_one_process) {
  model m;
  const auto h = g::on<g::device::cpu>(g::tanh(m.l1(m.x)));
  const auto loss = g::on<g::device::cpu>(g::nn::softmax_cross_entropy_loss(m.l3(g::tanh(m.l2(h))), m.y));
  using L = std::remove_cvref_t<decltype(loss)>;
  static_assert(g::stage_of_v<decltype(h)> == 0 && g::stage_of_v<L> == 1);
  static_assert(std::is_same_v<g::stage_device_t<0, L>, g::device::cpu> && std::is_same_v<g::stage_device_t<1, L>, g::device::cpu>);
  static_assert(std::is_same_v<g::stage_device_t<1, decltype(m.loss2())>, g::device::any>);
  const auto on_gpu = g::on<g::stage<1, g::device::cuda<2>>>(g::nn::softmax_cross_entropy_loss(m.l3(g::tanh(m.l2(h))), m.y));
  static_assert(std::is_same_v<g::stage_device_t<1, decltype(on_gpu)>, g::device::cuda<2>>);
  static_assert(gp::device_runs_on<g::device::cpu, g::cpu_simd> && !gp::device_runs_on<g::device::cuda<0>, g::cpu_simd> &&
                gp::device_runs_on<g::device::any, g::cpu_simd>);
  const std::string dot = g::to_dot(on_gpu);
  BOOST_TEST(gradus_test::contains(dot, "label=\"stage 0 (cpu)\""), dot);
  BOOST_TEST(gradus_test::contains(dot, "label=\"stage 1 (cuda:2)\""), dot);

  const auto data = make_batches(3, 10, 11);
  const g::sgd opt{.lr = 0.1, .momentum = 0.9};
  const trained ref = reference(m, m.loss2(), opt, data, 10);
  for (const int M : {1, 4}) {
    BOOST_TEST_CONTEXT("M = " << M) {
      g::session<g::cpu_simd> s0, s1;
      m.init(s0);
      m.init(s1);
      std::ostringstream log;
      auto step = gp::pipeline_in_process<2>({.micro_batches = M, .schedule = gp::schedule_kind::one_f_one_b, .placement_log = &log},
                                             loss, opt, s0, s1);
      for (std::size_t i = 0; i < data.size(); ++i) {
        const double l = step.run(m.x = g::view(data[i].x.data(), {10, 6}), m.y = g::view(data[i].y.data(), {10}));
        BOOST_TEST(std::abs(l - ref.losses[i]) <= 1e-5 * (1 + std::abs(ref.losses[i])));
      }
      step.gather_variables();  // into s0
      const std::vector<std::vector<float>> w{values(s0, m.l1.w), values(s0, m.l1.b), values(s0, m.l2.w),
                                              values(s0, m.l2.b), values(s0, m.l3.w), values(s0, m.l3.b)};
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (M == 1) BOOST_TEST(w[i] == ref.w[i], "tensor " << i << " bit-identical");
        BOOST_TEST(max_rel(w[i], ref.w[i]) <= 2e-5, "tensor " << i);
      }
      BOOST_TEST(step.stats(0).bytes_sent == 10u * 16 * 4);  // the [10, 16] activations
      BOOST_TEST(step.stats(1).bytes_sent == 10u * 16 * 4);  // and their gradient back
      BOOST_TEST(gradus_test::contains(log.str(), "(forward): stage 0 of 2 (rank 0, cpu, cpu_simd)\n"), log.str());
      BOOST_TEST(gradus_test::contains(log.str(), "gradus placement: step 2, stage 1 of 2 (rank 1, cpu, cpu_simd): sent 640 bytes"),
                 log.str());
    }
  }
  {  // stage 1 is not fed its labels: it fails, stage 0's wait for its gradient ends at once
    g::session<g::cpu_simd> s0, s1;
    m.init(s0);
    m.init(s1);
    auto step = gp::pipeline_in_process<2>({.micro_batches = 2}, loss, opt, s0, s1);
    const auto t0 = std::chrono::steady_clock::now();
    BOOST_CHECK_EXCEPTION(step.run(m.x = g::view(data[0].x.data(), {10, 6})), g::error, [](const g::error& e) {
      return gradus_test::contains(e.what(), "pipeline stage 1 (rank 1): placeholder 'y' of stage 1 was not fed");
    });
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    BOOST_TEST(secs < 3.0);
  }
  {  // across processes: rank 1's session (cpu_simd) cannot run its stage's device (cuda:2)
    auto comms = gp::thread_world::world(2, std::chrono::seconds(2));
    const auto res = gradus_test::on_threads(2, [&](int r) {
      g::session<g::cpu_simd> s;
      m.init(s);
      auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {}, s, on_gpu, opt);
    });
    BOOST_TEST(gradus_test::contains(res[1].error.value_or(""), "pipeline stage 1 (rank 1): the stage is placed on device cuda:2, "
                                                                "and this rank's session runs the cpu_simd backend"),
               res[1].error.value_or("(no error)"));
  }
}

BOOST_AUTO_TEST_CASE(balanced_cut_from_the_layer_types) {
  // MNIST's deep MLP: 784 -> 512, seven 512 -> 512, 512 -> 10 (costs 2·In·Out per row)
  constexpr std::array<double, 9> cost{2.0 * 784 * 512, 2.0 * 512 * 512, 2.0 * 512 * 512, 2.0 * 512 * 512, 2.0 * 512 * 512,
                                       2.0 * 512 * 512, 2.0 * 512 * 512, 2.0 * 512 * 512, 2.0 * 512 * 10};
  constexpr auto two = gp::balanced_cut<2>(cost);
  // an independent check: try every single cut, keep the least max
  double best = 1e300;
  for (std::size_t c = 1; c < cost.size(); ++c) {
    double a = 0, b = 0;
    for (std::size_t i = 0; i < cost.size(); ++i) (i < c ? a : b) += cost[i];
    best = std::min(best, std::max(a, b));
  }
  BOOST_TEST(two.max_cost() == best);
  BOOST_TEST(two.first[1] == 4);  // 784x512 + 3 hidden | 4 hidden + the output layer
  BOOST_TEST(two.cost[0] + two.cost[1] == std::accumulate(cost.begin(), cost.end(), 0.0));
  constexpr auto four = gp::balanced_cut<4>(cost);
  for (int k = 0; k < 4; ++k) BOOST_TEST(four.first[static_cast<std::size_t>(k)] <= four.last[static_cast<std::size_t>(k)]);
  BOOST_TEST(four.last[3] == 8);
  BOOST_TEST(four.describe().find("stage 3: layers") != std::string::npos);
  // the cut from the types: dense's flops_per_row
  model m;
  constexpr auto from_types = gp::balanced_cut<2, decltype(m.l1), decltype(m.l2), decltype(m.l3)>();
  static_assert(from_types.stage[0] == 0 && from_types.stage[2] == 1);
  // sequential<S> places each stage's last output: the same graph as the hand-placed one
  const auto relu = [](const auto& h) { return g::tanh(h); };
  const auto loss = g::nn::softmax_cross_entropy_loss(gp::sequential<2>(m.x, relu, m.l1, m.l2, m.l3), m.y);
  static_assert(g::stage_of_v<decltype(loss)> == 1);
  static_assert(std::tuple_size_v<gp::stage_variables_t<0, 2, decltype(loss)>> == 2 + 2 * (from_types.stage[1] == 0));
}

BOOST_AUTO_TEST_CASE(dot_draws_stages_and_transfers) {
  model m;
  const std::string dot = g::to_dot(m.loss3());
  BOOST_TEST(dot.find("subgraph cluster_stage_0") != std::string::npos);
  BOOST_TEST(dot.find("subgraph cluster_stage_2") != std::string::npos);
  BOOST_TEST(dot.find("transfer stage 0 -> 1\\n(?, 16) float32") != std::string::npos, dot);
  BOOST_TEST(dot.find("transfer stage 1 -> 2\\n(?, 12) float32") != std::string::npos, dot);
  // the variables drawn in their stages: p1's in stage 0's cluster, before stage 1's begins
  const auto s0 = dot.find("cluster_stage_0"), s1 = dot.find("cluster_stage_1"), w1 = dot.find("variable 'p1/w'"),
             w2 = dot.find("variable 'p2/w'");
  BOOST_TEST((s0 < w1 && w1 < s1 && s1 < w2));
  // an unplaced graph has no stage clusters
  BOOST_TEST(g::to_dot(m.l1(m.x)).find("cluster_stage") == std::string::npos);
}
