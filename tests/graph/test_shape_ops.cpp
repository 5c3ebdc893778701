// permute / transpose / matrix_transpose (materialised copies) and reshape (a view),
// against index arithmetic written out in the test.
#define BOOST_TEST_MODULE graph_shape_ops
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

using shape_v = std::vector<std::size_t>;

// out[i_0..i_{r-1}] = in[j] with j's axis perm[k] = i_k.
template <class T>
std::vector<double> permute_ref(const std::vector<T>& in, const shape_v& s, const std::vector<std::size_t>& perm,
                                shape_v& out_shape) {
  const std::size_t r = s.size();
  out_shape.assign(r, 0);
  for (std::size_t k = 0; k < r; ++k) out_shape[k] = s[perm[k]];
  std::vector<std::size_t> in_stride(r, 1);
  for (std::size_t k = r - 1; k-- > 0;) in_stride[k] = in_stride[k + 1] * s[k + 1];
  std::vector<double> out(in.size());
  std::vector<std::size_t> idx(r, 0);
  for (std::size_t flat = 0; flat < in.size(); ++flat) {
    std::size_t rem = flat, src = 0;
    for (std::size_t k = r; k-- > 0;) {
      idx[k] = rem % out_shape[k];
      rem /= out_shape[k];
    }
    for (std::size_t k = 0; k < r; ++k) src += idx[k] * in_stride[perm[k]];
    out[flat] = static_cast<double>(in[src]);
  }
  return out;
}

template <class V>
boost::test_tools::predicate_result shape_is(const V& got, const shape_v& want) {
  g::dims w;
  w.rank = want.size();
  for (std::size_t i = 0; i < want.size(); ++i) w.d[i] = static_cast<g::index_t>(want[i]);
  if (got.shape == w) return true;
  boost::test_tools::predicate_result r(false);
  r.message() << "shape " << dims_str(got.shape) << " != " << dims_str(w);
  return r;
}

template <class T, std::size_t R>
xt::xtensor<T, R> as_tensor(const shape_v& s, const std::vector<T>& v) {
  std::array<std::size_t, R> sh{};
  std::copy(s.begin(), s.end(), sh.begin());
  return tensor<T, R>(sh, v);
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(transpose_rank2, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  const shape_v shapes[] = {{1, 1}, {1, 7}, {7, 1}, {17, 33}, {16, 16}, {3, 1023}, {0, 5}};
  for (const auto& sh : shapes) {
    const auto xv = uniform<T>(numel(sh), -1, 1);
    const auto [t, mt, tt] = s.run(g::transpose(x), g::matrix_transpose(x), g::transpose(g::transpose(x)),
                                   x = as_tensor<T, 2>(sh, xv));
    shape_v os;
    const auto want = permute_ref(xv, sh, {1, 0}, os);
    BOOST_TEST(shape_is(t, os));
    BOOST_TEST(equal(t, want));
    BOOST_TEST(equal(mt, want));
    BOOST_TEST(shape_is(tt, sh));
    BOOST_TEST(equal(tt, std::vector<T>(xv)));
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(permutations_of_rank3, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  BOOST_TEST((std::is_same_v<g::shape_t<decltype(g::permute<2, 0, 1>(g::variable<"v", T, 2, 3, 4>{}))>,
                             g::shape<4, 2, 3>>));
  const shape_v shapes[] = {{2, 3, 4}, {1, 7, 1}, {5, 1, 17}, {3, 16, 33}, {0, 3, 4}, {2, 2, 2}};
  for (const auto& sh : shapes) {
    const auto xv = uniform<T>(numel(sh), -1, 1);
    const auto rs = s.run(g::permute<0, 1, 2>(x), g::permute<0, 2, 1>(x), g::permute<1, 0, 2>(x),
                          g::permute<1, 2, 0>(x), g::permute<2, 0, 1>(x), g::permute<2, 1, 0>(x), g::transpose(x),
                          g::matrix_transpose(x), x = as_tensor<T, 3>(sh, xv));
    const std::vector<std::size_t> perms[] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    auto check = [&](const auto& got, const std::vector<std::size_t>& p) {
      shape_v os;
      const auto want = permute_ref(xv, sh, p, os);
      BOOST_TEST(shape_is(got, os));
      BOOST_TEST(equal(got, want), "perm " << p[0] << p[1] << p[2] << " of " << sh[0] << "x" << sh[1] << "x" << sh[2]);
    };
    check(std::get<0>(rs), perms[0]);
    check(std::get<1>(rs), perms[1]);
    check(std::get<2>(rs), perms[2]);
    check(std::get<3>(rs), perms[3]);
    check(std::get<4>(rs), perms[4]);
    check(std::get<5>(rs), perms[5]);
    check(std::get<6>(rs), perms[5]);  // transpose reverses every axis
    check(std::get<7>(rs), perms[1]);  // matrix_transpose swaps the last two
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(permute_rank4_large_and_of_computed_operands, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn, g::dyn, g::dyn> x;
  g::placeholder<"y", T, g::dyn, g::dyn, g::dyn> y;
  g::session<g::cpu_simd> s;
  const shape_v s4 = {2, 3, 5, 7};
  const auto xv = uniform<T>(numel(s4), -1, 1);
  const auto r4 = s.run(g::permute<3, 1, 0, 2>(x), x = as_tensor<T, 4>(s4, xv));
  shape_v os;
  BOOST_TEST(equal(r4, permute_ref(xv, s4, {3, 1, 0, 2}, os)));
  BOOST_TEST(shape_is(r4, os));
  // 40 x 50 x 60 = 120000 elements: the threaded copy; and a permute of a fused pass.
  const shape_v s3 = {40, 50, 60};
  const auto yv = uniform<T>(numel(s3), -1, 1);
  const auto [p, q] = s.run(g::permute<2, 0, 1>(y), g::permute<1, 2, 0>(y * 2) + 1, y = as_tensor<T, 3>(s3, yv));
  BOOST_TEST(equal(p, permute_ref(yv, s3, {2, 0, 1}, os)));
  BOOST_TEST(shape_is(p, os));
  auto want = permute_ref(yv, s3, {1, 2, 0}, os);
  for (auto& v : want) v = static_cast<double>(static_cast<T>(2 * v) + T(1));
  BOOST_TEST(equal(q, want));
}

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
  s.assign(v, tensor<T, 2>({3, 4}, vv));
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
  s.assign(w, tensor<T, 2>({12, 2}, wv));
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
