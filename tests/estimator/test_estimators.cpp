#define BOOST_TEST_MODULE estimator_estimators
// The premade models: what they learn against independent references (least squares by
// normal equations, a function the test knows), the gain of hidden layers on a problem a
// linear model cannot solve, checkpoints and resuming (bit-identical to an uninterrupted
// run), the communicator wiring (a counting test double), data-parallel training on two
// ranks (threads) bit-identical to the per-gradient average of a hand-written loop, and bad
// input.
#include <boost/test/unit_test.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/estimator/estimators.hpp>
#include <gradus/gradus.hpp>

#include "../parallel/thread_comm.hpp"

namespace g = gradus;

namespace {

struct data2 {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  g::index_t n;
  g::tensor_view<const float> xv(g::index_t in) const { return {x.data(), g::dims{std::array<g::index_t, 2>{n, in}}}; }
  g::tensor_view<const std::int32_t> yv() const { return {y.data(), g::dims{std::array<g::index_t, 1>{n}}}; }
};

// Two interleaved half-moons with noise: not linearly separable (a line gets ~85-88%).
data2 moons(g::index_t n, std::uint32_t seed) {
  std::mt19937 r(seed);
  std::uniform_real_distribution<double> u(0, 3.14159265358979);
  std::normal_distribution<double> noise(0, 0.1);
  data2 d{{}, {}, n};
  for (g::index_t i = 0; i < n; ++i) {
    const double t = u(r);
    const int c = static_cast<int>(i % 2);
    const double px = c ? 1 - std::cos(t) : std::cos(t), py = c ? 0.5 - std::sin(t) : std::sin(t);
    d.x.push_back(static_cast<float>(px + noise(r)));
    d.x.push_back(static_cast<float>(py + noise(r)));
    d.y.push_back(c);
  }
  return d;
}

// Solves the symmetric system A x = b (A k x k) by Gaussian elimination with pivoting.
std::vector<double> solve(std::vector<double> a, std::vector<double> b, std::size_t k) {
  for (std::size_t c = 0; c < k; ++c) {
    std::size_t p = c;
    for (std::size_t r = c + 1; r < k; ++r)
      if (std::abs(a[r * k + c]) > std::abs(a[p * k + c])) p = r;
    for (std::size_t j = 0; j < k; ++j) std::swap(a[c * k + j], a[p * k + j]);
    std::swap(b[c], b[p]);
    for (std::size_t r = c + 1; r < k; ++r) {
      const double f = a[r * k + c] / a[c * k + c];
      for (std::size_t j = c; j < k; ++j) a[r * k + j] -= f * a[c * k + j];
      b[r] -= f * b[c];
    }
  }
  std::vector<double> x(k);
  for (std::size_t c = k; c-- > 0;) {
    double s = b[c];
    for (std::size_t j = c + 1; j < k; ++j) s -= a[c * k + j] * x[j];
    x[c] = s / a[c * k + c];
  }
  return x;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto d = std::filesystem::temp_directory_path() / ("gradus_estimator_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d;
}

// A world of two whose other rank always holds the same gradients as this one (so the
// average is the identity), counting what the trainer asks of it.
struct counting_comm {
  int allreduces = 0, broadcasts = 0, barriers = 0, sums = 0;
  std::size_t reduced_values = 0;
  int rank() const { return 0; }
  int world_size() const { return 2; }
  // The gradients (float) are averaged, never summed; the run fingerprint gathers where each
  // rank differs from rank 0 through a sum of one double per rank.
  void allreduce_sum(std::span<float>) { throw g::error("counting_comm: the trainer averages, it never sums"); }
  void allreduce_sum(std::span<double> v) {
    if (v.size() != 2) throw g::error("counting_comm: a sum of " + std::to_string(v.size()) + " doubles");
    ++sums;
  }
  template <class T>
  void allreduce_average(std::span<T> v) {
    ++allreduces;
    reduced_values += v.size();
  }
  template <class T>
  void broadcast(std::span<T>, int) {
    ++broadcasts;
  }
  void barrier() { ++barriers; }
};
static_assert(g::parallel::communicator<counting_comm>);

}  // namespace

BOOST_AUTO_TEST_CASE(linear_regressor_matches_least_squares) {
  // y = x . (0.5, -1, 2) + 0.3 + N(0, 0.05^2)
  const g::index_t n = 2000;
  std::mt19937 r(11);
  std::normal_distribution<double> nd(0, 1), noise(0, 0.05);
  std::vector<float> x, y;
  for (g::index_t i = 0; i < n; ++i) {
    double t = 0.3;
    const double w[3] = {0.5, -1, 2};
    for (double wj : w) {
      const double v = nd(r);
      x.push_back(static_cast<float>(v));
      t += wj * v;
    }
    y.push_back(static_cast<float>(t + noise(r)));
  }
  // the least-squares fit of [x, 1] by the normal equations, in double
  std::vector<double> ata(16, 0), aty(4, 0);
  for (g::index_t i = 0; i < n; ++i) {
    const double row[4] = {x[i * 3], x[i * 3 + 1], x[i * 3 + 2], 1};
    for (int a = 0; a < 4; ++a) {
      aty[a] += row[a] * y[i];
      for (int b = 0; b < 4; ++b) ata[a * 4 + b] += row[a] * row[b];
    }
  }
  const auto ls = solve(ata, aty, 4);

  g::linear_regressor<3, 1, g::cpu_simd, g::parallel::local, g::sgd> m({.seed = 3, .batch_size = 32}, g::sgd{.lr = 0.02});
  const g::tensor_view<const float> xv{x.data(), g::dims{std::array<g::index_t, 2>{n, 3}}};
  const g::tensor_view<const float> yv{y.data(), g::dims{std::array<g::index_t, 1>{n}}};
  const auto tr = m.train(xv, yv, 15);
  BOOST_TEST(tr.global_step == 15 * 63);  // ceil(2000 / 32) steps an epoch
  BOOST_TEST(tr.examples == 15 * n);
  const auto w = g::value(m.get_session(), g::variable<"linear/linear_model/w", float, 3, 1>{});
  const auto b = g::value(m.get_session(), g::variable<"linear/linear_model/b", float, 1>{});
  for (int j = 0; j < 3; ++j) BOOST_TEST(std::abs(w[j] - ls[static_cast<std::size_t>(j)]) < 0.01, "w[" << j << "] " << w[j] << " vs " << ls[j]);
  BOOST_TEST(std::abs(b[0] - ls[3]) < 0.01);
  const auto ev = m.evaluate(xv, yv);
  BOOST_TEST(ev.mse > 0.0025 * 0.8);  // the noise variance, which no fit can beat by much
  BOOST_TEST(ev.mse < 0.0025 * 1.3);
  // evaluate's mse is the mean squared error of predict's outputs
  const auto p = m.predict(xv);
  BOOST_REQUIRE(p.size() == static_cast<std::size_t>(n));
  double se = 0, ae = 0;
  for (g::index_t i = 0; i < n; ++i) se += std::pow(double(p[i]) - y[i], 2), ae += std::abs(double(p[i]) - y[i]);
  BOOST_TEST(std::abs(ev.mse - se / n) < 1e-6);
  BOOST_TEST(std::abs(ev.mae - ae / n) < 1e-6);
}

BOOST_AUTO_TEST_CASE(hidden_layers_solve_what_a_line_cannot) {
  const auto train = moons(1000, 5), test = moons(1000, 6);
  g::dnn_classifier<2, g::hidden<32, 32>, 2> dnn({.seed = 1, .batch_size = 32}, g::adam{.lr = 0.01});
  g::linear_classifier<2, 2> lin({.seed = 1, .batch_size = 32}, g::adam{.lr = 0.01});
  dnn.train(train.xv(2), train.yv(), 40);
  lin.train(train.xv(2), train.yv(), 40);
  const auto ed = dnn.evaluate(test.xv(2), test.yv()), el = lin.evaluate(test.xv(2), test.yv());
  BOOST_TEST_MESSAGE("moons: dnn accuracy " << ed.accuracy << ", linear " << el.accuracy);
  BOOST_TEST(ed.accuracy > 0.97);
  BOOST_TEST(el.accuracy < 0.92);
  BOOST_TEST(ed.loss < el.loss);
  // predict_proba: rows are distributions whose argmax is predict's class
  const auto proba = dnn.predict_proba(test.xv(2));
  const auto cls = dnn.predict(test.xv(2));
  BOOST_REQUIRE(proba.size() == 2u * cls.size());
  for (std::size_t i = 0; i < cls.size(); ++i) {
    BOOST_TEST(std::abs(proba[2 * i] + proba[2 * i + 1] - 1.0f) < 1e-5f);
    BOOST_TEST(cls[i] == (proba[2 * i + 1] > proba[2 * i] ? 1 : 0));
  }
}

BOOST_AUTO_TEST_CASE(dnn_regressor_fits_a_sine) {
  const g::index_t n = 1000;
  std::vector<float> x, y;
  std::mt19937 r(4);
  std::uniform_real_distribution<double> u(-3, 3);
  for (g::index_t i = 0; i < n; ++i) {
    const double v = u(r);
    x.push_back(static_cast<float>(v));
    y.push_back(static_cast<float>(std::sin(v)));
  }
  // The learning rate anneals to 0 (cosine over the 60 epochs x 32 steps): with a constant
  // 0.01 the last iterate bounces, and its grid mse ranged 0.00007-0.0126 over seeds and
  // over one-ulp changes of the arithmetic; annealed, it is 0.00001-0.0005 for seeds 1-6.
  g::dnn_regressor<1, g::hidden<32, 32>> m({.seed = 2, .batch_size = 32},
                                           g::adam{.lr = g::lr_schedule::cosine(0.01, 60 * 32)});
  const g::tensor_view<const float> xv{x.data(), g::dims{std::array<g::index_t, 2>{n, 1}}};
  const g::tensor_view<const float> yv{y.data(), g::dims{std::array<g::index_t, 2>{n, 1}}};
  m.train(xv, yv, 60);
  // on a grid the training never saw
  std::vector<float> gx, gy;
  for (int i = 0; i <= 100; ++i) gx.push_back(static_cast<float>(-2.9 + 5.8 * i / 100)), gy.push_back(std::sin(gx.back()));
  const auto e = m.evaluate({gx.data(), g::dims{std::array<g::index_t, 2>{101, 1}}}, {gy.data(), g::dims{std::array<g::index_t, 1>{101}}});
  BOOST_TEST_MESSAGE("sine: grid mse " << e.mse << ", mae " << e.mae);
  BOOST_TEST(e.mse < 0.01);
}

BOOST_AUTO_TEST_CASE(dataset_and_arrays_train_alike) {
  const auto d = moons(300, 9);
  g::dnn_classifier<2, g::hidden<8>, 2> a({.seed = 4, .batch_size = 16}, g::adam{.lr = 0.01});
  g::dnn_classifier<2, g::hidden<8>, 2> b({.seed = 4, .batch_size = 16}, g::adam{.lr = 0.01});
  a.train(d.xv(2), d.yv(), 3);
  b.train(g::data::dataset(d.x, g::dims{std::array<g::index_t, 1>{2}}, d.y), 3);
  const auto pa = a.predict_proba(d.xv(2)), pb = b.predict_proba(d.xv(2));
  BOOST_TEST(pa == pb);  // the same shuffles, the same batches: the same bits
  BOOST_TEST(a.global_step() == b.global_step());
}

BOOST_AUTO_TEST_CASE(checkpoints_restore_and_resume) {
  const auto d = moons(400, 3);
  const auto dir_a = fresh_dir("a"), dir_b = fresh_dir("b");
  std::vector<float> straight, resumed;
  {
    g::dnn_classifier<2, g::hidden<16>, 2> m({.seed = 7, .batch_size = 32, .model_dir = dir_a}, g::adam{.lr = 0.01});
    m.train(d.xv(2), d.yv(), 2);  // 2 epochs in one call
    straight = m.predict_proba(d.xv(2));
    BOOST_TEST(std::filesystem::exists(dir_a / "model.npz"));
  }
  {
    // a new estimator on the same directory restores it: same step, same predictions
    g::dnn_classifier<2, g::hidden<16>, 2> m({.seed = 99, .batch_size = 32, .model_dir = dir_a}, g::adam{.lr = 0.01});
    BOOST_TEST(m.global_step() == 2 * 13);
    BOOST_TEST(m.predict_proba(d.xv(2)) == straight);
  }
  {
    g::dnn_classifier<2, g::hidden<16>, 2> m({.seed = 7, .batch_size = 32, .model_dir = dir_b}, g::adam{.lr = 0.01});
    m.train(d.xv(2), d.yv(), 1);
  }
  {
    // resumed: epoch 2 shuffles as epoch 2 of the straight run (from the global step)
    g::dnn_classifier<2, g::hidden<16>, 2> m({.seed = 7, .batch_size = 32, .model_dir = dir_b}, g::adam{.lr = 0.01});
    m.train(d.xv(2), d.yv(), 1);
    resumed = m.predict_proba(d.xv(2));
  }
  BOOST_TEST(resumed == straight);
  std::filesystem::remove_all(dir_a);
  std::filesystem::remove_all(dir_b);
}

BOOST_AUTO_TEST_CASE(communicator_policy_is_used) {
  const auto d = moons(200, 8);
  using model = g::dnn_classifier<2, g::hidden<4>, 2, g::cpu_simd, counting_comm>;
  // every gradient its own bucket (1 byte: each gradient alone exceeds it)
  model m({.seed = 1, .batch_size = 10, .data_parallel = {.bucket_bytes = 1}});
  // the run fingerprint (its length and bytes from rank 0, one sum), then rank 0 broadcast
  // every tensor of the session (4 variables + Adam's 2 slots each) and its global step
  BOOST_TEST(m.communicator().sums == 1);
  BOOST_TEST(m.communicator().broadcasts == 2 + 13);
  m.train(d.xv(2), d.yv(), 1);
  // rank 0 of 2 trains on every other example: 100 examples, 10 steps, 4 gradients each
  BOOST_TEST(m.global_step() == 10);
  BOOST_TEST(m.communicator().allreduces == 40);
  BOOST_TEST(m.communicator().reduced_values == 10u * (2 * 4 + 4 + 4 * 2 + 2));
  BOOST_TEST(m.communicator().sums == 1);
  BOOST_TEST(m.communicator().broadcasts == 2 + 13);  // nothing broadcast again
  // by default the 4 gradients share one bucket: one average a step, the same values
  model one({.seed = 1, .batch_size = 10});
  one.train(d.xv(2), d.yv(), 1);
  BOOST_TEST(one.communicator().allreduces == 10);
  BOOST_TEST(one.communicator().reduced_values == 10u * (2 * 4 + 4 + 4 * 2 + 2));
}

namespace {

// Every tensor of a session (variables, optimizer state) by name, as bytes, and the step.
std::map<std::string, std::vector<unsigned char>> tensors(g::session<g::cpu_simd>& s) {
  std::map<std::string, std::vector<unsigned char>> out;
  for (const auto& e : s.entries()) {
    const auto* p = static_cast<const unsigned char*>(e.data);
    out[std::string(e.name)].assign(p, p + e.shape.numel() * static_cast<g::index_t>(g::size_of(e.dtype)));
  }
  out["global_step"].resize(sizeof(std::int64_t));
  const std::int64_t step = s.global_step();
  std::memcpy(out["global_step"].data(), &step, sizeof step);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_ranks_train_as_a_hand_written_loop_averaging_each_gradient) {
  // The estimator on 2 ranks (threads) against the loop estimators ran before they trained
  // through the data-parallel step: the same model built by hand (the layers' documented
  // names and initializers), compute_gradients, each gradient averaged over the ranks
  // through the same communicator, apply_gradients. Averages of two are exact up to one
  // rounding whatever groups them, so the bits must agree, on both ranks.
  const auto d = moons(300, 12);
  const g::data::dataset ds(d.x, g::dims{std::array<g::index_t, 1>{2}}, d.y);
  constexpr int world = 2, epochs = 2;
  constexpr g::index_t batch = 16;
  constexpr std::uint64_t seed = 5;
  std::vector<std::map<std::string, std::vector<unsigned char>>> road(world), loop(world);
  std::vector<std::string> errors(2 * world);
  {
    gradus_test::board b(world, std::chrono::milliseconds(20000));
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r)
      ts.emplace_back([&, r] {
        try {
          g::dnn_classifier<2, g::hidden<8>, 2, g::cpu_simd, gradus_test::thread_comm> m(
              {.seed = seed, .batch_size = batch}, g::adam{.lr = 0.01}, gradus_test::thread_comm{&b, r});
          m.train(ds, epochs);
          road[static_cast<std::size_t>(r)] = tensors(m.get_session());
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    for (auto& t : ts) t.join();
  }
  {
    gradus_test::board b(world, std::chrono::milliseconds(20000));
    std::vector<std::thread> ts;
    for (int r = 0; r < world; ++r)
      ts.emplace_back([&, r] {
        try {
          gradus_test::thread_comm comm{&b, r};
          g::placeholder<"features", float, g::dyn, 2> x;
          g::placeholder<"labels", std::int32_t, g::dyn> y;
          g::nn::dense<"dnn/hiddenlayer_0", 2, 8, float> hidden;
          g::nn::dense<"dnn/logits", 8, 2, float> logits;
          const auto loss = g::nn::softmax_cross_entropy_loss(logits(g::relu(hidden(x))), y);
          g::session<g::cpu_simd> s;
          auto step = g::minimize(s, loss, g::adam{.lr = 0.01});
          hidden.initialize(s, seed);
          logits.initialize(s, seed, g::init::glorot_uniform{});
          for (int e = 0; e < epochs; ++e)
            for (auto [xb, yb] : ds.shuffle(seed, static_cast<std::uint64_t>(e)).shard(r, world).batch(batch)) {
              step.compute_gradients(x = g::tensor_view<const float>{xb.data(), g::dims{std::array<g::index_t, 2>{xb.shape().d[0], 2}}},
                                     y = yb);
              for (auto& gb : step.gradients())
                comm.allreduce_average(std::span<float>(static_cast<float*>(gb.data), static_cast<std::size_t>(gb.size)));
              step.apply_gradients();
            }
          loop[static_cast<std::size_t>(r)] = tensors(s);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(world + r)] = e.what();
        }
      });
    for (auto& t : ts) t.join();
  }
  for (const auto& e : errors) BOOST_REQUIRE_MESSAGE(e.empty(), e);
  BOOST_REQUIRE(loop[0].size() == 4 + 8 + 1u);  // 4 variables, Adam's 2 slots each, the step
  std::int64_t steps = 0;
  std::memcpy(&steps, road[0].at("global_step").data(), sizeof steps);
  BOOST_TEST(steps == epochs * 10);  // 150 examples a rank, batches of 16
  BOOST_TEST(loop[0].at("global_step") == road[0].at("global_step"));
  for (int r = 0; r < world; ++r)
    for (const auto& [name, bytes] : loop[0]) {
      BOOST_TEST_CONTEXT("rank " << r << ", " << name) {
        BOOST_REQUIRE(road[static_cast<std::size_t>(r)].count(name) == 1u);
        BOOST_TEST((road[static_cast<std::size_t>(r)].at(name) == bytes));
        BOOST_TEST((loop[static_cast<std::size_t>(r)].at(name) == bytes));
      }
    }
}

BOOST_AUTO_TEST_CASE(bad_input_names_what_is_wrong) {
  g::dnn_classifier<3, g::hidden<4>, 5> m;
  std::vector<float> x(12, 0.5f);
  std::vector<std::int32_t> y{0, 1, 7, 2};
  const auto msg = [](const std::string& want) {
    return [want](const g::error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return std::string(e.what()).find(want) != std::string::npos;
    };
  };
  BOOST_CHECK_EXCEPTION(m.train({x.data(), g::dims{std::array<g::index_t, 2>{3, 4}}}, {y.data(), g::dims{std::array<g::index_t, 1>{3}}}),
                        g::shape_error, msg("estimator::train: features of shape (3, 4), the model takes [n, 3]"));
  BOOST_CHECK_EXCEPTION(m.evaluate({x.data(), g::dims{std::array<g::index_t, 2>{4, 3}}}, {y.data(), g::dims{std::array<g::index_t, 1>{3}}}),
                        g::shape_error, msg("labels of shape (3,) for 4 examples"));
  BOOST_CHECK_EXCEPTION(m.train({x.data(), g::dims{std::array<g::index_t, 2>{4, 3}}}, {y.data(), g::dims{std::array<g::index_t, 1>{4}}}),
                        g::error, msg("label 7 of example 2 is not a class in [0, 5)"));
  // a dataset of 4-value examples for a 3-feature model: refused by train and evaluate alike
  // (evaluate used to read it as [m, 3] rows: past the batch's end, or examples mixed up)
  const g::data::dataset wide(std::vector<float>(12, 0.5f), g::dims{std::array<g::index_t, 1>{4}}, {0, 1, 2});
  BOOST_CHECK_EXCEPTION(m.train(wide), g::shape_error,
                        msg("estimator::train: the dataset's examples have shape (4,), the model takes 3 features"));
  BOOST_CHECK_EXCEPTION(m.evaluate(wide), g::shape_error,
                        msg("estimator::evaluate: the dataset's examples have shape (4,), the model takes 3 features"));
  BOOST_TEST(m.global_step() == 0);  // nothing trained on bad input
}
