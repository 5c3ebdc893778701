#pragma once
// Learning-rate schedules: a pure function of the step counter (the session's
// global_step), so a restored checkpoint resumes the schedule where it stopped.
//   constant_lr(lr)                                   lr
//   step_lr(lr, step_size, gamma)                     lr * gamma^floor(step / step_size)
//   exponential_lr(lr, decay_rate, decay_steps, staircase)  lr * decay_rate^(step / decay_steps)
//   cosine_lr(lr, total_steps, warmup_steps, min_lr)  linear warm-up, lr * (step + 1) /
//       (warmup_steps + 1) for step < warmup_steps, then half a cosine from lr down to
//       min_lr at total_steps (and min_lr after it)
// An optimizer's `lr` field takes a schedule or a plain number (a constant schedule).
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

#include "gradus/core/error.hpp"
#include "gradus/core/text.hpp"

namespace gradus {

/// A learning rate as a pure function of the 0-based step counter (the session's
/// global_step): `schedule(step)` is the rate of the update that step applies, so a restored
/// checkpoint resumes the schedule where it stopped. Made by the factories below (or
/// constant_lr, step_lr, exponential_lr, cosine_lr), or implicitly from a number, which is a
/// constant schedule: an optimizer's `lr` field takes either. A small value type; its member
/// functions are const and safe to call from any thread.
class lr_schedule {
 public:
  /// Which formula: constant, step, exponential or cosine (the factories of those names).
  enum class kind { constant, step, exponential, cosine };

  /// The constant rate `lr` (default 0.01), also an implicit conversion from a number. Throws
  /// gradus::error unless lr is finite and >= 0; every factory checks its lr the same way.
  lr_schedule(double lr = 0.01) : lr_(lr) { check(); }  // NOLINT: a number is a constant schedule

  /// `lr` at every step.
  static lr_schedule constant(double lr) { return lr_schedule(lr); }
  /// `lr * gamma^floor(step / step_size)`: lr multiplied by gamma every step_size steps
  /// (PyTorch's StepLR). Throws gradus::error when step_size <= 0 or gamma is not a finite
  /// number >= 0 (a negative gamma would make every other stage's rate negative).
  static lr_schedule step(double lr, std::int64_t step_size, double gamma) {
    lr_schedule s(lr);
    s.kind_ = kind::step;
    s.steps_ = step_size;
    s.factor_ = gamma;
    if (step_size <= 0) throw error("gradus: step_lr: step_size must be positive, got " + std::to_string(step_size));
    if (!(gamma >= 0) || !std::isfinite(gamma))
      throw error("gradus: step_lr: gamma must be a finite number >= 0, got " + shortest_text(gamma));
    return s;
  }
  /// `lr * decay_rate^(step / decay_steps)`, the exponent floored when `staircase` (default
  /// false: a smooth decay), as TensorFlow's exponential_decay. Throws gradus::error when
  /// decay_steps <= 0 or decay_rate is not a finite number > 0.
  static lr_schedule exponential(double lr, double decay_rate, std::int64_t decay_steps, bool staircase = false) {
    lr_schedule s(lr);
    s.kind_ = kind::exponential;
    s.steps_ = decay_steps;
    s.factor_ = decay_rate;
    s.staircase_ = staircase;
    if (decay_steps <= 0)
      throw error("gradus: exponential_lr: decay_steps must be positive, got " + std::to_string(decay_steps));
    if (!(decay_rate > 0) || !std::isfinite(decay_rate))
      throw error("gradus: exponential_lr: decay_rate must be a finite number > 0, got " + shortest_text(decay_rate));
    return s;
  }
  /// Linear warm-up, then cosine decay: `lr * (step + 1) / (warmup_steps + 1)` for
  /// step < warmup_steps (warmup_steps defaults to 0: none); then
  /// `min_lr + (lr - min_lr) * (1 + cos(pi * (step - warmup_steps) / (total_steps - warmup_steps))) / 2`,
  /// from lr down to min_lr (default 0) at total_steps; min_lr from total_steps on. Throws
  /// gradus::error unless 0 <= warmup_steps < total_steps and min_lr is a finite number >= 0.
  static lr_schedule cosine(double lr, std::int64_t total_steps, std::int64_t warmup_steps = 0, double min_lr = 0) {
    lr_schedule s(lr);
    s.kind_ = kind::cosine;
    s.steps_ = total_steps;
    s.warmup_ = warmup_steps;
    s.min_lr_ = min_lr;
    if (warmup_steps < 0 || total_steps <= warmup_steps)
      throw error("gradus: cosine_lr: need 0 <= warmup_steps < total_steps, got warmup_steps=" +
                  std::to_string(warmup_steps) + " total_steps=" + std::to_string(total_steps));
    if (!(min_lr >= 0) || !std::isfinite(min_lr))
      throw error("gradus: cosine_lr: min_lr must be a finite number >= 0, got " + shortest_text(min_lr));
    return s;
  }

  /// The learning rate of the update that step `step` (0-based) applies.
  double operator()(std::int64_t step) const {
    switch (kind_) {
      case kind::constant: return lr_;
      case kind::step: return lr_ * std::pow(factor_, static_cast<double>(step / steps_));  // NOLINT(bugprone-integer-division): a staircase, floor(step / steps) is meant
      case kind::exponential: {
        const double p = staircase_ ? static_cast<double>(step / steps_)  // NOLINT(bugprone-integer-division): the staircase floors
                                    : static_cast<double>(step) / static_cast<double>(steps_);
        return lr_ * std::pow(factor_, p);
      }
      case kind::cosine: {
        if (step < warmup_) return lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_ + 1);
        if (step >= steps_) return min_lr_;
        const double t = static_cast<double>(step - warmup_) / static_cast<double>(steps_ - warmup_);
        return min_lr_ + 0.5 * (lr_ - min_lr_) * (1 + std::cos(std::numbers::pi * t));
      }
    }
    return lr_;
  }
  kind type() const { return kind_; }  ///< which formula
  double base() const { return lr_; }  ///< the `lr` it was made with (the peak rate of a cosine schedule)
  /// Every parameter, exactly: "0.05", "cosine(lr=0.01, total_steps=1920, warmup_steps=0,
  /// min_lr=0)". Data-parallel ranks compare it (parallel/agree.hpp), and
  /// optimizer_from_description reads it back.
  std::string describe() const {
    const auto n = [](double v) { return shortest_text(v); };
    switch (kind_) {
      case kind::constant: return n(lr_);
      case kind::step:
        return "step(lr=" + n(lr_) + ", step_size=" + std::to_string(steps_) + ", gamma=" + n(factor_) + ")";
      case kind::exponential:
        return "exponential(lr=" + n(lr_) + ", decay_rate=" + n(factor_) + ", decay_steps=" + std::to_string(steps_) +
               ", staircase=" + (staircase_ ? "true" : "false") + ")";
      case kind::cosine:
        return "cosine(lr=" + n(lr_) + ", total_steps=" + std::to_string(steps_) + ", warmup_steps=" +
               std::to_string(warmup_) + ", min_lr=" + n(min_lr_) + ")";
    }
    return n(lr_);
  }

 private:
  void check() const {
    if (!(lr_ >= 0) || !std::isfinite(lr_))
      throw error("gradus: learning rate must be a finite number >= 0, got " + std::to_string(lr_));
  }
  double lr_;
  kind kind_ = kind::constant;
  std::int64_t steps_ = 1, warmup_ = 0;
  double factor_ = 1, min_lr_ = 0;
  bool staircase_ = false;
};

/// lr_schedule::constant: `lr` at every step.
inline lr_schedule constant_lr(double lr) { return lr_schedule::constant(lr); }
/// lr_schedule::step: `lr * gamma^floor(step / step_size)`.
inline lr_schedule step_lr(double lr, std::int64_t step_size, double gamma) {
  return lr_schedule::step(lr, step_size, gamma);
}
/// lr_schedule::exponential: `lr * decay_rate^(step / decay_steps)`, floored exponent when `staircase`.
inline lr_schedule exponential_lr(double lr, double decay_rate, std::int64_t decay_steps, bool staircase = false) {
  return lr_schedule::exponential(lr, decay_rate, decay_steps, staircase);
}
/// lr_schedule::cosine: linear warm-up over warmup_steps, then half a cosine from lr to
/// min_lr at total_steps.
inline lr_schedule cosine_lr(double lr, std::int64_t total_steps, std::int64_t warmup_steps = 0, double min_lr = 0) {
  return lr_schedule::cosine(lr, total_steps, warmup_steps, min_lr);
}

}  // namespace gradus
