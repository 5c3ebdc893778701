// Reductions of rank 2: sum / mean / max / min / argmax over each axis (positive or
// negative, keepdims or not) and over all axes, argmax ties, threaded sizes, and static
// result shapes, against plain loops with wide accumulation. Rank 3, zero-size and fused
// operands: test_reduce_axes.
#define BOOST_TEST_MODULE graph_reduce
#include "../support/reduce_reference.hpp"

namespace {

// Every rank-2 reduction in one graph (one plan, 21 outputs), checked against the
// reference; returns the results for further checks.
template <class T, class X>
auto run_rank2(g::session<g::cpu_simd>& s, const X& x, const std::vector<T>& xv, const shape_v& sh) {
  const auto xt = as_tensor<T, 2>(sh, xv);
  const auto rs = s.run(g::sum<0>(x), g::sum<1>(x), g::mean<0>(x), g::mean<1>(x), g::max<0>(x), g::max<1>(x),
                        g::min<0>(x), g::min<1>(x), g::argmax<0>(x), g::argmax<1>(x), g::sum(x), g::mean(x),
                        g::max(x), g::min(x), g::argmax(x), g::sum<-1>(x), g::sum<0, true>(x), g::max<1, true>(x),
                        g::argmax<-1, true>(x), g::mean<g::all_axes, true>(x), g::min<-2>(x), x = xt);
  check(std::get<0>(rs), rk::sum, 0, false, xv, sh);
  check(std::get<1>(rs), rk::sum, 1, false, xv, sh);
  check(std::get<2>(rs), rk::mean, 0, false, xv, sh);
  check(std::get<3>(rs), rk::mean, 1, false, xv, sh);
  check(std::get<4>(rs), rk::max, 0, false, xv, sh);
  check(std::get<5>(rs), rk::max, 1, false, xv, sh);
  check(std::get<6>(rs), rk::min, 0, false, xv, sh);
  check(std::get<7>(rs), rk::min, 1, false, xv, sh);
  check(std::get<8>(rs), rk::argmax, 0, false, xv, sh);
  check(std::get<9>(rs), rk::argmax, 1, false, xv, sh);
  check(std::get<10>(rs), rk::sum, all, false, xv, sh);
  check(std::get<11>(rs), rk::mean, all, false, xv, sh);
  check(std::get<12>(rs), rk::max, all, false, xv, sh);
  check(std::get<13>(rs), rk::min, all, false, xv, sh);
  check(std::get<14>(rs), rk::argmax, all, false, xv, sh);
  check(std::get<15>(rs), rk::sum, 1, false, xv, sh);   // sum<-1>
  check(std::get<16>(rs), rk::sum, 0, true, xv, sh);    // keepdims: (1, C)
  check(std::get<17>(rs), rk::max, 1, true, xv, sh);    // keepdims: (N, 1)
  check(std::get<18>(rs), rk::argmax, 1, true, xv, sh);
  check(std::get<19>(rs), rk::mean, all, true, xv, sh);  // keepdims: (1, 1)
  check(std::get<20>(rs), rk::min, 0, false, xv, sh);    // min<-2>
  return rs;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(rank2_every_reduction_axis_and_keepdims, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  const shape_v shapes[] = {{1, 1}, {7, 1}, {1, 7}, {7, 1023}, {1023, 7}, {17, 33}, {16, 16}, {3, 17}, {1, 1023}};
  for (const auto& sh : shapes) {
    run_rank2(s, x, uniform<T>(numel(sh), -1, 1), sh);
    run_rank2(s, x, discrete<T>(numel(sh), -2, 2), sh);  // ties everywhere
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(argmax_ties_pick_the_first_index, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  // rows: all equal; max twice; max at the end and the start; two maxima per column
  const std::vector<T> xv = {1, 1, 1, 1, 0, 5, 2, 5, 3, -1, 2, 3, -2, -2, -1, -1};
  const auto rs = run_rank2(s, x, xv, {4, 4});
  BOOST_TEST(equal(std::get<9>(rs), std::vector<int>{0, 1, 0, 2}));
  BOOST_TEST(equal(std::get<8>(rs), std::vector<int>{2, 1, 1, 1}));
  BOOST_TEST(equal(std::get<14>(rs), std::vector<int>{5}));
  // Rows of 33 (SIMD and tail): the maximum repeated, first at 20.
  std::vector<T> wide(2 * 33);
  for (std::size_t j = 0; j < 33; ++j) {
    wide[j] = T(7);
    wide[33 + j] = j == 20 || j == 31 ? T(9) : T(j % 5);
  }
  const auto rw = run_rank2(s, x, wide, {2, 33});
  BOOST_TEST(equal(std::get<9>(rw), std::vector<int>{0, 20}));
  BOOST_TEST(equal(std::get<14>(rw), std::vector<int>{53}));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(large_reductions_run_threaded_and_match, T, real_types) {
  // (1, 2^17 + 3): one long run reduced in blocks; (300, 1001) and (5, 40000): across
  // rows (rows longer than a piece); (1001, 300): many rows in parallel.
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::session<g::cpu_simd> s;
  const shape_v shapes[] = {{1, (1u << 17) + 3}, {300, 1001}, {5, 40000}, {1001, 300}};
  for (const auto& sh : shapes) run_rank2(s, x, uniform<T>(numel(sh), -1, 1), sh);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(static_result_shapes, T, real_types) {
  g::placeholder<"x", T, g::dyn, 4> x;
  g::variable<"w", T, 3, 5, 2> w;
  using g::shape;
  using g::shape_t;
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::sum<0>(x))>, shape<4>>));
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::sum<1>(x))>, shape<g::dyn>>));
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::sum<-1, true>(x))>, shape<g::dyn, 1>>));
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::sum<0, true>(x))>, shape<1, 4>>));
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::sum(x))>, shape<>>));
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::mean<g::all_axes, true>(w))>, shape<1, 1, 1>>));
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::max<1>(w))>, shape<3, 2>>));
  BOOST_TEST((std::is_same_v<shape_t<decltype(g::argmax<-2, true>(w))>, shape<3, 1, 2>>));
  BOOST_TEST((std::is_same_v<g::value_t<decltype(g::argmax<0>(w))>, std::int32_t>));
  BOOST_TEST((std::is_same_v<g::value_t<decltype(g::sum<0>(w))>, T>));

  // The same on a variable, computed.
  g::session<g::cpu_simd> s;
  const auto wv = uniform<T>(30, -1, 1);
  gradus::assign(s, w, tensor<T, 3>({3, 5, 2}, wv));
  const auto [m, a] = s.run(g::max<1>(w), g::argmax<-2, true>(w));
  check(m, rk::max, 1, false, wv, {3, 5, 2});
  check(a, rk::argmax, 1, true, wv, {3, 5, 2});
}

