#pragma once
// minimize(session, loss, optimizer, variables...): a training step.
//
//   auto step = g::minimize(s, loss, g::adam{.lr = 1e-3}, w1, b1, w2, b2);
//   for (...) float l = step.run(x = xb, y = yb);
//
// run() = compute_gradients() + apply_gradients(): one session run of the loss and every
// gradient together (planned once: forward values are shared by the backward pass, the
// whole step allocates nothing after the first), then one fused optimizer pass per
// variable, in place in the session's storage. The split (as TensorFlow's
// compute_gradients / apply_gradients) is where a data-parallel trainer all-reduces the
// gradients between the two.
//
// Constructing the step declares its variables and creates the optimizer's state tensors
// in the session ("w1/momentum", "w1/adam_m", ...), so a checkpoint can be restored into
// the session before the first step.
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gradus/autodiff/grad.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/train/optimizer.hpp"

namespace gradus {

template <class E>
inline constexpr bool is_variable_v = false;
template <fixed_string N, class T, index_t... E>
inline constexpr bool is_variable_v<variable<N, T, E...>> = true;

namespace detail {
template <class... Vs>
constexpr bool distinct_names() {
  constexpr std::array<std::string_view, sizeof...(Vs)> names{Vs::name.view()...};
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = i + 1; j < names.size(); ++j)
      if (names[i] == names[j]) return false;
  return true;
}
template <class G>
auto as_tuple(G g) {
  if constexpr (requires { std::tuple_size<G>::value; }) return g;
  else return std::tuple<G>{g};
}
}  // namespace detail

// What the trainer sees of one gradient between compute and apply (device memory).
struct gradient_buffer {
  std::string_view name;   // the variable's
  std::string_view dtype;  // "float32" / "float64"
  void* data;              // writable: a communicator may reduce into it
  index_t size;
};

template <class Backend, class Opt, class Loss, class... Vs>
class train_step {
  static_assert(sizeof...(Vs) > 0, "gradus: minimize: name the variables to train");
  static_assert((is_variable_v<Vs> && ...), "gradus: minimize: only variables can be trained (not placeholders)");
  static_assert(detail::distinct_names<Vs...>(), "gradus: minimize: a variable is named twice");
  using grads_t = decltype(detail::as_tuple(grad(std::declval<const Loss&>(), std::declval<const Vs&>()...)));
  static constexpr std::size_t max_slots = 2;

 public:
  using loss_type = value_t<Loss>;

  train_step(session<Backend>& s, const Loss& loss, const Opt& opt, const Vs&... vs)
      : s_(s), loss_(loss), opt_(opt), grads_(detail::as_tuple(grad(loss, vs...))) {
    opt_.validate();
    (s_.declare(vs), ...);
    std::size_t i = 0;
    (make_slots(vs, i++), ...);
  }

  // One training step: the loss before the update.
  template <class... Feeds>
  loss_type run(const Feeds&... feeds) {
    const loss_type l = compute_gradients(feeds...);
    apply_gradients();
    return l;
  }

  // Forward and backward: the loss, and every gradient in gradients().
  template <class... Feeds>
  loss_type compute_gradients(const Feeds&... feeds) {
    std::apply(
        [&](const auto&... g) {
          auto r = s_.run(loss_, g..., feeds...);
          [&]<std::size_t... I>(std::index_sequence<I...>) {
            ((buffers_[I] = {std::tuple_element_t<I, std::tuple<Vs...>>::name.view(),
                             dtype_name<value_t<std::tuple_element_t<I, std::tuple<Vs...>>>>(),
                             const_cast<void*>(static_cast<const void*>(std::get<I + 1>(r).data())),
                             std::get<I + 1>(r).size()}),
             ...);
          }(std::index_sequence_for<Vs...>{});
          Backend::copy_to_host(&last_loss_, std::get<0>(r).data(), sizeof(loss_type));
        },
        grads_);
    have_grads_ = true;
    return last_loss_;
  }

  // The gradients of the last compute_gradients(), in the order the variables were named.
  std::span<gradient_buffer> gradients() { return buffers_; }

  // The optimizer's update of every variable (clipping first, if asked), then step + 1.
  void apply_gradients() {
    if (!have_grads_) throw error("gradus: train_step::apply_gradients: no gradients; call compute_gradients first");
    have_grads_ = false;
    double scale = 1;
    if (opt_.clip_global_norm > 0) {
      last_norm_ = norm_of_gradients();
      if (last_norm_ > opt_.clip_global_norm) scale = opt_.clip_global_norm / last_norm_;
    }
    const std::int64_t step = s_.global_step();
    // each variable's storage, looked up once per step (also for the aliasing check)
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((storage_[I] = s_.template data<value_t<Vs>>(Vs::name.view())), ...);
    }(std::index_sequence_for<Vs...>{});
    [&]<std::size_t... I>(std::index_sequence<I...>) { (update<I>(step, scale), ...); }(std::index_sequence_for<Vs...>{});
    s_.set_global_step(step + 1);
  }

  // The global gradient norm of the last step (only computed when clipping).
  double last_global_norm() const { return last_norm_; }
  // The L2 norm over all gradients of the last compute_gradients() (one extra pass).
  double gradient_norm() const {
    if (!have_grads_) throw error("gradus: train_step::gradient_norm: no gradients; call compute_gradients first");
    return norm_of_gradients();
  }
  // The learning rate the next update will use.
  double learning_rate() const { return opt_.lr(s_.global_step()); }
  const Opt& optimizer() const { return opt_; }
  const Loss& loss() const { return loss_; }
  const grads_t& gradient_expressions() const { return grads_; }
  session<Backend>& owner() const { return s_; }

 private:
  template <std::size_t I>
  const auto* grad_ptr() const {
    using T = value_t<std::tuple_element_t<I, std::tuple<Vs...>>>;
    return static_cast<const T*>(buffers_[I].data);
  }

  double norm_of_gradients() const {
    double sq = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((sq += static_cast<double>(Backend::sum_squares(grad_ptr<I>(), buffers_[I].size))), ...);
    }(std::index_sequence_for<Vs...>{});
    return std::sqrt(sq);
  }

  template <class V>
  void make_slots(const V&, std::size_t i) {
    using T = value_t<V>;
    const dims d = static_dims<shape_t<V>>();
    for (int k = 0; k < opt_.slot_count(); ++k) {
      const std::string slot_name = std::string(V::name.view()) + "/" + std::string(opt_.slot_name(k));
      slots_[i][static_cast<std::size_t>(k)] = s_.template state<T>(slot_name, d);
    }
  }

  template <std::size_t I>
  void update(std::int64_t step, double scale) {
    using T = value_t<std::tuple_element_t<I, std::tuple<Vs...>>>;
    T* w = static_cast<T*>(storage_[I]);
    const T* g = grad_ptr<I>();
    const index_t n = buffers_[I].size;
    // A gradient may be another trained variable's storage itself (d(a*b)/da = b): updating
    // that variable first would change this gradient, so it is read from a copy.
    if (aliases_trained(g, static_cast<std::size_t>(n) * sizeof(T))) {
      T* copy = scratch<T>(I, n);
      Backend::copy(copy, g, static_cast<std::size_t>(n) * sizeof(T));
      g = copy;
    }
    std::array<T*, max_slots> sl{};
    for (std::size_t k = 0; k < max_slots; ++k) sl[k] = static_cast<T*>(slots_[I][k]);
    opt_.template apply<Backend>(n, w, g, sl.data(), step, scale);
  }

  // Whether [g, g + bytes) overlaps any trained variable's storage.
  bool aliases_trained(const void* g, std::size_t bytes) const {
    const auto* lo = static_cast<const char*>(g);
    for (std::size_t i = 0; i < sizeof...(Vs); ++i) {
      const auto* w = static_cast<const char*>(storage_[i]);
      if (lo < w + storage_bytes_[i] && w < lo + bytes) return true;
    }
    return false;
  }

  template <class T>
  T* scratch(std::size_t i, index_t n) {
    auto& b = scratch_[i];
    const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(n) * sizeof(T), sizeof(T));
    if (b.bytes < bytes) {
      if (b.p) Backend::deallocate(b.p);
      b.p = nullptr;
      b.p = Backend::allocate(bytes);
      b.bytes = bytes;
    }
    return static_cast<T*>(b.p);
  }
  struct buffer {
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  struct scratch_list {
    std::array<buffer, sizeof...(Vs)> b{};
    buffer& operator[](std::size_t i) { return b[i]; }
    scratch_list() = default;
    scratch_list(const scratch_list&) = delete;
    scratch_list& operator=(const scratch_list&) = delete;
    ~scratch_list() {
      for (auto& x : b)
        if (x.p) Backend::deallocate(x.p);
    }
  };

  session<Backend>& s_;
  Loss loss_;
  Opt opt_;
  grads_t grads_;
  std::array<void*, sizeof...(Vs)> storage_{};  // the variables' storage, this step
  static constexpr std::array<std::size_t, sizeof...(Vs)> storage_bytes_{
      static_cast<std::size_t>(static_dims<shape_t<Vs>>().numel()) * sizeof(value_t<Vs>)...};
  std::array<gradient_buffer, sizeof...(Vs)> buffers_{};
  std::array<std::array<void*, max_slots>, sizeof...(Vs)> slots_{};
  scratch_list scratch_;
  loss_type last_loss_{};
  double last_norm_ = 0;
  bool have_grads_ = false;
};

// The variables an expression reads, each once, in order of first appearance (a type
// list: std::tuple<variable<...>...>), found by walking the expression's type.
namespace detail {
template <class Acc, class... Es>
struct collect_variables {
  using type = Acc;
};
template <class Acc, class E>
struct collect_children {
  using type = Acc;
};
template <class Acc, class... C>
struct collect_children_of;
template <class Acc, class... C>
struct collect_children_of<Acc, std::tuple<C...>> {
  using type = typename collect_variables<Acc, std::remove_cvref_t<C>...>::type;
};
template <class Acc, class E>
  requires requires(const E& e) { e.children(); }
struct collect_children<Acc, E> {
  using type = typename collect_children_of<Acc, children_t<E>>::type;
};
template <class E, class Acc>
struct append_variable {
  using type = typename collect_children<Acc, E>::type;
};
template <fixed_string N, class T, index_t... X, class... A>
struct append_variable<variable<N, T, X...>, std::tuple<A...>> {
  using V = variable<N, T, X...>;
  using type = std::conditional_t<(std::is_same_v<A, V> || ...), std::tuple<A...>, std::tuple<A..., V>>;
};
template <class Acc, class E0, class... Es>
struct collect_variables<Acc, E0, Es...> {
  using type = typename collect_variables<typename append_variable<E0, Acc>::type, Es...>::type;
};
}  // namespace detail
template <class E>
using variables_of_t = typename detail::collect_variables<std::tuple<>, E>::type;

// minimize(session, loss, optimizer, variables...): the training step of `loss` over the
// named variables (see train_step).
template <class Backend, class Opt, expression Loss, class... Vs>
  requires(sizeof...(Vs) > 0)
auto minimize(session<Backend>& s, const Loss& loss, const Opt& opt, const Vs&... vs) {
  return train_step<Backend, Opt, Loss, Vs...>(s, loss, opt, vs...);
}

// minimize(session, loss, optimizer): over every variable the loss reads (as
// tf.train.Optimizer.minimize trains all trainable variables). Hold a variable fixed by
// naming the others explicitly.
template <class Backend, class Opt, expression Loss>
auto minimize(session<Backend>& s, const Loss& loss, const Opt& opt) {
  return [&]<class... Vs>(std::tuple<Vs...>*) {
    static_assert(sizeof...(Vs) > 0, "gradus: minimize: the loss reads no variable");
    return train_step<Backend, Opt, Loss, Vs...>(s, loss, opt, Vs{}...);
  }(static_cast<variables_of_t<Loss>*>(nullptr));
}

}  // namespace gradus
