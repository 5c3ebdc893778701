#pragma once
// any_point_to_point: any point-to-point policy (point_to_point.hpp) behind one virtual call
// per send or receive, so that a pipeline's stages are compiled once for every transport.
//
//   auto p2p = parallel::any_point_to_point::make<C>(args...);   // owns it
//   auto p2p = parallel::any_point_to_point::share(ptr);         // a std::shared_ptr<C>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>

#include "gradus/parallel/point_to_point.hpp"

namespace gradus::parallel {

/// Any `point_to_point` policy (point_to_point.hpp) behind one virtual call per send or
/// receive, so that a pipeline's stages are compiled once for every transport. Copies share
/// one policy object; a default-constructed one holds none (false), and any other call on it
/// is undefined. The policy's errors pass through unchanged.
class any_point_to_point {
  struct iface {
    virtual ~iface() = default;
    virtual int rank() = 0;
    virtual int world_size() = 0;
    virtual const char* name() = 0;
    virtual void send(std::span<const std::byte>, int) = 0;
    virtual void send(std::span<const float>, int) = 0;
    virtual void send(std::span<const double>, int) = 0;
    virtual void recv(std::span<std::byte>, int) = 0;
    virtual void recv(std::span<float>, int) = 0;
    virtual void recv(std::span<double>, int) = 0;
    virtual bool can_probe() = 0;
    virtual bool probe(int) = 0;
  };
  template <class C>
  struct holder final : iface {
    std::shared_ptr<C> c;
    explicit holder(std::shared_ptr<C> p) : c(std::move(p)) {}
    int rank() override { return c->rank(); }
    int world_size() override { return c->world_size(); }
    const char* name() override { return C::name; }
    void send(std::span<const std::byte> x, int to) override { c->send(x, to); }
    void send(std::span<const float> x, int to) override { c->send(x, to); }
    void send(std::span<const double> x, int to) override { c->send(x, to); }
    void recv(std::span<std::byte> x, int from) override { c->recv(x, from); }
    void recv(std::span<float> x, int from) override { c->recv(x, from); }
    void recv(std::span<double> x, int from) override { c->recv(x, from); }
    bool can_probe() override { return probing<C>; }
    bool probe(int from) override {
      if constexpr (probing<C>) return c->probe(from);
      else return true;  // (cannot tell: "do not wait on my account")
    }
  };
  std::shared_ptr<iface> p_;
  explicit any_point_to_point(std::shared_ptr<iface> p) : p_(std::move(p)) {}

 public:
  any_point_to_point() = default;  ///< none (operator bool: false)
  /// Whether it holds a policy.
  explicit operator bool() const { return p_ != nullptr; }
  /// A new C built from args, owned by this holder and its copies.
  template <point_to_point C, class... A>
  static any_point_to_point make(A&&... args) {
    return share(std::make_shared<C>(std::forward<A>(args)...));
  }
  /// The policy c points to, shared with its other holders.
  template <point_to_point C>
  static any_point_to_point share(std::shared_ptr<C> c) {
    return any_point_to_point(std::make_shared<holder<C>>(std::move(c)));
  }

  /// This rank: 0 .. world_size() - 1.
  int rank() const { return p_->rank(); }
  /// The number of ranks.
  int world_size() const { return p_->world_size(); }
  /// The policy's name, its `C::name`.
  const char* name() const { return p_->name(); }
  /// x to rank `to` (T: std::byte, float or double); returns once x may be reused. Messages
  /// between one pair of ranks arrive in the order they were sent.
  template <class T>
  void send(std::span<const T> x, int to) {
    p_->send(x, to);
  }
  /// Fills x with the next message from rank `from`, which must hold exactly x.size()
  /// elements: a mismatch throws, naming the peer and both sizes. A dead or silent peer
  /// throws (`comm_error` naming it) instead of blocking forever.
  template <class T>
  void recv(std::span<T> x, int from) {
    p_->recv(x, from);
  }
  /// Whether the policy can tell a message has arrived without waiting (`probing`).
  bool can_probe() const { return p_->can_probe(); }
  /// Whether the next message from rank `from` has arrived (recv would not wait); true
  /// where the policy cannot tell (can_probe() false).
  bool probe(int from) { return p_->probe(from); }
};
static_assert(probing<any_point_to_point>);

}  // namespace gradus::parallel
