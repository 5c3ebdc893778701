#pragma once
// gradus::cpu_simd — the CPU compute policy: xsimd for fused elementwise passes,
// reductions and softmax; OpenBLAS (CBLAS) for GEMM; OpenMP for threads; xtensor for
// interop. The interface every backend implements (named as concepts in exec/backend.hpp,
// asserted below; backends/compute/cuda is written file for file against the same sections):
//
//   memory   allocate(bytes) / deallocate(p)         64-byte aligned device buffers
//            copy_to_device(dst, src, bytes) / copy_to_host(dst, src, bytes)
//   fused    assign(out, loop_shape, plan)            one pass of an elementwise plan
//   reduce   reduce(kind, in, outer, n, inner, out)   over the middle of [outer, n, inner]
//            argmax(in, outer, n, inner, out_i32)
//   gemm     gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch)
//   rows     softmax(in, rows, cols, out, log), softmax_xent(logits, labels, rows, cols, loss)
//   index    one_hot(idx, n, depth, out), gather(table, rows, row_len, idx, n, out)
//            scatter_add(g, idx, n, row_len, out, rows), scatter_rows(src, idx, n, row_len, out, rows)
//   layout   permute(in, in_dims, perm, out)
//   conv     conv2d(x, w, n, c, h, w, o, kh, kw, stride, pad, y)           NCHW (*) OIHW -> NCHW
//            conv2d_backward_data(dy, w, ..., dx), conv2d_backward_weights(x, dy, ..., dw)
//   image    im2col(x, n, c, h, w, kh, kw, stride, pad, col), col2im(col, ..., x)
//            pool2d(max, x, planes, h, w, kh, kw, stride, pad, y), pool2d_grad(max, x, g, ..., dx)
//   update   for_each(n, rule, p...)                  an optimizer's rule, in place, one pass
//            sum_squares(x, n)                        host scalar (gradient clipping)
//            copy(dst, src, bytes)                    device to device
//   checks   first_nonfinite(x, n)                    host index of the first NaN/inf, or -1
//   random   dropout_mask(out, n, keep, seed, draw)   counter-based inverted-dropout mask
//
// One file per section, each a struct that derives from the one before it, so a kernel
// calls what an earlier section provides unqualified; helpers a section keeps to itself
// (the GEMM cut, the streaming stores, the scratch buffers) are protected:
//
//   cpu_simd/base.hpp     name, alignment, parallel thresholds, threads
//   cpu_simd/memory.hpp   memory
//   cpu_simd/fused.hpp    fused (assign, for_each)
//   cpu_simd/reduce.hpp   reduce (reduce, argmax, sum_squares, first_nonfinite)
//   cpu_simd/gemm.hpp     gemm
//   cpu_simd/rows.hpp     rows (softmax family)
//   cpu_simd/index.hpp    index
//   cpu_simd/layout.hpp   layout
//   cpu_simd/images.hpp   conv, image
//   cpu_simd/random.hpp   random
//   cpu_simd/low_precision.hpp  gemm_low: bf16 GEMM (oneDNN, cpu_simd/dnnl_matmul.hpp) for
//                         mixed-precision sessions (core/precision.hpp, exec/compute_kernels.hpp)
//   cpu_simd/xtensor.hpp  to_xarray / to_xtensor / adapt
#include "gradus/backends/cpu_simd/low_precision.hpp"
#include "gradus/backends/cpu_simd/xtensor.hpp"

namespace gradus {

struct cpu_simd : cpu_simd_sections::low_precision_section {};
static_assert(backend<cpu_simd>, "gradus: cpu_simd does not implement the backend interface (exec/backend.hpp)");

}  // namespace gradus
