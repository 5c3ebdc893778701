#pragma once
// `local`: a world of one, the trivial policy a trainer runs on when it runs alone. Every
// collective is the identity; split() gives a world of one again; a message sent to itself
// (rank 0) waits in a queue for its recv. Every concept of the communication layer
// (collectives.hpp, point_to_point.hpp) holds for it, so programs and tests written against
// them run here unchanged.
#include <cstddef>
#include <cstring>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/collectives.hpp"
#include "gradus/parallel/point_to_point.hpp"

namespace gradus::parallel {

/// A world of one: the policy a trainer runs on when it runs alone. Every collective is the
/// identity, split() gives a world of one again, and a message sent to itself (rank 0) waits
/// in a queue for its recv. It is `collectives`, `splittable` and `point_to_point`; not
/// thread-safe (its queue has no lock).
struct local {
  static constexpr const char* name = "local";  ///< the policy's name (any_collectives::name())
  /// Always 0.
  int rank() const { return 0; }
  /// Always 1.
  int world_size() const { return 1; }
  /// The identity: the sum over a world of one.
  template <class T>
  void allreduce_sum(std::span<T>) {}
  /// The identity: the average over a world of one.
  template <class T>
  void allreduce_average(std::span<T>) {}
  /// The identity (nothing travels; parallel::wire_collectives).
  void allreduce_average(std::span<float>, element_type) {}
  /// The identity. Throws `error` where root is not 0.
  template <class T>
  void broadcast(std::span<T>, int root) {
    if (root != 0) throw error("gradus: local communicator: broadcast from rank " + std::to_string(root) + " of a world of 1");
  }
  /// Returns at once.
  void barrier() {}
  /// Every color is this rank's own group of one. Throws `error` for a color below 0.
  local split(int color, int) const {
    if (color < 0) throw error("gradus: local communicator: split with color " + std::to_string(color) + " (colors are >= 0)");
    return {};
  }

  /// A copy of x queued for this rank's own recv. Throws `error` where `to` is not 0.
  template <class T>
  void send(std::span<const T> x, int to) {
    if (to != 0) throw error("gradus: local communicator: send to rank " + std::to_string(to) + " of a world of 1");
    const auto* p = reinterpret_cast<const std::byte*>(x.data());
    sent_.emplace_back(p, p + x.size_bytes());
  }
  /// The oldest queued message into x. Throws `error` where `from` is not 0, where nothing
  /// is queued (it would wait forever), or where the message's size in bytes is not x's (the
  /// message stays queued).
  template <class T>
  void recv(std::span<T> x, int from) {
    if (from != 0) throw error("gradus: local communicator: recv from rank " + std::to_string(from) + " of a world of 1");
    if (sent_.empty()) throw error("gradus: local communicator: recv from rank 0, which has sent nothing (it would wait forever)");
    if (sent_.front().size() != x.size_bytes())
      throw error("gradus: local communicator: recv of " + std::to_string(x.size_bytes()) + " bytes from rank 0, whose message holds " +
                  std::to_string(sent_.front().size()));
    if (!x.empty()) std::memcpy(x.data(), sent_.front().data(), x.size_bytes());
    sent_.pop_front();
  }
  /// Whether a message is queued (recv would not throw for want of one). Throws `error`
  /// where `from` is not 0.
  bool probe(int from) const {
    if (from != 0) throw error("gradus: local communicator: probe for rank " + std::to_string(from) + " of a world of 1");
    return !sent_.empty();
  }

 private:
  std::deque<std::vector<std::byte>> sent_;  ///< messages to itself, oldest first
};
static_assert(collectives<local>);
static_assert(splittable<local>);
static_assert(point_to_point<local>);

}  // namespace gradus::parallel
