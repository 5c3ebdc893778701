#pragma once
// cuda: where device memory comes from. A caching allocator: blocks are rounded up to 512
// bytes and, when freed, kept on a free list for their size, so a graph that runs the same
// shapes again allocates nothing from the device (cudaMalloc synchronises the whole device;
// PyTorch's CUDACachingAllocator exists for the same reason). No managed memory.
//
// A freed block is tagged with the stream that freed it, and an event is recorded there.
// The same stream takes it back at once (its own later work is ordered after the work that
// used the block); another stream takes it only after making itself wait for that event
// (cudaStreamWaitEvent: the device waits, the host does not). So neither deallocate nor a
// kernel's scratch array ever waits on the host, and two sessions on two streams never
// overwrite each other's blocks under a running kernel.
//
// Two pools of the same kind: one for buffers (variables, the plan's slots, staging), one
// for a kernel's temporaries (Thrust's temporary storage through a Thrust allocator, sort
// keys, cuDNN workspaces), so that a buffer planned on the first run never takes the
// block a temporary just gave back and leaves the next run's temporary to allocate again.
// A sort or a reduction allocates nothing from the device after its first run either.
//
// The backend's memory interface over these pools (allocate, the copies, events) is
// cuda/memory.hpp's memory_section.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "gradus/backends/cuda/base.hpp"

namespace gradus {

namespace cuda_detail {

struct pool_stats {
  std::size_t device_allocations = 0;   ///< cudaMalloc calls (operator new in the cuda-omp build)
  std::size_t device_frees = 0;
  std::size_t reused = 0;               ///< requests served from the free lists
  std::size_t cross_stream_reuses = 0;  ///< ... of them, blocks another stream had freed
  std::size_t bytes_reserved = 0;       ///< held from the device: in use + cached
  std::size_t bytes_in_use = 0;
  /// the most both pools held from the device at once since the program started (PyTorch's
  /// torch.cuda.max_memory_reserved: neither counts the CUDA context, cuBLAS' or cuDNN's own)
  std::size_t peak_bytes_reserved = 0;
};

class device_pool {
  using base = cuda_sections::base_section;

 public:
  static device_pool& buffers() {
    static device_pool p;
    return p;
  }
  static device_pool& scratch() {
    static device_pool p;
    return p;
  }
  /// Both pools' figures, summed.
  static pool_stats total() {
    const pool_stats a = buffers().stats(), b = scratch().stats();
    return {a.device_allocations + b.device_allocations, a.device_frees + b.device_frees, a.reused + b.reused,
            a.cross_stream_reuses + b.cross_stream_reuses, a.bytes_reserved + b.bytes_reserved,
            a.bytes_in_use + b.bytes_in_use, peak_reserved().load()};
  }
  static void release_all() noexcept {
    buffers().release_cached();
    scratch().release_cached();
  }
  static bool device_memory(const void* p, std::size_t bytes) { return buffers().holds(p, bytes) || scratch().holds(p, bytes); }
  device_pool(const device_pool&) = delete;
  device_pool& operator=(const device_pool&) = delete;
  ~device_pool() { release_cached(); }

  static std::size_t round(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + 511) / 512 * 512; }

  void* get(std::size_t bytes) {
    const std::size_t size = round(bytes);
    const std::uint64_t me = base::current_context_id();
    {
      std::lock_guard<std::mutex> lock(m_);
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        auto& list = it->second;
        // this stream's own block if there is one (newest first), else any other's
        auto pick = std::find_if(list.rbegin(), list.rend(), [&](const cached& c) { return c.stream == me; });
        const bool other = pick == list.rend();
        if (other) pick = list.rbegin();
        const cached c = *pick;
        list.erase(std::next(pick).base());
        if (other) {
#if GRADUS_CUDA_GPU
          base::check(cudaStreamWaitEvent(base::stream(), at(c.p).freed, 0),
                      "cudaStreamWaitEvent (a block another stream freed)");
#endif
          ++stats_.cross_stream_reuses;
        }
        at(c.p).in_use = true;
        ++stats_.reused;
        stats_.bytes_in_use += size;
        return c.p;
      }
    }
    void* p = raw_alloc(size);
    if (!p) {  // out of memory: give the cached blocks back and try once more
      release_all();
      p = raw_alloc(size);
      if (!p)
        throw cuda_error("gradus: cuda: out of device memory allocating " + std::to_string(size) + " bytes (" +
                         std::to_string(stats().bytes_in_use) + " in use)");
    }
    std::lock_guard<std::mutex> lock(m_);
    blocks_.emplace(key(p), block{size, true});
    ++stats_.device_allocations;
    stats_.bytes_reserved += size;
    note_reserved(static_cast<std::ptrdiff_t>(size));
    stats_.bytes_in_use += size;
    return p;
  }
  /// Back to the free list of its size, tagged with the calling thread's stream, once the
  /// work queued there so far is done (an event; the host does not wait).
  void put(void* p) noexcept {
    if (!p) return;
    std::lock_guard<std::mutex> lock(m_);
    auto it = blocks_.find(key(p));
    if (it == blocks_.end() || !it->second.in_use) return;  // not ours: nothing to do (never raw-freed blindly)
    block& b = it->second;
#if GRADUS_CUDA_GPU
    if (!b.freed && cudaEventCreateWithFlags(&b.freed, cudaEventDisableTiming) != cudaSuccess) b.freed = nullptr;
    // without an event the block cannot be handed to another stream safely: wait here instead
    if (!b.freed || cudaEventRecord(b.freed, base::stream()) != cudaSuccess) cudaStreamSynchronize(base::stream());
#endif
    b.in_use = false;
    stats_.bytes_in_use -= b.size;
    free_[b.size].push_back({p, base::current_context_id()});
  }
  /// Return every cached (free) block to the device.
  void release_cached() noexcept {
    std::lock_guard<std::mutex> lock(m_);
    for (auto& [size, list] : free_) {
      for (const cached& c : list) {
        auto it = blocks_.find(key(c.p));
#if GRADUS_CUDA_GPU
        if (it->second.freed) cudaEventDestroy(it->second.freed);
#endif
        blocks_.erase(it);
        raw_free(c.p);
        ++stats_.device_frees;
        stats_.bytes_reserved -= size;
        note_reserved(-static_cast<std::ptrdiff_t>(size));
      }
      list.clear();
    }
  }
  pool_stats stats() const {
    std::lock_guard<std::mutex> lock(m_);
    return stats_;
  }
  /// Whether [p, p + bytes) lies in one block the pool handed out and has not taken back:
  /// the cuda-omp build asks it of every pointer a copy or kernel treats as device memory.
  bool holds(const void* p, std::size_t bytes) const {
    std::lock_guard<std::mutex> lock(m_);
    auto it = blocks_.upper_bound(key(p));
    if (it == blocks_.begin()) return false;
    --it;
    return it->second.in_use && key(p) + bytes <= it->first + it->second.size;
  }

 private:
  struct block {
    std::size_t size;
    bool in_use;
#if GRADUS_CUDA_GPU
    cudaEvent_t freed = nullptr;  // recorded on the freeing stream
#endif
  };
  struct cached {
    void* p;
    std::uint64_t stream;  ///< the context that freed it (0: the legacy stream)
  };

#if GRADUS_CUDA_GPU
  /// The CUDA runtime is started first, so that it is torn down after the pools at exit
  /// (static objects end in the reverse order of their construction): their cudaFree calls
  /// then reach a live runtime.
  device_pool() { cudaFree(nullptr); }
#else
  device_pool() = default;
#endif
  /// both pools' reserved bytes, and their peak
  static std::atomic<std::size_t>& reserved() {
    static std::atomic<std::size_t> n{0};
    return n;
  }
  static std::atomic<std::size_t>& peak_reserved() {
    static std::atomic<std::size_t> n{0};
    return n;
  }
  static void note_reserved(std::ptrdiff_t delta) {
    const std::size_t now = reserved().fetch_add(static_cast<std::size_t>(delta)) + static_cast<std::size_t>(delta);
    std::size_t peak = peak_reserved().load();
    while (now > peak && !peak_reserved().compare_exchange_weak(peak, now)) {
    }
  }
  static std::uintptr_t key(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  block& at(void* p) { return blocks_.at(key(p)); }
  /// null when the device is out of memory; any other failure (no device, no driver) throws
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
    return ::operator new(size, std::align_val_t{base::alignment}, std::nothrow);
#endif
  }
  static void raw_free(void* p) noexcept {
#if GRADUS_CUDA_GPU
    cudaFree(p);
#else
    ::operator delete(p, std::align_val_t{base::alignment});
#endif
  }
  mutable std::mutex m_;
  std::unordered_map<std::size_t, std::vector<cached>> free_;
  std::map<std::uintptr_t, block> blocks_;  ///< every block held from the device, by address
  pool_stats stats_;
};

/// Thrust's temporary storage (sorts, reductions, searches) from the pool.
struct thrust_temporaries {
  using value_type = char;
  char* allocate(std::ptrdiff_t n) { return static_cast<char*>(device_pool::scratch().get(static_cast<std::size_t>(n))); }
  void deallocate(char* p, std::size_t) { device_pool::scratch().put(p); }
  static thrust_temporaries& instance() {
    static thrust_temporaries a;
    return a;
  }
};

/// A kernel's temporary device array, from the pool and back to it at scope exit (on the
/// stream that used it: no wait).
template <class T>
class device_scratch {
 public:
  explicit device_scratch(std::size_t n) : p_(static_cast<T*>(device_pool::scratch().get(n * sizeof(T)))) {}
  device_scratch(const device_scratch&) = delete;
  device_scratch& operator=(const device_scratch&) = delete;
  ~device_scratch() { device_pool::scratch().put(p_); }
  T* get() const { return p_; }

 private:
  T* p_;
};

}  // namespace cuda_detail
}  // namespace gradus
