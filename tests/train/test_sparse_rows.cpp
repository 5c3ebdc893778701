#define BOOST_TEST_MODULE train_sparse_rows
// Sparse-row gradients (embedding_lookup / nn::embedding<..., Sparse = true>) in a
// train_step: the coalesced rows and indices it exposes against a hand-computed
// scatter-add; plain SGD equal to the dense path; momentum and Adam against an
// independent lazy reference (only the named rows and their state move, as TensorFlow's
// sparse apply ops and PyTorch's SparseAdam); clipping by the norm of the coalesced
// gradient; sparse_as_dense; reduce_gradients' error for a sparse gradient.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/dist/communicator.hpp>
#include <gradus/gradus.hpp>

namespace g = gradus;

namespace {

constexpr g::index_t vocab = 50, dim = 7, positions = 12;
g::placeholder<"ids", std::int32_t, g::dyn> ids;
g::placeholder<"c", double, g::dyn, dim> c;  // the loss' gradient w.r.t. each gathered row

// repeated rows (3, 17), first and last row, 9 distinct rows out of 50
const std::vector<std::int32_t> idx{3, 17, 0, 3, 49, 17, 8, 3, 21, 30, 0, 44};

std::vector<double> random_vec(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0, 1);
  std::vector<double> r(n);
  for (auto& x : r) x = nd(rng);
  return r;
}

// The reference: dense gradient rows of sum(lookup(table, idx) * c), summed in position order.
std::vector<double> dense_reference(const std::vector<std::int32_t>& ix, const std::vector<double>& cv) {
  std::vector<double> d(static_cast<std::size_t>(vocab * dim), 0.0);
  for (std::size_t p = 0; p < ix.size(); ++p)
    for (g::index_t j = 0; j < dim; ++j) d[static_cast<std::size_t>(ix[p] * dim + j)] += cv[p * dim + j];
  return d;
}

template <bool Sparse>
struct model {
  g::nn::embedding<"emb", vocab, dim, double, Sparse> emb;
  auto loss() const { return g::sum(emb(ids) * c); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(gradient_is_marked_sparse_and_fd_equal) {
  model<true> m;
  using G = decltype(g::grad(m.loss(), m.emb.table));
  static_assert(decltype(G::e)::sparse, "embedding_lookup's table gradient is sparse_rows");
  static_assert(!decltype(g::grad(model<false>{}.loss(), model<false>{}.emb.table).e)::sparse);
  // evaluated directly, the sparse gradient is the dense scatter-add
  g::session<g::cpu_simd> s;
  auto t0 = random_vec(vocab * dim, 1);
  s.assign(m.emb.table, g::view(t0.data(), {vocab, dim}));
  auto cv = random_vec(positions * dim, 2);
  auto gr = s.run(g::grad(m.loss(), m.emb.table), ids = g::view(idx.data(), {positions}),
                    c = g::view(cv.data(), {positions, dim}));
  const auto ref = dense_reference(idx, cv);
  BOOST_REQUIRE_EQUAL(gr.size(), vocab * dim);
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST(gr[static_cast<g::index_t>(i)] == ref[i]);
}

BOOST_AUTO_TEST_CASE(coalesced_rows_and_indices) {
  model<true> m;
  g::session<g::cpu_simd> s;
  auto t0 = random_vec(vocab * dim, 3);
  s.assign(m.emb.table, g::view(t0.data(), {vocab, dim}));
  auto step = g::minimize(s, m.loss(), g::sgd{.lr = 0.1});
  auto cv = random_vec(positions * dim, 4);
  step.compute_gradients(ids = g::view(idx.data(), {positions}), c = g::view(cv.data(), {positions, dim}));
  auto grads = step.gradients();
  BOOST_REQUIRE_EQUAL(grads.size(), 1u);
  const auto& gb = grads[0];
  BOOST_TEST(gb.sparse());
  BOOST_TEST(std::string(gb.name) == "emb/table");
  const std::vector<std::int32_t> rows{0, 3, 8, 17, 21, 30, 44, 49};
  BOOST_REQUIRE_EQUAL(gb.rows, static_cast<g::index_t>(rows.size()));
  BOOST_REQUIRE_EQUAL(gb.row_len, dim);
  BOOST_REQUIRE_EQUAL(gb.size, gb.rows * dim);
  const auto ref = dense_reference(idx, cv);
  const auto* data = static_cast<const double*>(gb.data);
  for (std::size_t k = 0; k < rows.size(); ++k) {
    BOOST_TEST(gb.indices[k] == rows[k]);
    for (g::index_t j = 0; j < dim; ++j)
      BOOST_TEST(data[static_cast<g::index_t>(k) * dim + j] == ref[static_cast<std::size_t>(rows[k] * dim + j)]);
  }
  // the norm the clipping uses is the dense gradient's
  double sq = 0;
  for (double x : ref) sq += x * x;
  BOOST_TEST(step.gradient_norm() == std::sqrt(sq), boost::test_tools::tolerance(1e-12));
}

// Plain SGD (no momentum, no weight decay): the sparse step is the dense step.
BOOST_AUTO_TEST_CASE(sgd_matches_dense_bitwise) {
  model<true> ms;
  model<false> md;
  g::session<g::cpu_simd> ss, sd;
  auto t0 = random_vec(vocab * dim, 5);
  ss.assign(ms.emb.table, g::view(t0.data(), {vocab, dim}));
  sd.assign(md.emb.table, g::view(t0.data(), {vocab, dim}));
  auto step_s = g::minimize(ss, ms.loss(), g::sgd{.lr = 0.05});
  auto step_d = g::minimize(sd, md.loss(), g::sgd{.lr = 0.05});
  for (int k = 0; k < 5; ++k) {
    auto cv = random_vec(positions * dim, 100 + static_cast<std::uint64_t>(k));
    step_s.run(ids = g::view(idx.data(), {positions}), c = g::view(cv.data(), {positions, dim}));
    step_d.run(ids = g::view(idx.data(), {positions}), c = g::view(cv.data(), {positions, dim}));
  }
  auto a = ss.run(ms.emb.table);
  auto b = sd.run(md.emb.table);
  // the same to rounding: the compact rows and the whole table put an element in a SIMD
  // batch or the scalar tail differently, where a compiler may fuse a multiply-add
  for (g::index_t i = 0; i < vocab * dim; ++i) BOOST_TEST(a[i] == b[i], boost::test_tools::tolerance(1e-14));
}

namespace {
// Lazy reference updates on the named rows of w (and their state), from PyTorch's formulas.
struct lazy_reference {
  std::vector<double> w, m, v;
  void momentum(const std::vector<std::int32_t>& ix, const std::vector<double>& cv, double lr, double mu) {
    const auto d = dense_reference(ix, cv);
    for (std::int32_t r = 0; r < vocab; ++r) {
      if (std::find(ix.begin(), ix.end(), r) == ix.end()) continue;
      for (g::index_t j = 0; j < dim; ++j) {
        const auto i = static_cast<std::size_t>(r * dim + j);
        m[i] = mu * m[i] + d[i];
        w[i] -= lr * m[i];
      }
    }
  }
  void adam(const std::vector<std::int32_t>& ix, const std::vector<double>& cv, double lr, int t) {
    const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const auto d = dense_reference(ix, cv);
    for (std::int32_t r = 0; r < vocab; ++r) {
      if (std::find(ix.begin(), ix.end(), r) == ix.end()) continue;
      for (g::index_t j = 0; j < dim; ++j) {
        const auto i = static_cast<std::size_t>(r * dim + j);
        m[i] = b1 * m[i] + (1 - b1) * d[i];
        v[i] = b2 * v[i] + (1 - b2) * d[i] * d[i];
        const double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
        w[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
    }
  }
};

// Batches naming different rows each step, so some rows sit out some steps.
std::vector<std::int32_t> batch_ids(int k) {
  std::vector<std::int32_t> r(static_cast<std::size_t>(positions));
  for (std::size_t p = 0; p < r.size(); ++p) r[p] = static_cast<std::int32_t>((p * 7 + static_cast<std::size_t>(k) * 11) % 23);
  r[0] = r[3];  // a repeat
  return r;
}

template <class Opt, class Ref>
void check_lazy(const Opt& opt, const char* slot, Ref&& ref_step) {
  model<true> m;
  g::session<g::cpu_simd> s;
  auto t0 = random_vec(vocab * dim, 6);
  s.assign(m.emb.table, g::view(t0.data(), {vocab, dim}));
  auto step = g::minimize(s, m.loss(), opt);
  lazy_reference ref{t0, std::vector<double>(t0.size()), std::vector<double>(t0.size())};
  for (int k = 0; k < 6; ++k) {
    const auto ix = batch_ids(k);
    auto cv = random_vec(positions * dim, 200 + static_cast<std::uint64_t>(k));
    step.run(ids = g::view(ix.data(), {positions}), c = g::view(cv.data(), {positions, dim}));
    ref_step(ref, ix, cv, k + 1);
  }
  auto w = s.run(m.emb.table);
  for (std::size_t i = 0; i < ref.w.size(); ++i)
    BOOST_TEST(w[static_cast<g::index_t>(i)] == ref.w[i], boost::test_tools::tolerance(1e-12));
  // rows 23.. were never named: weights and state untouched
  const auto* st = s.data<double>("emb/table/" + std::string(slot));
  for (std::size_t i = 23 * dim; i < ref.w.size(); ++i) {
    BOOST_TEST(w[static_cast<g::index_t>(i)] == t0[i]);
    BOOST_TEST(st[i] == 0.0);
  }
  for (std::size_t i = 0; i < 23 * dim; ++i) BOOST_TEST(st[i] == ref.m[i], boost::test_tools::tolerance(1e-12));
}
}  // namespace

BOOST_AUTO_TEST_CASE(momentum_is_lazy) {
  check_lazy(g::sgd{.lr = 0.05, .momentum = 0.9}, "momentum",
             [](lazy_reference& r, const auto& ix, const auto& cv, int) { r.momentum(ix, cv, 0.05, 0.9); });
}

BOOST_AUTO_TEST_CASE(adam_is_lazy) {
  check_lazy(g::adam{.lr = 0.01}, "adam_m",
             [](lazy_reference& r, const auto& ix, const auto& cv, int t) { r.adam(ix, cv, 0.01, t); });
}

BOOST_AUTO_TEST_CASE(sparse_as_dense_gives_the_dense_gradient) {
  model<true> m;
  g::session<g::cpu_simd> s;
  auto t0 = random_vec(vocab * dim, 7);
  s.assign(m.emb.table, g::view(t0.data(), {vocab, dim}));
  auto step = g::minimize(s, m.loss(), g::adam{});
  step.set_sparse_as_dense(true);
  auto cv = random_vec(positions * dim, 8);
  step.compute_gradients(ids = g::view(idx.data(), {positions}), c = g::view(cv.data(), {positions, dim}));
  const auto& gb = step.gradients()[0];
  BOOST_TEST(!gb.sparse());
  BOOST_REQUIRE_EQUAL(gb.size, vocab * dim);
  const auto ref = dense_reference(idx, cv);
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST(static_cast<const double*>(gb.data)[i] == ref[i]);
  step.apply_gradients();  // dense Adam: every row moves (rows with zero gradient too, by 0)
}

namespace {
struct world_of_two {  // a communicator stand-in: only its world size matters here
  int rank() const { return 0; }
  int world_size() const { return 2; }
  template <class T>
  void allreduce_sum(std::span<T>) {}
  template <class T>
  void allreduce_average(std::span<T>) {}
  template <class T>
  void broadcast(std::span<T>, int) {}
  void barrier() {}
};
}  // namespace

BOOST_AUTO_TEST_CASE(reduce_gradients_refuses_sparse) {
  model<true> m;
  g::session<g::cpu_simd> s;
  auto t0 = random_vec(vocab * dim, 9);
  s.assign(m.emb.table, g::view(t0.data(), {vocab, dim}));
  auto step = g::minimize(s, m.loss(), g::sgd{.lr = 0.1});
  auto cv = random_vec(positions * dim, 10);
  step.compute_gradients(ids = g::view(idx.data(), {positions}), c = g::view(cv.data(), {positions, dim}));
  world_of_two comm;
  BOOST_CHECK_EXCEPTION(g::dist::reduce_gradients(comm, step), g::error, [](const g::error& e) {
    const std::string m = e.what();
    return m.find("'emb/table'") != std::string::npos && m.find("set_sparse_as_dense") != std::string::npos;
  });
  step.set_sparse_as_dense(true);
  step.compute_gradients(ids = g::view(idx.data(), {positions}), c = g::view(cv.data(), {positions, dim}));
  g::dist::reduce_gradients(comm, step);  // dense now: accepted
}

// An out-of-range index fails in the forward gather with the op and the value named.
BOOST_AUTO_TEST_CASE(bad_index_is_named) {
  model<true> m;
  g::session<g::cpu_simd> s;
  auto t0 = random_vec(vocab * dim, 11);
  s.assign(m.emb.table, g::view(t0.data(), {vocab, dim}));
  auto step = g::minimize(s, m.loss(), g::sgd{.lr = 0.1});
  std::vector<std::int32_t> bad{1, 50};
  std::vector<double> cv(2 * dim, 1.0);
  BOOST_CHECK_EXCEPTION(step.run(ids = g::view(bad.data(), {2}), c = g::view(cv.data(), {2, dim})), g::index_error,
                        [](const g::index_error& e) {
                          const std::string m = e.what();
                          return m.find("gather") != std::string::npos && m.find("50") != std::string::npos;
                        });
  // nothing moved
  auto w = s.run(m.emb.table);
  for (std::size_t i = 0; i < t0.size(); ++i) BOOST_TEST(w[static_cast<g::index_t>(i)] == t0[i]);
}
