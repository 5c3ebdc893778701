#define BOOST_TEST_MODULE train_optimizer_description
// train/optimizer_description.hpp: every optimizer, described by its settings() text and
// rebuilt from it, describes itself the same and applies bit-identical updates (float and
// double, at steps a schedule's changes fall between); text that is no setting is refused
// with the setting and its text named.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/train/optimizer_description.hpp>

namespace g = gradus;

namespace {

constexpr const char* who = "gradus: test";

// Runs opt's rule and the rebuilt one's over the same random weights, gradients and state,
// at several steps, and compares the bits.
template <class T, class Opt>
void check_same_updates(const Opt& opt, const g::any_optimizer& rebuilt) {
  constexpr g::index_t n = 70001;  // SIMD batches, a scalar tail and the threaded path
  std::mt19937_64 rng(11);
  std::normal_distribution<double> nd(0, 1);
  const auto random = [&] {
    std::vector<T> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = static_cast<T>(nd(rng));
    return v;
  };
  std::vector<T> w1 = random(), w2 = w1;
  std::vector<std::vector<T>> s1, s2;
  for (int k = 0; k < opt.slot_count(); ++k) s1.push_back(random());
  s2 = s1;
  for (const std::int64_t step : {0, 1, 99, 100, 150, 1919, 5000}) {
    const auto grad = random();
    std::vector<T*> p1, p2;
    for (auto& s : s1) p1.push_back(s.data());
    for (auto& s : s2) p2.push_back(s.data());
    opt.template apply<g::cpu_simd, T>(n, w1.data(), grad.data(), p1.data(), step, 0.75);
    rebuilt.visit([&](const auto& o) {
      BOOST_TEST((std::is_same_v<std::remove_cvref_t<decltype(o)>, Opt>));
      o.template apply<g::cpu_simd, T>(n, w2.data(), grad.data(), p2.data(), step, 0.75);
    });
    BOOST_TEST(std::memcmp(w1.data(), w2.data(), w1.size() * sizeof(T)) == 0, Opt::name << " weights at step " << step);
    for (std::size_t k = 0; k < s1.size(); ++k)
      BOOST_TEST(std::memcmp(s1[k].data(), s2[k].data(), s1[k].size() * sizeof(T)) == 0, Opt::name << " state " << k << " at step " << step);
  }
}

template <class Opt>
void check_round_trip(const Opt& opt) {
  const auto d = g::describe_optimizer(opt);
  BOOST_TEST(d.name == Opt::name);
  const g::any_optimizer rebuilt = g::optimizer_from_description(d.name, d.settings, who);
  const auto again = g::describe_optimizer(rebuilt);
  BOOST_TEST(again.name == d.name);
  BOOST_TEST((again.settings == d.settings));
  for (const auto& [setting, text] : d.settings)
    BOOST_TEST(again.settings.at(setting) == text, Opt::name << " " << setting);
  BOOST_TEST(rebuilt.name() == Opt::name);
  BOOST_TEST(rebuilt.slot_count() == opt.slot_count());
  for (int k = 0; k < opt.slot_count(); ++k) BOOST_TEST(rebuilt.slot_name(k) == opt.slot_name(k));
  check_same_updates<float>(opt, rebuilt);
  check_same_updates<double>(opt, rebuilt);
}

std::string message_of(const g::optimizer_settings& settings, const char* name = "sgd") {
  try {
    (void)g::optimizer_from_description(name, settings, who);
  } catch (const g::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

BOOST_AUTO_TEST_CASE(sgd_round_trips) {
  check_round_trip(g::sgd{});
  check_round_trip(g::sgd{.lr = 0.1 + 0.2, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-4});
  check_round_trip(g::sgd{.lr = g::step_lr(0.05, 100, 0.5), .momentum = 1.0 / 3, .clip_global_norm = 2.5});
}

BOOST_AUTO_TEST_CASE(adam_round_trips) {
  check_round_trip(g::adam{});
  check_round_trip(g::adam{.lr = g::exponential_lr(0.01, 0.96, 100, true), .beta1 = 0.85, .beta2 = 0.995, .eps = 1e-7, .weight_decay = 3e-4});
  check_round_trip(g::adam{.lr = g::exponential_lr(0.003, 0.5, 150), .eps = 1.0 / 7});
}

BOOST_AUTO_TEST_CASE(adamw_round_trips) {
  check_round_trip(g::adamw{});
  check_round_trip(g::adamw{.lr = g::cosine_lr(0.003, 1920, 100, 1e-5), .weight_decay = 0.05});
  check_round_trip(g::adamw{.lr = 2e-4, .beta2 = 0.98, .weight_decay = 0});
}

BOOST_AUTO_TEST_CASE(a_setting_left_out_keeps_the_optimizers_default) {
  BOOST_TEST((g::describe_optimizer(g::optimizer_from_description("adamw", {}, who)) == g::describe_optimizer(g::adamw{})));
  BOOST_TEST((g::describe_optimizer(g::optimizer_from_description("adam", {{"beta1", "0.5"}}, who)) ==
              g::describe_optimizer(g::adam{.beta1 = 0.5})));
  BOOST_TEST((g::describe_optimizer(g::optimizer_from_description("sgd", {{"nesterov", "true"}, {"momentum", "0.9"}}, who)) ==
              g::describe_optimizer(g::sgd{.momentum = 0.9, .nesterov = true})));
}

BOOST_AUTO_TEST_CASE(the_names_it_rebuilds) {
  BOOST_TEST(g::any_optimizer::names() == "sgd, adam, adamw");
  BOOST_TEST(g::any_optimizer::knows("adamw"));
  BOOST_TEST(!g::any_optimizer::knows("rmsprop"));
  BOOST_TEST(g::any_optimizer().name() == "sgd");
}

BOOST_AUTO_TEST_CASE(text_that_is_no_setting_is_refused_naming_it) {
  BOOST_TEST(message_of({{"momentum", "fast"}}) == "gradus: test: optimizer setting momentum = 'fast' is not a number");
  BOOST_TEST(message_of({{"momentum", "0.9x"}}) == "gradus: test: optimizer setting momentum = '0.9x' is not a number");
  BOOST_TEST(message_of({{"weight_decay", ""}}) == "gradus: test: optimizer setting weight_decay = '' is not a number");
  BOOST_TEST(message_of({{"nesterov", "yes"}}) == "gradus: test: optimizer setting nesterov = 'yes' is not true or false");
  const std::string not_a_schedule = "' is not a number or a schedule (step(...), exponential(...), cosine(...))";
  for (const std::string lr : {"fast", "cosine(lr=0.1)", "cosine(lr=0.1, total_steps=10, warmup_steps=0, min_lr=0, x=1)",
                               "step(lr=0.1, step_size=1.5, gamma=0.5)", "exponential(lr=0.1, decay_rate=0.5, decay_steps=3, staircase=1)",
                               "linear(lr=0.1)", "step(lr=0.1, step_size=10, gamma=0.5"})
    BOOST_TEST(message_of({{"lr", lr}}, "adam") == "gradus: test: optimizer setting lr = '" + lr + not_a_schedule);
  BOOST_TEST(message_of({{"beta1", "0.9"}}) ==
             "gradus: test: optimizer setting beta1 = '0.9' is not one of sgd's (lr, momentum, nesterov, weight_decay, clip_global_norm)");
  BOOST_TEST(message_of({}, "rmsprop") == "gradus: test: optimizer 'rmsprop' is not one of sgd, adam, adamw");
  // a value each field can hold is checked as the optimizer checks its own
  BOOST_TEST(message_of({{"beta2", "1"}}, "adamw").find("gradus: adamw: beta2 = 1") == 0u, message_of({{"beta2", "1"}}, "adamw"));
  BOOST_TEST(message_of({{"nesterov", "true"}}) == "gradus: sgd: nesterov needs momentum > 0");
  BOOST_TEST(message_of({{"lr", "step(lr=0.1, step_size=0, gamma=0.5)"}}) == "gradus: step_lr: step_size must be positive, got 0");
}
