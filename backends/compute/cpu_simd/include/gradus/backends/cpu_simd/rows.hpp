#pragma once
// cpu_simd: the row-wise softmax family (softmax, log-softmax, softmax cross-entropy).
#include "gradus/backends/cpu_simd/gemm.hpp"
#include "gradus/graph/ops/elementwise.hpp"  // fn::saturating_exp

namespace gradus::cpu_simd_sections {

struct rows_section : gemm_section {
  /// ---- row-wise softmax family -----------------------------------------------------------
  template <class T>
  static void softmax(const T* in, index_t rows, index_t cols, T* out, bool log) {
    const bool par = rows * cols >= parallel_threshold && rows > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t r = 0; r < rows; ++r) {
      const T* x = in + r * cols;
      T* y = out + r * cols;
      const T mx = row_max(x, cols);
      if (log) {
        // (v - mx) is exact near the max; adding mx to log(sum) first would round the
        // result to mx's precision (log_softmax([1e30, 1e30]) would be 0, not -log 2).
        const T ls = std::log(row_sum_exp(x, cols, mx));
        map_row(x, y, cols, [mx, ls](auto v) { return (v - decltype(v)(mx)) - decltype(v)(ls); });
      } else {
        map_row(x, y, cols, [mx](auto v) { return fn::saturating_exp(v - decltype(v)(mx)); });
        const T inv = T(1) / row_sum(y, cols);
        map_row(y, y, cols, [inv](auto v) { return v * decltype(v)(inv); });
      }
    }
  }

  template <class T>
  static void softmax_xent(const T* logits, const std::int32_t* labels, index_t rows, index_t cols, T* loss) {
    check_indices("softmax_cross_entropy", "label", labels, rows, cols);
    const bool par = rows * cols >= parallel_threshold && rows > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t r = 0; r < rows; ++r) {
      const T* x = logits + r * cols;
      const T mx = row_max(x, cols);
      // -log softmax[label] = logsumexp(x) - x[label], with the max taken out first
      loss[r] = std::log(row_sum_exp(x, cols, mx)) - (x[labels[r]] - mx);
    }
  }
};

}  // namespace gradus::cpu_simd_sections
