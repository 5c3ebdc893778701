#pragma once
// any_communicator: a communicator chosen at run time (a program's --comm option), the
// composition the data-parallel step needs — the policy's collectives (any_collectives.hpp)
// and, where the policy holds the variables (a parameter server), its key-value store
// (any_key_value_store.hpp), both sharing one object. The step is compiled once for all
// policies: one virtual call per collective, push or pull.
//
//   auto comm = parallel::any_communicator::make<ring_allreduce>(spec, options);
//   auto step = parallel::minimize(comm, opts, s, loss, opt);   // a ps: push/pull; else all-reduce
//
// Default-constructed: parallel::local. It is a `collectives` itself (forwarding); store()
// is the key-value store, holds_variables() whether there is one.
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "gradus/core/error.hpp"
#include "gradus/parallel/any_collectives.hpp"
#include "gradus/parallel/any_key_value_store.hpp"
#include "gradus/parallel/local.hpp"

namespace gradus::parallel {

class any_communicator {
  any_collectives coll_;
  any_key_value_store store_;  // empty: the policy holds no variables
  any_communicator(any_collectives c, any_key_value_store s) : coll_(std::move(c)), store_(std::move(s)) {}

 public:
  any_communicator() : coll_(any_collectives::make<local>()) {}
  template <class C, class... A>
  static any_communicator make(A&&... args) {
    auto c = std::make_shared<C>(std::forward<A>(args)...);
    if constexpr (key_value_store<C>) return {any_collectives::share(c), any_key_value_store::share(c)};
    else return {any_collectives::share(std::move(c)), {}};
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

  bool holds_variables() const { return static_cast<bool>(store_); }
  any_key_value_store& store() {
    if (!store_) throw error(std::string("gradus: ") + name() + " is not a parameter server (store)");
    return store_;
  }
};
static_assert(splittable<any_communicator>);

}  // namespace gradus::parallel
