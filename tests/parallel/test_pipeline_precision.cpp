// Pipelines under a precision policy (core/precision.hpp): a 2-stage pipeline of a bf16 or
// fp16 session computes the numbers of the unsplit model of the same policy (its GEMMs, the
// deferred weight gradients among them, in the compute type; not fp32's numbers); under fp16
// the last stage's backward pass starts from the loss scale and every stage skips, backs off
// and grows alike, a step with Inf leaving every stage's weights untouched and the floor's
// error naming the first non-finite variable in stage order on every rank; the scaler's state
// is in each stage's checkpoint file; ranks of different policies are refused by name.
#define BOOST_TEST_MODULE parallel_pipeline_precision
#include <boost/test/unit_test.hpp>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/io/npz.hpp>
#include <gradus/parallel/pipeline/pipeline.hpp>
#include <gradus/parallel/thread_world.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "../support/rank_harness.hpp"

namespace g = gradus;
namespace gp = gradus::parallel;

namespace {
// 24 -> 32 (tanh, stage 0) -> 10 (stage 1), softmax cross-entropy.
struct model {
  g::placeholder<"x", float, g::dyn, 24> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"a", 24, 32> l1;
  g::nn::dense<"b", 32, 10> l2;
  auto loss() const {
    const auto h = g::on<g::stage<0>>(g::tanh(l1(x)));
    return g::on<g::stage<1>>(g::nn::softmax_cross_entropy_loss(l2(h), y));
  }
  template <class B>
  void init(g::session<B>& s) const {
    l1.initialize(s, 3);
    l2.initialize(s, 3);
  }
};

constexpr long rows = 16;
struct batch {
  std::vector<float> x;
  std::vector<std::int32_t> y;
};
std::vector<batch> make_batches(int steps) {
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0, 1);
  std::vector<batch> r(static_cast<std::size_t>(steps));
  for (auto& b : r) {
    for (long i = 0; i < rows * 24; ++i) b.x.push_back(n(rng));
    for (long i = 0; i < rows; ++i) b.y.push_back(static_cast<std::int32_t>(rng() % 10));
  }
  return r;
}

template <class B>
std::vector<float> weights(g::session<B>& s, const model& m) {
  std::vector<float> r;
  const auto add = [&](const auto& v) {
    const auto t = g::value(s, v);
    r.insert(r.end(), t.data(), t.data() + t.size());
  };
  add(m.l1.w), add(m.l1.b), add(m.l2.w), add(m.l2.b);
  return r;
}

// The unsplit model's weights under policy P after the batches.
template <class P>
std::vector<float> unsplit(const model& m, const std::vector<batch>& data) {
  g::session_of<g::cpu_simd, P> s;
  m.init(s);
  auto step = g::minimize(s, m.loss(), g::sgd{.lr = 0.2, .momentum = 0.9});
  for (const auto& b : data) step.run(m.x = g::view(b.x.data(), {rows, 24}), m.y = g::view(b.y.data(), {rows}));
  return weights(s, m);
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(static_cast<double>(a[i]) - b[i]));
  return e;
}

// Runs f(rank, session, step) for a 2-stage pipeline under P on threads; each rank's error.
template <class P, class F>
auto on_pipeline(const model& m, int micro_batches, F&& f) {
  auto comms = gp::thread_world::world(2, std::chrono::seconds(20));
  return gradus_test::on_threads(2, [&](int r) {
    g::session_of<g::cpu_simd, P> s;
    m.init(s);
    auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = micro_batches}, s, m.loss(),
                                g::sgd{.lr = 0.2, .momentum = 0.9});
    f(r, s, step);
  });
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_pipeline_computes_its_policys_numbers) {
  const model m;
  const auto data = make_batches(3);
  const auto fp32 = unsplit<g::full_precision>(m, data);
  const auto check = [&]<class P>(const char* name) {
    BOOST_TEST_CONTEXT(name) {
      const auto ref = unsplit<P>(m, data);
      const double policy_effect = max_diff(ref, fp32);  // what the policy changes in 3 steps
      BOOST_TEST(policy_effect > 1e-5);
      std::vector<float> piped;
      std::array<gp::pipeline_stats, 2> stats{};
      std::array<std::string, 2> precision;
      const auto res = on_pipeline<P>(m, 1, [&](int r, auto& s, auto& step) {
        for (const auto& f : step.run_fingerprint())
          if (f.name == "precision") precision[static_cast<std::size_t>(r)] = f.value;
        for (const auto& b : data) step.run(m.x = g::view(b.x.data(), {rows, 24}), m.y = g::view(b.y.data(), {rows}));
        stats[static_cast<std::size_t>(r)] = step.stats();
        step.gather_variables();
        if (r == 0) piped = weights(s, m);
      });
      for (int r = 0; r < 2; ++r) BOOST_TEST_REQUIRE(!res[static_cast<std::size_t>(r)].error, res[static_cast<std::size_t>(r)].error.value_or(""));
      // one micro-batch: the unsplit model's operations (the weight gradients deferred to the
      // same compute-type GEMMs), so the policy's numbers to within float summation order
      const double d = max_diff(piped, ref);
      BOOST_TEST(d <= 0.01 * policy_effect, "pipeline vs unsplit " << d << ", policy effect " << policy_effect);
      for (const auto& p : precision) BOOST_TEST(p == std::string(P::name));
      for (const auto& st : stats) {
        BOOST_TEST(st.loss_scale == (P::scales_loss ? 65536.0 : 1.0));
        BOOST_TEST(st.skipped_steps == 0);
      }
    }
  };
  check.template operator()<g::mixed_bf16>("bf16");
  check.template operator()<g::mixed_fp16>("fp16");
}

BOOST_AUTO_TEST_CASE(an_fp16_pipeline_skips_and_scales_on_every_stage_alike) {
  const model m;
  auto data = make_batches(3);
  data[1].x[7] = std::numeric_limits<float>::infinity();  // step 1: non-finite gradients on both stages
  const auto dir = std::filesystem::temp_directory_path() / ("gradus_pipe_fp16_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::array<std::vector<float>, 2> after0, after1;
  std::array<gp::pipeline_stats, 2> stats{};
  std::array<std::int64_t, 2> global{};
  const auto res = on_pipeline<g::mixed_fp16>(m, 2, [&](int r, auto& s, auto& step) {
    const auto u = static_cast<std::size_t>(r);
    for (std::size_t k = 0; k < data.size(); ++k) {
      step.run(m.x = g::view(data[k].x.data(), {rows, 24}), m.y = g::view(data[k].y.data(), {rows}));
      if (k == 0) after0[u] = weights(s, m);
      if (k == 1) after1[u] = weights(s, m);
    }
    stats[u] = step.stats();
    global[u] = s.global_step();
    step.save_checkpoint(dir / "ckpt.npz");
  });
  for (int r = 0; r < 2; ++r) BOOST_TEST_REQUIRE(!res[static_cast<std::size_t>(r)].error, res[static_cast<std::size_t>(r)].error.value_or(""));
  for (int r = 0; r < 2; ++r) {
    const auto u = static_cast<std::size_t>(r);
    BOOST_TEST(after1[u] == after0[u], "rank " << r << ": the skipped step changed a weight");
    BOOST_TEST(stats[u].skipped_steps == 1);
    BOOST_TEST(stats[u].loss_scale == 32768.0);
    BOOST_TEST(global[u] == 3);  // a skipped step still advances the step
  }
  // each stage's file holds the scaler's state
  for (int k = 0; k < 2; ++k) {
    std::filesystem::path file;  // the committed set's part of stage k (pipeline/checkpoint.hpp names it)
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().find(".stage-" + std::to_string(k) + "-of-2.npz") != std::string::npos) file = e.path();
    BOOST_TEST_REQUIRE(!file.empty(), "no file of stage " << k);
    float scale = 0;
    for (const auto& a : g::io::read_npz(file))
      if (a.name == "loss_scaler/scale") std::memcpy(&scale, a.bytes.data(), sizeof scale);
    BOOST_TEST(scale == 32768.0f, file.string());
  }
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(the_floor_stops_every_stage_naming_the_first_variable) {
  const model m;
  auto data = make_batches(1);
  data[0].x[0] = std::numeric_limits<float>::infinity();
  // 65536 halved 16 times is 1, the floor; the 17th back-off would go below it
  const auto res = on_pipeline<g::mixed_fp16>(m, 2, [&](int, auto&, auto& step) {
    for (int k = 0; k < 20; ++k) step.run(m.x = g::view(data[0].x.data(), {rows, 24}), m.y = g::view(data[0].y.data(), {rows}));
  });
  for (int r = 0; r < 2; ++r) {
    const std::string e = res[static_cast<std::size_t>(r)].error.value_or("(no error)");
    BOOST_TEST(e.find("the gradient of 'a/w' holds Inf or NaN at global step 16") != std::string::npos, "rank " << r << ": " << e);
  }
}

BOOST_AUTO_TEST_CASE(ranks_of_different_policies_are_refused) {
  const model m;
  const auto data = make_batches(1);
  auto comms = gp::thread_world::world(2, std::chrono::seconds(5));
  const auto res = gradus_test::on_threads(2, [&](int r) {
    const auto go = [&](auto& s) {
      m.init(s);
      auto step = gp::pipeline<2>(comms[static_cast<std::size_t>(r)], {.micro_batches = 2}, s, m.loss(), g::sgd{.lr = 0.2, .momentum = 0.9});
      step.run(m.x = g::view(data[0].x.data(), {rows, 24}), m.y = g::view(data[0].y.data(), {rows}));
    };
    if (r == 0) {
      g::session<g::cpu_simd> s;
      go(s);
    } else {
      g::session<g::cpu_simd, g::mixed_bf16> s;
      go(s);
    }
  });
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(res[static_cast<std::size_t>(r)].error.value_or("").find("rank 1 has precision = bf16, rank 0 has precision = fp32") !=
                   std::string::npos,
               res[static_cast<std::size_t>(r)].error.value_or("(no error)"));
}
