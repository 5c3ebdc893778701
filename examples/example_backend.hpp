#pragma once
// The backend an example runs on, chosen here and nowhere else: cpu_simd, or gradus::cuda
// in an example's _cuda twin (examples/CMakeLists.txt compiles the same .cpp with nvcc and
// defines GRADUS_EXAMPLE_CUDA). Include it first: cpu_simd.hpp quiets g++ 12's AVX-512
// intrinsics warnings before anything else includes them.
#if defined(GRADUS_EXAMPLE_CUDA)
#include <gradus/backends/cuda.hpp>
#else
#include <gradus/backends/cpu_simd.hpp>
#endif

namespace gradus_examples {

#if defined(GRADUS_EXAMPLE_CUDA)
using backend = gradus::cuda;
#else
using backend = gradus::cpu_simd;
#endif

// --threads sets the CPU backend's threads; a GPU backend has none (0 in the JSON line).
template <class B>
concept has_threads = requires(int n) { B::set_threads(n); };
// (templates, so that the branch not taken is discarded)
template <class B = backend>
void set_threads(int n) {
  if constexpr (has_threads<B>) B::set_threads(n);
}
template <class B = backend>
int threads() {
  if constexpr (has_threads<B>) return B::threads();
  else return 0;
}

// The most device memory the backend's allocator held at once, in MiB (the --json line's
// peak_device_mb, beside PyTorch's torch.cuda.max_memory_reserved); -1 for a CPU backend.
template <class B>
concept has_device_memory_stats = requires { B::memory_stats().peak_bytes_reserved; };
template <class B = backend>
double peak_device_mb() {
  if constexpr (has_device_memory_stats<B>) return static_cast<double>(B::memory_stats().peak_bytes_reserved) / (1 << 20);
  else return -1;
}

}  // namespace gradus_examples
