#pragma once
// any_communicator: a communicator chosen at run time (a program's --comm option), the
// composition the data-parallel step and the pipeline need — the policy's collectives
// (any_collectives.hpp), where the policy holds the variables (a parameter server) its
// key-value store (any_key_value_store.hpp), and where it has them its point-to-point
// sends (any_point_to_point.hpp: a pipeline's transfers), all sharing one object. The step is
// compiled once for all policies: one virtual call per collective, push, pull or send.
//
//   auto comm = parallel::any_communicator::make<ring_allreduce>(spec, options);
//   auto step = parallel::minimize(comm, opts, s, loss, opt);   // a ps: push/pull; else all-reduce
//
// Default-constructed: parallel::local. It is a `collectives` and a `point_to_point` itself
// (forwarding); store() is the key-value store, holds_variables() whether there is one;
// send/recv of a policy without point-to-point throw, naming it.
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "gradus/core/error.hpp"
#include "gradus/parallel/any_collectives.hpp"
#include "gradus/parallel/any_key_value_store.hpp"
#include "gradus/parallel/any_point_to_point.hpp"
#include "gradus/parallel/local.hpp"
#include "gradus/parallel/point_to_point.hpp"

namespace gradus::parallel {

/// A communicator chosen at run time (a program's `--comm` option), what the data-parallel
/// step and the pipeline take: the policy's collectives, its key-value store where it holds
/// the variables (a parameter server), and its point-to-point sends where it has them, all
/// sharing one policy object, each operation one virtual call. Default-constructed: `local`,
/// the world of one. Copies share the policy. The collectives follow any_collectives' rules
/// (every rank calls them, in the same order; the policy's errors pass through).
class any_communicator {
  any_collectives coll_;
  any_key_value_store store_;  ///< empty: the policy holds no variables
  any_point_to_point p2p_;     ///< empty: the policy has no point-to-point
  any_communicator(any_collectives c, any_key_value_store s, any_point_to_point p)
      : coll_(std::move(c)), store_(std::move(s)), p2p_(std::move(p)) {}

 public:
  any_communicator() : any_communicator(make<local>()) {}
  /// A new C built from args; its store and its point-to-point are offered where C is a
  /// `key_value_store` or a `point_to_point`. Throws what C's constructor throws (a failed
  /// rendezvous).
  template <class C, class... A>
  static any_communicator make(A&&... args) {
    auto c = std::make_shared<C>(std::forward<A>(args)...);
    any_key_value_store s;
    any_point_to_point p;
    if constexpr (key_value_store<C>) s = any_key_value_store::share(c);
    if constexpr (point_to_point<C>) p = any_point_to_point::share(c);
    return {any_collectives::share(std::move(c)), std::move(s), std::move(p)};
  }

  /// This rank: 0 .. world_size() - 1.
  int rank() const { return coll_.rank(); }
  /// The number of ranks (workers, for a parameter server).
  int world_size() const { return coll_.world_size(); }
  /// The wrapped policy's name ("local", "ring", "mpi", "parameter_server").
  const char* name() const { return coll_.name(); }
  /// Every rank's x summed, in place on every rank (T: float or double; a collective).
  template <class T>
  void allreduce_sum(std::span<T> x) {
    coll_.allreduce_sum(x);
  }
  /// The sum of every rank's x divided by world_size(), in place (T: float or double).
  template <class T>
  void allreduce_average(std::span<T> x) {
    coll_.allreduce_average(x);
  }
  /// The float average with x travelling as `wire` (any_collectives::allreduce_average).
  void allreduce_average(std::span<float> x, element_type wire) { coll_.allreduce_average(x, wire); }
  /// Rank root's x into every other rank's x, in place (T: float, double or std::byte).
  template <class T>
  void broadcast(std::span<T> x, int root) {
    coll_.broadcast(x, root);
  }
  /// Returns once every rank has entered it.
  void barrier() { coll_.barrier(); }
  /// The collectives of this rank's sub-group (any_collectives::split: every rank calls it);
  /// throws `error` where the policy makes no sub-groups.
  any_collectives split(int color, int key) { return coll_.split(color, key); }

  /// Whether the policy has send/recv (the ring, MPI, `local`; not the parameter server).
  bool has_point_to_point() const { return static_cast<bool>(p2p_); }
  /// x (bytes, float or double) to rank `to`; returns once x may be reused. Throws `error`
  /// naming the policy where it has no point-to-point (has_point_to_point() is false), and
  /// what the policy throws (a dead peer: `comm_error`).
  template <class T>
  void send(std::span<const T> x, int to) {
    peers().send(x, to);
  }
  /// Fills x with the next message from rank `from`, which must hold exactly x.size()
  /// elements (a mismatch throws, naming the peer and both sizes). Throws `error` where the
  /// policy has no point-to-point, and what the policy throws (a dead or silent peer:
  /// `comm_error`).
  template <class T>
  void recv(std::span<T> x, int from) {
    peers().recv(x, from);
  }

  /// Whether the policy's point-to-point can tell a message has arrived without waiting
  /// (`probing`); false without point-to-point.
  bool can_probe() const { return p2p_ && p2p_.can_probe(); }
  /// Whether the next message from rank `from` has arrived (recv would not wait); true where
  /// the policy cannot tell. Throws as recv does where it has no point-to-point.
  bool probe(int from) { return peers().probe(from); }

  /// Whether the policy holds the variables (a parameter server): the data-parallel step
  /// then pushes and pulls through store() instead of averaging gradients.
  bool holds_variables() const { return static_cast<bool>(store_); }
  /// The policy's key-value store. Throws `error` ("... is not a parameter server (store)")
  /// where holds_variables() is false.
  any_key_value_store& store() {
    if (!store_) throw error(std::string("gradus: ") + name() + " is not a parameter server (store)");
    return store_;
  }

 private:
  any_point_to_point& peers() {
    if (!p2p_) throw error(std::string("gradus: ") + name() + ": point-to-point send/recv is not supported (a pipeline needs it)");
    return p2p_;
  }
};
static_assert(splittable<any_communicator> && point_to_point<any_communicator> && wire_collectives<any_communicator>);

}  // namespace gradus::parallel
