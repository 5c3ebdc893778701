#define BOOST_TEST_MODULE nn_dropout_embedding
// dropout: mask values and keep fraction (statistical, 5 sigma), a new mask each training
// run, the same sequence for the same seed, identity in eval mode, gradient = upstream *
// mask of the same run. embedding: rows gathered, names, gradient by scatter-add.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace g = gradus;

namespace {
g::placeholder<"x", float, g::dyn> x;
constexpr g::index_t n = 100000;  // threaded mask (> 2^15)
}  // namespace

BOOST_AUTO_TEST_CASE(dropout_masks) {
  g::nn::dropout drop(0.3, 7), same(0.3, 7);
  g::session<g::cpu_simd> s;
  const std::vector<float> ones(n, 2.0f);
  auto run = [&](const g::nn::dropout& d) {
    const auto r = s.run(d(x), x = g::view(ones.data(), {n}));
    return std::vector<float>(r.begin(), r.end());
  };
  const auto m1 = run(drop), m2 = run(drop);
  std::size_t kept = 0;
  for (float v : m1) {
    BOOST_TEST_REQUIRE((v == 0.f || std::abs(v - 2.0f / 0.7f) < 1e-6f));
    kept += v != 0.f;
  }
  const double p = 0.7, sd = std::sqrt(p * (1 - p) / double(n));
  BOOST_TEST(std::abs(double(kept) / double(n) - p) < 5 * sd);
  BOOST_TEST((m1 != m2));  // a new mask each run
  BOOST_TEST(drop.draws() == 2u);
  // another object with the same seed: the same sequence
  BOOST_TEST((run(same) == m1));
  BOOST_TEST((run(same) == m2));
  // eval: identity, counter unchanged
  drop.eval();
  const auto e = run(drop);
  BOOST_TEST((e == ones));
  BOOST_TEST(drop.draws() == 2u);
  // resume: set_draws replays
  drop.train();
  drop.set_draws(1);
  BOOST_TEST((run(drop) == m2));
}

BOOST_AUTO_TEST_CASE(dropout_gradient_uses_the_runs_mask) {
  g::variable<"w", double, 1000> w;
  g::placeholder<"c", double, 1000> c;
  g::session<g::cpu_simd> s;
  g::initialize(s, w, g::init::uniform{0.5, 1.5}, 1);
  g::nn::dropout drop(0.5, 3);
  const auto y = drop(w);
  const auto dw = g::grad(g::sum(y * c), w);
  std::vector<double> cs(1000);
  for (std::size_t i = 0; i < cs.size(); ++i) cs[i] = std::cos(double(i));
  const auto [yv, gv] = s.run(y, dw, c = g::view(cs.data(), {1000}));
  std::size_t zeros = 0;
  for (g::index_t i = 0; i < 1000; ++i) {
    const double mask = yv[i] / g::value(s, w)[i];  // 0 or 2
    BOOST_TEST(gv[i] == mask * cs[static_cast<std::size_t>(i)], boost::test_tools::tolerance(1e-12));
    zeros += mask == 0;
  }
  BOOST_TEST(zeros > 400u);
  BOOST_TEST(zeros < 600u);
}

BOOST_AUTO_TEST_CASE(embedding_rows_and_gradient) {
  g::nn::embedding<"words", 5, 3, double> emb;
  static_assert(decltype(emb.table)::name.view() == "words/table");
  g::placeholder<"ids", std::int32_t, g::dyn> ids;
  g::session<g::cpu_simd> s;
  emb.initialize(s, 4);
  const std::vector<std::int32_t> iv{3, 0, 3};
  const std::vector<double> up{1, 2, 3, 4, 5, 6, 7, 8, 9};
  const auto e = emb(ids);
  g::placeholder<"up", double, g::dyn, 3> u;
  const auto dt = g::grad(g::sum(e * u), emb.table);
  const auto [ev, gv] = s.run(e, dt, ids = g::view(iv.data(), {3}), u = g::view(up.data(), {3, 3}));
  const auto t = g::value(s, emb.table);
  for (g::index_t r = 0; r < 3; ++r)
    for (g::index_t k = 0; k < 3; ++k) BOOST_TEST(ev[r * 3 + k] == t[iv[static_cast<std::size_t>(r)] * 3 + k]);
  // row 3 gets rows 0 and 2 of up; row 0 gets row 1; others zero
  const std::vector<double> want{4, 5, 6, 0, 0, 0, 0, 0, 0, 8, 10, 12, 0, 0, 0};
  BOOST_TEST(std::vector<double>(gv.begin(), gv.end()) == want, boost::test_tools::per_element());
}
