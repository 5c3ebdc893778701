#pragma once
// Reference matrix products (triple loops, wide accumulation) shared by the matmul tests.
#include "check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

// C[b] = A[b] (m x k) * B[b] (k x n); a batch stride of 0 repeats a 2-D operand.
struct product {
  std::vector<double> value, scale;  // scale: sum_k |a||b|, the product's condition
};
template <class T>
product matmul_ref(const std::vector<T>& a, const std::vector<T>& b, std::size_t batch, std::size_t m,
                   std::size_t k, std::size_t n, std::size_t stride_a, std::size_t stride_b) {
  product p;
  p.value.assign(batch * m * n, 0.0);
  p.scale.assign(batch * m * n, 0.0);
  for (std::size_t q = 0; q < batch; ++q)
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) {
        long double acc = 0, abs_acc = 0;
        for (std::size_t l = 0; l < k; ++l) {
          const long double t = static_cast<long double>(a[q * stride_a + i * k + l]) *
                                static_cast<long double>(b[q * stride_b + l * n + j]);
          acc += t;
          abs_acc += std::abs(t);
        }
        p.value[(q * m + i) * n + j] = static_cast<double>(acc);
        p.scale[(q * m + i) * n + j] = static_cast<double>(abs_acc);
      }
  return p;
}

// The (batched) transpose of a row-major [batch, r, c] array: [batch, c, r].
template <class T>
std::vector<T> transposed(const std::vector<T>& x, std::size_t batch, std::size_t r, std::size_t c) {
  std::vector<T> t(x.size());
  for (std::size_t q = 0; q < batch; ++q)
    for (std::size_t i = 0; i < r; ++i)
      for (std::size_t j = 0; j < c; ++j) t[q * r * c + j * r + i] = x[q * r * c + i * c + j];
  return t;
}

struct mkn {
  std::size_t m, k, n;
};
// (the last three: few rows against a wide operand, cpu_simd's register-blocked kernels for float)
constexpr mkn sizes2[] = {{1, 1, 1}, {7, 7, 7},  {3, 1023, 5}, {17, 33, 19},  {16, 16, 16},
                          {1, 7, 1}, {64, 5, 1}, {5, 1, 9},    {8, 512, 96}, {64, 64, 64}, {10, 70, 130}};

}  // namespace
