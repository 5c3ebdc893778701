#pragma once
// any_collectives: any collectives policy (collectives.hpp) behind one virtual call per
// operation, so that code taking it is compiled once for all of them (a program's --comm
// option picks the ring, MPI or a parameter server's collectives at run time).
//
//   auto c = parallel::any_collectives::make<ring_allreduce>(spec, options);   // owns it
//   auto c = parallel::any_collectives::share(ptr);   // a std::shared_ptr<C>: shared with
//                                                     // another holder (any_communicator)
//
// split(color, key) forwards to a splittable policy (local, the ring, MPI); for one without
// sub-groups (the parameter server) it throws "gradus: <name>: split (sub-groups) is not
// supported yet".
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "gradus/core/error.hpp"
#include "gradus/parallel/collectives.hpp"

namespace gradus::parallel {

class any_collectives {
  struct iface {
    virtual ~iface() = default;
    virtual int rank() = 0;
    virtual int world_size() = 0;
    virtual const char* name() = 0;
    virtual void allreduce_sum(std::span<float>) = 0;
    virtual void allreduce_sum(std::span<double>) = 0;
    virtual void allreduce_average(std::span<float>) = 0;
    virtual void allreduce_average(std::span<double>) = 0;
    virtual void broadcast(std::span<float>, int) = 0;
    virtual void broadcast(std::span<double>, int) = 0;
    virtual void broadcast(std::span<std::byte>, int) = 0;
    virtual void barrier() = 0;
    virtual any_collectives split(int, int) = 0;
  };
  template <class C>
  struct holder final : iface {
    std::shared_ptr<C> c;
    explicit holder(std::shared_ptr<C> p) : c(std::move(p)) {}
    int rank() override { return c->rank(); }
    int world_size() override { return c->world_size(); }
    const char* name() override { return C::name; }
    void allreduce_sum(std::span<float> x) override { c->allreduce_sum(x); }
    void allreduce_sum(std::span<double> x) override { c->allreduce_sum(x); }
    void allreduce_average(std::span<float> x) override { c->allreduce_average(x); }
    void allreduce_average(std::span<double> x) override { c->allreduce_average(x); }
    void broadcast(std::span<float> x, int root) override { c->broadcast(x, root); }
    void broadcast(std::span<double> x, int root) override { c->broadcast(x, root); }
    void broadcast(std::span<std::byte> x, int root) override { c->broadcast(x, root); }
    void barrier() override { c->barrier(); }
    any_collectives split(int color, int key) override {
      if constexpr (splittable<C>) {
        using group = std::remove_cvref_t<decltype(c->split(color, key))>;
        return any_collectives::share(std::make_shared<group>(c->split(color, key)));
      } else {
        throw error(std::string("gradus: ") + C::name + ": split (sub-groups) is not supported yet");
      }
    }
  };
  std::shared_ptr<iface> p_;
  explicit any_collectives(std::shared_ptr<iface> p) : p_(std::move(p)) {}

 public:
  template <collectives C, class... A>
  static any_collectives make(A&&... args) {
    return share(std::make_shared<C>(std::forward<A>(args)...));
  }
  template <collectives C>
  static any_collectives share(std::shared_ptr<C> c) {
    return any_collectives(std::make_shared<holder<C>>(std::move(c)));
  }

  int rank() const { return p_->rank(); }
  int world_size() const { return p_->world_size(); }
  const char* name() const { return p_->name(); }
  template <class T>
  void allreduce_sum(std::span<T> x) {
    p_->allreduce_sum(x);
  }
  template <class T>
  void allreduce_average(std::span<T> x) {
    p_->allreduce_average(x);
  }
  template <class T>
  void broadcast(std::span<T> x, int root) {
    p_->broadcast(x, root);
  }
  void barrier() { p_->barrier(); }
  any_collectives split(int color, int key) { return p_->split(color, key); }
};
static_assert(splittable<any_collectives>);

}  // namespace gradus::parallel
