// 2-D matmul with transposed operands in every combination (folded into GEMM flags: the
// results prove the flags right), transposes of computed operands, dedup of equal
// products, empty extents; against a triple loop with wide accumulation. Batched: test_matmul_batched.
#define BOOST_TEST_MODULE graph_matmul
#include <cstring>

#include "../support/matmul_reference.hpp"

BOOST_AUTO_TEST_CASE_TEMPLATE(matmul_2d_with_every_transpose_combination, T, real_types) {
  // a [M, K] and at = a^T [K, M]; b [K, N] and bt = b^T [N, K]: all four products are a*b.
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"at", T, g::dyn, g::dyn> at;
  g::placeholder<"b", T, g::dyn, g::dyn> b;
  g::placeholder<"bt", T, g::dyn, g::dyn> bt;
  g::session<g::cpu_simd> s;
  for (const auto [m, k, n] : sizes2) {
    const auto av = uniform<T>(m * k, -1, 1), bv = uniform<T>(k * n, -1, 1);
    const auto atv = transposed(av, 1, m, k), btv = transposed(bv, 1, k, n);
    const auto rs = s.run(g::matmul(a, b), g::matmul(g::transpose(at), b), g::matmul(a, g::transpose(bt)),
                          g::matmul(g::transpose(at), g::transpose(bt)), g::matmul(g::matrix_transpose(at), b),
                          a = tensor<T, 2>({m, k}, av), at = tensor<T, 2>({k, m}, atv), b = tensor<T, 2>({k, n}, bv),
                          bt = tensor<T, 2>({n, k}, btv));
    const auto want = matmul_ref(av, bv, 1, m, k, n, 0, 0);
    const std::string label = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    BOOST_TEST(same_shape(std::get<0>(rs), {long(m), long(n)}), label);
    BOOST_TEST(same_shape(std::get<3>(rs), {long(m), long(n)}), label);
    BOOST_TEST(close(std::get<0>(rs), want.value, rtol<T>(), want.scale), "a*b " << label);
    BOOST_TEST(close(std::get<1>(rs), want.value, rtol<T>(), want.scale), "at^T*b " << label);
    BOOST_TEST(close(std::get<2>(rs), want.value, rtol<T>(), want.scale), "a*bt^T " << label);
    BOOST_TEST(close(std::get<3>(rs), want.value, rtol<T>(), want.scale), "at^T*bt^T " << label);
    BOOST_TEST(close(std::get<4>(rs), want.value, rtol<T>(), want.scale), "matrix_transpose(at)*b " << label);
    // The transposes were GEMM flags: no permute step ran, one GEMM per distinct product.
    BOOST_TEST(s.stats().count("permute") == 0u);
    BOOST_TEST(s.stats().count("matmul") == 4u);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(transposed_computed_operands, T, real_types) {
  // A transpose of a fused pass or of a kernel's result is folded too: its operand is
  // materialised, then read with the transpose flag.
  g::placeholder<"x", T, g::dyn, g::dyn> x;  // [K, M]
  g::variable<"w", T, 6, 4> w;               // [N, K] read transposed
  g::session<g::cpu_simd> s;
  const std::size_t k = 4, m = 9, n = 6;
  const auto xv = uniform<T>(k * m, -1, 1), wv = uniform<T>(n * k, -1, 1);
  gradus::assign(s, w, tensor<T, 2>({n, k}, wv));
  const auto [r1, r2] = s.run(g::matmul(g::transpose(x * 2), g::transpose(g::exp(w))),
                              g::matmul(g::transpose(g::matmul(w, x)), w), x = tensor<T, 2>({k, m}, xv));
  // r1 = (2x)^T exp(w)^T: [M, K] x [K, N]
  std::vector<T> a(m * k), b(k * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t l = 0; l < k; ++l) a[i * k + l] = T(2) * xv[l * m + i];
  for (std::size_t l = 0; l < k; ++l)
    for (std::size_t j = 0; j < n; ++j) b[l * n + j] = static_cast<T>(std::exp(double(wv[j * k + l])));
  const auto want1 = matmul_ref(a, b, 1, m, k, n, 0, 0);
  BOOST_TEST(same_shape(r1, {long(m), long(n)}));
  BOOST_TEST(close(r1, want1.value, 2 * rtol<T>(), want1.scale));
  // r2 = (w x)^T w: [M, N] x [N, K], the transposed operand being a matmul's result
  const auto p = matmul_ref(wv, xv, 1, n, k, m, 0, 0);  // [N, M]
  std::vector<T> pv(p.value.size());
  for (std::size_t i = 0; i < pv.size(); ++i) pv[i] = static_cast<T>(p.value[i]);
  const auto want2 = matmul_ref(transposed(pv, 1, n, m), wv, 1, m, n, k, 0, 0);
  BOOST_TEST(same_shape(r2, {long(m), long(k)}));
  BOOST_TEST(close(r2, want2.value, 8 * rtol<T>(), want2.scale));
  BOOST_TEST(s.stats().count("permute") == 0u);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(equal_subexpressions_are_computed_once_and_right, T, real_types) {
  g::placeholder<"x", T, g::dyn, 5> x;
  g::variable<"w", T, 5, 3> w;
  g::variable<"b", T, 3> b;
  g::session<g::cpu_simd> s;
  const auto xv = uniform<T>(4 * 5, -1, 1), wv = uniform<T>(15, -1, 1), bv = uniform<T>(3, -1, 1);
  gradus::assign(s, w, tensor<T, 2>({5, 3}, wv));
  gradus::assign(s, b, tensor<T, 1>({3}, bv));
  const auto xt = tensor<T, 2>({4, 5}, xv);
  const auto xw = matmul_ref(xv, wv, 1, 4, 5, 3, 0, 0);
  const auto r = s.run(g::matmul(x, w) + g::matmul(x, w), x = xt);
  BOOST_TEST(s.stats().count("matmul") == 1u, "matmul(x, w) + matmul(x, w) runs one GEMM");
  std::vector<double> twice(12), scale2(12);
  for (std::size_t i = 0; i < 12; ++i) {
    twice[i] = 2 * xw.value[i];
    scale2[i] = 2 * xw.scale[i];
  }
  BOOST_TEST(same_shape(r, {4, 3}));
  BOOST_TEST(close(r, twice, rtol<T>(), scale2));
  // A layer written twice over, as several outputs of one run.
  const auto h = g::relu(g::matmul(x, w) + b);
  const auto [r1, r2, r3] = s.run(h, h * 2, g::sum<1>(h) + g::sum<1>(h), x = xt);
  BOOST_TEST(s.stats().count("matmul") == 1u);
  BOOST_TEST(s.stats().count("sum") == 1u);
  std::vector<double> wh(12), wh2(12), ws(4, 0.0), ss(4, 0.0), sh(12);
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = 0; j < 3; ++j) {
      const double v = std::max(0.0, xw.value[i * 3 + j] + bv[j]);
      wh[i * 3 + j] = v;
      wh2[i * 3 + j] = 2 * v;
      sh[i * 3 + j] = xw.scale[i * 3 + j] + std::abs(double(bv[j]));
      ws[i] += 2 * v;
      ss[i] += 2 * sh[i * 3 + j];
    }
  BOOST_TEST(close(r1, wh, rtol<T>(), sh));
  BOOST_TEST(close(r2, wh2, rtol<T>(), sh));
  BOOST_TEST(close(r3, ws, rtol<T>(), ss));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(zero_size_and_empty_inner_dimension, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn> x;
  g::placeholder<"w", T, g::dyn, g::dyn> w;
  g::session<g::cpu_simd> s;
  // M = 0: an empty result of the right shape.
  const xt::xtensor<T, 2> x0(std::array<std::size_t, 2>{0, 4});
  const auto w43 = random_tensor<T, 2>({4, 3});
  BOOST_TEST(same_shape(s.run(g::matmul(x, w), x = x0, w = w43), {0, 3}));
  // K = 0: the empty sum, zeros.
  const xt::xtensor<T, 2> x30(std::array<std::size_t, 2>{3, 0});
  const xt::xtensor<T, 2> w02(std::array<std::size_t, 2>{0, 2});
  const auto r = s.run(g::matmul(x, w), x = x30, w = w02);
  BOOST_TEST(same_shape(r, {3, 2}));
  BOOST_TEST(equal(r, std::vector<double>(6, 0.0)));
  // And the same graph then multiplies real data.
  const auto x34 = random_tensor<T, 2>({3, 4});
  const auto r2 = s.run(g::matmul(x, w), x = x34, w = w43);
  const std::vector<T> xv(x34.begin(), x34.end()), wv(w43.begin(), w43.end());
  const auto want = matmul_ref(xv, wv, 1, 3, 4, 3, 0, 0);
  BOOST_TEST(close(r2, want.value, rtol<T>(), want.scale));
}

// A small output over a long inner dimension (a convolution's weight gradient) is split
// over k across threads: each transpose combination against the reference, and the
// same bits on a second run (the partial sums are added in a fixed order).
BOOST_AUTO_TEST_CASE_TEMPLATE(long_inner_dimension_split_over_threads, T, real_types) {
  g::session<g::cpu_simd> s;
  const std::size_t m = 6, n = 25, k = 5000;
  g::placeholder<"a", T, g::dyn, g::dyn> a;
  g::placeholder<"b", T, g::dyn, g::dyn> b;
  g::placeholder<"at", T, g::dyn, g::dyn> at;
  g::placeholder<"bt", T, g::dyn, g::dyn> bt;
  const auto av = uniform<T>(m * k, -1, 1), bv = uniform<T>(k * n, -1, 1);
  const auto atv = transposed(av, 1, m, k), btv = transposed(bv, 1, k, n);
  const auto ref = matmul_ref(av, bv, 1, m, k, n, 0, 0);
  const auto feeds = std::tuple{a = g::view(av.data(), {long(m), long(k)}), b = g::view(bv.data(), {long(k), long(n)}),
                                at = g::view(atv.data(), {long(k), long(m)}), bt = g::view(btv.data(), {long(n), long(k)})};
  const auto run = [&] {
    return std::apply([&](const auto&... f) {
      const auto [r0, r1, r2, r3] = s.run(g::matmul(a, b), g::matmul(g::transpose(at), b), g::matmul(a, g::transpose(bt)),
                                          g::matmul(g::transpose(at), g::transpose(bt)), f...);
      return std::array<std::vector<T>, 4>{std::vector<T>(r0.begin(), r0.end()), std::vector<T>(r1.begin(), r1.end()),
                                           std::vector<T>(r2.begin(), r2.end()), std::vector<T>(r3.begin(), r3.end())};
    }, feeds);
  };
  const auto first = run(), second = run();
  for (std::size_t i = 0; i < 4; ++i) {
    BOOST_TEST(close(g::tensor_view<const T>{first[i].data(), g::dims{std::array<g::index_t, 2>{long(m), long(n)}}},
                     ref.value, 10 * rtol<T>(), ref.scale), "transpose combination " << i);
    BOOST_TEST((first[i] == second[i]), "transpose combination " << i << " differs between two runs");
  }
}

// A few rows against held weights (cpu_simd::hold_weights, cpu_simd/dnnl_matmul.hpp: what a
// pipeline stage does over its micro-batches): the packed copies give the product of the
// weights as held; a square matrix and its transpose are two copies (they share a layout);
// after release_weights, a changed matrix is read again, not its old copy; refill_weights
// fills the copies from the new values at once.
BOOST_AUTO_TEST_CASE(few_rows_against_held_weights) {
  const g::index_t m = 8, k = 96, n = 96;
  const auto a = uniform<float>(m * k, -1, 1);
  auto w = uniform<float>(k * n, -1, 1);
  std::vector<float> c(static_cast<std::size_t>(m * n));
  const auto check = [&](bool tb, const std::string& what) {
    g::cpu_simd::gemm(false, tb, m, n, k, 1.0f, a.data(), k, 0, w.data(), n, 0, 0.0f, c.data(), n, 0, 1);
    double worst = 0;
    for (g::index_t i = 0; i < m; ++i)
      for (g::index_t j = 0; j < n; ++j) {
        double ref = 0;
        for (g::index_t q = 0; q < k; ++q)
          ref += double(a[static_cast<std::size_t>(i * k + q)]) * w[static_cast<std::size_t>(tb ? j * n + q : q * n + j)];
        worst = std::max(worst, std::abs(c[static_cast<std::size_t>(i * n + j)] - ref));
      }
    BOOST_TEST(worst <= 1e-4, what << ": largest error " << worst);
  };
  for (int round = 0; round < 2; ++round) {
    g::cpu_simd::hold_weights(w.data(), w.size() * sizeof(float));
    check(false, "held, round " + std::to_string(round));
    check(true, "held, transposed, round " + std::to_string(round));
    check(false, "held again, round " + std::to_string(round));
    g::cpu_simd::release_weights();
    for (auto& v : w) v = -2 * v + 0.25f;  // changed after the release
  }
  check(false, "released");
#if defined(GRADUS_HAVE_DNNL) && GRADUS_HAVE_DNNL
  // refill_weights after the holder's own write (a pipeline stage's update): the copies are
  // reordered from the new values at once and used as they are at the next hold
  auto& h = g::cpu_dnnl::held();
  BOOST_TEST_REQUIRE(h.copies.size() == 2u);  // the matrix, and its transpose
  const auto epoch = g::cpu_dnnl::weights_epoch();
  for (auto& v : w) v = 0.5f * v - 0.125f;
  g::cpu_simd::refill_weights(w.data(), w.size() * sizeof(float));
  BOOST_TEST(h.refilled == 2u);
  const auto filled = h.filled_on_use;
  g::cpu_simd::hold_weights(w.data(), w.size() * sizeof(float));
  check(false, "refilled");
  check(true, "refilled, transposed");
  BOOST_TEST(h.filled_on_use == filled, "the refilled copies are used, not filled again");
  g::cpu_simd::release_weights();
  BOOST_TEST(g::cpu_dnnl::weights_epoch() == epoch + 1);
  // a range that holds neither copy's operand refills nothing
  g::cpu_simd::refill_weights(a.data(), a.size() * sizeof(float));
  BOOST_TEST(h.refilled == 2u);
#endif
}

#if defined(GRADUS_HAVE_DNNL) && GRADUS_HAVE_DNNL && defined(__AVX__)
// refill_weights packs a held operand itself (cpu_simd/panel_pack.hpp) into the layout
// oneDNN's matmul chose: the same bytes as oneDNN's own reorder, padding included, for
// operands read as they are and transposed, k and n off the layout's blocks, a leading
// dimension wider than a row, rows that end off the 16- and 8-row tiles, and the rows packed
// in two pieces, the second starting inside a tile.
BOOST_AUTO_TEST_CASE(packed_rows_match_onednns_reorder) {
  using dt = dnnl::memory::data_type;
  struct shape {
    g::index_t k, n, ldb;
    bool tb;
  };
  const auto& eng = g::cpu_dnnl::engine();
  dnnl::stream st(eng);
  for (const auto [k, n, ldb, tb] : {shape{96, 96, 96, false}, shape{96, 96, 96, true}, shape{100, 72, 80, false},
                                     shape{100, 72, 110, true}, shape{784, 512, 512, false}, shape{784, 512, 784, true},
                                     shape{37, 13, 41, true}, shape{17, 130, 130, false}, shape{100, 72, 100, true},
                                     shape{512, 512, 512, true}}) {
    BOOST_TEST_CONTEXT("B [" << k << ", " << n << "], ldb " << ldb << (tb ? ", transposed" : "")) {
      const g::index_t m = 8;
      const dnnl::memory::desc a_md({m, k}, dt::f32, dnnl::memory::dims{k, 1});
      const dnnl::memory::desc b_md({k, n}, dt::f32, tb ? dnnl::memory::dims{1, ldb} : dnnl::memory::dims{ldb, 1});
      const dnnl::memory::desc c_md({m, n}, dt::f32, dnnl::memory::dims{n, 1});
      const dnnl::memory::desc any({k, n}, dt::f32, dnnl::memory::format_tag::any);
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, any, c_md), eng);
      const auto panels = g::cpu_dnnl::panels_of(pd.weights_desc(), k, n);
      BOOST_TEST_REQUIRE(bool(panels), "oneDNN's layout is not cpu_pack's panels");
      const auto src = uniform<float>((tb ? n : k) * ldb, -1, 1);
      std::vector<float> zeros(src.size(), 0.0f);
      dnnl::memory want(pd.weights_desc(), eng), got(pd.weights_desc(), eng);
      const dnnl::reorder r(dnnl::reorder::primitive_desc(eng, b_md, eng, pd.weights_desc()));
      r.execute(st, {{DNNL_ARG_FROM, dnnl::memory(b_md, eng, const_cast<float*>(src.data()))}, {DNNL_ARG_TO, want}});
      r.execute(st, {{DNNL_ARG_FROM, dnnl::memory(b_md, eng, zeros.data())}, {DNNL_ARG_TO, got}});  // the padding
      st.wait();
      const auto bytes = pd.weights_desc().get_size();
      const std::vector<char> padded(static_cast<const char*>(got.get_data_handle()),
                                     static_cast<const char*>(got.get_data_handle()) + bytes);
      const g::index_t rows = tb ? n : k;
      auto* out = static_cast<float*>(got.get_data_handle());
      g::cpu_pack::pack_rows(panels, tb, k, n, src.data(), ldb, 0, rows, out);
      BOOST_TEST(std::memcmp(want.get_data_handle(), out, bytes) == 0, "packed at once");
      std::memcpy(out, padded.data(), bytes);  // again, in two pieces cut off the tiles
      const g::index_t cut = std::min<g::index_t>(rows, 9);
      g::cpu_pack::pack_rows(panels, tb, k, n, src.data(), ldb, 0, cut, out);
      g::cpu_pack::pack_rows(panels, tb, k, n, src.data(), ldb, cut, rows, out);
      BOOST_TEST(std::memcmp(want.get_data_handle(), out, bytes) == 0, "packed in two pieces");
    }
  }
}
#endif
