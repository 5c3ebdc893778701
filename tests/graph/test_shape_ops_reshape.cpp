// reshape (a view of its operand's buffer): static shapes, an extent inferred at compile
// time or from the feed, zero size, and views read by kernels and fused passes.
#define BOOST_TEST_MODULE graph_shape_ops_reshape
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

BOOST_AUTO_TEST_CASE_TEMPLATE(reshape_static_and_inferred, T, real_types) {
  g::variable<"v", T, 3, 4> v;
  g::placeholder<"x", T, g::dyn, 3, 4> x;
  g::session<g::cpu_simd> s;
  // Static shapes, with a dyn extent inferred at compile time when the operand is static.
  BOOST_TEST((std::is_same_v<g::shape_t<decltype(g::reshape<2, 6>(v))>, g::shape<2, 6>>));
  BOOST_TEST((std::is_same_v<g::shape_t<decltype(g::reshape<g::dyn, 6>(v))>, g::shape<2, 6>>));
  BOOST_TEST((std::is_same_v<g::shape_t<decltype(g::reshape<4, g::dyn, 1>(v))>, g::shape<4, 3, 1>>));
  BOOST_TEST((std::is_same_v<g::shape_t<decltype(g::reshape<g::dyn, 6>(x))>, g::shape<g::dyn, 6>>));
  const auto vv = uniform<T>(12, -1, 1);
  g::assign(s, v, tensor<T, 2>({3, 4}, vv));
  const auto [a, b, c, d] = s.run(g::reshape<2, 6>(v), g::reshape<12>(v), g::reshape<g::dyn, 2>(v) * 2,
                                  g::reshape<1, g::dyn, 1>(v));
  BOOST_TEST(same_shape(a, {2, 6}));
  BOOST_TEST(same_shape(b, {12}));
  BOOST_TEST(same_shape(c, {6, 2}));
  BOOST_TEST(same_shape(d, {1, 12, 1}));
  BOOST_TEST(equal(a, std::vector<T>(vv)));
  BOOST_TEST(equal(b, std::vector<T>(vv)));
  BOOST_TEST(equal(d, std::vector<T>(vv)));
  std::vector<double> twice(12);
  for (std::size_t i = 0; i < 12; ++i) twice[i] = 2.0 * vv[i];
  BOOST_TEST(equal(c, twice));

  // Inferred at run time from the feed: [N, 3, 4] -> [2N, 6]; N = 0 gives [0, 6].
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(5)}) {
    const auto xv = uniform<T>(n * 12, -1, 1);
    const auto xt = tensor<T, 3>({n, 3, 4}, xv);
    const auto [r, e] = s.run(g::reshape<g::dyn, 6>(x), g::reshape<g::dyn>(g::exp(x)), x = xt);
    BOOST_TEST(same_shape(r, {long(2 * n), 6}));
    BOOST_TEST(same_shape(e, {long(12 * n)}));
    BOOST_TEST(equal(r, std::vector<T>(xv)));
    std::vector<double> ex(xv.size());
    for (std::size_t i = 0; i < xv.size(); ++i) ex[i] = std::exp(double(xv[i]));
    BOOST_TEST(close(e, ex, rtol<T>()));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reshape_feeds_kernels_and_fused_passes, T, real_types) {
  // [N, 3, 4] -> [N, 12] -> matmul with [12, 2]; the same view summed and broadcast.
  g::placeholder<"x", T, g::dyn, 3, 4> x;
  g::variable<"w", T, 12, 2> w;
  g::session<g::cpu_simd> s;
  const std::size_t n = 7;
  const auto xv = uniform<T>(n * 12, -1, 1), wv = uniform<T>(24, -1, 1);
  g::assign(s, w, tensor<T, 2>({12, 2}, wv));
  const auto flat = g::reshape<g::dyn, 12>(x);
  const auto xt = tensor<T, 3>({n, 3, 4}, xv);
  const auto [mm, rs, bc] = s.run(g::matmul(flat, w), g::sum<1>(flat), flat - g::reshape<1, 12>(g::sum<0>(flat)),
                                  x = xt);
  std::vector<double> wmm(n * 2, 0.0), smm(n * 2, 0.0), wrs(n, 0.0), srs(n, 0.0), col(12, 0.0), wbc(n * 12);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < 12; ++k) {
      const double xe = xv[i * 12 + k];
      for (std::size_t j = 0; j < 2; ++j) {
        wmm[i * 2 + j] += xe * wv[k * 2 + j];
        smm[i * 2 + j] += std::abs(xe * wv[k * 2 + j]);
      }
      wrs[i] += xe;
      srs[i] += std::abs(xe);
      col[k] += xe;
    }
  std::vector<double> sbc(n * 12);
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t k = 0; k < 12; ++k) {
      wbc[i * 12 + k] = xv[i * 12 + k] - col[k];
      sbc[i * 12 + k] = double(n) + 1;  // |x| <= 1: sum of n terms plus one
    }
  BOOST_TEST(same_shape(mm, {long(n), 2}));
  BOOST_TEST(close(mm, wmm, rtol<T>(), smm));
  BOOST_TEST(same_shape(rs, {long(n)}));
  BOOST_TEST(close(rs, wrs, rtol<T>(), srs));
  BOOST_TEST(same_shape(bc, {long(n), 12}));
  BOOST_TEST(close(bc, wbc, rtol<T>(), sbc));
}
