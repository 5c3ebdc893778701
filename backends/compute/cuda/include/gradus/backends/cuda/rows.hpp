#pragma once
// cuda: the row-wise softmax family, one thread per row (max, sum of exponentials, write):
// the classifier heads this library trains have rows of tens to hundreds of classes.
#include <cmath>

#include "gradus/backends/cuda/gemm.hpp"

namespace gradus {

namespace cuda_kernels {

template <class T>
struct softmax_fn {
  const T* in;
  index_t cols;
  T* out;
  bool log;
  GRADUS_HD void operator()(index_t r) const {
    using std::exp, std::log;
    const T* x = in + r * cols;
    T* y = out + r * cols;
    T mx = x[0];
    for (index_t j = 1; j < cols; ++j) mx = x[j] > mx || x[j] != x[j] ? x[j] : mx;
    T s = 0;
    for (index_t j = 0; j < cols; ++j) s += exp(x[j] - mx);
    if (this->log) {
      const T ls = log(s);
      for (index_t j = 0; j < cols; ++j) y[j] = (x[j] - mx) - ls;
    } else {
      const T inv = T(1) / s;
      for (index_t j = 0; j < cols; ++j) y[j] = exp(x[j] - mx) * inv;
    }
  }
};

template <class T>
struct softmax_xent_fn {
  const T* logits;
  const std::int32_t* labels;
  index_t cols;
  T* loss;
  GRADUS_HD void operator()(index_t r) const {
    using std::exp, std::log;
    const T* x = logits + r * cols;
    T mx = x[0];
    for (index_t j = 1; j < cols; ++j) mx = x[j] > mx || x[j] != x[j] ? x[j] : mx;
    T s = 0;
    for (index_t j = 0; j < cols; ++j) s += exp(x[j] - mx);
    loss[r] = log(s) - (x[labels[r]] - mx);  // logsumexp(x) - x[label], the max taken out first
  }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct rows_section : gemm_section {
  template <class T>
  static void softmax(const T* in, index_t rows, index_t cols, T* out, bool log) {
    if (cols <= 0) return;
    for_n(rows, cuda_kernels::softmax_fn<T>{in, cols, out, log});
  }
  template <class T>
  static void softmax_xent(const T* logits, const std::int32_t* labels, index_t rows, index_t cols, T* loss) {
    check_indices("softmax_cross_entropy", "label", labels, rows, cols);
    for_n(rows, cuda_kernels::softmax_xent_fn<T>{logits, labels, cols, loss});
  }
};

}  // namespace cuda_sections
}  // namespace gradus
