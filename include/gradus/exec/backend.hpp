#pragma once
// The compute policy a session runs on, named. A backend is a type of static functions
// (no state: a session's buffers are the backend's device memory, its kernels take raw
// pointers and extents), in sections that match what the graph's nodes, the optimizers and
// the session call on it:
//
//   memory     allocate / deallocate / copy_to_device / copy_to_host / copy (device to device)
//   fused      assign(out, loop_shape, plan): one pass of an elementwise plan (exec/plan.hpp);
//              for_each(n, rule, p...): an optimizer's rule in place over its buffers
//   reduce     reduce(kind, in, outer, n, inner, out), argmax, sum_squares, first_nonfinite
//   gemm       gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc,
//              stride_c, batch): row-major, transposes as flags, a batch by strides
//   rows       softmax(in, rows, cols, out, log), softmax_xent(logits, labels, rows, cols, loss)
//   index      one_hot, gather, scatter_add, scatter_rows
//   layout     permute(in, in_dims, perm, out)
//   images     conv2d / conv2d_backward_data / conv2d_backward_weights (NCHW, OIHW),
//              im2col / col2im, pool2d / pool2d_grad: each takes its pointers and one
//              conv_geometry (graph/ops/conv_geometry.hpp)
//   random     dropout_mask(out, n, keep, seed, draw): counter-based, the same bits on
//              every backend for a seed
//
// Each section is a concept of its own, checked for float and double, so a backend that
// lacks one names the section in the compiler's message (cpu_simd.hpp asserts
// backend<cpu_simd>, cuda.hpp backend<cuda>). RNN cells need no section: they are GEMMs and
// fused passes.
//
// Two optional parts, for a backend whose work is queued rather than done when called (a
// GPU's): backend_context (per-session state, bound to the calling thread: the session's
// stream) and backend_async_copies (pinned host buffers, queued copies, events). Where a
// backend has neither, session::bind() and host_buffer / queue_copy_to_* are plain calls.
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "gradus/exec/plan.hpp"
#include "gradus/graph/leaves.hpp"  // tensor_view, which ops/reduce.hpp uses
#include "gradus/graph/ops/conv_geometry.hpp"
#include "gradus/graph/ops/reduce.hpp"

namespace gradus {

namespace backend_probe {
/// A rule of the shape for_each takes (an optimizer's update of w from g).
template <class T>
struct rule {
  template <class V>
  void operator()(V&, const V&) const {}
};
}  // namespace backend_probe

/// Whether a backend's buffers are host memory (a pointer the CPU may read): cpu_simd's are;
/// a GPU backend declares host_memory = false, and the executor then copies feeds to the
/// device and results back (exec/graph.hpp). A backend that does not say is host memory.
template <class B>
inline constexpr bool backend_host_memory = [] {
  if constexpr (requires { B::host_memory; }) return static_cast<bool>(B::host_memory);
  else return true;
}();

template <class B>
concept backend_memory = requires(void* p, const void* q, std::size_t bytes) {
  { B::allocate(bytes) } -> std::same_as<void*>;
  B::deallocate(p);
  B::copy_to_device(p, q, bytes);
  B::copy_to_host(p, q, bytes);
  B::copy(p, q, bytes);
  { B::alignment } -> std::convertible_to<std::size_t>;
  { B::name } -> std::convertible_to<const char*>;
};

template <class B, class T>
concept backend_fused = requires(T* o, const loop_shape& ls, const leaf_plan<T>& plan, index_t n) {
  B::assign(o, ls, plan);
  B::for_each(n, backend_probe::rule<T>{}, o, o);
};

template <class B, class T>
concept backend_reduce = requires(const T* x, T* o, index_t n, std::int32_t* i32) {
  B::reduce(reduce_kind::sum, x, n, n, n, o);
  B::argmax(x, n, n, n, i32);
  { B::sum_squares(x, n) } -> std::convertible_to<T>;
  { B::first_nonfinite(x, n) } -> std::convertible_to<index_t>;
};

template <class B, class T>
concept backend_gemm = requires(const T* a, T* c, index_t n, T s) {
  B::gemm(true, false, n, n, n, s, a, n, n, a, n, n, s, c, n, n, n);
};

template <class B, class T>
concept backend_rows = requires(const T* x, T* o, const std::int32_t* labels, index_t n) {
  B::softmax(x, n, n, o, true);
  B::softmax_xent(x, labels, n, n, o);
};

template <class B, class T>
concept backend_index = requires(const T* x, T* o, const std::int32_t* idx, index_t n) {
  B::one_hot(idx, n, n, o);
  B::gather(x, n, n, idx, n, o);
  B::scatter_add(x, idx, n, n, o, n);
  B::scatter_rows(x, idx, n, n, o, n);
};

template <class B, class T>
concept backend_layout = requires(const T* x, T* o, const dims& d, const std::array<std::size_t, max_rank>& perm) {
  B::permute(x, d, perm, o);
};

template <class B, class T>
concept backend_images = requires(const T* x, T* o, const conv_geometry& g) {
  B::conv2d(x, x, g, o);
  B::conv2d_backward_data(x, x, g, o);
  B::conv2d_backward_weights(x, x, g, o);
  B::im2col(x, g, o);
  B::col2im(x, g, o);
  B::pool2d(true, x, g, o);
  B::pool2d_grad(true, x, x, g, o);
};

template <class B, class T>
concept backend_random = requires(T* o, index_t n, double keep, std::uint64_t seed) {
  B::dropout_mask(o, n, keep, seed, seed);
};

/// Every section, for one dtype.
template <class B, class T>
concept backend_for = backend_fused<B, T> && backend_reduce<B, T> && backend_gemm<B, T> && backend_rows<B, T> &&
                      backend_index<B, T> && backend_layout<B, T> && backend_images<B, T> && backend_random<B, T>;

template <class B>
concept backend = backend_memory<B> && backend_for<B, float> && backend_for<B, double>;

/// Optional: per-session state (a GPU's stream). B::context is owned by the session, and
/// B::bind(context&) returns a guard that makes it the calling thread's current context
/// until the guard is destroyed; the backend queues the work it is given meanwhile there.
/// session::bind() does it for the session's own operations and for code that works on the
/// session's buffers from outside (a training step, data_parallel, checkpoints).
template <class B>
concept backend_context = requires(typename B::context& c) { B::bind(c); };

/// Optional: copies that are queued rather than waited for, between device memory and host
/// memory from allocate_host (pinned on a GPU), with events to wait for them from any
/// thread. data_parallel's gradient buckets use them to overlap the device-to-host copies
/// with the rest of the backward pass.
template <class B>
concept backend_async_copies = requires(void* p, const void* q, std::size_t bytes, typename B::event& e) {
  { B::allocate_host(bytes) } -> std::same_as<void*>;
  B::deallocate_host(p);
  B::copy_to_host_async(p, q, bytes);
  B::copy_to_device_async(p, q, bytes);
  e.record();
  e.wait();
};

namespace detail {
struct no_event {
  void record() {}
  void wait() const {}
};
template <class B>
struct event_of {
  using type = no_event;
};
template <backend_async_copies B>
struct event_of<B> {
  using type = typename B::event;
};
}  // namespace detail

/// B::event where the backend queues copies, else an event that is always passed.
template <class B>
using backend_event = typename detail::event_of<B>::type;

/// A copy from device memory into a `host_buffer<B>`: queued where the backend can (the
/// host buffer must then stay untouched until an event recorded after it has passed),
/// done at once elsewhere.
template <class B>
void queue_copy_to_host(void* host_dst, const void* src, std::size_t bytes) {
  if constexpr (backend_async_copies<B>) B::copy_to_host_async(host_dst, src, bytes);
  else B::copy_to_host(host_dst, src, bytes);
}
/// The same from a `host_buffer<B>` into device memory: queued where the backend can (the
/// host buffer must stay untouched until an event recorded after it has passed).
template <class B>
void queue_copy_to_device(void* dst, const void* host_src, std::size_t bytes) {
  if constexpr (backend_async_copies<B>) B::copy_to_device_async(dst, host_src, bytes);
  else B::copy_to_device(dst, host_src, bytes);
}

/// Bytes of a backend's device memory, grown on demand (never shrunk), freed with the owner
/// (also when the owner's constructor throws). Allocate and free with the session bound.
template <class B>
struct device_buffer {
  void* data = nullptr;  ///< B::allocate's memory, or null before the first reserve or grow
  std::size_t capacity = 0;  ///< bytes
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (data) B::deallocate(data);
  }
  /// At least `bytes` bytes (1 for 0) of device memory, reallocated when it is too small:
  /// the contents are then lost. Returns data.
  void* reserve(std::size_t bytes) {  // discards the contents when it grows
    if (data && bytes <= capacity) return data;
    if (data) B::deallocate(data);
    data = nullptr, capacity = 0;
    data = B::allocate(bytes ? bytes : 1);
    capacity = bytes ? bytes : 1;
    return data;
  }
  /// At least `bytes` bytes (1 for 0) of device memory, the contents kept (copied with
  /// B::copy): a reallocation takes max(bytes, 2 * capacity). Returns data.
  void* grow(std::size_t bytes) {  // keeps the contents; at least doubles when it grows
    if (data && bytes <= capacity) return data;
    const std::size_t want = bytes > 2 * capacity ? bytes : 2 * capacity;
    void* p = B::allocate(want ? want : 1);
    if (data) {
      B::copy(p, data, capacity);
      B::deallocate(data);
    }
    data = p, capacity = want ? want : 1;
    return data;
  }
};

/// A host buffer for a backend's copies: allocate_host's where the backend queues copies,
/// else plain host memory. Owns its bytes; sized once.
template <class B>
class host_buffer {
 public:
  host_buffer() = default;
  /// Allocates `bytes` bytes: B::allocate_host's where B queues copies, else zeroed host memory.
  explicit host_buffer(std::size_t bytes) { resize(bytes); }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  /// Takes o's bytes; o is left empty.
  host_buffer(host_buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  /// Frees this buffer's bytes and takes o's; o is left empty.
  host_buffer& operator=(host_buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  ~host_buffer() { release(); }
  /// Reallocates to `bytes` bytes unless it already has that size; the contents are lost.
  void resize(std::size_t bytes) {  // discards the contents
    if (bytes == n_) return;
    release();
    if constexpr (backend_async_copies<B>) p_ = static_cast<std::byte*>(B::allocate_host(bytes));
    else p_ = new std::byte[bytes ? bytes : 1]();
    n_ = bytes;
  }
  /// The bytes (null for a default-constructed or moved-from buffer).
  std::byte* data() { return p_; }
  /// The bytes (null for a default-constructed or moved-from buffer).
  const std::byte* data() const { return p_; }
  /// Bytes held (as asked of the constructor or resize).
  std::size_t size() const { return n_; }

 private:
  void release() noexcept {
    if (!p_) return;
    if constexpr (backend_async_copies<B>) B::deallocate_host(p_);
    else delete[] p_;
    p_ = nullptr, n_ = 0;
  }
  std::byte* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace gradus
