// permute / transpose / matrix_transpose (materialised copies) of ranks 2 to 4, against
// index arithmetic written out in the test. reshape: test_shape_ops_reshape.
#define BOOST_TEST_MODULE graph_shape_ops
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

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

