// Dynamic loss scaling (train/loss_scale.hpp) under the mixed_fp16 policy: GradScaler's
// schedule (growth after the interval, back-off and a skipped step on Inf/NaN), the floor's
// error, a skipped step touching no variable or optimizer state, the unscaled update equal to
// the fp32 one worked out by hand, tiny gradients surviving fp16 GEMMs only when scaled, and
// the scaler's state through a checkpoint.
#define BOOST_TEST_MODULE train_loss_scale
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/io/checkpoint.hpp>

namespace g = gradus;

BOOST_AUTO_TEST_CASE(the_schedule_grows_backs_off_and_stops_at_its_floor) {
  g::loss_scaler s({.initial = 1024, .growth = 2, .backoff = 0.5, .growth_interval = 3, .min_scale = 256});
  BOOST_TEST(s.scale() == 1024);
  BOOST_TEST(s.update(0, ""));
  BOOST_TEST(s.update(1, ""));
  BOOST_TEST(s.scale() == 1024);  // 2 clean steps: not yet
  BOOST_TEST(s.update(2, ""));
  BOOST_TEST(s.scale() == 2048);  // the third: doubled, the count restarts
  BOOST_TEST(s.good_steps() == 0);
  BOOST_TEST(s.update(3, ""));
  BOOST_TEST(!s.update(4, "fc1/w"));  // Inf: skipped, halved, the count restarts
  BOOST_TEST(s.scale() == 1024);
  BOOST_TEST(s.good_steps() == 0);
  BOOST_TEST(s.skipped_steps() == 1);
  BOOST_TEST(!s.update(5, "fc1/w"));
  BOOST_TEST(s.scale() == 512);
  BOOST_TEST(!s.update(6, "fc2/b"));
  BOOST_TEST(s.scale() == 256);
  try {
    s.update(7, "fc2/b");  // 128 would be below the floor
    BOOST_FAIL("a back-off below the floor must stop the run");
  } catch (const g::numerics_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("'fc2/b'") != std::string::npos, what);
    BOOST_TEST(what.find("global step 7") != std::string::npos, what);
    BOOST_TEST(what.find("floor 256") != std::string::npos, what);
  }
  // bad options are named
  try {
    g::loss_scaler bad({.backoff = 1.5});
    BOOST_FAIL("backoff 1.5 accepted");
  } catch (const g::error& e) {
    BOOST_TEST(std::string(e.what()).find("backoff must be in (0, 1), got 1.5") != std::string::npos, e.what());
  }
}

namespace {
constexpr g::index_t n = 37;
}

BOOST_AUTO_TEST_CASE(a_step_with_inf_gradients_is_skipped_and_the_next_one_unscaled) {
  // loss = sum(w * c): the gradient of w is c, chosen by the test
  g::variable<"w", float, n> w;
  g::placeholder<"c", float, n> c;
  g::session<g::cpu_simd, g::mixed_fp16> s;
  std::vector<float> w0(n), c1(n), c2(n);
  for (g::index_t i = 0; i < n; ++i) {
    w0[i] = 0.01f * static_cast<float>(i) - 0.2f;
    c1[i] = 0.5f - 0.03f * static_cast<float>(i);
    c2[i] = c1[i];
  }
  c2[5] = std::numeric_limits<float>::infinity();
  g::assign(s, w, g::view(w0.data(), {n}));
  auto step = g::minimize(s, g::sum(w * c), g::sgd{.lr = 0.125, .momentum = 0.5}, w);
  BOOST_TEST(step.loss_scale() == 65536.0);
  step.run(c = g::view(c2.data(), {n}));  // Inf in the gradient: skipped
  BOOST_TEST(step.skipped_steps() == 1);
  BOOST_TEST(step.loss_scale() == 32768.0);
  BOOST_TEST(s.global_step() == 1);
  {
    const auto v = g::value(s, w);
    for (g::index_t i = 0; i < n; ++i) BOOST_TEST(v.data()[i] == w0[i]);  // untouched
  }
  step.run(c = g::view(c1.data(), {n}));  // finite: applied, unscaled
  const auto v = g::value(s, w);
  const auto m = s.template data<float>("w/momentum");
  for (g::index_t i = 0; i < n; ++i) {
    // first momentum step: buffer = g; w -= lr * buffer (the scale is a power of two: exact)
    BOOST_TEST(m[i] == c1[i]);
    BOOST_TEST(v.data()[i] == w0[i] - 0.125f * c1[i]);
  }
  BOOST_TEST(step.skipped_steps() == 1);
}

BOOST_AUTO_TEST_CASE(tiny_gradients_survive_fp16_gemms_only_when_scaled) {
  // loss = 2.7e-7 * sum(matmul(x, w)): w's gradient is 2.7e-7 * x^T 1, whose backward GEMM reads
  // the upstream gradient 2.7e-7: a subnormal in fp16 (steps of 2^-24 = 6e-8), 10% off, unless
  // the loss is scaled (2.7e-7 * 65536 = 0.0177, a normal fp16 number).
  constexpr float tiny = 2.7e-7f;
  BOOST_TEST(std::abs(static_cast<float>(g::f16(tiny)) - tiny) > 0.05f * tiny);  // the premise
  g::variable<"w", float, 8, 4> w;
  g::placeholder<"x", float, 16, 8> x;
  std::vector<float> xv(16 * 8);
  for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = 0.37f + 0.011f * static_cast<float>(i % 13);
  const auto loss = g::sum(g::matmul(x, w)) * tiny;
  g::session<g::cpu_simd, g::mixed_fp16> s;
  const std::vector<float> quarter(32, 0.25f);
  g::assign(s, w, g::view(quarter.data(), {8, 4}));
  auto step = g::minimize(s, loss, g::sgd{.lr = 1}, w);
  step.compute_gradients(x = g::view(xv.data(), {16, 8}));
  const auto* gw = static_cast<const float*>(step.gradients()[0].data);
  const double unscale = 1.0 / 65536;
  for (int r = 0; r < 8; ++r) {
    double want = 0;  // tiny * sum over the batch of x[b, r]
    for (int b = 0; b < 16; ++b) want += xv[static_cast<std::size_t>(b * 8 + r)];
    want *= tiny;
    for (int q = 0; q < 4; ++q) {
      const double got = gw[r * 4 + q] * unscale;
      // x and the scaled upstream gradient rounded to fp16 (relative 2^-11 each), summed in fp32
      BOOST_TEST(std::abs(got - want) <= 3 * std::ldexp(1.0, -11) * want, "row " << r << ": " << got << " vs " << want);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_scaler_state_is_checkpointed) {
  g::variable<"w", float, n> w;
  g::placeholder<"c", float, n> c;
  const auto file = std::filesystem::temp_directory_path() / ("gradus_loss_scale_" + std::to_string(::getpid()) + ".npz");
  std::vector<float> ones(n, 1.0f), bad(n, 1.0f);
  bad[0] = std::numeric_limits<float>::quiet_NaN();
  {
    g::session<g::cpu_simd, g::mixed_fp16> s;
    g::assign(s, w, g::view(ones.data(), {n}));
    auto step = g::minimize(s, g::sum(w * c), g::sgd{.lr = 0.01}, w);
    step.run(c = g::view(bad.data(), {n}));   // skipped: 32768
    step.run(c = g::view(ones.data(), {n}));  // one clean step
    g::save_checkpoint(s, file);
  }
  g::session<g::cpu_simd, g::mixed_fp16> s;
  g::assign(s, w, g::view(ones.data(), {n}));
  auto step = g::minimize(s, g::sum(w * c), g::sgd{.lr = 0.01}, w);
  g::restore_checkpoint(s, file);
  step.run(c = g::view(bad.data(), {n}));  // the restored 32768 backs off to 16384
  BOOST_TEST(step.loss_scale() == 16384.0);
  std::filesystem::remove(file);
}

BOOST_AUTO_TEST_CASE(a_checkpoint_of_one_policy_loads_into_another) {
  // masters are fp32 under every policy: fp16 -> fp32 ignores the scaler's state, fp32 -> fp16
  // starts the scaler afresh, bf16 -> fp16 likewise; the variables and the step come across
  g::variable<"w", float, n> w;
  g::placeholder<"c", float, n> c;
  const auto dir = std::filesystem::temp_directory_path() / ("gradus_policies_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::vector<float> w0(n), c0(n, 0.5f);
  for (g::index_t i = 0; i < n; ++i) w0[i] = 0.1f * static_cast<float>(i);
  auto train_and_save = [&]<class P>(const std::string& name) {
    g::session<g::cpu_simd, P> s;
    g::assign(s, w, g::view(w0.data(), {n}));
    auto step = g::minimize(s, g::sum(w * c), g::sgd{.lr = 0.25}, w);
    step.run(c = g::view(c0.data(), {n}));
    g::save_checkpoint(s, dir / name);
  };
  train_and_save.template operator()<g::mixed_fp16>("fp16.npz");
  train_and_save.template operator()<g::full_precision>("fp32.npz");
  train_and_save.template operator()<g::mixed_bf16>("bf16.npz");
  auto check = [&](auto& s, const std::string& from) {
    BOOST_TEST(s.global_step() == 1, from);
    const auto v = g::value(s, w);
    for (g::index_t i = 0; i < n; ++i) BOOST_TEST(v.data()[i] == w0[i] - 0.25f * 0.5f, from << " element " << i);
  };
  {
    g::session<g::cpu_simd> s;
    auto step = g::minimize(s, g::sum(w * c), g::sgd{.lr = 0.25}, w);
    g::restore_checkpoint(s, dir / "fp16.npz");
    check(s, "fp16 -> fp32");
  }
  for (const char* from : {"fp32.npz", "bf16.npz"}) {
    g::session<g::cpu_simd, g::mixed_fp16> s;
    auto step = g::minimize(s, g::sum(w * c), g::sgd{.lr = 0.25}, w);
    g::restore_checkpoint(s, dir / from);
    check(s, from);
    step.run(c = g::view(c0.data(), {n}));
    BOOST_TEST(step.loss_scale() == 65536.0, from);  // the scaler starts afresh
  }
  // the policy is recorded: element_type's value of the compute type
  for (const auto& [file, want] : {std::pair{"fp16.npz", g::element_type::f16}, {"fp32.npz", g::element_type::f32},
                                   {"bf16.npz", g::element_type::bf16}}) {
    std::int64_t got = -1;
    for (const auto& a : g::io::read_npz(dir / file))
      if (a.name == g::precision_key) std::memcpy(&got, a.bytes.data(), sizeof got);
    BOOST_TEST(got == static_cast<std::int64_t>(want), file);
  }
  std::filesystem::remove_all(dir);
}
