#pragma once
// Optimizers: the update rule each applies to one variable, given its gradient and its
// state. A train_step (train_step.hpp) runs the rule as one fused pass per variable over
// the variable's storage (in place), its gradient and its state tensors, which the
// session keeps by name ("<variable>/<slot>") so that checkpoints save them.
//
//   sgd{.lr, .momentum, .nesterov, .weight_decay, .clip_global_norm}
//       d = g + weight_decay*w;  m = momentum*m + d;  w -= lr * (nesterov ? d + momentum*m : m)
//       (momentum 0: w -= lr*d, no state) — PyTorch's SGD.
//   adam{.lr, .beta1, .beta2, .eps, .weight_decay, .clip_global_norm}
//       d = g + weight_decay*w;  m = b1*m + (1-b1)*d;  v = b2*v + (1-b2)*d*d
//       w -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)     (t = step + 1) — PyTorch's Adam.
//   adamw: as adam, with decoupled weight decay: w *= 1 - lr*weight_decay, no L2 term.
//
// clip_global_norm > 0 scales every gradient of the step by clip / max(norm, clip), where
// norm is the L2 norm over all of the step's gradients together (TensorFlow's
// clip_by_global_norm), before the rule sees them. `lr` takes a number or a schedule.
//
// Each optimizer names its hyper-parameters once, in fields(); its defaults are its member
// initializers and nowhere else. settings() writes the fields as exact text, and
// optimizer_description.hpp rebuilds the optimizer from that text (a parameter server does).
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "gradus/core/device.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/train/schedule.hpp"

namespace gradus {

namespace opt_detail {
inline void check_range(const char* opt, const char* field, double v, double lo, double hi, bool hi_open = false) {
  if (!(v >= lo) || (hi_open ? !(v < hi) : !(v <= hi)) || !std::isfinite(v))
    throw error(std::string("gradus: ") + opt + ": " + field + " = " + std::to_string(v) + " is outside [" +
                std::to_string(lo) + ", " + std::to_string(hi) + (hi_open ? ")" : "]"));
}

/// A hyper-parameter as exact text (shortest round-trip decimals; a schedule's describe()),
/// what settings() writes and optimizer_description.hpp reads back.
inline std::string setting_text(double v) { return shortest_text(v); }
inline std::string setting_text(bool v) { return v ? "true" : "false"; }
inline std::string setting_text(const lr_schedule& v) { return v.describe(); }
template <class Opt, class F>
void write_settings(const Opt& o, F& f) {
  Opt::fields(o, [&](const char* setting, const auto& field) { f(setting, setting_text(field)); });
}

/// The per-element rules, written once for scalars and SIMD batches (V is T or a batch).
/// No named locals of type V (core/device.hpp says why): a value used twice is a parameter
/// of a second function, bound to the temporary that computes it once.
template <class T>
struct sgd_rule {
  T lr, wd, scale;
  template <class V>
  GRADUS_HD void operator()(V& w, const V& g) const {
    w = w - V(lr) * (g * V(scale) + V(wd) * w);
  }
};
template <class T, bool Nesterov>
struct momentum_rule {
  T lr, mu, wd, scale;
  template <class V>
  GRADUS_HD void operator()(V& w, const V& g, V& m) const {
    step(w, m, g * V(scale) + V(wd) * w);
  }
  template <class V>
  GRADUS_HD void step(V& w, V& m, const V& d) const {
    m = V(mu) * m + d;
    if constexpr (Nesterov) w = w - V(lr) * (d + V(mu) * m);
    else w = w - V(lr) * m;
  }
};
template <class T>
struct adam_rule {
  T step_size;     ///< lr / (1 - b1^t)
  T b1, b2, eps;
  T inv_sqrt_bc2;  ///< 1 / sqrt(1 - b2^t)
  T l2;            ///< Adam's L2 term (0 for AdamW)
  T decay;         ///< AdamW's 1 - lr*wd (1 for Adam)
  T scale;
  template <class V>
  GRADUS_HD void operator()(V& w, const V& g, V& m, V& v) const {
    step(w, m, v, g * V(scale) + V(l2) * w);
  }
  template <class V>
  GRADUS_HD void step(V& w, V& m, V& v, const V& d) const {
    using std::sqrt;
    m = V(b1) * m + V(T(1) - b1) * d;
    v = V(b2) * v + V(T(1) - b2) * (d * d);
    w = w * V(decay) - V(step_size) * m / (sqrt(v) * V(inv_sqrt_bc2) + V(eps));
  }
};
}  // namespace opt_detail

/// Stochastic gradient descent with optional momentum, Nesterov momentum, L2 weight decay
/// and global-norm clipping, as PyTorch's SGD; set the fields by name,
/// `sgd{.lr = 0.1, .momentum = 0.9}`. Per element, with g the (clipped) gradient:
///
///     d = g + weight_decay * w
///     momentum == 0:  w -= lr * d                                   (no state)
///     otherwise:      m = momentum * m + d
///                     w -= lr * (nesterov ? d + momentum * m : m)   (state "<variable>/momentum", from 0)
///
/// lr is `lr(step)`, the schedule at the session's global_step.
struct sgd {
  lr_schedule lr = 0.01;         ///< learning rate: a number or a schedule (default 0.01)
  double momentum = 0;           ///< momentum factor, in [0, 1) (default 0: none)
  bool nesterov = false;         ///< Nesterov momentum (default false; needs momentum > 0)
  double weight_decay = 0;       ///< L2 penalty factor added to the gradient, >= 0 (default 0)
  double clip_global_norm = 0;   ///< clip the step's gradients to this global L2 norm (default 0: off)

  static constexpr const char* name = "sgd";  ///< its name in a description and in settings
  /// Throws gradus::error, naming the field, when momentum is outside [0, 1), weight_decay
  /// or clip_global_norm negative or not finite, or nesterov is set without momentum.
  /// minimize() and the other trainers call it before the first step.
  void validate() const {
    opt_detail::check_range(name, "momentum", momentum, 0, 1, true);
    opt_detail::check_range(name, "weight_decay", weight_decay, 0, 1e30);
    opt_detail::check_range(name, "clip_global_norm", clip_global_norm, 0, 1e300);
    if (nesterov && momentum == 0) throw error("gradus: sgd: nesterov needs momentum > 0");
  }
  /// f(setting, field) for every hyper-parameter, each named once: settings() writes them,
  /// optimizer_description.hpp reads them back (self: an sgd, const or not).
  template <class Self, class F>
  static void fields(Self& self, F&& f) {
    f("lr", self.lr);
    f("momentum", self.momentum);
    f("nesterov", self.nesterov);
    f("weight_decay", self.weight_decay);
    f("clip_global_norm", self.clip_global_norm);
  }
  /// f(setting, value as exact text) for every hyper-parameter (parallel/agree.hpp compares
  /// them between data-parallel ranks; a parameter server rebuilds the optimizer from them).
  template <class F>
  void settings(F&& f) const {
    opt_detail::write_settings(*this, f);
  }
  /// State tensors per variable: 1 (the momentum buffer) when momentum > 0, else 0.
  int slot_count() const { return momentum > 0 ? 1 : 0; }
  /// The name of its only state tensor, "momentum" (a checkpoint holds "<variable>/momentum").
  static std::string_view slot_name(int) { return "momentum"; }

  /// Applies the rule to n elements: one fused Backend pass, in place over the variable's
  /// storage `w` and its state `slots[0]` (when momentum > 0), reading the gradient `g`
  /// multiplied by `scale` (the clipping factor, 1 without clipping); `step` is the 0-based
  /// global step that picks the learning rate. Pointers are in Backend's memory.
  template <class Backend, class T>
  void apply(index_t n, T* w, const T* g, T* const* slots, std::int64_t step, double scale) const {
    const T l = static_cast<T>(lr(step)), wd = static_cast<T>(weight_decay), sc = static_cast<T>(scale);
    if (momentum == 0) {
      Backend::for_each(n, opt_detail::sgd_rule<T>{l, wd, sc}, w, g);
    } else if (nesterov) {
      Backend::for_each(n, opt_detail::momentum_rule<T, true>{l, static_cast<T>(momentum), wd, sc}, w, g, slots[0]);
    } else {
      Backend::for_each(n, opt_detail::momentum_rule<T, false>{l, static_cast<T>(momentum), wd, sc}, w, g, slots[0]);
    }
  }
};

/// adam and adamw: one template, the decay decoupled or not (defaults as PyTorch's). Per
/// element, with g the (clipped) gradient and t = global_step + 1:
///
///     d = g + weight_decay * w                       (adam; adamw: d = g)
///     m = beta1 * m + (1 - beta1) * d                (state "<variable>/adam_m", from 0)
///     v = beta2 * v + (1 - beta2) * d * d            (state "<variable>/adam_v", from 0)
///     w = w * (1 - lr * weight_decay)                (adamw only)
///     w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
///
/// lr is `lr(global_step)`. Write gradus::adam or gradus::adamw, `adam{.lr = 1e-3}`.
template <bool Decoupled>
struct adam_optimizer {
  lr_schedule lr = 0.001;                      ///< learning rate: a number or a schedule (default 0.001)
  double beta1 = 0.9;                          ///< decay of the first-moment average m, in [0, 1) (default 0.9)
  double beta2 = 0.999;                        ///< decay of the second-moment average v, in [0, 1) (default 0.999)
  double eps = 1e-8;                           ///< added to the denominator, >= 0 (default 1e-8)
  double weight_decay = Decoupled ? 0.01 : 0;  ///< L2 term (adam, default 0) or decoupled decay (adamw, default 0.01), >= 0
  double clip_global_norm = 0;                 ///< clip the step's gradients to this global L2 norm (default 0: off)

  static constexpr const char* name = Decoupled ? "adamw" : "adam";  ///< "adam" or "adamw"
  /// Throws gradus::error, naming the field, when beta1 or beta2 is outside [0, 1), or eps,
  /// weight_decay or clip_global_norm negative or not finite.
  void validate() const {
    opt_detail::check_range(name, "beta1", beta1, 0, 1, true);
    opt_detail::check_range(name, "beta2", beta2, 0, 1, true);
    opt_detail::check_range(name, "eps", eps, 0, 1e30);
    opt_detail::check_range(name, "weight_decay", weight_decay, 0, 1e30);
    opt_detail::check_range(name, "clip_global_norm", clip_global_norm, 0, 1e300);
  }
  /// f(setting, field) for every hyper-parameter, as sgd::fields (self: an adam_optimizer,
  /// const or not).
  template <class Self, class F>
  static void fields(Self& self, F&& f) {
    f("lr", self.lr);
    f("beta1", self.beta1);
    f("beta2", self.beta2);
    f("eps", self.eps);
    f("weight_decay", self.weight_decay);
    f("clip_global_norm", self.clip_global_norm);
  }
  /// f(setting, value as exact text) for every hyper-parameter, as sgd::settings.
  template <class F>
  void settings(F&& f) const {
    opt_detail::write_settings(*this, f);
  }
  /// State tensors per variable: 2, the moment averages m and v.
  int slot_count() const { return 2; }
  /// "adam_m" for state 0, "adam_v" for state 1 (a checkpoint holds "<variable>/adam_m", ...).
  static std::string_view slot_name(int i) { return i == 0 ? "adam_m" : "adam_v"; }

  /// Applies the rule to n elements: one fused Backend pass, in place over `w`, `slots[0]`
  /// (m) and `slots[1]` (v), reading the gradient `g` multiplied by `scale` (the clipping
  /// factor); `step` is the 0-based global step (the bias corrections use `t = step + 1`).
  template <class Backend, class T>
  void apply(index_t n, T* w, const T* g, T* const* slots, std::int64_t step, double scale) const {
    const double l = lr(step), t = static_cast<double>(step + 1);
    const double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
    const opt_detail::adam_rule<T> rule{static_cast<T>(l / bc1),
                                        static_cast<T>(beta1),
                                        static_cast<T>(beta2),
                                        static_cast<T>(eps),
                                        static_cast<T>(1 / std::sqrt(bc2)),
                                        static_cast<T>(Decoupled ? 0 : weight_decay),
                                        static_cast<T>(Decoupled ? 1 - l * weight_decay : 1),
                                        static_cast<T>(scale)};
    Backend::for_each(n, rule, w, g, slots[0], slots[1]);
  }
};
/// Adam (Kingma and Ba), weight_decay an L2 term added to the gradient: PyTorch's Adam.
using adam = adam_optimizer<false>;
/// AdamW (Loshchilov and Hutter), weight decay decoupled from the gradient (default 0.01):
/// PyTorch's AdamW.
using adamw = adam_optimizer<true>;

}  // namespace gradus
