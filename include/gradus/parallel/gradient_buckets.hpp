#pragma once
// gradient_buckets: the first way the data-parallel step finishes a gradient — averaged over
// the world through the collectives (collectives.hpp), in buckets, as PyTorch's
// DistributedDataParallel and Horovod do it. (The second: pushed to a key-value store and
// pulled back, ps_worker.hpp.)
//
// The plan: the variables in reverse order (the backward pass finishes the last layers'
// gradients first), one dtype per bucket, at most bucket_bytes a bucket unless one gradient
// alone is larger. Each bucket is host memory (pinned on a GPU) that the communicator
// averages in place. As each gradient is final, arrived() queues its copy out of the device
// into its bucket; a bucket whose last gradient arrived is handed on (full(k)) in bucket
// order, so every rank issues the same collectives in the same order; average(comm, k) runs
// on the communicator's thread; upload() queues the averaged gradients back where the
// optimizer reads them. Nothing is allocated after the plan.
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/precision.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/parallel/collectives.hpp"

namespace gradus::parallel {

/// The default bucket size: as PyTorch DDP's bucket_cap_mb = 25.
inline constexpr std::size_t default_bucket_bytes = std::size_t{25} << 20;

/// The data-parallel step's gradient buckets (the plan at the top of this file): host
/// buffers (pinned on a GPU) of one dtype each, filled as the gradients are final and
/// averaged in place through the collectives. Step is the train_step whose variables make
/// the plan. arrived() and upload() run on the training thread, average() on the
/// communicator's, on a bucket arrived() has handed on.
template <class Step>
class gradient_buckets {
  using backend = typename std::remove_cvref_t<decltype(std::declval<Step&>().owner())>::backend_type;

 public:
  /// Plans and allocates the buckets: at most bucket_bytes each unless one gradient alone is
  /// larger. Throws `error` where a variable's dtype is not float32 or float64.
  explicit gradient_buckets(std::size_t bucket_bytes) { plan(bucket_bytes); }
  gradient_buckets(const gradient_buckets&) = delete;
  gradient_buckets& operator=(const gradient_buckets&) = delete;
  /// The last upload's copies read the buckets: they must have been done.
  ~gradient_buckets() { uploaded_.wait(); }

  /// The number of buckets (each one all-reduce a step).
  std::size_t size() const { return buckets_.size(); }
  /// Before a backward pass: every bucket waits for all of its gradients.
  void begin_step() {
    for (auto& b : buckets_) b.pending = b.members.size();
    next_ = 0;
  }
  /// Buckets handed on so far this step (all of them once every gradient arrived).
  std::size_t filled() const { return next_; }

  /// Gradient i is final: into its bucket; full(k) for each bucket now complete, in order.
  template <class Gradient, class Full>
  void arrived(std::size_t i, const Gradient& g, Full&& full) {
    auto& b = buckets_[bucket_of_[i]];
    for (const auto& m : b.members)
      if (m.var == i) {
        if (static_cast<std::size_t>(g.size) * size_of(b.dtype) != m.bytes || g.sparse())
          throw error("gradus: data_parallel: gradient of '" + std::string(g.name) + "' is not the dense size planned");
        queue_copy_to_host<backend>(b.data.data() + m.offset, g.data, m.bytes);
        if (--b.pending == 0) b.ready.record();
      }
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) full(next_++);
  }

  /// What float gradients travel as: the session's precision policy's Comm type
  /// (core/precision.hpp; float32 for a plain backend).
  static constexpr element_type wire = precision_of_backend_t<backend>::comm_type;

  /// On the communicator's thread: bucket k averaged over the world, once its gradients'
  /// copies out of the device are done; float buckets travel as `wire` where the
  /// communicator can (parallel::average_as). Returns its bytes in memory.
  template <class Comm>
  std::size_t average(Comm& comm, std::size_t k) {
    auto& b = buckets_[k];
    b.ready.wait();
    if (b.dtype == element_type::f64)
      comm.allreduce_average(std::span<double>(reinterpret_cast<double*>(b.data.data()), b.data.size() / 8));
    else
      average_as(comm, std::span<float>(reinterpret_cast<float*>(b.data.data()), b.data.size() / 4), wire);
    return b.data.size();
  }

  /// The averaged gradients back where the optimizer reads them (queued on the session's
  /// stream: the next step's copies into the buckets come after these on the same stream,
  /// and its averages after those).
  template <class Gradients>
  void upload(Gradients&& grads) {
    for (const auto& b : buckets_)
      for (const auto& m : b.members) queue_copy_to_device<backend>(grads[m.var].data, b.data.data() + m.offset, m.bytes);
    uploaded_.record();
  }

 private:
  struct member {
    std::size_t var;
    std::size_t offset;  // bytes into the bucket
    std::size_t bytes;
  };
  struct bucket {
    element_type dtype = element_type::none;
    std::vector<member> members;
    std::size_t bytes = 0;
    host_buffer<backend> data;     ///< host memory the communicator averages in place (pinned on a GPU)
    backend_event<backend> ready;  ///< after the copies of its gradients out of the device
    std::size_t pending = 0;
  };

  void plan(std::size_t bucket_bytes) {
    const auto& dtypes = Step::variable_dtypes();
    const auto& sizes = Step::variable_sizes();
    bucket_of_.assign(Step::variable_count, 0);
    for (std::size_t k = Step::variable_count; k-- > 0;) {
      if (dtypes[k] != element_type::f32 && dtypes[k] != element_type::f64)
        throw error("gradus: data_parallel: variable '" + std::string(Step::variable_names()[k]) + "' has dtype " +
                    std::string(name_of(dtypes[k])) + "; only float32 and float64 gradients are reduced");
      const std::size_t bytes = static_cast<std::size_t>(sizes[k]) * size_of(dtypes[k]);
      if (buckets_.empty() || buckets_.back().dtype != dtypes[k] ||
          (buckets_.back().bytes + bytes > bucket_bytes && !buckets_.back().members.empty())) {
        buckets_.emplace_back();
        buckets_.back().dtype = dtypes[k];
      }
      auto& b = buckets_.back();
      b.members.push_back({k, b.bytes, bytes});
      b.bytes += bytes;
      bucket_of_[k] = buckets_.size() - 1;
    }
    for (auto& b : buckets_) b.data.resize(b.bytes);
  }

  std::vector<bucket> buckets_;
  std::vector<std::size_t> bucket_of_;
  std::size_t next_ = 0;
  backend_event<backend> uploaded_;  ///< after the last upload's copies to the device
};

}  // namespace gradus::parallel
