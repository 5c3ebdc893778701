#define BOOST_TEST_MODULE autodiff_grad_gather
// gather's derivative w.r.t. its table (a scatter_add of the adjoint rows into zeros of
// the table's shape), against central differences; one case against a hand-computed
// scatter-add; the cpu_simd primitive's threaded path against the sequential loop.
#include "../support/check.hpp"
#include "../support/finite_difference.hpp"

#include <array>
#include <cstdint>
#include <vector>

using namespace gradus_test;

namespace {
g::variable<"t1", double, 7> t1;        // rank-1 table
g::variable<"t2", double, 5, 3> t2;     // rank-2 table (an embedding)
g::variable<"t3", double, 4, 2, 3> t3;  // rank-3 table
g::variable<"w6", double, 6> w6;
g::variable<"w63", double, 6, 3> w63;
g::variable<"w233", double, 2, 3, 3> w233;
g::variable<"w623", double, 6, 2, 3> w623;
g::variable<"w2323", double, 2, 3, 2, 3> w2323;
g::variable<"w53", double, 5, 3> w53;
g::variable<"u63", double, 6, 3> u63;

g::placeholder<"i1", std::int32_t, g::dyn> i1;          // rank-1 indices
g::placeholder<"i2", std::int32_t, g::dyn, g::dyn> i2;  // rank-2 indices

// Repeated indices (accumulate) and rows no index names (zero gradient).
const std::vector<std::int32_t> idx6{2, 0, 2, 4, 2, 0};     // into 5 rows: 1 and 3 unused
const std::vector<std::int32_t> idx23{3, 1, 3, 0, 3, 1};    // (2, 3) into 4 or 5 rows: 2 unused
const std::vector<std::int32_t> idx6_of7{6, 1, 6, 6, 0, 3};  // into 7 rows

struct fixture {
  session s;
  fixture() {
    set_random(s, t1, -1, 1);
    set_random(s, t2, -1, 1);
    set_random(s, t3, -1, 1);
    set_random(s, w6, -1.5, 1.5);
    set_random(s, w63, -1.5, 1.5);
    set_random(s, w233, -1.5, 1.5);
    set_random(s, w623, -1.5, 1.5);
    set_random(s, w2323, -1.5, 1.5);
    set_random(s, w53, -1.5, 1.5);
    set_random(s, u63, -1, 1);
  }
};

// d loss / d v against central differences, the error printed at --log_level=message.
template <class Loss, class V, class... Feeds>
void fd_check(session& s, const char* what, const Loss& loss, const V& v, const Feeds&... feeds) {
  const double err = fd_error(s, loss, g::grad(loss, v), v, feeds...);
  BOOST_TEST_MESSAGE(what << ": max relative error " << err);
  BOOST_TEST(err < 1e-6, what << ": max relative error " << err);
}
}  // namespace

BOOST_FIXTURE_TEST_SUITE(gather_rule, fixture)

BOOST_AUTO_TEST_CASE(rank1_indices) {
  const auto f1 = (i1 = g::view(idx6.data(), {6}));
  fd_check(s, "gather(t2 (5,3), i (6))", g::sum(g::gather(t2, i1) * w63), t2, f1);
  fd_check(s, "gather(t3 (4,2,3), i (6))", g::sum(g::gather(t3, i1) * w623), t3,
           i1 = g::view(idx23.data(), {6}));
  fd_check(s, "gather(t1 (7), i (6))", g::sum(g::gather(t1, i1) * w6), t1, i1 = g::view(idx6_of7.data(), {6}));
}

BOOST_AUTO_TEST_CASE(rank2_indices) {
  const auto f2 = (i2 = g::view(idx23.data(), {2, 3}));
  fd_check(s, "gather(t2 (5,3), i (2,3))", g::sum(g::gather(t2, i2) * w233), t2, f2);
  fd_check(s, "gather(t3 (4,2,3), i (2,3))", g::sum(g::gather(t3, i2) * w2323), t3, f2);
}

// An embedding lookup feeding a nonlinearity; then the table in three places (gathered
// twice, once through exp, and used directly): the contributions add.
BOOST_AUTO_TEST_CASE(embedding_like_composite) {
  const auto f2 = (i2 = g::view(idx23.data(), {2, 3}));
  fd_check(s, "sum(tanh(gather(t2, i (2,3))) * w)", g::sum(g::tanh(g::gather(t2, i2)) * w233), t2, f2);
  auto tied = g::sum(g::tanh(g::gather(t2, i2)) * w233) + g::sum(g::square(t2) * w53) +
              g::sum(g::gather(g::exp(t2), i2));
  fd_check(s, "table in three places", tied, t2, f2);
}

// scatter_add is linear in its updates; its rule is a gather (the adjoint's static
// shape (?, 3) seen as the updates' (6, 3)).
BOOST_AUTO_TEST_CASE(scatter_add_rule) {
  const auto f1 = (i1 = g::view(idx6.data(), {6}));
  fd_check(s, "sum(scatter_add(u, i, t2) * w)", g::sum(g::scatter_add(g::tanh(u63), i1, t2) * w53), u63, f1);
}

// The gradient against a scatter-add written out by hand: row r of d/dt2 is the sum of
// the rows of w at the positions where idx names r.
BOOST_AUTO_TEST_CASE(hand_computed_scatter_add) {
  const std::vector<double> w{1, 2, 3,  10, 20, 30,  100, 200, 300,  -1, -2, -4,  0.5, 0.25, 0.125,  7, 8, 9};
  gradus::assign(s, w63, g::view(w.data(), {6, 3}));
  // idx6 = {2, 0, 2, 4, 2, 0}
  const std::vector<double> want{
      10 + 7,          20 + 8,           30 + 9,            // row 0: positions 1, 5
      0,               0,                0,                 // row 1: none
      1 + 100 + 0.5,   2 + 200 + 0.25,   3 + 300 + 0.125,   // row 2: positions 0, 2, 4
      0,               0,                0,                 // row 3: none
      -1,              -2,               -4};               // row 4: position 3
  const auto gt = s.run(g::grad(g::sum(g::gather(t2, i1) * w63), t2), i1 = g::view(idx6.data(), {6}));
  BOOST_TEST(same_shape(gt, {5, 3}));
  BOOST_TEST(equal(gt, want));
  BOOST_TEST(s.stats().count("scatter_add") == 1u);
  // No indices at all: zeros.
  const std::vector<std::int32_t> none;
  const auto z = s.run(g::grad(g::sum(g::gather(t2, i1)), t2), i1 = g::view(none.data(), {0}));
  BOOST_TEST(same_shape(z, {5, 3}));
  BOOST_TEST(equal(z, std::vector<double>(15, 0.0)));
}

// The gradient's graph still computes the forward gather (sum's rule reads the gather's
// dims through its buffer), which rejects the index first; scatter_add run on its own
// checks for itself.
BOOST_AUTO_TEST_CASE(out_of_range_index_and_mismatched_updates) {
  const std::vector<std::int32_t> bad{0, 5, 1, 1, 1, 1};
  auto message_of = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const g::index_error& e) {
      return e.what();
    }
    return "no index_error";
  };
  const std::string in_grad =
      message_of([&] { s.run(g::grad(g::sum(g::gather(t2, i1) * w63), t2), i1 = g::view(bad.data(), {6})); });
  BOOST_TEST(in_grad.find("index 5 at position 1 is outside [0, 5)") != std::string::npos, in_grad);
  BOOST_TEST(message_of([&] { s.run(g::scatter_add(u63, i1, t2), i1 = g::view(bad.data(), {6})); }) ==
             "gradus: scatter_add: index 5 at position 1 is outside [0, 5)");
  // 4 indices for 6 rows of updates: a shape_error naming the op and the shapes.
  try {
    s.run(g::scatter_add(u63, i1, t2), i1 = g::view(bad.data(), {4}));
    BOOST_ERROR("no shape_error");
  } catch (const g::shape_error& e) {
    BOOST_TEST(std::string(e.what()) == "gradus: scatter_add: updates of shape (6, 3) do not fit indices of shape (4,) "
                                        "into a target of shape (5, 3) (expected (4, 3))");
  }
}

BOOST_AUTO_TEST_CASE(to_dot_draws_the_scatter_add) {
  auto loss = g::sum(g::tanh(g::gather(t2, i2)) * w233);
  const std::string dot = g::to_dot(loss, g::grad(loss, t2));
  BOOST_TEST(dot.find("label=\"scatter_add\\n(5, 3) float64\"") != std::string::npos, dot);
  BOOST_TEST(dot.find("label=\"gather\\n(?, ?, 3) float64\"") != std::string::npos, dot);
}

BOOST_AUTO_TEST_SUITE_END()

// The primitive on its own: above the parallel threshold it sorts positions by row and
// deals rows to threads; each row is still summed in index order, so the result equals
// the sequential loop exactly.
BOOST_AUTO_TEST_CASE(cpu_simd_scatter_add_threaded_equals_sequential) {
  const g::index_t rows = 300, row_len = 37, n = 4000;  // n * row_len above the threshold
  static_assert(n * row_len >= g::cpu_simd::parallel_threshold);
  const auto idx = uniform_int(static_cast<std::size_t>(n), 0, static_cast<std::int32_t>(rows - 1));
  std::vector<std::int32_t> hot(idx);
  for (std::size_t i = 0; i < hot.size(); i += 3) hot[i] = 7;  // one row named by a third of them
  const auto upd = uniform<double>(static_cast<std::size_t>(n * row_len), -1, 1);
  for (const auto* ix : std::array<const std::vector<std::int32_t>*, 2>{&idx, &hot}) {
    std::vector<double> want(static_cast<std::size_t>(rows * row_len), 0.0);
    for (g::index_t i = 0; i < n; ++i)
      for (g::index_t j = 0; j < row_len; ++j)
        want[static_cast<std::size_t>((*ix)[static_cast<std::size_t>(i)] * row_len + j)] +=
            upd[static_cast<std::size_t>(i * row_len + j)];
    std::vector<double> got(want.size(), -1.0);
    g::cpu_simd::scatter_add(upd.data(), ix->data(), n, row_len, got.data(), rows);
    BOOST_TEST(got == want);
  }
  std::vector<double> out(static_cast<std::size_t>(rows * row_len));
  std::vector<std::int32_t> neg(idx);
  neg[2] = -3;
  BOOST_CHECK_EXCEPTION(g::cpu_simd::scatter_add(upd.data(), neg.data(), n, row_len, out.data(), rows),
                        g::index_error, [](const g::index_error& e) {
                          return std::string(e.what()) == "gradus: scatter_add: index -3 at position 2 is outside [0, 300)";
                        });
}
