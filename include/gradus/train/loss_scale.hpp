#pragma once
// Dynamic loss scaling, for a session whose precision policy computes in fp16
// (core/precision.hpp's mixed_fp16): the training step multiplies the loss by scale() before
// the backward pass, so gradients too small for fp16 (below 2^-24) survive its GEMMs, and
// divides the gradients by it before the update. PyTorch GradScaler's schedule:
//   - initial scale 2^16;
//   - a step whose gradients hold Inf or NaN is skipped (no update of any variable or of the
//     optimizer state), and the scale is multiplied by backoff (0.5);
//   - after growth_interval (2000) steps in a row with finite gradients, it is multiplied by
//     growth (2).
// And what users ask PyTorch for and it lacks: a floor (min_scale) under which the run stops
// with an error naming the step and the first non-finite gradient's variable, rather than
// skipping every step for ever; and the count of skipped steps (the examples' JSON line).
//
// The scale and the count of clean steps are session state ("loss_scaler/scale",
// "loss_scaler/good_steps"), so a checkpoint holds them and a restored run goes on with its
// own schedule.
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "gradus/core/error.hpp"
#include "gradus/exec/session.hpp"

namespace gradus {

/// The schedule's parameters (GradScaler's names and defaults, and the floor).
struct loss_scale_options {
  double initial = 65536.0;     ///< init_scale: 2^16
  double growth = 2.0;          ///< growth_factor, > 1
  double backoff = 0.5;         ///< backoff_factor, in (0, 1)
  std::int64_t growth_interval = 2000;  ///< clean steps in a row before the scale grows, >= 1
  double min_scale = 1.0;       ///< the floor: a scale backed off below it stops the run
  /// Throws gradus::error naming the first parameter out of its range.
  void validate() const {
    const auto bad = [](const std::string& what) {
      throw error("gradus: loss_scale_options: " + what);
    };
    if (!(initial > 0) || !std::isfinite(initial)) bad("initial must be a finite number > 0, got " + std::to_string(initial));
    if (!(growth > 1) || !std::isfinite(growth)) bad("growth must be a finite number > 1, got " + std::to_string(growth));
    if (!(backoff > 0 && backoff < 1)) bad("backoff must be in (0, 1), got " + std::to_string(backoff));
    if (growth_interval < 1) bad("growth_interval must be >= 1, got " + std::to_string(growth_interval));
    if (!(min_scale > 0) || min_scale > initial)
      bad("min_scale must be > 0 and at most initial (" + std::to_string(initial) + "), got " + std::to_string(min_scale));
  }
};

/// The schedule itself, on the host: what the training step consults each step.
class loss_scaler {
 public:
  /// At o.initial; throws gradus::error for invalid options (loss_scale_options::validate).
  explicit loss_scaler(const loss_scale_options& o = {}) : o_(o), scale_(o.initial) { o_.validate(); }

  /// The scale the next backward pass multiplies the loss by.
  double scale() const { return scale_; }
  /// Steps in a row with finite gradients since the scale last changed.
  std::int64_t good_steps() const { return good_; }
  /// Steps skipped for non-finite gradients since this scaler was made or restored.
  std::int64_t skipped_steps() const { return skipped_; }
  const loss_scale_options& options() const { return o_; }  ///< as given

  /// After the gradients of global step `step` are computed: `first_nonfinite` is empty when
  /// every gradient is finite, else the name of the first variable whose gradient is not.
  /// Returns whether the update may be applied. Throws numerics_error when a back-off takes
  /// the scale below min_scale.
  bool update(std::int64_t step, std::string_view first_nonfinite) {
    if (first_nonfinite.empty()) {
      if (++good_ >= o_.growth_interval) {
        scale_ *= o_.growth;
        good_ = 0;
      }
      return true;
    }
    ++skipped_;
    good_ = 0;
    const double next = scale_ * o_.backoff;
    if (next < o_.min_scale)
      throw numerics_error("gradus: loss scaling: the gradient of '" + std::string(first_nonfinite) +
                               "' holds Inf or NaN at global step " + std::to_string(step) + " with the loss scale at " +
                               std::to_string(scale_) + "; backing off would take it below its floor " +
                               std::to_string(o_.min_scale) + " (" + std::to_string(skipped_) +
                               " steps skipped so far): the model diverges in fp16 whatever the scale; lower the "
                               "learning rate, clip gradients, or train in bf16 (g::mixed_bf16)",
                           {});
    scale_ = next;
    return false;
  }

  /// The state a checkpoint restored (scale, clean steps in a row).
  void restore(double scale, std::int64_t good_steps) {
    if (!(scale > 0) || !std::isfinite(scale))
      throw error("gradus: loss scaling: a restored loss scale must be a finite number > 0, got " + std::to_string(scale));
    scale_ = scale;
    good_ = good_steps < 0 ? 0 : good_steps;
  }

 private:
  loss_scale_options o_;
  double scale_;
  std::int64_t good_ = 0, skipped_ = 0;
};

/// The variable a scaled loss is multiplied by: the session's "loss_scaler/scale".
using loss_scale_variable = variable<"loss_scaler/scale", float>;

/// A training step's loss scaling on Backend: the scaler, and its state in the session (the
/// source of truth, so a restored checkpoint's scale is taken up by the next step).
template <class Backend>
class step_loss_scaling {
 public:
  /// Creates (or finds, restored) the scaler's state tensors in s.
  explicit step_loss_scaling(session<Backend>& s, const loss_scale_options& o = {}) : scaler_(o) {
    scale_ = s.template state<float>(loss_scale_variable::name.view(), dims{});
    good_ = s.template state<float>("loss_scaler/good_steps", dims{});
  }
  /// Before a backward pass: the session's state read (0: never set, so the initial scale is
  /// written), and the scale this pass uses remembered for the unscale.
  void before_backward() {
    float stored[2] = {0, 0};
    Backend::copy_to_host(&stored[0], scale_, sizeof(float));
    Backend::copy_to_host(&stored[1], good_, sizeof(float));
    if (stored[0] == 0) write();
    else scaler_.restore(stored[0], static_cast<std::int64_t>(stored[1]));
    used_ = scaler_.scale();
  }
  /// After the gradients of global step `step` (their names and buffers: dense float, or
  /// sparse rows) are final: whether the update may be applied (loss_scaler::update).
  template <class Buffers>
  bool after_backward(std::int64_t step, const Buffers& buffers) {
    return record(step, first_nonfinite(buffers));
  }
  /// The name of the first buffer (name, float data on Backend, size) holding Inf or NaN;
  /// empty when every one is finite.
  template <class Buffers>
  static std::string_view first_nonfinite(const Buffers& buffers) {
    for (const auto& b : buffers)
      if (b.size > 0 && Backend::first_nonfinite(static_cast<const float*>(b.data), b.size) >= 0) return b.name;
    return {};
  }
  /// The verdict on global step `step`'s gradients, found by the caller (empty: all finite;
  /// else the first non-finite gradient's variable, as a pipeline agrees on it across its
  /// stages): the schedule advanced and stored; whether the update may be applied
  /// (loss_scaler::update, whose floor error names `first_nonfinite`).
  bool record(std::int64_t step, std::string_view first_nonfinite) {
    const bool apply = scaler_.update(step, first_nonfinite);
    write();
    return apply;
  }
  /// The factor that undoes the last backward pass's scale.
  double unscale() const { return 1.0 / used_; }
  const loss_scaler& scaler() const { return scaler_; }  ///< the schedule

 private:
  void write() {
    const float v[2] = {static_cast<float>(scaler_.scale()), static_cast<float>(scaler_.good_steps())};
    Backend::copy_to_device(scale_, &v[0], sizeof(float));
    Backend::copy_to_device(good_, &v[1], sizeof(float));
  }
  loss_scaler scaler_;
  float* scale_ = nullptr;
  float* good_ = nullptr;
  double used_ = 1;
};

}  // namespace gradus
