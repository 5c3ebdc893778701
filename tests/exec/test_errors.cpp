// Run-time errors, checked by type and by message: a message must name the op (or the
// placeholder / variable) and the shapes or values involved. After an error the session
// keeps working.
#define BOOST_TEST_MODULE exec_errors
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

// Runs f, which must throw E; every string in `parts` must appear in the message.
template <class E, class F>
void throws_with(F f, std::initializer_list<std::string> parts) {
  try {
    f();
    BOOST_ERROR("no exception; expected one naming " << *parts.begin());
  } catch (const E& e) {
    const std::string m = e.what();
    for (const auto& p : parts) BOOST_TEST(m.find(p) != std::string::npos, "'" << p << "' not in: " << m);
    // every gradus error is a gradus::error
    BOOST_TEST(dynamic_cast<const g::error*>(&e) != nullptr);
  } catch (const std::exception& e) {
    BOOST_ERROR("wrong exception type: " << e.what());
  }
}

xt::xtensor<float, 2> zeros2(std::size_t a, std::size_t b) { return xt::xtensor<float, 2>(std::array<std::size_t, 2>{a, b}, 0.f); }

}  // namespace

BOOST_AUTO_TEST_CASE(dyn_mismatch_in_add_names_op_and_shapes) {
  g::placeholder<"x", float, g::dyn, 4> x;
  g::placeholder<"y", float, g::dyn, 4> y;
  g::session<g::cpu_simd> s;
  const auto a = zeros2(3, 4), b = zeros2(5, 4);
  throws_with<g::shape_error>([&] { s.run(x + y, x = a, y = b); }, {"add", "(3, 4)", "(5, 4)"});
  throws_with<g::shape_error>([&] { s.run(g::exp(x) * y, x = a, y = b); }, {"mul", "(3, 4)", "(5, 4)"});
  // The same graph then runs on fitting feeds, and a (1, 4) operand broadcasts.
  const auto c = zeros2(1, 4);
  const auto r = s.run(x + y, x = a, y = c);
  BOOST_TEST(same_shape(r, {3, 4}));
  const auto r2 = s.run(x + y, x = a, y = a);
  BOOST_TEST(same_shape(r2, {3, 4}));
}

BOOST_AUTO_TEST_CASE(feed_with_wrong_extents_names_placeholder_and_shapes) {
  g::placeholder<"images", float, g::dyn, 4> x;
  g::session<g::cpu_simd> s;
  const auto bad = zeros2(3, 5);
  throws_with<g::feed_error>([&] { s.run(x * 2, x = bad); }, {"'images'", "(?, 4)", "(3, 5)"});
  const xt::xtensor<float, 1> rank1 = {1, 2, 3, 4};
  throws_with<g::feed_error>([&] { s.run(x * 2, x = rank1); }, {"'images'", "(?, 4)", "(4,)"});
  g::placeholder<"fixed", float, 2, 3> f;
  const auto f32 = zeros2(3, 2);
  throws_with<g::feed_error>([&] { s.run(f + 1, f = f32); }, {"'fixed'", "(2, 3)", "(3, 2)"});
}

BOOST_AUTO_TEST_CASE(missing_unknown_and_double_feeds) {
  g::placeholder<"x", float, g::dyn, 4> x;
  g::placeholder<"y", float, g::dyn, 4> y;
  g::placeholder<"z", float, g::dyn, 4> z;
  g::session<g::cpu_simd> s;
  const auto a = zeros2(2, 4);
  throws_with<g::feed_error>([&] { s.run(x + y, x = a); }, {"placeholder 'y'", "(?, 4)", "not fed"});
  throws_with<g::feed_error>([&] { s.run(x * 2, x = a, z = a); }, {"'z'", "names no placeholder"});
  throws_with<g::feed_error>([&] { s.run(x * 2, x = a, x = a); }, {"'x'", "fed twice"});
  // A correct run afterwards.
  const auto r = s.run(x + y, x = a, y = a);
  BOOST_TEST(same_shape(r, {2, 4}));
}

BOOST_AUTO_TEST_CASE(variables_unassigned_or_misassigned) {
  g::variable<"weights", float, 4, 3> w;
  g::placeholder<"x", float, g::dyn, 4> x;
  g::session<g::cpu_simd> s;
  const auto a = zeros2(2, 4);
  throws_with<g::feed_error>([&] { s.run(g::matmul(x, w), x = a); }, {"variable 'weights'", "(4, 3)", "assign"});
  const auto wrong = zeros2(3, 4);
  throws_with<g::feed_error>([&] { g::assign(s, w, wrong); }, {"'weights'", "(4, 3)", "(3, 4)"});
  throws_with<g::feed_error>([&] { (void)g::value(s, w); }, {"'weights'"});
  g::assign(s, w, zeros2(4, 3));
  BOOST_TEST(same_shape(s.run(g::matmul(x, w), x = a), {2, 3}));
  // Two different variables under one name in one graph.
  g::variable<"weights", float, 3, 4> w2;
  throws_with<g::error>([&] { s.run(g::matmul(x, w) + g::sum<1>(w2)); }, {"'weights'", "(4, 3)", "(3, 4)"});
}

BOOST_AUTO_TEST_CASE(out_of_range_labels_and_indices) {
  g::placeholder<"l", float, g::dyn, 5> l;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::variable<"table", float, 6, 2> t;
  g::session<g::cpu_simd> s;
  g::assign(s, t, zeros2(6, 2));
  const auto lv = zeros2(4, 5);
  const xt::xtensor<std::int32_t, 1> bad = {0, 4, 7, 1}, neg = {0, -1, 2, 3}, good = {0, 4, 2, 1};
  throws_with<g::index_error>([&] { s.run(g::softmax_cross_entropy(l, y), l = lv, y = bad); },
                              {"softmax_cross_entropy", "7", "position 2", "[0, 5)"});
  throws_with<g::index_error>([&] { s.run(g::softmax_cross_entropy(l, y), l = lv, y = neg); },
                              {"softmax_cross_entropy", "-1", "position 1"});
  throws_with<g::index_error>([&] { s.run(g::one_hot<5>(y), y = bad); }, {"one_hot", "7", "position 2", "[0, 5)"});
  throws_with<g::index_error>([&] { s.run(g::one_hot<5>(y), y = neg); }, {"one_hot", "-1", "position 1"});
  const xt::xtensor<std::int32_t, 1> far = {5, 6};
  throws_with<g::index_error>([&] { s.run(g::gather(t, y), y = far); }, {"gather", "6", "position 1", "[0, 6)"});
  throws_with<g::index_error>([&] { s.run(g::gather(t, y), y = neg); }, {"gather", "-1", "position 1"});
  // In-range labels work on the same graph afterwards: uniform logits give log 5.
  const auto loss = s.run(g::softmax_cross_entropy(l, y), l = lv, y = good);
  BOOST_TEST(close(loss, std::vector<double>(4, std::log(5.0)), 1e-6));
}

BOOST_AUTO_TEST_CASE(kernel_shape_mismatches_with_dyn_extents) {
  g::placeholder<"a", float, g::dyn, g::dyn> a;
  g::placeholder<"b", float, g::dyn, g::dyn> b;
  g::placeholder<"a3", float, g::dyn, g::dyn, g::dyn> a3;
  g::placeholder<"b3", float, g::dyn, g::dyn, g::dyn> b3;
  g::session<g::cpu_simd> s;
  const auto x34 = zeros2(3, 4), x52 = zeros2(5, 2);
  throws_with<g::shape_error>([&] { s.run(g::matmul(a, b), a = x34, b = x52); }, {"matmul", "(3, 4)", "(5, 2)"});
  // the logical (transposed) shapes are the ones named
  throws_with<g::shape_error>([&] { s.run(g::matmul(g::transpose(a), b), a = x34, b = x52); },
                              {"matmul", "(4, 3)", "(5, 2)"});
  const xt::xtensor<float, 3> p(std::array<std::size_t, 3>{2, 3, 4}, 0.f), q(std::array<std::size_t, 3>{3, 4, 5}, 0.f);
  throws_with<g::shape_error>([&] { s.run(g::matmul(a3, b3), a3 = p, b3 = q); }, {"matmul", "(2, 3, 4)", "(3, 4, 5)"});
  // reshape that cannot hold the elements
  g::placeholder<"r", float, g::dyn, 5> r;
  const auto r35 = zeros2(3, 5);
  throws_with<g::shape_error>([&] { s.run(g::reshape<g::dyn, 4>(r), r = r35); }, {"reshape", "(3, 5)", "(?, 4)"});
  throws_with<g::shape_error>([&] { s.run(g::reshape<4, 4>(r) + 1, r = r35); }, {"reshape", "(3, 5)", "(4, 4)"});
  // logits and labels disagreeing on the batch size
  g::placeholder<"l", float, g::dyn, 3> l;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  const auto l43 = zeros2(4, 3);
  const xt::xtensor<std::int32_t, 1> y5 = {0, 1, 2, 0, 1};
  throws_with<g::shape_error>([&] { s.run(g::softmax_cross_entropy(l, y), l = l43, y = y5); },
                              {"softmax_cross_entropy", "(4, 3)", "(5,)"});
  // Every one of them is a gradus::error, catchable as such.
  BOOST_CHECK_THROW(s.run(g::matmul(a, b), a = x34, b = x52), g::error);
}

// check_numerics: the first NaN or infinity stops the run; the error names where it was
// made (the fused pass as an expression, or the kernel and its inputs), what it reaches,
// and the global step. Off, the same runs give NaN and Inf silently.
BOOST_AUTO_TEST_CASE(check_numerics_names_node_gradient_and_step) {
  g::placeholder<"x", double, g::dyn> x;
  g::variable<"w", double, 4> w;
  g::session<g::cpu_simd> s;
  const std::vector<double> wv{1, 0, 4, 9}, xv{1, -1, 2, 3}, bad{1, 2, std::nan(""), 4};
  g::assign(s, w, g::view(wv.data(), {4}));
  const auto xf = (x = g::view(xv.data(), {4}));
  // off: log(-1) is NaN, silently
  BOOST_TEST(std::isnan(s.run(g::sum(g::log(x) * w), xf)[0]));
  s.set_check_numerics(true);
  s.set_global_step(7);
  throws_with<g::numerics_error>([&] { s.run(g::sum(g::log(x) * w), xf); },
                                 {"check_numerics", "fused pass mul(log(x), w)", "NaN at element 1", "global step 7"});
  // a kernel: its op, shape and inputs
  // log(x) materialised as sum's operand: found there, before the sum
  throws_with<g::numerics_error>([&] { s.run(g::sum(g::log(x)), xf); },
                                 {"the result of the fused pass log(x) (4,)", "NaN", "inputs: placeholder 'x' (4,)"});
  // a kernel: named by its op, with its inputs
  g::placeholder<"m", double, g::dyn, g::dyn> m;
  const std::vector<double> mv{1e300, 1e300, 1, 1};
  throws_with<g::numerics_error>([&] { s.run(g::sum(g::matmul(m, m)), m = g::view(mv.data(), {2, 2})); },
                                 {"the result of 'matmul' (2, 2)", "+Inf at element 0", "inputs: placeholder 'm' (2, 2), placeholder 'm' (2, 2)"});
  // a feed
  throws_with<g::numerics_error>([&] { s.run(g::sum(x * w), x = g::view(bad.data(), {4})); },
                                 {"placeholder 'x' (4,)", "NaN at element 2", "before the run"});
  // finite values pass, and the session goes on
  BOOST_TEST(s.run(g::sum(x * w), xf)[0] == 1 * 1 + 0 - 1 * 0 + 2 * 4 + 3 * 9);

  // a training step: sqrt(w) is finite at w = 0, its gradient x/(2 sqrt(w)) is infinite there
  auto step = g::minimize(s, g::sum(g::sqrt(w) * x), g::sgd{.lr = 0.1});
  try {
    step.run(xf);
    BOOST_ERROR("no numerics_error");
  } catch (const g::numerics_error& e) {
    const std::string m = e.what();
    for (const char* part : {"the fused pass div(", "Inf at element 1", "global step 7", "it reaches the gradient of 'w'"})
      BOOST_TEST(m.find(part) != std::string::npos, part << " not in: " << m);
    BOOST_TEST(m.find("the loss") == std::string::npos, m);  // the loss itself is finite
  }
  BOOST_TEST(g::value(s, w)[1] == 0.0);  // nothing was applied
  BOOST_TEST(s.global_step() == 7);

  // an update that overflows: the variable and the step are named
  g::variable<"v", double, 2> v;
  const std::vector<double> vv{-1.7e308, 1}, ones{1, 1};
  g::assign(s, v, g::view(vv.data(), {2}));
  g::placeholder<"k", double, g::dyn> k;
  auto blow = g::minimize(s, g::sum(v * k), g::sgd{.lr = 1e308});
  throws_with<g::numerics_error>([&] { blow.run(k = g::view(ones.data(), {2})); },
                                 {"variable 'v'", "-Inf at element 0", "after the optimizer's update at global step 7"});
}
