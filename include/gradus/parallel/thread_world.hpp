#pragma once
// thread_world: ranks that are threads of one process, with mailboxes between every pair —
// point-to-point (send/recv, in order per pair), sub-groups (split) and collectives over
// them. pipeline_in_process runs a pipeline's stages on it (one thread per device); the
// pipeline tests run whole pipelines on it.
//
//   auto comms = g::parallel::thread_world::world(2);   // comms[k]: rank k's; one per thread
//
// Every wait is bounded (the world's timeout, then a comm_error naming the peer "silent").
// A rank that fails calls abort(): every wait of the world, now or later, ends at once with
// a comm_error naming that rank "gone" (what a dead process is to the ring), so the others
// fail within a wake-up instead of waiting out the timeout. The collectives gather to the
// group's first member, which sums in member order and sends the result back, so every
// member gets the same bits.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/parallel/collectives.hpp"
#include "gradus/parallel/point_to_point.hpp"

namespace gradus::parallel {

namespace detail {
struct thread_boxes {
  explicit thread_boxes(std::chrono::milliseconds timeout) : timeout(timeout) {}
  std::chrono::milliseconds timeout;
  std::mutex m;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> boxes;  ///< (channel, from, to)
  int failed = -1;  ///< the world rank that aborted, if one did
  std::string why;
};
}  // namespace detail

/// Ranks that are threads of one process, with a mailbox for every ordered pair:
/// point-to-point (in order per pair), sub-groups (split) and collectives over them.
/// pipeline_in_process runs a pipeline's stages on it; tests run whole pipelines on it. Each
/// thread uses its own rank's object (world()[k] for rank k); the objects of one world share
/// its mailboxes under a lock. Every wait is bounded by the world's timeout and then throws
/// `comm_error` naming the peer "silent"; once a rank calls abort(), every wait of the world,
/// now or later, ends at once with `comm_error` naming that rank "gone".
class thread_world {
 public:
  /// World rank `rank` of `members.size()`; members are world ranks, channel tells groups apart.
  thread_world(std::shared_ptr<detail::thread_boxes> b, std::vector<int> members, int me, int channel)
      : b_(std::move(b)), members_(std::move(members)), me_(me), channel_(channel) {}
  /// n ranks, one communicator each (rank k's is [k]), every wait bounded by timeout.
  static std::vector<thread_world> world(int n, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    if (n < 1) throw error("gradus: thread_world: " + std::to_string(n) + " ranks (at least 1)");
    auto b = std::make_shared<detail::thread_boxes>(timeout);
    std::vector<int> all(static_cast<std::size_t>(n));
    std::iota(all.begin(), all.end(), 0);
    std::vector<thread_world> r;
    r.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) r.emplace_back(b, all, i, 0);
    return r;
  }

  /// This rank in its group (the world, or a split's group).
  int rank() const { return me_; }
  /// The number of ranks in the group.
  int world_size() const { return static_cast<int>(members_.size()); }
  /// "threads".
  std::string name() const { return "threads"; }
  std::size_t messages_sent = 0;  ///< messages this object has sent, its collectives' included

  /// The world rank that aborted first, or -1.
  int failed_rank() const {
    std::lock_guard lk(b_->m);
    return b_->failed;
  }
  /// This rank failed (`why`): every wait of the world ends with a comm_error naming it.
  void abort(const std::string& why) {
    {
      std::lock_guard lk(b_->m);
      if (b_->failed < 0) b_->failed = world_rank(me_), b_->why = why;
    }
    b_->cv.notify_all();
  }

  /// A copy of x into the mailbox to rank `to` of the group; returns at once (any T). Throws
  /// `error` where `to` is not a rank of the group.
  template <class T>
  void send(std::span<const T> x, int to) {
    check(to, "send to");
    std::vector<std::byte> v(x.size_bytes());
    if (!v.empty()) std::memcpy(v.data(), x.data(), v.size());
    {
      std::lock_guard lk(b_->m);
      b_->boxes[{channel_, world_rank(me_), world_rank(to)}].push_back(std::move(v));
    }
    ++messages_sent;
    b_->cv.notify_all();
  }
  /// The next message from rank `from` into x, waiting up to the world's timeout. Throws
  /// `comm_error` (peer `from`, "silent") at the timeout; `comm_error` naming the failed rank
  /// "gone" once a rank of the world called abort() and nothing is queued (queued messages are
  /// still delivered); `error` where `from` is not a rank of the group or the message's size
  /// in bytes is not x's (the message is consumed).
  template <class T>
  void recv(std::span<T> x, int from) {
    check(from, "recv from");
    std::unique_lock lk(b_->m);
    auto& q = b_->boxes[{channel_, world_rank(from), world_rank(me_)}];
    if (!b_->cv.wait_for(lk, b_->timeout, [&] { return !q.empty() || b_->failed >= 0; }))
      throw comm_error("gradus: thread_world: rank " + std::to_string(me_) + " waited " + std::to_string(b_->timeout.count()) +
                           " ms for rank " + std::to_string(from) + " (silent)",
                       from, "silent");
    if (q.empty()) {  // a rank aborted: the peer waited for may be the one, or wait on it
      const int f = group_rank(b_->failed);
      throw comm_error("gradus: thread_world: rank " + std::to_string(me_) + ": rank " + std::to_string(b_->failed) +
                           " failed (" + b_->why + "); it was waiting for rank " + std::to_string(from),
                       f >= 0 ? f : from, "gone");
    }
    std::vector<std::byte> v = std::move(q.front());
    q.pop_front();
    if (v.size() != x.size_bytes())
      throw error("gradus: thread_world: recv of " + std::to_string(x.size_bytes()) + " bytes from rank " +
                          std::to_string(from) + ", whose message holds " + std::to_string(v.size()));
    if (!v.empty()) std::memcpy(x.data(), v.data(), v.size());
  }

  /// Whether a message from rank `from` is queued (recv(x, from) would not wait), or a rank
  /// of the world failed (recv would throw at once). Throws `error` where `from` is not a
  /// rank of the group.
  bool probe(int from) {
    check(from, "probe");
    std::lock_guard lk(b_->m);
    return !b_->boxes[{channel_, world_rank(from), world_rank(me_)}].empty() || b_->failed >= 0;
  }

  /// Every member's x summed, in place: the group's first member receives the others'
  /// buffers, adds them in member order and sends the sum back, so every member gets the same
  /// bits. Every member calls it; waits and errors are recv's.
  template <class T>
  void allreduce_sum(std::span<T> x) {
    if (me_ == 0) {
      std::vector<T> part(x.size());
      for (int k = 1; k < world_size(); ++k) {
        recv(std::span<T>(part), k);
        for (std::size_t i = 0; i < x.size(); ++i) x[i] += part[i];
      }
      for (int k = 1; k < world_size(); ++k) send(std::span<const T>(x.data(), x.size()), k);
    } else {
      send(std::span<const T>(x.data(), x.size()), 0);
      recv(x, 0);
    }
  }
  /// allreduce_sum, then divided by world_size() on every member.
  template <class T>
  void allreduce_average(std::span<T> x) {
    allreduce_sum(x);
    for (auto& v : x) v /= static_cast<T>(world_size());
  }
  /// Rank root's x into every other member's x (root sends it to each in turn). Every member
  /// calls it.
  template <class T>
  void broadcast(std::span<T> x, int root) {
    if (me_ == root) {
      for (int k = 0; k < world_size(); ++k)
        if (k != root) send(std::span<const T>(x.data(), x.size()), k);
    } else {
      recv(x, root);
    }
  }
  /// Returns once every member has entered it (an all-reduce of one int).
  void barrier() {
    int b = 0;
    allreduce_sum(std::span<int>(&b, 1));
  }
  /// MPI_Comm_split: (color, key) exchanged with every member; the group of this color,
  /// ordered by (key, rank).
  thread_world split(int color, int key) {
    if (color < 0) throw error("gradus: thread_world: split with color " + std::to_string(color));
    std::vector<int> mine{color, key};
    std::vector<std::vector<int>> all(static_cast<std::size_t>(world_size()));
    for (int k = 0; k < world_size(); ++k)
      if (k != me_) send(std::span<const int>(mine), k);
    for (int k = 0; k < world_size(); ++k) {
      all[static_cast<std::size_t>(k)] = mine;
      if (k != me_) recv(std::span<int>(all[static_cast<std::size_t>(k)]), k);
    }
    std::vector<int> group;
    for (int k = 0; k < world_size(); ++k)
      if (all[static_cast<std::size_t>(k)][0] == color) group.push_back(k);
    std::stable_sort(group.begin(), group.end(), [&](int a, int c) {
      return all[static_cast<std::size_t>(a)][1] < all[static_cast<std::size_t>(c)][1];
    });
    std::vector<int> members;
    int me = 0;
    for (std::size_t i = 0; i < group.size(); ++i) {
      members.push_back(world_rank(group[i]));
      if (group[i] == me_) me = static_cast<int>(i);
    }
    return thread_world(b_, members, me, channel_ * 64 + color + 1);
  }

 private:
  int world_rank(int r) const { return members_[static_cast<std::size_t>(r)]; }
  int group_rank(int world) const {  // -1: not in this group
    for (std::size_t i = 0; i < members_.size(); ++i)
      if (members_[i] == world) return static_cast<int>(i);
    return -1;
  }
  void check(int peer, const char* what) const {
    if (peer < 0 || peer >= world_size())
      throw error(std::string("gradus: thread_world: ") + what + " rank " + std::to_string(peer) + " of " +
                  std::to_string(world_size()));
  }
  std::shared_ptr<detail::thread_boxes> b_;
  std::vector<int> members_;
  int me_;
  int channel_;
};
static_assert(point_to_point<thread_world>);
static_assert(splittable<thread_world>);

}  // namespace gradus::parallel
