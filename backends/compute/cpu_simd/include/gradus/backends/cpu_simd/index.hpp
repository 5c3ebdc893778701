#pragma once
// cpu_simd: index ops (one-hot, gather, scatter of rows, scatter-add in index order).
#include "gradus/backends/cpu_simd/rows.hpp"

namespace gradus::cpu_simd_sections {

struct index_section : rows_section {
  /// ---- index ops -------------------------------------------------------------------------
  template <class T>
  static void one_hot(const std::int32_t* idx, index_t n, index_t depth, T* out) {
    check_indices("one_hot", "index", idx, n, depth);
    std::fill(out, out + n * depth, T(0));
    for (index_t i = 0; i < n; ++i) out[i * depth + idx[i]] = T(1);
  }
  template <class T>
  static void gather(const T* table, index_t rows, index_t row_len, const std::int32_t* idx, index_t n, T* out) {
    check_indices("gather", "index", idx, n, rows);
    const bool par = n * row_len >= parallel_threshold && n > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t i = 0; i < n; ++i)
      std::memcpy(out + i * row_len, table + idx[i] * row_len, static_cast<std::size_t>(row_len) * sizeof(T));
  }
  /// out[idx[i]] = src[i] for i = 0..n-1 (rows of row_len; the indices are distinct): the
  /// write-back of rows a sparse update gathered.
  template <class T>
  static void scatter_rows(const T* src, const std::int32_t* idx, index_t n, index_t row_len, T* out, index_t rows) {
    check_indices("scatter_rows", "index", idx, n, rows);
    const bool par = n * row_len >= parallel_threshold && n > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t i = 0; i < n; ++i)
      std::memcpy(out + idx[i] * row_len, src + i * row_len, static_cast<std::size_t>(row_len) * sizeof(T));
  }
  /// out (rows x row_len) = 0, then out[idx[i]] += g[i] for i = 0..n-1. Each output row is
  /// summed by one thread in index order, so the result is the sequential one, bit for bit,
  /// whatever the thread count: small inputs run that sequential loop; large ones sort the
  /// positions by target row (stable counting sort), then deal out disjoint output rows.
  template <class T>
  static void scatter_add(const T* g, const std::int32_t* idx, index_t n, index_t row_len, T* out, index_t rows) {
    check_indices("scatter_add", "index", idx, n, rows);
    if (n * row_len < parallel_threshold || rows < 2) {
      std::fill(out, out + rows * row_len, T(0));
      for (index_t i = 0; i < n; ++i) zip_row(g + i * row_len, out + idx[i] * row_len, 0, row_len, add_op{});
      return;
    }
    std::vector<index_t> start(static_cast<std::size_t>(rows) + 1, 0), order(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) ++start[static_cast<std::size_t>(idx[i]) + 1];
    for (index_t r = 0; r < rows; ++r) start[static_cast<std::size_t>(r) + 1] += start[static_cast<std::size_t>(r)];
    {
      std::vector<index_t> next(start.begin(), start.end() - 1);
      for (index_t i = 0; i < n; ++i) order[static_cast<std::size_t>(next[static_cast<std::size_t>(idx[i])]++)] = i;
    }
    // dynamic: a row named by many positions (a padding index) would stall a static share
#pragma omp parallel for schedule(dynamic, 16)
    for (index_t r = 0; r < rows; ++r) {
      T* y = out + r * row_len;
      std::fill(y, y + row_len, T(0));
      for (index_t k = start[static_cast<std::size_t>(r)]; k < start[static_cast<std::size_t>(r) + 1]; ++k)
        zip_row(g + order[static_cast<std::size_t>(k)] * row_len, y, 0, row_len, add_op{});
    }
  }
};

}  // namespace gradus::cpu_simd_sections
