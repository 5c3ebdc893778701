#define BOOST_TEST_MODULE train_optimizers
// Each optimizer against an independent reference: the update written out in plain
// double-precision loops from the formulas PyTorch documents (SGD, momentum, Nesterov,
// Adam, AdamW) and TensorFlow's clip_by_global_norm. The loss sum(w * c) + sum(u * d)
// has the fed tensors c and d as its gradients, so each step's gradient is chosen by the
// test. Sizes: 37 (SIMD batches and a scalar tail) and 70001 (the threaded path).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/util/trace.hpp>

namespace g = gradus;

namespace {

constexpr g::index_t n_small = 37, n_big = 70001;
constexpr int steps = 12;

struct reference_state {
  std::vector<double> w, m, v;
};

// One reference update of all variables; grads already scaled by the clip factor.
using rule = std::function<void(reference_state&, const std::vector<double>& g, int step)>;

template <class T>
struct harness {
  g::variable<"w", T, n_small> w;
  g::variable<"u", T, n_big> u;
  g::placeholder<"c", T, n_small> c;
  g::placeholder<"d", T, n_big> d;
  std::mt19937_64 rng{7};

  std::vector<T> random(g::index_t n, double scale) {
    std::normal_distribution<double> nd(0, scale);
    std::vector<T> r(static_cast<std::size_t>(n));
    for (auto& x : r) x = static_cast<T>(nd(rng));
    return r;
  }

  // Runs `steps` steps with gradients scaled by grad_scale; compares with the reference.
  template <class Opt>
  void check(const Opt& opt, const rule& ref, double clip, double grad_scale, double tol) {
    g::session<g::cpu_simd> s;
    auto w0 = random(n_small, 1), u0 = random(n_big, 1);
    g::assign(s, w, g::view(w0.data(), {n_small}));
    g::assign(s, u, g::view(u0.data(), {n_big}));
    auto loss = g::sum(w * c) + g::sum(u * d);
    auto step = g::minimize(s, loss, opt, w, u);

    reference_state rw{{w0.begin(), w0.end()}, std::vector<double>(n_small), std::vector<double>(n_small)};
    reference_state ru{{u0.begin(), u0.end()}, std::vector<double>(n_big), std::vector<double>(n_big)};
    for (int k = 0; k < steps; ++k) {
      auto gc = random(n_small, grad_scale), gd = random(n_big, grad_scale);
      step.run(c = g::view(gc.data(), {n_small}), d = g::view(gd.data(), {n_big}));
      std::vector<double> dc(gc.begin(), gc.end()), dd(gd.begin(), gd.end());
      if (clip > 0) {
        double sq = 0;
        for (double x : dc) sq += x * x;
        for (double x : dd) sq += x * x;
        const double norm = std::sqrt(sq);
        BOOST_TEST(step.last_global_norm() == norm, boost::test_tools::tolerance(1e-5));
        const double f = clip / std::max(norm, clip);
        for (double& x : dc) x *= f;
        for (double& x : dd) x *= f;
      }
      ref(rw, dc, k);
      ref(ru, dd, k);
    }
    BOOST_TEST(s.global_step() == steps);
    auto cmp = [&](g::tensor_view<const T> got, const std::vector<double>& want) {
      double worst = 0;
      for (std::size_t i = 0; i < want.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(got[static_cast<g::index_t>(i)]) - want[i]) /
                                    std::max(1.0, std::abs(want[i])));
      BOOST_TEST(worst < tol);
    };
    cmp(g::value(s, w), rw.w);
    cmp(g::value(s, u), ru.w);
    // the update moved the values: a no-op optimizer fails here
    double moved = 0;
    for (std::size_t i = 0; i < w0.size(); ++i) moved = std::max(moved, std::abs(static_cast<double>(g::value(s, w)[static_cast<g::index_t>(i)]) - w0[i]));
    BOOST_TEST(moved > 1e-3);
  }
};

rule sgd_ref(std::function<double(int)> lr, double mu, bool nesterov, double wd) {
  return [=](reference_state& s, const std::vector<double>& gr, int k) {
    for (std::size_t i = 0; i < gr.size(); ++i) {
      const double dp = gr[i] + wd * s.w[i];
      if (mu == 0) {
        s.w[i] -= lr(k) * dp;
        continue;
      }
      s.m[i] = mu * s.m[i] + dp;  // PyTorch: buf = momentum * buf + d_p (first step: buf = d_p)
      s.w[i] -= lr(k) * (nesterov ? dp + mu * s.m[i] : s.m[i]);
    }
  };
}

rule adam_ref(double lr, double b1, double b2, double eps, double wd, bool decoupled) {
  return [=](reference_state& s, const std::vector<double>& gr, int k) {
    const double t = k + 1;
    for (std::size_t i = 0; i < gr.size(); ++i) {
      double gi = gr[i];
      if (decoupled) s.w[i] *= 1 - lr * wd;
      else gi += wd * s.w[i];
      s.m[i] = b1 * s.m[i] + (1 - b1) * gi;
      s.v[i] = b2 * s.v[i] + (1 - b2) * gi * gi;
      const double mhat = s.m[i] / (1 - std::pow(b1, t)), vhat = s.v[i] / (1 - std::pow(b2, t));
      s.w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  };
}

template <class T>
constexpr double tol() {
  return std::is_same_v<T, float> ? 2e-5 : 1e-12;
}

using types = std::tuple<float, double>;

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(plain_sgd, T, types) {
  harness<T>{}.check(g::sgd{.lr = 0.1}, sgd_ref([](int) { return 0.1; }, 0, false, 0), 0, 1, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sgd_weight_decay, T, types) {
  harness<T>{}.check(g::sgd{.lr = 0.05, .weight_decay = 0.01}, sgd_ref([](int) { return 0.05; }, 0, false, 0.01), 0,
                     1, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(momentum, T, types) {
  harness<T>{}.check(g::sgd{.lr = 0.05, .momentum = 0.9}, sgd_ref([](int) { return 0.05; }, 0.9, false, 0), 0, 1,
                     tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(nesterov_with_decay, T, types) {
  harness<T>{}.check(g::sgd{.lr = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 1e-3},
                     sgd_ref([](int) { return 0.05; }, 0.8, true, 1e-3), 0, 1, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(adam, T, types) {
  harness<T>{}.check(g::adam{.lr = 0.01}, adam_ref(0.01, 0.9, 0.999, 1e-8, 0, false), 0, 1, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(adam_l2, T, types) {
  harness<T>{}.check(g::adam{.lr = 0.02, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 0.05},
                     adam_ref(0.02, 0.8, 0.99, 1e-6, 0.05, false), 0, 1, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(adamw, T, types) {
  // default weight decay 0.01, as PyTorch's AdamW
  harness<T>{}.check(g::adamw{.lr = 0.01}, adam_ref(0.01, 0.9, 0.999, 1e-8, 0.01, true), 0, 1, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(clipping_by_global_norm, T, types) {
  // gradients of norm ~ sqrt(70038) * 0.5 = 132, clipped to 5: the clipped update differs
  // from the unclipped one by a factor of ~26
  harness<T>{}.check(g::sgd{.lr = 0.1, .momentum = 0.5, .clip_global_norm = 5},
                     sgd_ref([](int) { return 0.1; }, 0.5, false, 0), 5, 0.5, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(clipping_inactive_below_the_norm, T, types) {
  // norm ~ 132 * 1e-3 < 10: no scaling
  harness<T>{}.check(g::adam{.lr = 0.01, .clip_global_norm = 10}, adam_ref(0.01, 0.9, 0.999, 1e-8, 0, false), 10,
                     1e-3, tol<T>());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(scheduled_learning_rate, T, types) {
  auto sched = g::step_lr(0.1, 4, 0.5);
  harness<T>{}.check(g::sgd{.lr = sched, .momentum = 0.9},
                     sgd_ref([](int k) { return 0.1 * std::pow(0.5, k / 4); }, 0.9, false, 0), 0, 1, tol<T>());
}

BOOST_AUTO_TEST_CASE(state_lives_in_the_session_by_name) {
  g::variable<"layer/w", float, 3> w;
  g::placeholder<"c", float, 3> c;
  g::session<g::cpu_simd> s;
  const std::vector<float> w0{1, 2, 3}, gc{0.5f, -1, 2};
  g::assign(s, w, g::view(w0.data(), {3}));
  auto step = g::minimize(s, g::sum(w * c), g::adam{.lr = 0.1}, w);
  std::vector<std::string> names;
  for (const auto& e : s.entries()) names.emplace_back(e.name);
  BOOST_TEST(names == (std::vector<std::string>{"layer/w", "layer/w/adam_m", "layer/w/adam_v"}),
             boost::test_tools::per_element());
  step.run(c = g::view(gc.data(), {3}));
  // after one step: m = (1 - 0.9) g, v = (1 - 0.999) g^2 (the factors rounded to float)
  const float* m = s.data<float>("layer/w/adam_m");
  const float* v = s.data<float>("layer/w/adam_v");
  for (int i = 0; i < 3; ++i) {
    BOOST_TEST(m[i] == 0.1f * gc[static_cast<std::size_t>(i)], boost::test_tools::tolerance(1e-6f));
    BOOST_TEST(v[i] == (1 - 0.999f) * gc[static_cast<std::size_t>(i)] * gc[static_cast<std::size_t>(i)],
               boost::test_tools::tolerance(1e-5f));
  }
}

BOOST_AUTO_TEST_CASE(gradient_that_is_another_trained_variable) {
  // d(sum(a*b))/da = b and /db = a: each update must read the other's value from before
  // the step, not the freshly updated one.
  g::variable<"a", double, 5> a;
  g::variable<"b", double, 5> b;
  g::session<g::cpu_simd> s;
  const std::vector<double> a0{1, 2, 3, 4, 5}, b0{-1, 0.5, 2, -3, 1};
  g::assign(s, a, g::view(a0.data(), {5}));
  g::assign(s, b, g::view(b0.data(), {5}));
  auto step = g::minimize(s, g::sum(a * b), g::sgd{.lr = 0.1}, a, b);
  step.run();
  for (std::size_t i = 0; i < 5; ++i) {
    BOOST_TEST(g::value(s, a)[static_cast<g::index_t>(i)] == a0[i] - 0.1 * b0[i]);
    BOOST_TEST(g::value(s, b)[static_cast<g::index_t>(i)] == b0[i] - 0.1 * a0[i]);
  }
}

BOOST_AUTO_TEST_CASE(errors_name_what_is_wrong) {
  g::variable<"w", float, 3> w;
  g::placeholder<"c", float, 3> c;
  g::session<g::cpu_simd> s;
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const g::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BOOST_TEST(msg([&] { g::sgd{.lr = 0.1, .momentum = 1.5}.validate(); }).find("sgd: momentum = 1.5") !=
             std::string::npos);
  BOOST_TEST(msg([&] { g::adam{.beta2 = 1.0}.validate(); }).find("adam: beta2") != std::string::npos);
  BOOST_TEST(msg([&] { g::sgd{.lr = -1.0}.validate(); }).find("learning rate must be a finite number >= 0") != std::string::npos);
  BOOST_TEST(msg([&] { g::sgd{.lr = 0.1, .nesterov = true}.validate(); }).find("nesterov needs momentum") !=
             std::string::npos);
  auto step = g::minimize(s, g::sum(w * c), g::sgd{.lr = 0.1}, w);
  const std::vector<float> gc{1, 2, 3};
  // declared by minimize, never given a value
  BOOST_TEST(msg([&] { step.run(c = g::view(gc.data(), {3})); }).find("variable 'w' of shape (3,)") !=
             std::string::npos);
  BOOST_TEST(msg([&] { step.apply_gradients(); }).find("no gradients") != std::string::npos);
  BOOST_TEST(s.global_step() == 0);
}

BOOST_AUTO_TEST_CASE(variables_deduced_from_the_loss) {
  // minimize(s, loss, opt) trains every variable the loss reads, each once, in order of
  // first appearance; naming them explicitly instead trains only those.
  g::placeholder<"x", double, g::dyn, 2> x;
  g::variable<"w", double, 2, 1> w;
  g::variable<"b", double, 1> b;
  const auto loss = g::sum(g::square(g::matmul(x, w) + b)) + 0.5 * g::sum(w * w);
  static_assert(std::is_same_v<g::variables_of_t<std::remove_cvref_t<decltype(loss)>>, std::tuple<decltype(w), decltype(b)>>);
  const std::vector<double> xs{1, 2, 3, 4};
  for (int explicit_w_only = 0; explicit_w_only < 2; ++explicit_w_only) {
    g::session<g::cpu_simd> s;
    g::initialize(s, w, g::init::constant{1}, 0);
    g::initialize(s, b, g::init::constant{1}, 0);
    // d/dw = 2 x^T (xw + b) + w = 2 [1 3; 2 4] [4; 8] + 1 = [57; 81]; d/db = 2 (4 + 8) = 24
    if (explicit_w_only) g::minimize(s, loss, g::sgd{.lr = 0.01}, w).run(x = g::view(xs.data(), {2, 2}));
    else g::minimize(s, loss, g::sgd{.lr = 0.01}).run(x = g::view(xs.data(), {2, 2}));
    BOOST_TEST(g::value(s, w)[0] == 1 - 0.01 * 57, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(g::value(s, w)[1] == 1 - 0.01 * 81, boost::test_tools::tolerance(1e-12));
    BOOST_TEST(g::value(s, b)[0] == (explicit_w_only ? 1 : 1 - 0.01 * 24), boost::test_tools::tolerance(1e-12));
  }
}

BOOST_AUTO_TEST_CASE(compute_then_apply) {
  // the split a data-parallel trainer uses: gradients are readable (and writable) between
  // compute_gradients and apply_gradients, and their norm is available without clipping
  g::placeholder<"x", double, g::dyn, 2> x;
  g::variable<"w", double, 2, 1> w;
  g::variable<"b", double, 1> b;
  const auto loss = g::sum(g::square(g::matmul(x, w) + b)) + 0.5 * g::sum(w * w);
  const std::vector<double> xs{1, 2, 3, 4};
  g::session<g::cpu_simd> s;
  g::initialize(s, w, g::init::constant{1}, 0);
  g::initialize(s, b, g::init::constant{1}, 0);
  auto step = g::minimize(s, loss, g::sgd{.lr = 0.01});
  const double l = step.compute_gradients(x = g::view(xs.data(), {2, 2}));
  BOOST_TEST(l == 16 + 64 + 1);  // (1+2+1)^2 + (3+4+1)^2 + 0.5 * 2
  BOOST_TEST(step.gradient_norm() == std::sqrt(57.0 * 57 + 81 * 81 + 24 * 24), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(step.gradients().size() == 2u);
  BOOST_TEST(step.gradients()[0].name == "w");
  BOOST_TEST((step.gradients()[1].dtype == g::element_type::f64));
  static_cast<double*>(step.gradients()[1].data)[0] = 100;  // as an all-reduce would write
  step.apply_gradients();
  BOOST_TEST(g::value(s, b)[0] == 1 - 0.01 * 100, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(s.global_step() == 1);
}

// A training step under a trace recorder (util/trace.hpp): each step begins a step of the
// ring buffer, and its forward and backward pass, its kernels (named after their nodes) and
// its update are spans; no recorder installed, the same step records nothing.
BOOST_AUTO_TEST_CASE(a_traced_step_records_its_passes_kernels_and_update) {
  g::placeholder<"x", float, g::dyn, 3> x;
  g::variable<"w", float, 3, 2> w;
  g::session<g::cpu_simd> s;
  const std::vector<float> w0{1, -1, 0.5f, 2, -2, 1}, xs{1, 2, 3, -1, 0, 4};
  g::assign(s, w, g::view(w0.data(), {3, 2}));
  auto step = g::minimize(s, g::sum(g::square(g::matmul(x, w))), g::sgd{.lr = 0.01}, w);
  step.run(x = g::view(xs.data(), {2, 3}));  // untraced
  const auto dir = std::filesystem::temp_directory_path() / ("gradus_step_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string text;
  {
    g::util::trace_recorder rec({.path = dir / "t.json", .keep_steps = 10});
    {
      const g::util::trace_install on(rec);
      for (int i = 0; i < 3; ++i) step.run(x = g::view(xs.data(), {2, 3}));
    }
    step.run(x = g::view(xs.data(), {2, 3}));  // uninstalled again: not recorded
    text = rec.json();
  }
  std::filesystem::remove_all(dir);
  auto count = [&](const std::string& needle) {
    std::size_t n = 0;
    for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  };
  BOOST_TEST(count("\"name\":\"forward and backward\"") == 3u);
  BOOST_TEST(count("\"name\":\"optimizer update\"") == 3u);
  BOOST_TEST(count("\"cat\":\"compute\"") >= 3u * 3);  // the product, its two gradients' products...
  BOOST_TEST(count("matmul") >= 3u);                    // ...named after their nodes
  BOOST_TEST(text.find("\"steps_seen\":3,") != std::string::npos);
  BOOST_TEST(text.find("\"last_step\":3,") != std::string::npos);  // global steps 1, 2, 3 (step 0 untraced)
}
