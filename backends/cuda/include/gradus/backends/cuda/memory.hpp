#pragma once
// cuda: memory. Device buffers come from a caching allocator: blocks are rounded up to
// 512 bytes and, when freed, kept on a free list for their size, so a graph that runs the
// same shapes again allocates nothing from the device (cudaMalloc synchronises the whole
// device; PyTorch's CUDACachingAllocator exists for the same reason). No managed memory.
// Host <-> device copies go through a pinned staging buffer per thread, on the thread's
// stream; copy_to_host waits for its copy, copy_to_device only for the previous use of the
// staging buffer.
#include <algorithm>
#include <cstddef>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "gradus/backends/cuda/base.hpp"

namespace gradus {

namespace cuda_detail {

struct pool_stats {
  std::size_t device_allocations = 0;  // cudaMalloc calls (operator new in the cuda-omp build)
  std::size_t device_frees = 0;
  std::size_t reused = 0;              // requests served from the free lists
  std::size_t bytes_reserved = 0;      // held from the device: in use + cached
  std::size_t bytes_in_use = 0;
};

class device_pool {
 public:
  static device_pool& instance() {
    static device_pool p;
    return p;
  }
  device_pool(const device_pool&) = delete;
  device_pool& operator=(const device_pool&) = delete;
  ~device_pool() { release_cached(); }

  static std::size_t round(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + 511) / 512 * 512; }

  void* get(std::size_t bytes) {
    const std::size_t size = round(bytes);
    {
      std::lock_guard<std::mutex> lock(m_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        in_use_.emplace(p, size);
        ++stats_.reused;
        stats_.bytes_in_use += size;
        return p;
      }
    }
    void* p = raw_alloc(size);
    if (!p) {  // out of memory: give the cached blocks back and try once more
      release_cached();
      p = raw_alloc(size);
      if (!p)
        throw cuda_error("gradus: cuda: out of device memory allocating " + std::to_string(size) + " bytes (" +
                         std::to_string(stats().bytes_in_use) + " in use)");
    }
    std::lock_guard<std::mutex> lock(m_);
    in_use_.emplace(p, size);
    ++stats_.device_allocations;
    stats_.bytes_reserved += size;
    stats_.bytes_in_use += size;
    return p;
  }
  void put(void* p) noexcept {
    if (!p) return;
    std::lock_guard<std::mutex> lock(m_);
    auto it = in_use_.find(p);
    if (it == in_use_.end()) return;  // not ours: nothing to do (never raw-freed blindly)
    stats_.bytes_in_use -= it->second;
    free_[it->second].push_back(p);
    in_use_.erase(it);
  }
  // Return every cached (free) block to the device.
  void release_cached() noexcept {
    std::lock_guard<std::mutex> lock(m_);
    for (auto& [size, list] : free_) {
      for (void* p : list) {
        raw_free(p);
        ++stats_.device_frees;
        stats_.bytes_reserved -= size;
      }
      list.clear();
    }
  }
  pool_stats stats() const {
    std::lock_guard<std::mutex> lock(m_);
    return stats_;
  }

 private:
  device_pool() = default;
  // null when the device is out of memory; any other failure (no device, no driver) throws
  static void* raw_alloc(std::size_t size) {
#if GRADUS_CUDA_GPU
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaSuccess) return p;
    cudaGetLastError();  // clear it
    if (e == cudaErrorMemoryAllocation) return nullptr;
    throw cuda_error(std::string("gradus: cuda: cudaMalloc of ") + std::to_string(size) + " bytes: " +
                     cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
#else
    return ::operator new(size, std::align_val_t{cuda_sections::base_section::alignment}, std::nothrow);
#endif
  }
  static void raw_free(void* p) noexcept {
#if GRADUS_CUDA_GPU
    cudaFree(p);
#else
    ::operator delete(p, std::align_val_t{cuda_sections::base_section::alignment});
#endif
  }
  mutable std::mutex m_;
  std::unordered_map<std::size_t, std::vector<void*>> free_;
  std::unordered_map<void*, std::size_t> in_use_;
  pool_stats stats_;
};

// A kernel's temporary device array, from the pool and back to it at scope exit.
template <class T>
class device_scratch {
 public:
  explicit device_scratch(std::size_t n) : p_(static_cast<T*>(device_pool::instance().get(n * sizeof(T)))) {}
  device_scratch(const device_scratch&) = delete;
  device_scratch& operator=(const device_scratch&) = delete;
  ~device_scratch() {
#if GRADUS_CUDA_GPU
    cudaStreamSynchronize(cuda_sections::base_section::stream());  // its kernels are done before reuse
#endif
    device_pool::instance().put(p_);
  }
  T* get() const { return p_; }

 private:
  T* p_;
};

#if GRADUS_CUDA_GPU
// The calling thread's pinned host buffer for copies, grown to the largest copy.
class pinned_staging {
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
  // The buffer, at least `bytes`, once the copy that last used it has finished.
  void* acquire(std::size_t bytes) {
    using B = cuda_sections::base_section;
    if (!done_) B::check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    B::check(cudaEventSynchronize(done_), "cudaEventSynchronize (staging)");
    if (bytes > size_) {
      if (data_) cudaFreeHost(data_);
      data_ = nullptr, size_ = 0;
      B::check(cudaMallocHost(&data_, bytes), "cudaMallocHost (staging)");
      size_ = bytes;
    }
    return data_;
  }
  void release() { cuda_sections::base_section::check(cudaEventRecord(done_, cuda_sections::base_section::stream()), "cudaEventRecord"); }

 private:
  pinned_staging() = default;
  void* data_ = nullptr;
  std::size_t size_ = 0;
  cudaEvent_t done_ = nullptr;
};
#endif

}  // namespace cuda_detail

namespace cuda_sections {

struct memory_section : base_section {
  static void* allocate(std::size_t bytes) { return cuda_detail::device_pool::instance().get(bytes); }
  // A block goes back to the pool once the calling thread's stream has finished with it, so
  // another thread (another stream) that takes it next cannot overwrite it under a kernel.
  static void deallocate(void* p) noexcept {
#if GRADUS_CUDA_GPU
    if (p) cudaStreamSynchronize(stream());
#endif
    cuda_detail::device_pool::instance().put(p);
  }
  // What the pool holds and how often it went to the device (tests assert that a second
  // run of the same graph goes to it zero times).
  static cuda_detail::pool_stats memory_stats() { return cuda_detail::device_pool::instance().stats(); }
  static void empty_cache() { cuda_detail::device_pool::instance().release_cached(); }

  static void copy_to_device(void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
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
#if GRADUS_CUDA_GPU
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "cudaMemcpyAsync (device to device)");
#else
    std::memcpy(dst, src, bytes);
#endif
  }
};

}  // namespace cuda_sections
}  // namespace gradus
