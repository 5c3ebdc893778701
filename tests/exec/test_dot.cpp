#define BOOST_TEST_MODULE exec_dot
#include <boost/test/unit_test.hpp>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <string>

namespace g = gradus;

namespace {
std::size_t occurrences(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}
}  // namespace

BOOST_AUTO_TEST_CASE(forward_graph_labels_clusters_and_sharing) {
  g::placeholder<"x", float, g::dyn, 4> x;
  g::variable<"w", float, 4, 3> w;
  g::variable<"b", float, 3> b;
  auto h = g::matmul(x, w);
  const std::string dot = g::to_dot(g::relu(h + b), g::sum(h));
  BOOST_TEST(dot.rfind("digraph gradus {", 0) == 0u);
  BOOST_TEST(occurrences(dot, "placeholder 'x'\\n(?, 4) float32") == 1u);
  BOOST_TEST(occurrences(dot, "variable 'w'\\n(4, 3) float32") == 1u);
  BOOST_TEST(occurrences(dot, "label=\"matmul\\n(?, 3) float32\"") == 1u);  // shared by both outputs
  BOOST_TEST(occurrences(dot, "subgraph cluster_") == 1u);               // relu(h + b): one fused pass
  BOOST_TEST(occurrences(dot, "label=\"relu\\n") == 1u);
  BOOST_TEST(occurrences(dot, "label=\"add\\n") == 1u);
  BOOST_TEST(occurrences(dot, "label=\"sum\\n()") == 1u);
  // x, w -> matmul; matmul, b -> add; add -> relu; matmul -> sum
  BOOST_TEST(occurrences(dot, " -> ") == 6u);
}

BOOST_AUTO_TEST_CASE(backward_graph_of_a_layer) {
  g::placeholder<"x", double, g::dyn, 4> x;
  g::variable<"w", double, 4, 3> w;
  auto loss = g::mean(g::square(g::matmul(x, w)));
  const std::string dot = g::to_dot(loss, g::grad(loss, w));
  BOOST_TEST(occurrences(dot, "label=\"matmul\\n") == 2u);  // forward, and x^T g (transpose as a flag)
  BOOST_TEST(occurrences(dot, "permute") == 0u);
  BOOST_TEST(occurrences(dot, "gradient") == 1u);
  BOOST_TEST(occurrences(dot, "inv_count") == 1u);
}
