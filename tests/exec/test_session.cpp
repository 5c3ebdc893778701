#define BOOST_TEST_MODULE exec_session
#include <boost/test/unit_test.hpp>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace g = gradus;

BOOST_AUTO_TEST_CASE(bias_add_exp_matches_loop) {
  g::placeholder<"x", float, g::dyn, 4> x;
  g::variable<"b", float, 4> b;
  g::session<g::cpu_simd> s;
  xt::xtensor<float, 1> bv = {1, 2, 3, 4};
  s.assign(b, bv);
  xt::xtensor<float, 2> xv = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  auto r = s.run(g::exp(x * 0.5f) + b, x = xv);
  BOOST_TEST(r.shape.rank == 2u);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 4; ++j)
      BOOST_TEST(r[static_cast<g::index_t>(i * 4 + j)] == std::exp(xv(i, j) * 0.5f) + bv(j),
                 boost::test_tools::tolerance(1e-6f));
}
