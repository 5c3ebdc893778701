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

// cpu_simd's register-blocked kernels (cpu_simd/gemm_kernels.hpp: few rows, or a small right
// operand) called directly, against a long-double triple loop, over the shapes that reach
// every tail: rows off the 8-row tile, columns off the 48-, 32- and 16-wide blocks, k off a
// vector, leading dimensions wider than a row, alpha and beta; C's padding stays unwritten.
BOOST_AUTO_TEST_CASE(few_row_kernels_against_a_wide_reference) {
  namespace k_ = g::cpu_gemm;
  if constexpr (!k_::available) {
    BOOST_TEST_MESSAGE("built without AVX2 / AVX-512: OpenBLAS takes every product");
    return;
  } else {
    struct layout {
      bool ta, tb;
    };
    int cases = 0;
    const auto check = [&](layout l, g::index_t m, g::index_t n, g::index_t k, float alpha, float beta, g::index_t pad) {
      const g::index_t lda = (l.ta ? m : k) + pad, ldb = (l.tb ? k : n) + pad, ldc = n + pad;
      const auto a = uniform<float>((l.ta ? k : m) * lda, -1, 1), b = uniform<float>((l.tb ? n : k) * ldb, -1, 1);
      const auto c0 = uniform<float>(m * ldc, -1, 1);
      auto c = c0;
      k_::gemm(l.ta, l.tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
      double worst = 0;
      bool padding = true;
      for (g::index_t i = 0; i < m; ++i)
        for (g::index_t j = 0; j < ldc; ++j) {
          const auto at = static_cast<std::size_t>(i * ldc + j);
          if (j >= n) {
            padding = padding && c[at] == c0[at];
            continue;
          }
          long double acc = 0, scale = 0;
          for (g::index_t q = 0; q < k; ++q) {
            const long double t = static_cast<long double>(a[static_cast<std::size_t>(l.ta ? q * lda + i : i * lda + q)]) *
                                  b[static_cast<std::size_t>(l.tb ? j * ldb + q : q * ldb + j)];
            acc += t;
            scale += std::abs(t);
          }
          const long double want = alpha * acc + (beta == 0 ? 0 : beta * static_cast<long double>(c0[at]));
          worst = std::max(worst, static_cast<double>(std::abs(want - c[at]) / (1 + std::abs(alpha) * scale)));
        }
      BOOST_TEST(worst <= 4e-7, (l.ta ? "A^T " : "A ") << (l.tb ? "B^T " : "B ") << m << "x" << n << "x" << k << " alpha "
                                                         << alpha << " beta " << beta << " pad " << pad << ": error " << worst);
      BOOST_TEST(padding, "C's padding was written: " << m << "x" << n << "x" << k);
      ++cases;
    };
    for (const layout l : {layout{false, false}, layout{true, false}, layout{false, true}})
      for (const g::index_t m : {1, 7, 8, 9, 17, 64})
        for (const g::index_t n : {1, 3, 15, 16, 17, 33, 47, 48, 49, 80, 100})
          for (const g::index_t k : {1, 5, 16, 17, 70})
            check(l, m, n, k, 1.0f, 0.0f, (m + n + k) % 3);
    for (const layout l : {layout{false, false}, layout{true, false}, layout{false, true}}) {
      check(l, 9, 50, 20, 0.5f, 1.0f, 1);
      check(l, 9, 50, 20, 1.0f, 1.0f, 2);  // A B, A^T B: the sums go on from C's values
      check(l, 9, 50, 20, -2.0f, 0.25f, 0);
      check(l, 300, 100, 64, 1.0f, 0.0f, 3);  // many row tiles against a small B: a weight gradient's shape
      check(l, 8, 520, 515, 1.0f, 0.0f, 0);   // a micro-batch against a layer's weights
    }
    BOOST_TEST(cases == 3 * 6 * 11 * 5 + 15);
  }
}

// Where the kernels take over from OpenBLAS (takes: what the pipelines' micro-batches and a
// batch of 64 ask for), and that a micro-batch's rows come out with the whole batch's bits
// (each output sums its k products in one order whatever the rows around it and the thread
// count), through cpu_simd::gemm as the graph calls it.
BOOST_AUTO_TEST_CASE(micro_batch_rows_have_the_whole_batchs_bits) {
  namespace k_ = g::cpu_gemm;
  BOOST_TEST(k_::takes(false, false, 8, 512, 512) == k_::available);
  BOOST_TEST(k_::takes(false, true, 8, 512, 512) == k_::available);
  BOOST_TEST(k_::takes(true, false, 512, 512, 64) == k_::available);  // X^T G over a batch: B 128 KiB
  BOOST_TEST(!k_::takes(false, false, 1000, 512, 512));                // many rows, B 1 MiB: OpenBLAS's
  BOOST_TEST(!k_::takes(false, false, 64, 10, 512));                   // narrower than a block
  BOOST_TEST(!k_::takes(false, true, 64, 512, 10));                    // dot products of 10
  BOOST_TEST(!k_::takes(true, true, 8, 512, 512));
  const g::index_t rows = 64, k = 200, n = 130;
  const auto x = uniform<float>(rows * k, -1, 1), w = uniform<float>(k * n, -1, 1), wt = transposed(w, 1, k, n);
  for (const bool tb : {false, true}) {
    std::vector<float> whole(static_cast<std::size_t>(rows * n)), parts(whole.size()), two(whole.size());
    const float* b = tb ? wt.data() : w.data();
    const g::index_t ldb = tb ? k : n;
    const int threads = g::cpu_simd::threads();
    g::cpu_simd::set_threads(1);
    g::cpu_simd::gemm(false, tb, rows, n, k, 1.0f, x.data(), k, 0, b, ldb, 0, 0.0f, whole.data(), n, 0, 1);
    for (g::index_t r0 = 0; r0 < rows; r0 += 9) {  // micro-batches of 9 rows, the last of 1
      const g::index_t r = std::min<g::index_t>(9, rows - r0);
      g::cpu_simd::gemm(false, tb, r, n, k, 1.0f, x.data() + r0 * k, k, 0, b, ldb, 0, 0.0f, parts.data() + r0 * n, n, 0, 1);
    }
    g::cpu_simd::set_threads(2);
    g::cpu_simd::gemm(false, tb, rows, n, k, 1.0f, x.data(), k, 0, b, ldb, 0, 0.0f, two.data(), n, 0, 1);
    g::cpu_simd::set_threads(threads);
    BOOST_TEST(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)) == 0, "micro-batches, tb " << tb);
    BOOST_TEST(std::memcmp(whole.data(), two.data(), whole.size() * sizeof(float)) == 0, "two threads, tb " << tb);
    const auto want = matmul_ref(x, w, 1, rows, k, n, 0, 0);
    BOOST_TEST(close(g::tensor_view<const float>{whole.data(), g::dims{std::array<g::index_t, 2>{rows, n}}}, want.value,
                     rtol<float>(), want.scale));
  }
}

// A B and A^T B with alpha = beta = 1 go on from C's values: a product over k's first rows,
// then one over the rest, gives the bits of one product over all of them (a pipeline stage
// sums its weight gradients over the micro-batches done while it waits for the last one:
// parallel/pipeline/pipeline_stage.hpp), through cpu_simd::gemm as the stage calls it, on
// 1 and 2 threads, rows off the tile and columns off the blocks; gemm_continues_sums says
// where (not for B^T, double, OpenBLAS's shapes).
BOOST_AUTO_TEST_CASE(a_product_over_k_in_two_parts_has_the_whole_ones_bits) {
  using cs = g::cpu_simd;
  const bool on = g::cpu_gemm::available;
  BOOST_TEST(cs::gemm_continues_sums<float>(true, false, 784, 512, 56) == on);  // X^T G of the rows done
  BOOST_TEST(cs::gemm_continues_sums<float>(false, false, 8, 512, 512) == on);
  BOOST_TEST(!cs::gemm_continues_sums<float>(false, true, 8, 512, 512));  // dot products: summed across lanes
  BOOST_TEST(!cs::gemm_continues_sums<double>(true, false, 784, 512, 56));
  BOOST_TEST(!cs::gemm_continues_sums<float>(true, false, 512, 10, 64));     // narrower than a block: OpenBLAS's
  BOOST_TEST(!cs::gemm_continues_sums<float>(false, false, 1000, 512, 512)); // many rows, B 1 MiB: OpenBLAS's
  if (!on) return;
  const int threads = cs::threads();
  for (const bool ta : {false, true})
    for (const auto& [m, n, k, k1] : std::vector<std::array<g::index_t, 4>>{{8, 130, 64, 56}, {9, 512, 64, 1}, {300, 100, 64, 17},
                                                                           {784, 512, 64, 56}})
      for (const int t : {1, 2}) {
        const auto a = uniform<float>(m * k, -1, 1), b = uniform<float>(k * n, -1, 1);
        const g::index_t lda = ta ? m : k;  // A [m, k], or A^T stored [k, m]
        const auto row = [&](g::index_t p) { return ta ? a.data() + p * lda : a.data() + p; };
        std::vector<float> whole(static_cast<std::size_t>(m * n)), parts(whole.size(), 7.0f);
        cs::set_threads(t);
        BOOST_TEST(cs::gemm_continues_sums<float>(ta, false, m, n, k1));
        BOOST_TEST(cs::gemm_continues_sums<float>(ta, false, m, n, k - k1));
        cs::gemm(ta, false, m, n, k, 1.0f, a.data(), lda, 0, b.data(), n, 0, 0.0f, whole.data(), n, 0, 1);
        cs::gemm(ta, false, m, n, k1, 1.0f, row(0), lda, 0, b.data(), n, 0, 0.0f, parts.data(), n, 0, 1);
        cs::gemm(ta, false, m, n, k - k1, 1.0f, row(k1), lda, 0, b.data() + k1 * n, n, 0, 1.0f, parts.data(), n, 0, 1);
        BOOST_TEST(std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)) == 0,
                   (ta ? "A^T B " : "A B ") << m << "x" << n << "x" << k << " at " << k1 << ", threads " << t);
      }
  cs::set_threads(threads);
}
