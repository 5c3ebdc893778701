#pragma once
// gradus::cuda, section by section (cuda.hpp lists them; cpu_simd's are the same list, file
// for file). Each section is a struct of static functions deriving from the one before it.
//
// The kernels are Thrust algorithms over functors whose call operator is GRADUS_HD, so one
// source serves two builds:
//   nvcc              a GPU: Thrust's CUDA system on the thread's stream, cuBLAS, cuDNN;
//   g++ / clang++     Thrust's OpenMP system (-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP,
//                     the cuda-omp build): the same functors on host threads, with cpu_simd's
//                     GEMM standing in for cuBLAS and its convolutions for cuDNN.
// Either way the backend declares host_memory = false, so the executor copies feeds in and
// results out through copy_to_device / copy_to_host exactly as it does on a GPU.
#include <thrust/detail/config.h>

#if defined(__CUDACC__)
#define GRADUS_CUDA_GPU 1
#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>
#else
#define GRADUS_CUDA_GPU 0
#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_OMP
#error "gradus: backends/cuda compiles with nvcc, or with -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP (the cuda-omp build)"
#endif
#include <thrust/system/omp/execution_policy.h>
#endif

#include <thrust/find.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "gradus/core/device.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/exec/backend.hpp"

namespace gradus {

// A CUDA runtime, cuBLAS or cuDNN call that failed, with the call and the library's text.
struct cuda_error : error {
  using error::error;
};

// The functors the kernels run are namespace-scope types: nvcc's kernel stubs name them
// from outside any class.
namespace cuda_kernels {
struct outside {  // an index outside [0, bound)
  index_t bound;
  GRADUS_HD bool operator()(std::int32_t v) const { return v < 0 || v >= bound; }
};
}  // namespace cuda_kernels

namespace cuda_sections {

struct base_section {
  static constexpr const char* name = "cuda";
  static constexpr std::size_t alignment = 256;  // cudaMalloc's
  static constexpr bool host_memory = false;     // the executor stages feeds and results

#if GRADUS_CUDA_GPU
  // One stream per host thread (a session runs on the thread that calls run()); every
  // kernel, copy and library call of that thread goes on it, in order.
  static cudaStream_t stream() {
    struct holder {
      cudaStream_t s = nullptr;
      holder() { check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
      holder(const holder&) = delete;
      holder& operator=(const holder&) = delete;
      ~holder() { cudaStreamDestroy(s); }
    };
    thread_local holder h;
    return h.s;
  }
  static auto policy() { return thrust::cuda::par_nosync.on(stream()); }
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw cuda_error(std::string("gradus: cuda: ") + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
  static void synchronize() { check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }
#else
  static auto policy() { return thrust::omp::par; }
  static void synchronize() {}
#endif

  // f(i) for i in [0, n): one thread per element (a grid-stride kernel on a GPU).
  template <class F>
  static void for_n(index_t n, const F& f) {
    if (n > 0) thrust::for_each_n(policy(), thrust::counting_iterator<index_t>(0), n, f);
  }

 protected:
  // One element from device memory to the host (errors name what they read).
  template <class T>
  static T read_one(const T* p) {
    T v{};
#if GRADUS_CUDA_GPU
    check(cudaMemcpyAsync(&v, p, sizeof(T), cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync (one element)");
    synchronize();
#else
    std::memcpy(&v, p, sizeof(T));
#endif
    return v;
  }
  // The first index outside [0, bound), found on the device, thrown with its position.
  static void check_indices(const char* op, const char* what, const std::int32_t* idx, index_t n, index_t bound) {
    if (n <= 0) return;
    const std::int32_t* it = thrust::find_if(policy(), idx, idx + n, cuda_kernels::outside{bound});
    if (it == idx + n) return;
    const index_t i = it - idx;
    throw index_error(std::string("gradus: ") + op + ": " + what + " " + std::to_string(read_one(it)) +
                      " at position " + std::to_string(i) + " is outside [0, " + std::to_string(bound) + ")");
  }
};

}  // namespace cuda_sections
}  // namespace gradus
