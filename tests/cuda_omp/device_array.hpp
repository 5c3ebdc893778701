#pragma once
// A test's array in gradus::cuda's device memory (a block of its pool: the GPU's memory, or
// in the cuda-omp build a block its memory-space checks know), filled from a host vector and
// read back into one, so that a test calling the backend's kernels directly hands them
// device pointers in both builds.
#include <cstddef>
#include <vector>

#include <gradus/backends/cuda.hpp>

namespace gradus_test {

template <class T>
class device_array {
 public:
  explicit device_array(std::size_t n) : n_(n), p_(static_cast<T*>(gradus::cuda::allocate(n * sizeof(T)))) {}
  explicit device_array(const std::vector<T>& h) : device_array(h.size()) {
    gradus::cuda::copy_to_device(p_, h.data(), n_ * sizeof(T));
  }
  device_array(const device_array&) = delete;
  device_array& operator=(const device_array&) = delete;
  ~device_array() { gradus::cuda::deallocate(p_); }
  T* get() const { return p_; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    gradus::cuda::copy_to_host(h.data(), p_, n_ * sizeof(T));
    return h;
  }

 private:
  std::size_t n_;
  T* p_;
};

}  // namespace gradus_test
