#pragma once
// cuda: memory. The backend's memory section: device buffers from the caching pools
// (cuda/device_pool.hpp), copies between host and device, pinned host buffers with queued
// copies and events, Thrust's execution policy and for_n, index checks, and the cuda-omp
// build's checks of which memory space a pointer lies in.
//
// Host <-> device copies of pageable memory go through a pinned staging buffer per thread;
// pinned host buffers (allocate_host) are copied from and to directly, queued on the
// stream, with events to wait for them (what data_parallel's gradient buckets use).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>

#include <thrust/find.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include "gradus/backends/cuda/base.hpp"
#include "gradus/backends/cuda/device_pool.hpp"

namespace gradus {

namespace cuda_detail {

#if GRADUS_CUDA_GPU
/// The calling thread's pinned host buffer for copies of pageable memory, grown to the
/// largest copy.
class pinned_staging {
  using base = cuda_sections::base_section;

 public:
  static pinned_staging& mine() {
    thread_local pinned_staging s;
    return s;
  }
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() {
    if (done_) cudaEventDestroy(done_);
    if (data_) cudaFreeHost(data_);
  }
  /// The buffer, at least `bytes`, once the copy that last used it has finished.
  void* acquire(std::size_t bytes) {
    if (!done_) base::check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    base::check(cudaEventSynchronize(done_), "cudaEventSynchronize (staging)");
    if (bytes > size_) {
      if (data_) cudaFreeHost(data_);
      data_ = nullptr, size_ = 0;
      base::check(cudaMallocHost(&data_, bytes), "cudaMallocHost (staging)");
      size_ = bytes;
    }
    return data_;
  }
  void release() { base::check(cudaEventRecord(done_, base::stream()), "cudaEventRecord"); }

 private:
  pinned_staging() = default;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  cudaEvent_t done_ = nullptr;
};
#endif

}  // namespace cuda_detail

namespace cuda_kernels {
struct outside {  // an index outside [0, bound)
  index_t bound;
  GRADUS_HD bool operator()(std::int32_t v) const { return v < 0 || v >= bound; }
};

#if GRADUS_CUDA_GPU
/// for_n's kernel where n fits 32 bits: f(i) once per thread, i counted in 32 bits. Thrust's
/// for_each_n (a 64-bit counting iterator, several items a thread in a loop) ran the fused
/// passes of bench_cuda on an H200 at 0.40x a device copy's bandwidth (one element a thread)
/// and 0.69x (4 elements of a row a thread), against 0.47x and 0.86x launched this way.
inline constexpr unsigned each_index_threads = 256;
template <class F>
__global__ void __launch_bounds__(each_index_threads) each_index(F f, std::uint32_t n) {
  const std::uint32_t i = blockIdx.x * each_index_threads + threadIdx.x;
  if (i < n) f(static_cast<index_t>(i));
}
#endif
}  // namespace cuda_kernels

namespace cuda_sections {

struct memory_section : base_section {
  static void* allocate(std::size_t bytes) { return cuda_detail::device_pool::buffers().get(bytes); }
  static void deallocate(void* p) noexcept { cuda_detail::device_pool::buffers().put(p); }
  /// What the pool holds and how often it went to the device (tests assert that a second
  /// run of the same graph goes to it zero times).
  static cuda_detail::pool_stats memory_stats() { return cuda_detail::device_pool::total(); }
  static void empty_cache() { cuda_detail::device_pool::release_all(); }

  static void copy_to_device(void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    expect_device(dst, bytes, "copy_to_device", "the destination");
    expect_host(src, bytes, "copy_to_device", "the source");
#if GRADUS_CUDA_GPU
    auto& st = cuda_detail::pinned_staging::mine();
    void* pinned = st.acquire(bytes);
    std::memcpy(pinned, src, bytes);
    check(cudaMemcpyAsync(dst, pinned, bytes, cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync (to device)");
    st.release();
#else
    std::memcpy(dst, src, bytes);
#endif
  }
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    expect_device(src, bytes, "copy_to_host", "the source");
    expect_host(dst, bytes, "copy_to_host", "the destination");
#if GRADUS_CUDA_GPU
    auto& st = cuda_detail::pinned_staging::mine();
    void* pinned = st.acquire(bytes);
    check(cudaMemcpyAsync(pinned, src, bytes, cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync (to host)");
    st.release();
    synchronize();
    std::memcpy(dst, pinned, bytes);
#else
    std::memcpy(dst, src, bytes);
#endif
  }
  static void copy(void* dst, const void* src, std::size_t bytes) {  // device to device
    if (!bytes) return;
    expect_device(dst, bytes, "copy", "the destination");
    expect_device(src, bytes, "copy", "the source");
#if GRADUS_CUDA_GPU
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "cudaMemcpyAsync (device to device)");
#else
    std::memcpy(dst, src, bytes);
#endif
  }

  /// Queued copies (exec/backend.hpp's backend_async_copies). Host memory from
  /// allocate_host is pinned: the copy engine reads and writes it directly while the host
  /// goes on, so the host must not touch it until an event recorded after the copy is done.
  static void* allocate_host(std::size_t bytes) {
#if GRADUS_CUDA_GPU
    void* p = nullptr;
    check(cudaMallocHost(&p, std::max<std::size_t>(bytes, 1)), "cudaMallocHost");
    return p;
#else
    return ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t{alignment});
#endif
  }
  static void deallocate_host(void* p) noexcept {  // waits for the copies queued on it (cudaFreeHost does)
    if (!p) return;
#if GRADUS_CUDA_GPU
    cudaFreeHost(p);
#else
    ::operator delete(p, std::align_val_t{alignment});
#endif
  }
  static void copy_to_host_async(void* pinned_dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    expect_device(src, bytes, "copy_to_host_async", "the source");
    expect_host(pinned_dst, bytes, "copy_to_host_async", "the destination");
#if GRADUS_CUDA_GPU
    check(cudaMemcpyAsync(pinned_dst, src, bytes, cudaMemcpyDeviceToHost, stream()), "cudaMemcpyAsync (to pinned host)");
#else
    std::memcpy(pinned_dst, src, bytes);
#endif
  }
  static void copy_to_device_async(void* dst, const void* pinned_src, std::size_t bytes) {
    if (!bytes) return;
    expect_device(dst, bytes, "copy_to_device_async", "the destination");
    expect_host(pinned_src, bytes, "copy_to_device_async", "the source");
#if GRADUS_CUDA_GPU
    check(cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice, stream()), "cudaMemcpyAsync (from pinned host)");
#else
    std::memcpy(dst, pinned_src, bytes);
#endif
  }
  /// A point in the current stream: record() marks it, wait() blocks the calling thread (any
  /// thread) until the stream has passed it.
  class event {
   public:
    event() = default;
    event(const event&) = delete;
    event& operator=(const event&) = delete;
    event(event&& o) noexcept { swap(o); }
    event& operator=(event&& o) noexcept {
      event(std::move(o)).swap(*this);
      return *this;
    }
    ~event() {
#if GRADUS_CUDA_GPU
      if (e_) cudaEventDestroy(e_);
#endif
    }
    void record() {
#if GRADUS_CUDA_GPU
      if (!e_) check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventRecord(e_, stream()), "cudaEventRecord");
#endif
      recorded_ = true;
    }
    void wait() const {
      if (!recorded_) return;
#if GRADUS_CUDA_GPU
      check(cudaEventSynchronize(e_), "cudaEventSynchronize");
#endif
    }

   private:
    void swap(event& o) noexcept {
#if GRADUS_CUDA_GPU
      std::swap(e_, o.e_);
#endif
      std::swap(recorded_, o.recorded_);
    }
#if GRADUS_CUDA_GPU
    cudaEvent_t e_ = nullptr;
#endif
    bool recorded_ = false;
  };

  /// The execution policy of every Thrust call: the current stream (without the
  /// synchronisation Thrust would add after each algorithm), temporaries from the pool.
  static auto policy() {
#if GRADUS_CUDA_GPU
    return thrust::cuda::par_nosync(cuda_detail::thrust_temporaries::instance()).on(stream());
#else
    return thrust::omp::par(cuda_detail::thrust_temporaries::instance());
#endif
  }

  /// f(i) for i in [0, n): one thread per element (cuda_kernels::each_index on a GPU, where
  /// n fits 32 bits; Thrust's for_each_n beyond that and in the cuda-omp build).
  template <class F>
  static void for_n(index_t n, const F& f) {
    if (n <= 0) return;
#if GRADUS_CUDA_GPU
    constexpr unsigned threads = cuda_kernels::each_index_threads;
    if (static_cast<std::uint64_t>(n) <= std::uint64_t(0xffffffffu) - threads) {
      const auto blocks = static_cast<unsigned>((static_cast<std::uint64_t>(n) + threads - 1) / threads);
      cuda_kernels::each_index<<<blocks, threads, 0, stream()>>>(f, static_cast<std::uint32_t>(n));
      check(cudaGetLastError(), "a kernel launch (for_n)");
      return;
    }
#endif
    thrust::for_each_n(policy(), thrust::counting_iterator<index_t>(0), n, f);
  }

  /// The cuda-omp build keeps the two memory spaces apart as a GPU does: a pointer used as
  /// device memory must lie in a block of the pool, a host pointer must not. On a GPU either
  /// mistake faults or corrupts memory; Thrust's OpenMP system would run it without a word.
  /// (Nothing on a GPU build: the hardware checks there.)
  static void expect_device([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t bytes,
                            [[maybe_unused]] const char* op, [[maybe_unused]] const char* what) {
#if !GRADUS_CUDA_GPU
    if (bytes && !cuda_detail::device_pool::device_memory(p, bytes)) space_error(op, what, bytes, "not device memory");
#endif
  }
  static void expect_host([[maybe_unused]] const void* p, [[maybe_unused]] std::size_t bytes,
                          [[maybe_unused]] const char* op, [[maybe_unused]] const char* what) {
#if !GRADUS_CUDA_GPU
    if (bytes && cuda_detail::device_pool::device_memory(p, 1)) space_error(op, what, bytes, "device memory, not host memory");
#endif
  }

 protected:
  [[noreturn]] static void space_error(const char* op, const char* what, std::size_t bytes, const char* is) {
    throw error(std::string("gradus: cuda: ") + op + ": " + what + " (" + std::to_string(bytes) + " bytes) is " + is +
                " (the cuda-omp build checks what a GPU would fault on)");
  }
  /// One element from device memory to the host (errors name what they read).
  template <class T>
  static T read_one(const T* p) {
    T v{};
    copy_to_host(&v, p, sizeof(T));
    return v;
  }
  /// The first index outside [0, bound), found on the device, thrown with its position.
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
