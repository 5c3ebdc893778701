#pragma once
// gradus::cuda — the GPU compute policy: session<cuda> and trainer<cuda, ...> run the same
// model source as cpu_simd. The interface is exec/backend.hpp's, written file for file
// against cpu_simd's sections:
//
//   cuda/base.hpp     name, host_memory = false, the session's context (its stream) and
//                     binding it to the calling thread
//   cuda/device_pool.hpp  the caching device allocator (blocks tagged by stream)
//   cuda/memory.hpp   pinned staging and
//                     pinned buffers with queued copies and events, Thrust's policy, for_n,
//                     index checks, the cuda-omp build's memory-space checks
//   cuda/fused.hpp    assign (an elementwise plan: 16 bytes or one element per thread),
//                     for_each (a rule per element)
//   cuda/reduce.hpp   reduce, argmax, sum_squares, first_nonfinite
//   cuda/gemm.hpp     cuBLAS (cpu_simd's GEMM in the cuda-omp build)
//   cuda/rows.hpp     softmax, log-softmax, softmax cross-entropy
//   cuda/index.hpp    one_hot, gather, scatter_rows, scatter_add (sorted, no atomics)
//   cuda/layout.hpp   permute
//   cuda/images.hpp   cuDNN convolutions (cpu_simd's in the cuda-omp build), im2col,
//                     col2im, pooling
//   cuda/random.hpp   dropout masks (core/counter_hash.hpp, as cpu_simd)
//
// Built by nvcc for a GPU; built by g++ or clang++ with
// -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP against Thrust's OpenMP system (the
// cuda-omp test label), where every kernel runs on host threads and the executor still
// treats the memory as a device's.
// Before any Thrust header: a g++ or clang++ build that includes this file by mistake gets
// gradus' message, not "thrust/copy.h: No such file".
#if !defined(__CUDACC__) && !defined(THRUST_DEVICE_SYSTEM)
#error "gradus: gradus/backends/cuda.hpp: compile this translation unit as CUDA (.cu or LANGUAGE CUDA, linking gradus::cuda); for the cuda-omp build (host threads) add -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP and the directory holding thrust/ (CUDA 13: <cuda>/include/cccl; before: <cuda>/include), or link gradus::cuda_omp"
#endif
#include "gradus/backends/cuda/random.hpp"
#include "gradus/gradus.hpp"

namespace gradus {

struct cuda : cuda_sections::random_section {};
static_assert(backend<cuda>, "gradus: cuda does not implement the backend interface (exec/backend.hpp)");

}  // namespace gradus
