#pragma once
// cuda: GEMM, row-major with transposes as flags. On a GPU: cuBLAS (one handle per host
// thread, on the thread's stream). Row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T, so cuBLAS is called with the operands swapped and no copy; a
// batch is one strided-batched call. In the cuda-omp build cpu_simd's GEMM stands in.
//
// gemm_low (the low-precision GEMM of a mixed-precision session, exec/compute_kernels.hpp):
// both float operands converted to bf16 or fp16 into scratch device arrays, then one
// cublasGemmStridedBatchedEx with fp32 accumulation (CUBLAS_COMPUTE_32F) into the float
// result: the tensor cores' bf16 / fp16 path. In the cuda-omp build, cpu_simd's gemm_low.
#include "gradus/backends/cuda/reduce.hpp"
#include "gradus/core/half.hpp"

#if GRADUS_CUDA_GPU
#include <cublas_v2.h>
#else
#include "gradus/backends/cpu_simd.hpp"
#endif

namespace gradus {
namespace cuda_kernels {
/// dst[i] = the bits of src[i] rounded to bf16 (or fp16), to nearest even (core/half.hpp).
struct to_half_fn {
  const float* src;
  std::uint16_t* dst;
  bool bf16;
  GRADUS_HD void operator()(index_t i) const {
    dst[i] = bf16 ? half_bits::bf16_from_float(src[i]) : half_bits::f16_from_float(src[i]);
  }
};
}  // namespace cuda_kernels

namespace cuda_sections {

struct gemm_section : reduce_section {
  template <class T>
  static void gemm(bool ta, bool tb, index_t m, index_t n, index_t k, T alpha, const T* a, index_t lda,
                   index_t stride_a, const T* b, index_t ldb, index_t stride_b, T beta, T* c, index_t ldc,
                   index_t stride_c, index_t batch) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "gradus: cuda: gemm of float or double");
    if (m <= 0 || n <= 0 || batch <= 0) return;
    if (k > 0) expect_device(a, sizeof(T), "gemm", "A"), expect_device(b, sizeof(T), "gemm", "B");
    expect_device(c, sizeof(T), "gemm", "C");
#if GRADUS_CUDA_GPU
    // Items that share an output (stride_c 0) accumulate in order: one call each.
    if (stride_c == 0 && batch > 1) {
      for (index_t i = 0; i < batch; ++i)
        gemm(ta, tb, m, n, k, alpha, a + i * stride_a, lda, 0, b + i * stride_b, ldb, 0, i ? T(1) : beta, c, ldc, 0,
             index_t(1));
      return;
    }
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const auto i32 = [](index_t v) { return static_cast<int>(v); };
    cublasStatus_t st;
    if constexpr (std::is_same_v<T, float>)
      st = cublasSgemmStridedBatched(handle(), opb, opa, i32(n), i32(m), i32(k), &alpha, b, i32(ldb), stride_b, a,
                                     i32(lda), stride_a, &beta, c, i32(ldc), stride_c, i32(batch));
    else
      st = cublasDgemmStridedBatched(handle(), opb, opa, i32(n), i32(m), i32(k), &alpha, b, i32(ldb), stride_b, a,
                                     i32(lda), stride_a, &beta, c, i32(ldc), stride_c, i32(batch));
    check_blas(st, "cublas gemm");
#else
    cpu_simd::gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
#endif
  }

  /// gemm's contract in float with A and B rounded to `compute` (bf16 or f16) and the products
  /// summed in fp32 (compute f32: gemm itself).
  static void gemm_low(element_type compute, bool ta, bool tb, index_t m, index_t n, index_t k, float alpha,
                       const float* a, index_t lda, index_t stride_a, const float* b, index_t ldb, index_t stride_b,
                       float beta, float* c, index_t ldc, index_t stride_c, index_t batch) {
#if GRADUS_CUDA_GPU
    if (m <= 0 || n <= 0 || batch <= 0) return;
    if (k <= 0 || compute == element_type::f32)
      return gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
    expect_device(a, sizeof(float), "gemm", "A"), expect_device(b, sizeof(float), "gemm", "B");
    expect_device(c, sizeof(float), "gemm", "C");
    if (stride_c == 0 && batch > 1) {  // items that share an output accumulate in order
      for (index_t i = 0; i < batch; ++i)
        gemm_low(compute, ta, tb, m, n, k, alpha, a + i * stride_a, lda, 0, b + i * stride_b, ldb, 0, i ? 1.f : beta,
                 c, ldc, 0, index_t(1));
      return;
    }
    const auto span = [&](index_t stride, index_t rows, index_t cols, index_t ld) {
      return (stride == 0 ? 0 : (batch - 1) * stride) + (rows - 1) * ld + cols;
    };
    const index_t na = span(stride_a, ta ? k : m, ta ? m : k, lda), nb = span(stride_b, tb ? n : k, tb ? k : n, ldb);
    const bool bf = compute == element_type::bf16;
    cuda_detail::device_scratch<std::uint16_t> a16(static_cast<std::size_t>(na)), b16(static_cast<std::size_t>(nb));
    for_n(na, cuda_kernels::to_half_fn{a, a16.get(), bf});
    for_n(nb, cuda_kernels::to_half_fn{b, b16.get(), bf});
    const cudaDataType_t t = bf ? CUDA_R_16BF : CUDA_R_16F;
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const auto i32 = [](index_t v) { return static_cast<int>(v); };
    check_blas(cublasGemmStridedBatchedEx(handle(), opb, opa, i32(n), i32(m), i32(k), &alpha, b16.get(), t, i32(ldb),
                                          stride_b, a16.get(), t, i32(lda), stride_a, &beta, c, CUDA_R_32F, i32(ldc),
                                          stride_c, i32(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmStridedBatchedEx (bf16 / fp16 operands, fp32 accumulation)");
#else
    cpu_simd::gemm_low(compute, ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
#endif
  }

#if GRADUS_CUDA_GPU
 protected:
  static void check_blas(cublasStatus_t st, const char* what) {
    if (st != CUBLAS_STATUS_SUCCESS)
      throw cuda_error(std::string("gradus: cuda: ") + what + ": " + cublasGetStatusString(st));
  }
  static cublasHandle_t handle() {
    struct holder {
      cublasHandle_t h = nullptr;
      holder() { check_blas(cublasCreate(&h), "cublasCreate"); }
      holder(const holder&) = delete;
      holder& operator=(const holder&) = delete;
      ~holder() { cublasDestroy(h); }
    };
    thread_local holder h;
    check_blas(cublasSetStream(h.h, stream()), "cublasSetStream");
    return h.h;
  }
#endif
};

}  // namespace cuda_sections
}  // namespace gradus
