#pragma once
// A communicator of threads that share memory, for the data-parallel tests (tests/parallel,
// tests/estimator): ranks are threads of one process meeting at a generation barrier
// (bounded: a timeout, then an error); each rank sums every rank's buffer in rank order, so
// all ranks get the same bits, and averages by dividing that sum by the world size.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <span>
#include <vector>

#include <gradus/core/error.hpp>
#include <gradus/parallel/communicator.hpp>

namespace gradus_test {

namespace g = gradus;

// Ranks as threads meeting at a generation barrier (bounded: a timeout, then an error).
struct board {
  board(int n, std::chrono::milliseconds timeout) : n(n), timeout(timeout), ptr(static_cast<std::size_t>(n)) {}
  int n;
  std::chrono::milliseconds timeout;
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  long gen = 0;
  std::vector<const void*> ptr;
  void sync() {
    std::unique_lock lk(m);
    const long my = gen;
    if (++arrived == n) {
      arrived = 0;
      ++gen;
      cv.notify_all();
    } else if (!cv.wait_for(lk, timeout, [&] { return gen != my; })) {
      throw g::error("test board: a rank did not arrive in time");
    }
  }
};

struct thread_comm {
  static constexpr const char* name = "test threads";
  board* b;
  int r;
  int calls = 0;
  int fail_at = -1;  // throw on this allreduce call (a "dead peer")
  int rank() const { return r; }
  int world_size() const { return b->n; }
  template <class T>
  void allreduce_sum(std::span<T> x) {
    if (calls++ == fail_at) throw g::error("test comm: allreduce failed: peer rank 1 at inproc://test is gone");
    b->ptr[static_cast<std::size_t>(r)] = x.data();
    b->sync();
    std::vector<T> sum(x.size(), T(0));
    for (int k = 0; k < b->n; ++k) {
      const T* p = static_cast<const T*>(b->ptr[static_cast<std::size_t>(k)]);
      for (std::size_t i = 0; i < x.size(); ++i) sum[i] += p[i];
    }
    b->sync();  // everyone has read every buffer
    std::copy(sum.begin(), sum.end(), x.begin());
  }
  template <class T>
  void allreduce_average(std::span<T> x) {
    allreduce_sum(x);
    for (auto& v : x) v /= static_cast<T>(b->n);
  }
  template <class T>
  void broadcast(std::span<T> x, int root) {
    b->ptr[static_cast<std::size_t>(r)] = x.data();
    b->sync();
    if (r != root) std::memcpy(x.data(), b->ptr[static_cast<std::size_t>(root)], x.size() * sizeof(T));
    b->sync();
  }
  void barrier() { b->sync(); }
};
static_assert(g::parallel::communicator<thread_comm>);

}  // namespace gradus_test
