// Batched matmul: 3-D x 3-D with transposed operands in every combination, 3-D x 2-D and
// 2-D x 3-D (the matrix shared across the batch), against a triple loop.
#define BOOST_TEST_MODULE graph_matmul_batched
#include "../support/matmul_reference.hpp"

BOOST_AUTO_TEST_CASE_TEMPLATE(batched_matmul_with_every_transpose_combination, T, real_types) {
  g::placeholder<"a", T, g::dyn, g::dyn, g::dyn> a;    // [B, M, K]
  g::placeholder<"at", T, g::dyn, g::dyn, g::dyn> at;  // [B, K, M]
  g::placeholder<"b", T, g::dyn, g::dyn, g::dyn> b;    // [B, K, N]
  g::placeholder<"bt", T, g::dyn, g::dyn, g::dyn> bt;  // [B, N, K]
  g::session<g::cpu_simd> s;
  const std::size_t batches[] = {1, 3, 7};
  for (std::size_t nb : batches)
    for (const auto [m, k, n] : sizes2) {
      if (m * k * n > 20000) continue;
      const auto av = uniform<T>(nb * m * k, -1, 1), bv = uniform<T>(nb * k * n, -1, 1);
      const auto atv = transposed(av, nb, m, k), btv = transposed(bv, nb, k, n);
      const auto rs = s.run(g::matmul(a, b), g::matmul(g::matrix_transpose(at), b),
                            g::matmul(a, g::matrix_transpose(bt)),
                            g::matmul(g::matrix_transpose(at), g::matrix_transpose(bt)),
                            a = tensor<T, 3>({nb, m, k}, av), at = tensor<T, 3>({nb, k, m}, atv),
                            b = tensor<T, 3>({nb, k, n}, bv), bt = tensor<T, 3>({nb, n, k}, btv));
      const auto want = matmul_ref(av, bv, nb, m, k, n, m * k, k * n);
      const std::string label =
          std::to_string(nb) + "x" + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
      BOOST_TEST(same_shape(std::get<0>(rs), {long(nb), long(m), long(n)}), label);
      BOOST_TEST(same_shape(std::get<3>(rs), {long(nb), long(m), long(n)}), label);
      BOOST_TEST(close(std::get<0>(rs), want.value, rtol<T>(), want.scale), "a*b " << label);
      BOOST_TEST(close(std::get<1>(rs), want.value, rtol<T>(), want.scale), "at^T*b " << label);
      BOOST_TEST(close(std::get<2>(rs), want.value, rtol<T>(), want.scale), "a*bt^T " << label);
      BOOST_TEST(close(std::get<3>(rs), want.value, rtol<T>(), want.scale), "at^T*bt^T " << label);
      BOOST_TEST(s.stats().count("permute") == 0u);
    }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(batched_against_a_shared_matrix, T, real_types) {
  // [B, M, K] x [K, N] (also with the matrix transposed), and [M, K] x [B, K, N].
  g::placeholder<"a", T, g::dyn, g::dyn, g::dyn> a;
  g::placeholder<"w", T, g::dyn, g::dyn> w;
  g::placeholder<"wt", T, g::dyn, g::dyn> wt;
  g::placeholder<"b", T, g::dyn, g::dyn, g::dyn> b;
  g::session<g::cpu_simd> s;
  const std::size_t nb = 5, m = 7, k = 17, n = 3;
  const auto av = uniform<T>(nb * m * k, -1, 1), wv = uniform<T>(k * n, -1, 1), bv = uniform<T>(nb * k * n, -1, 1);
  const auto mv = uniform<T>(m * k, -1, 1);
  const auto [r1, r2, r3, r4] =
      s.run(g::matmul(a, w), g::matmul(a, g::transpose(wt)), g::matmul(w * 0 + g::transpose(wt), g::transpose(w)),
            g::matmul(g::transpose(g::transpose(a * 1)), w), a = tensor<T, 3>({nb, m, k}, av),
            w = tensor<T, 2>({k, n}, wv), wt = tensor<T, 2>({n, k}, transposed(wv, 1, k, n)));
  const auto want = matmul_ref(av, wv, nb, m, k, n, m * k, 0);
  BOOST_TEST(same_shape(r1, {long(nb), long(m), long(n)}));
  BOOST_TEST(close(r1, want.value, rtol<T>(), want.scale));
  BOOST_TEST(close(r2, want.value, rtol<T>(), want.scale));
  // w w^T : [K, N] x [N, K]
  const auto wwt = matmul_ref(wv, transposed(wv, 1, k, n), 1, k, n, k, 0, 0);
  BOOST_TEST(same_shape(r3, {long(k), long(k)}));
  BOOST_TEST(close(r3, wwt.value, rtol<T>(), wwt.scale));
  BOOST_TEST(close(r4, want.value, rtol<T>(), want.scale));

  const auto r5 = s.run(g::matmul(w * 1, b), w = tensor<T, 2>({m, k}, mv), b = tensor<T, 3>({nb, k, n}, bv));
  const auto want5 = matmul_ref(mv, bv, nb, m, k, n, 0, k * n);
  BOOST_TEST(same_shape(r5, {long(nb), long(m), long(n)}));
  BOOST_TEST(close(r5, want5.value, rtol<T>(), want5.scale));
}

