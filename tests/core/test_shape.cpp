// Static shape algebra (extents, broadcasting, per-op shape rules) checked at run time so
// a wrong rule is a reported failure rather than a build break, and the run-time dims:
// numel, printing, fits, broadcast_dims (with the error it throws) and broadcast strides.
#define BOOST_TEST_MODULE core_shape
#include <boost/test/unit_test.hpp>

#include <array>
#include <string>
#include <type_traits>

#include <gradus/gradus.hpp>

namespace g = gradus;
using g::dyn;
using g::shape;

namespace {

template <class S>
std::vector<g::index_t> ext() {
  return std::vector<g::index_t>(S::extents.begin(), S::extents.end());
}

std::vector<g::index_t> vec(std::initializer_list<g::index_t> l) { return l; }

template <class A, class B>
constexpr bool same = std::is_same_v<A, B>;

}  // namespace

BOOST_AUTO_TEST_CASE(static_shapes) {
  BOOST_TEST((shape<3, dyn, 4>::rank == 3u));
  const auto e = ext<shape<3, dyn, 4>>();
  BOOST_TEST(e == vec({3, dyn, 4}), boost::test_tools::per_element());
  BOOST_TEST(!(shape<3, dyn, 4>::is_static));
  BOOST_TEST((shape<2, 3>::is_static));
  BOOST_TEST(shape<>::rank == 0u);
  BOOST_TEST(shape<>::is_static);
  BOOST_TEST((same<g::dyn_shape_t<3>, shape<dyn, dyn, dyn>>));
  BOOST_TEST((same<g::dyn_shape_t<0>, shape<>>));
}

BOOST_AUTO_TEST_CASE(static_broadcasting) {
  BOOST_TEST(g::broadcast_extent(3, 3) == 3);
  BOOST_TEST(g::broadcast_extent(1, 5) == 5);
  BOOST_TEST(g::broadcast_extent(5, 1) == 5);
  BOOST_TEST(g::broadcast_extent(dyn, 5) == 5);
  BOOST_TEST(g::broadcast_extent(5, dyn) == 5);
  BOOST_TEST(g::broadcast_extent(dyn, 1) == dyn);
  BOOST_TEST(g::broadcast_extent(1, dyn) == dyn);
  BOOST_TEST(g::broadcast_extent(dyn, dyn) == dyn);
  BOOST_TEST(g::broadcast_extent(3, 5) == -2);

  BOOST_TEST((same<g::broadcast_shape_t<shape<dyn, 4>, shape<4>>, shape<dyn, 4>>));
  BOOST_TEST((same<g::broadcast_shape_t<shape<3, 1>, shape<1, 5>>, shape<3, 5>>));
  BOOST_TEST((same<g::broadcast_shape_t<shape<4, 1, 5>, shape<3, 1>>, shape<4, 3, 5>>));
  BOOST_TEST((same<g::broadcast_shape_t<shape<>, shape<2, 3>>, shape<2, 3>>));
  BOOST_TEST((same<g::broadcast_shape_t<shape<2, 3>, shape<>>, shape<2, 3>>));
  BOOST_TEST((same<g::broadcast_shape_t<shape<dyn, 1>, shape<1, dyn>>, shape<dyn, dyn>>));
  BOOST_TEST((g::broadcast_result<shape<dyn, 4>, shape<dyn, 4>>::ok));
  BOOST_TEST((g::broadcast_result<shape<3, 4>, shape<4>>::ok));
  BOOST_TEST(!(g::broadcast_result<shape<3, 4>, shape<5, 4>>::ok));
  BOOST_TEST(!(g::broadcast_result<shape<3, 4>, shape<3>>::ok));
  BOOST_TEST((g::broadcast_result<shape<dyn, 4>, shape<5, dyn>>::ok));
}

BOOST_AUTO_TEST_CASE(static_op_shape_rules) {
  // matmul: 2-D, batched, and a 2-D operand against a batch.
  using m22 = g::detail::matmul_extents<shape<3, 4>, shape<4, 5>>;
  BOOST_TEST(m22::ok);
  BOOST_TEST(std::vector<g::index_t>(m22::value.begin(), m22::value.end()) == vec({3, 5}),
             boost::test_tools::per_element());
  using m33 = g::detail::matmul_extents<shape<dyn, 3, 4>, shape<7, 4, 5>>;
  BOOST_TEST(m33::ok);
  BOOST_TEST(std::vector<g::index_t>(m33::value.begin(), m33::value.end()) == vec({7, 3, 5}),
             boost::test_tools::per_element());
  using m32 = g::detail::matmul_extents<shape<2, 3, 4>, shape<4, dyn>>;
  BOOST_TEST(m32::ok);
  BOOST_TEST(std::vector<g::index_t>(m32::value.begin(), m32::value.end()) == vec({2, 3, dyn}),
             boost::test_tools::per_element());
  using m23 = g::detail::matmul_extents<shape<3, 4>, shape<6, 4, 5>>;
  BOOST_TEST(std::vector<g::index_t>(m23::value.begin(), m23::value.end()) == vec({6, 3, 5}),
             boost::test_tools::per_element());
  BOOST_TEST(!(g::op::matmul::fits<shape<3, 4>, shape<5, 6>>));
  BOOST_TEST((g::op::matmul::fits<shape<3, dyn>, shape<5, 6>>));
  BOOST_TEST(!(g::op::matmul::fits<shape<2, 3, 4>, shape<3, 4, 5>>));
  BOOST_TEST(!(g::op::matmul::fits<shape<4>, shape<4, 5>>));

  // permute must be a permutation of the operand's axes.
  BOOST_TEST((g::op::permute<1, 0>::fits<shape<2, 3>, shape<>>));
  BOOST_TEST((g::op::permute<2, 0, 1>::fits<shape<2, 3, 4>, shape<>>));
  BOOST_TEST(!(g::op::permute<0, 0>::fits<shape<2, 3>, shape<>>));
  BOOST_TEST(!(g::op::permute<0, 2>::fits<shape<2, 3>, shape<>>));
  BOOST_TEST(!(g::op::permute<1, 0>::fits<shape<2, 3, 4>, shape<>>));

  // reshape: equal sizes when static, one inferred extent at most.
  BOOST_TEST((g::op::reshape::fits<shape<3, 4>, shape<2, 6>>));
  BOOST_TEST(!(g::op::reshape::fits<shape<3, 4>, shape<5, 2>>));
  BOOST_TEST((g::op::reshape::fits<shape<3, 4>, shape<dyn, 6>>));
  BOOST_TEST(!(g::op::reshape::fits<shape<3, 4>, shape<dyn, 5>>));
  BOOST_TEST(!(g::op::reshape::fits<shape<3, 4>, shape<dyn, dyn>>));
  BOOST_TEST((g::op::reshape::fits<shape<dyn, 4>, shape<2, dyn>>));

  // softmax_cross_entropy: [N, C] logits and [N] labels.
  BOOST_TEST((g::op::softmax_cross_entropy::fits<shape<dyn, 10>, shape<dyn>>));
  BOOST_TEST((g::op::softmax_cross_entropy::fits<shape<8, 10>, shape<8>>));
  BOOST_TEST(!(g::op::softmax_cross_entropy::fits<shape<8, 10>, shape<9>>));
  BOOST_TEST(!(g::op::softmax_cross_entropy::fits<shape<8, 10, 2>, shape<8>>));

  // Axes: negative ones count from the end.
  BOOST_TEST((g::normalize_axis<-1, 3>() == 2u));
  BOOST_TEST((g::normalize_axis<-3, 3>() == 0u));
  BOOST_TEST((g::normalize_axis<1, 3>() == 1u));
}

BOOST_AUTO_TEST_CASE(runtime_dims) {
  const g::dims a{3, 4}, b{3, 4}, c{4, 3}, e{0, 4}, s{};
  BOOST_TEST(a.rank == 2u);
  BOOST_TEST(a.numel() == 12);
  BOOST_TEST(e.numel() == 0);
  BOOST_TEST(s.numel() == 1);  // a scalar holds one element
  BOOST_TEST((a == b));
  BOOST_TEST(!(a == c));
  BOOST_TEST(!(a == g::dims{3, 4, 1}));
  BOOST_TEST(g::to_string(a) == "(3, 4)");
  BOOST_TEST(g::to_string(g::dims{5}) == "(5,)");
  BOOST_TEST(g::to_string(s) == "()");
  BOOST_TEST(g::to_string(g::dims{dyn, 4}) == "(?, 4)");
  BOOST_TEST((g::to_string(g::static_dims<shape<dyn, 7, 2>>()) == "(?, 7, 2)"));
  BOOST_TEST((g::fits<shape<dyn, 4>>(a)));
  BOOST_TEST((g::fits<shape<dyn, 4>>(e)));
  BOOST_TEST(!(g::fits<shape<dyn, 4>>(c)));
  BOOST_TEST(!(g::fits<shape<dyn, 4>>(g::dims{12})));
  BOOST_TEST(g::fits<shape<>>(s));
  // a list of more extents than a tensor can hold is refused, naming both counts
  BOOST_TEST(g::dims({1, 2, 3, 4, 5, 6}).rank == g::max_rank);
  BOOST_CHECK_EXCEPTION((void)g::dims({1, 2, 3, 4, 5, 6, 7}), g::shape_error, [](const g::shape_error& e) {
    return std::string(e.what()) == "gradus: dims: 7 extents listed, but a tensor has at most 6 (max_rank)";
  });
}

BOOST_AUTO_TEST_CASE(runtime_broadcasting) {
  BOOST_TEST(g::to_string(g::broadcast_dims("add", {3, 4}, {4})) == "(3, 4)");
  BOOST_TEST(g::to_string(g::broadcast_dims("add", {3, 1}, {1, 5})) == "(3, 5)");
  BOOST_TEST(g::to_string(g::broadcast_dims("add", {4, 1, 5}, {4, 3, 5})) == "(4, 3, 5)");
  BOOST_TEST(g::to_string(g::broadcast_dims("add", {2, 3}, {})) == "(2, 3)");
  BOOST_TEST(g::to_string(g::broadcast_dims("add", {0, 4}, {4})) == "(0, 4)");
  BOOST_TEST(g::to_string(g::broadcast_dims("add", {0, 4}, {1, 4})) == "(0, 4)");
  BOOST_TEST(g::to_string(g::broadcast_dims("add", {1}, {0})) == "(0,)");

  auto fails = [](const char* op, const g::dims& x, const g::dims& y, const std::string& sx, const std::string& sy) {
    try {
      g::broadcast_dims(op, x, y);
      BOOST_ERROR("broadcast_dims of " << sx << " and " << sy << " did not throw");
    } catch (const g::shape_error& err) {
      const std::string m = err.what();
      BOOST_TEST(m.find(op) != std::string::npos, m);
      BOOST_TEST(m.find(sx) != std::string::npos, m);
      BOOST_TEST(m.find(sy) != std::string::npos, m);
    }
  };
  fails("add", {3, 4}, {5, 4}, "(3, 4)", "(5, 4)");
  fails("mul", {3, 4}, {3}, "(3, 4)", "(3,)");
  fails("where", {2, 3, 4}, {2, 2, 4}, "(2, 3, 4)", "(2, 2, 4)");
  fails("sub", {0, 4}, {2, 4}, "(0, 4)", "(2, 4)");

  // A shape_error is a gradus::error.
  BOOST_CHECK_THROW(g::broadcast_dims("add", {3}, {4}), g::error);

  // Strides seen from the output: 0 on broadcast axes, missing leading axes stay 0.
  const auto st = g::broadcast_strides({4, 1, 5}, {4, 3, 5});
  BOOST_TEST(st[0] == 5);
  BOOST_TEST(st[1] == 0);
  BOOST_TEST(st[2] == 1);
  const auto sb = g::broadcast_strides({5}, {4, 3, 5});
  BOOST_TEST(sb[0] == 0);
  BOOST_TEST(sb[1] == 0);
  BOOST_TEST(sb[2] == 1);
  const auto sc = g::broadcast_strides({3, 1}, {3, 7});
  BOOST_TEST(sc[0] == 1);
  BOOST_TEST(sc[1] == 0);
}

BOOST_AUTO_TEST_CASE(expression_shapes_and_dtypes) {
  g::placeholder<"x", float, dyn, 4> x;
  g::variable<"w", float, 4, 3> w;
  g::variable<"b", float, 3> b;
  g::placeholder<"y", std::int32_t, dyn> y;
  const auto logits = g::matmul(x, w) + b;
  BOOST_TEST((same<g::shape_t<decltype(logits)>, shape<dyn, 3>>));
  BOOST_TEST((same<g::value_t<decltype(logits)>, float>));
  BOOST_TEST((same<g::shape_t<decltype(g::softmax_cross_entropy(logits, y))>, shape<dyn>>));
  BOOST_TEST((same<g::shape_t<decltype(g::mean(g::softmax_cross_entropy(logits, y)))>, shape<>>));
  BOOST_TEST((same<g::shape_t<decltype(g::transpose(w))>, shape<3, 4>>));
  BOOST_TEST((same<g::shape_t<decltype(g::matmul(g::transpose(w), g::transpose(x)))>, shape<3, dyn>>));
  BOOST_TEST((same<g::shape_t<decltype(x * 2.0)>, shape<dyn, 4>>));
  BOOST_TEST((same<g::value_t<decltype(2.0 * x)>, float>));  // a plain number adopts the dtype
  BOOST_TEST((same<g::shape_t<decltype(g::where(x > 0, x, 0))>, shape<dyn, 4>>));
  BOOST_TEST((g::kind_v<decltype(x + 1)> == g::node_kind::elementwise));
  BOOST_TEST((g::kind_v<decltype(g::matmul(x, w))> == g::node_kind::kernel));
  BOOST_TEST((g::kind_v<decltype(g::reshape<dyn>(x))> == g::node_kind::view));
  // Structural equality: equal subexpressions compare equal (the planner's dedup key).
  BOOST_TEST((g::matmul(x, w) == g::matmul(x, w)));
  BOOST_TEST(!(x * 2.0 == x * 3.0));
  BOOST_TEST((g::leaky_relu(x, 0.1) == g::leaky_relu(x, 0.1)));
  BOOST_TEST(!(g::leaky_relu(x, 0.1) == g::leaky_relu(x, 0.2)));
}
