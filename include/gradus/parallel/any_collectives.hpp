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

/// Any `collectives` policy (collectives.hpp: the ring, MPI, a parameter server's collectives,
/// `local`) behind one virtual call per operation, so that code taking it is compiled once for
/// every policy. Copies share one policy object. Every operation but rank(), world_size() and
/// name() is a collective: every rank of the group calls it, in the same order, and it
/// returns on a rank once that rank's part is done. The policy's errors pass through
/// unchanged: one that cannot finish (a dead or silent peer, past its timeout) throws
/// `comm_error` naming the peer rather than blocking forever (MPI leaves a dead rank to
/// mpirun).
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
    virtual void allreduce_average(std::span<float>, element_type) = 0;
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
    void allreduce_average(std::span<float> x, element_type wire) override { average_as(*c, x, wire); }
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
  /// A new C built from args, owned by this holder and its copies.
  template <collectives C, class... A>
  static any_collectives make(A&&... args) {
    return share(std::make_shared<C>(std::forward<A>(args)...));
  }
  /// The policy c points to, shared with its other holders (any_communicator gives one object
  /// to its collectives, its store and its point-to-point).
  template <collectives C>
  static any_collectives share(std::shared_ptr<C> c) {
    return any_collectives(std::make_shared<holder<C>>(std::move(c)));
  }

  /// This rank in the group: 0 .. world_size() - 1.
  int rank() const { return p_->rank(); }
  /// The number of ranks in the group.
  int world_size() const { return p_->world_size(); }
  /// The policy's name, its `C::name` ("local", "ring", "ring-group", "mpi", "parameter_server").
  const char* name() const { return p_->name(); }
  /// Every rank's x summed, in place on every rank. T: float or double (no other type
  /// compiles); x in host memory, the same length on every rank (0 included).
  template <class T>
  void allreduce_sum(std::span<T> x) {
    p_->allreduce_sum(x);
  }
  /// The sum of every rank's x divided by world_size(), in place (T: float or double).
  template <class T>
  void allreduce_average(std::span<T> x) {
    p_->allreduce_average(x);
  }
  /// The float average with x travelling as `wire` (parallel::average_as: as float32, after
  /// one warning, where the policy has no such wire).
  void allreduce_average(std::span<float> x, element_type wire) { p_->allreduce_average(x, wire); }
  /// Rank root's x into every other rank's x, in place. T: float, double or std::byte; the
  /// same length on every rank.
  template <class T>
  void broadcast(std::span<T> x, int root) {
    p_->broadcast(x, root);
  }
  /// Returns once every rank of the group has entered it.
  void barrier() { p_->barrier(); }
  /// MPI_Comm_split: every rank calls it; the ranks that pass the same color (>= 0) form a
  /// new group, ranked by key (ties by their rank here), and each gets that group's
  /// collectives. Throws `error` ("split (sub-groups) is not supported yet") where the policy
  /// makes no sub-groups (the parameter server).
  any_collectives split(int color, int key) { return p_->split(color, key); }
};
static_assert(splittable<any_collectives> && wire_collectives<any_collectives>);

}  // namespace gradus::parallel
