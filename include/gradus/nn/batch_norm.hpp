#pragma once
// batch_norm<"bn1", C>: batch normalisation over the channel axis 1 of [N, C] or [N, C, H, W]
// inputs, with the statistics of the batch in training and moving averages of them in
// evaluation (as tf.layers.batch_normalization / torch.nn.BatchNorm*d):
//
//   g::nn::batch_norm<"bn1", 6> bn1;
//   auto h_train = g::relu(bn1.train(conv1(x)));  // normalised by this batch's mean and variance
//   auto h_eval  = g::relu(bn1.eval(conv1(x)));   // by the moving averages
//   bn1.initialize(s);                             // gamma 1, beta 0, moving mean 0, moving var 1
//
// Variables: "bn1/gamma", "bn1/beta" (trained), "bn1/moving_mean", "bn1/moving_var" (never
// trained: no gradient reaches them; checkpoints keep them). Every run of an expression
// containing bn1.train(x) also updates the moving averages in the session, once per run:
// moving = decay * moving + (1 - decay) * batch statistic, the variance unbiased (n / (n - 1),
// n values per channel) as PyTorch's running_var. The update is a node of the graph whose
// value is a zero added to the output; it has no operands for autodiff (a stop-gradient),
// and it runs in the same pass as the training step, reading the statistics the
// normalisation computed anyway.
#include <cstdint>
#include <string>
#include <tuple>

#include "gradus/core/device.hpp"
#include "gradus/core/fixed_string.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/reduce.hpp"
#include "gradus/graph/ops/shape_ops.hpp"
#include "gradus/nn/init.hpp"

namespace gradus {

namespace detail {
template <class T>
struct ema_rule {
  T decay, gain;  ///< moving = decay * moving + gain * stat
  template <class V>
  GRADUS_HD void operator()(V& moving, const V& stat) const {
    moving = V(decay) * moving + V(gain) * stat;
  }
};
}  // namespace detail

/// moving <- decay * moving + (1 - decay) * stat (* n / (n - 1) if unbiased), where n is the
/// number of values per channel of `like`; the value is a scalar 0.
template <class Stat, class Moving, class Like>
struct moving_average_node : expr_base {
  using value_type = value_t<Moving>;
  using shape_type = shape<>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "moving_average";
  Stat stat;
  Moving moving;
  Like like;
  double decay;
  bool unbiased;
  auto operands() const { return std::tie(stat, moving, like); }
  auto children() const { return std::tuple<>{}; }  // an update: nothing to differentiate
  dims infer(const dims& s, const dims& m, const dims& x) const {
    if (s.numel() != m.numel() || m.numel() == 0 || x.numel() % m.numel() != 0)
      throw shape_error("gradus: batch_norm: statistics of shape " + to_string(s) + " do not fit moving averages of shape " +
                        to_string(m) + " for an input of shape " + to_string(x));
    return dims{};
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> s, tensor_view<const value_type> m,
               tensor_view<const value_type> x) const {
    using T = value_type;
    const index_t per = x.size() / m.size();
    const double corr = unbiased && per > 1 ? double(per) / double(per - 1) : 1.0;
    // the moving averages are session variables: the graph reads them through their storage
    Backend::for_each(m.size(), detail::ema_rule<T>{T(decay), T((1 - decay) * corr)}, const_cast<T*>(m.data()), s.data());
    const T zero = 0;
    Backend::copy_to_device(out, &zero, sizeof(T));
  }
  bool operator==(const moving_average_node&) const = default;
};

namespace nn {

/// Batch normalisation over the channel axis 1 of `[N, C]` or `[N, C, H, W]` inputs of dtype
/// `T`: `y = (x - mean) / sqrt(var + eps) * gamma + beta` per channel, where mean and var are
/// the batch's (over every axis but 1, var biased) in train() and the moving averages in
/// eval(), as tf.layers.batch_normalization and torch.nn.BatchNorm2d. Variables:
/// `Name + "/gamma"`, `Name + "/beta"` (trained), `Name + "/moving_mean"` and
/// `Name + "/moving_var"` (no gradient reaches them; checkpoints keep them), each `[C]`. An
/// input of another rank, channel count or dtype is a compile error.
template <fixed_string Name, index_t C, class T = float>
struct batch_norm {
  static_assert(C > 0, "gradus: nn::batch_norm: the channel count must be positive");
  variable<Name + "/gamma", T, C> gamma;              ///< per-channel scale, `[C]` (first value 1)
  variable<Name + "/beta", T, C> beta;                ///< per-channel shift, `[C]` (first value 0)
  variable<Name + "/moving_mean", T, C> moving_mean;  ///< moving average of the batch means, `[C]` (first value 0)
  variable<Name + "/moving_var", T, C> moving_var;    ///< moving average of the unbiased batch variances, `[C]` (first value 1)
  double decay = 0.9;  ///< TensorFlow's momentum; PyTorch's momentum 0.1 is 1 - decay
  double eps = 1e-5;   ///< added to the variance before the square root

  /// Normalised by the batch's statistics (x `[N, C]` or `[N, C, H, W]` -> the same shape).
  /// Each run of an expression containing it also updates the moving averages in the session,
  /// once per run: `moving = decay * moving + (1 - decay) * stat`, the variance made unbiased
  /// by `n / (n - 1)` for n values per channel (as PyTorch's running_var).
  template <expression X>
  auto train(const X& x) const {
    check<X>();
    const auto mu = batch_mean(x);
    const auto var = batch_mean(square(x - mu));
    const auto upd = moving_average_node<decltype(mu), decltype(moving_mean), X>{{}, mu, moving_mean, x, decay, false} +
                     moving_average_node<decltype(var), decltype(moving_var), X>{{}, var, moving_var, x, decay, true};
    return (x - mu) * rsqrt(var + T(eps)) * per_channel<X>(gamma) + per_channel<X>(beta) + upd;
  }
  /// Normalised by the moving averages (evaluation, inference); x keeps its shape.
  template <expression X>
  auto eval(const X& x) const {
    check<X>();
    return (x - per_channel<X>(moving_mean)) * rsqrt(per_channel<X>(moving_var) + T(eps)) * per_channel<X>(gamma) +
           per_channel<X>(beta);
  }

  /// Sets gamma to 1, beta to 0, moving_mean to 0 and moving_var to 1 in `s` (`seed` is
  /// unused by these constant initializers).
  template <class Backend>
  void initialize(session<Backend>& s, std::uint64_t seed = 0) const {
    gradus::initialize(s, gamma, init::constant{1}, seed);
    gradus::initialize(s, beta, init::zeros{}, seed);
    gradus::initialize(s, moving_mean, init::zeros{}, seed);
    gradus::initialize(s, moving_var, init::constant{1}, seed);
  }

 private:
  template <class X>
  static constexpr void check() {
    static_assert(rank_v<X> == 2 || rank_v<X> == 4, "gradus: nn::batch_norm: expects [N, C] or [N, C, H, W]");
    static_assert(shape_t<X>::extents[1] == C || shape_t<X>::extents[1] == dyn,
                  "gradus: nn::batch_norm: the input's axis 1 is not the layer's channel count");
    static_assert(std::is_same_v<value_t<X>, T>, "gradus: nn::batch_norm: the input's dtype is not the layer's");
  }
  /// The mean over every axis but 1, kept as [1, C] or [1, C, 1, 1].
  template <class X>
  static auto batch_mean(const X& x) {
    if constexpr (rank_v<X> == 2) return mean<0, true>(x);
    else return mean<0, true>(mean<2, true>(mean<3, true>(x)));
  }
  template <class X, class V>
  static auto per_channel(const V& v) {
    if constexpr (rank_v<X> == 2) return v;
    else return reshape<1, C, 1, 1>(v);
  }
};

}  // namespace nn
}  // namespace gradus
