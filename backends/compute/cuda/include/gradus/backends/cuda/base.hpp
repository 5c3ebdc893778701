#pragma once
// gradus::cuda, section by section (cuda.hpp lists them; cpu_simd's are the same list, file
// for file). Each section is a struct of static functions deriving from the one before it.
//
// The kernels are Thrust algorithms over functors whose call operator is GRADUS_HD, so one
// source serves two builds:
//   nvcc              a GPU: Thrust's CUDA system on the session's stream, cuBLAS, cuDNN;
//   g++ / clang++     Thrust's OpenMP system (-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP,
//                     the cuda-omp build): the same functors on host threads, with cpu_simd's
//                     GEMM standing in for cuBLAS and its convolutions for cuDNN.
// Either way the backend declares host_memory = false, so the executor copies feeds in and
// results out through copy_to_device / copy_to_host exactly as it does on a GPU.
//
// Streams. Each session owns a cuda::context (exec/backend.hpp's backend_context): its own
// stream, made on first use. The session binds it to the calling thread for the length of
// each of its operations (session::bind), and everything the backend queues meanwhile goes
// on that stream, in order. Work queued with no context bound goes on CUDA's legacy default
// stream, which is ordered with every session's stream (they are blocking streams): correct
// from any thread, only not concurrent. So a session may be used from one thread after
// another, and two sessions on two threads run side by side.
#include <thrust/detail/config.h>

#if defined(__CUDACC__)
#define GRADUS_CUDA_GPU 1
#include <cuda_runtime.h>
#include <thrust/system/cuda/execution_policy.h>
#else
#define GRADUS_CUDA_GPU 0
#if THRUST_DEVICE_SYSTEM != THRUST_DEVICE_SYSTEM_OMP
#error "gradus: backends/compute/cuda compiles with nvcc, or with -DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP (the cuda-omp build)"
#endif
#include <thrust/system/omp/execution_policy.h>
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "gradus/core/device.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/exec/backend.hpp"

namespace gradus {

/// A CUDA runtime, cuBLAS or cuDNN call that failed, with the call and the library's text.
struct cuda_error : error {
  using error::error;
};

namespace cuda_sections {

struct base_section {
  static constexpr const char* name = "cuda";
  static constexpr std::size_t alignment = 256;  ///< cudaMalloc's
  static constexpr bool host_memory = false;     ///< the executor stages feeds and results

#if GRADUS_CUDA_GPU
  static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      throw cuda_error(std::string("gradus: cuda: ") + what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  }
#endif

  /// A session's place on the device: its stream (created on first use) and an id that
  /// the caching allocator tags freed blocks with (0 is the legacy default stream).
  class context {
   public:
    context() : id_(next_id()) {}
    context(const context&) = delete;
    context& operator=(const context&) = delete;
    ~context() {
#if GRADUS_CUDA_GPU
      if (stream_) {
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
      }
#endif
    }
    std::uint64_t id() const { return id_; }
#if GRADUS_CUDA_GPU
    cudaStream_t stream() {
      if (!stream_) check(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault), "cudaStreamCreate (a session's stream)");
      return stream_;
    }
#endif

   private:
    static std::uint64_t next_id() {
      static std::atomic<std::uint64_t> n{0};
      return ++n;
    }
    std::uint64_t id_;
#if GRADUS_CUDA_GPU
    cudaStream_t stream_ = nullptr;
#endif
  };

  /// Makes a context current on the calling thread until it is destroyed (nests).
  class binding {
   public:
    explicit binding(context& c) : prev_(std::exchange(current_, &c)) {}
    binding(const binding&) = delete;
    binding& operator=(const binding&) = delete;
    ~binding() { current_ = prev_; }

   private:
    context* prev_;
  };
  [[nodiscard]] static binding bind(context& c) { return binding(c); }

  /// The id of the context bound on this thread; 0 when none is (the legacy stream).
  static std::uint64_t current_context_id() { return current_ ? current_->id() : 0; }

#if GRADUS_CUDA_GPU
  /// Where this thread's work goes now: the bound session's stream, else the legacy stream.
  static cudaStream_t stream() { return current_ ? current_->stream() : cudaStreamLegacy; }
  static void synchronize() { check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize"); }
#else
  static void synchronize() {}
#endif

 private:
  static inline thread_local context* current_ = nullptr;
};

}  // namespace cuda_sections
}  // namespace gradus
