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

class any_communicator {
  any_collectives coll_;
  any_key_value_store store_;  ///< empty: the policy holds no variables
  any_point_to_point p2p_;     ///< empty: the policy has no point-to-point
  any_communicator(any_collectives c, any_key_value_store s, any_point_to_point p)
      : coll_(std::move(c)), store_(std::move(s)), p2p_(std::move(p)) {}

 public:
  any_communicator() : any_communicator(make<local>()) {}
  template <class C, class... A>
  static any_communicator make(A&&... args) {
    auto c = std::make_shared<C>(std::forward<A>(args)...);
    any_key_value_store s;
    any_point_to_point p;
    if constexpr (key_value_store<C>) s = any_key_value_store::share(c);
    if constexpr (point_to_point<C>) p = any_point_to_point::share(c);
    return {any_collectives::share(std::move(c)), std::move(s), std::move(p)};
  }

  int rank() const { return coll_.rank(); }
  int world_size() const { return coll_.world_size(); }
  const char* name() const { return coll_.name(); }
  template <class T>
  void allreduce_sum(std::span<T> x) {
    coll_.allreduce_sum(x);
  }
  template <class T>
  void allreduce_average(std::span<T> x) {
    coll_.allreduce_average(x);
  }
  template <class T>
  void broadcast(std::span<T> x, int root) {
    coll_.broadcast(x, root);
  }
  void barrier() { coll_.barrier(); }
  any_collectives split(int color, int key) { return coll_.split(color, key); }

  bool has_point_to_point() const { return static_cast<bool>(p2p_); }
  template <class T>
  void send(std::span<const T> x, int to) {
    peers().send(x, to);
  }
  template <class T>
  void recv(std::span<T> x, int from) {
    peers().recv(x, from);
  }

  bool holds_variables() const { return static_cast<bool>(store_); }
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
static_assert(splittable<any_communicator> && point_to_point<any_communicator>);

}  // namespace gradus::parallel
