#pragma once
// comm_worker: the one background thread that talks to a communicator for the data-parallel
// step (data_parallel.hpp). ZeroMQ sockets belong to one thread, and a collective that runs
// here overlaps the backward pass that goes on in the caller's. Tasks run in the order they
// were submitted, so every rank issues its collectives in the same order.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace gradus::parallel {

/// One background thread running queued tasks in order. After a task throws, the rest of
/// the queue is dropped (its collectives could only fail or hang) and wait() rethrows.
class comm_worker {
 public:
  comm_worker() : thread_([this] { loop(); }) {}
  comm_worker(const comm_worker&) = delete;
  comm_worker& operator=(const comm_worker&) = delete;
  ~comm_worker() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  /// Queues task to run after every task submitted before it; returns at once. Once a task
  /// has failed, the tasks submitted until wait() rethrows that failure are dropped unrun.
  void submit(std::function<void()> task) {
    {
      std::lock_guard lk(m_);
      if (failed_) return;
      queue_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  /// Blocks until every submitted task has run; rethrows the first failure (once).
  void wait() {
    std::unique_lock lk(m_);
    idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
    if (failed_) {
      auto e = std::exchange(failed_, nullptr);
      std::rethrow_exception(e);
    }
  }
  /// wait(), adding the time it blocked to `seconds` (comm_stats::wait_seconds) when it returns.
  void wait(double& seconds) {
    const auto t0 = std::chrono::steady_clock::now();
    wait();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  void loop() {
    std::unique_lock lk(m_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_
      auto task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lk.unlock();
      std::exception_ptr err;
      try {
        task();
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      busy_ = false;
      if (err && !failed_) {
        failed_ = err;
        queue_.clear();
      }
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> queue_;
  std::exception_ptr failed_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  ///< last: starts after the state above exists
};

}  // namespace gradus::parallel
