#pragma once
// softmax / log_softmax over the last axis (max-subtracted: no overflow), and
// softmax_cross_entropy(logits [N, C], labels int32 [N]) -> per-example loss [N].
#include <cstdint>
#include <string>
#include <tuple>

#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"

namespace gradus {

template <bool Log, class A>
struct softmax_node : expr_base {
  static_assert(real_dtype<value_t<A>>, "gradus: softmax needs a float or double operand");
  static_assert(rank_v<A> >= 1, "gradus: softmax needs rank >= 1 (it normalises the last axis)");
  using value_type = value_t<A>;
  using shape_type = shape_t<A>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = Log ? "log_softmax" : "softmax";
  A a;
  auto operands() const { return std::tie(a); }
  auto children() const { return std::tie(a); }
  dims infer(const dims& in) const { return in; }
  template <class Backend>
  void compute(value_type* out, const dims& od, tensor_view<const value_type> in) const {
    const index_t cols = od.d[od.rank - 1];
    const index_t rows = cols ? od.numel() / cols : 0;
    Backend::softmax(in.data(), rows, cols, out, Log);
  }
  bool operator==(const softmax_node&) const = default;
};

/// softmax(a): e^a normalised to sum 1 along the last axis (the maximum subtracted first:
/// no overflow); a's shape, float or double, rank >= 1. Gradient: y (g - sum(g y)), y =
/// softmax(a), the sum along the last axis.
template <expression A>
auto softmax(const A& a) {
  return softmax_node<false, A>{{}, a};
}
/// log_softmax(a): a - log(sum(e^a)) along the last axis, computed as stably as softmax; a's
/// shape, float or double, rank >= 1. Gradient: g - softmax(a) sum(g), the sum along the
/// last axis.
template <expression A>
auto log_softmax(const A& a) {
  return softmax_node<true, A>{{}, a};
}

namespace op {
struct softmax_cross_entropy {
  static constexpr const char* name = "softmax_cross_entropy";
  template <class SL, class SY>
  static constexpr bool fits = SL::rank == 2 && SY::rank == 1 &&
                               (SL::extents[0] == dyn || SY::extents[0] == dyn || SL::extents[0] == SY::extents[0]);
};
}  // namespace op

template <class L, class Y>
struct softmax_xent_node : expr_base {
  static_assert(real_dtype<value_t<L>>, "gradus: softmax_cross_entropy: logits must be float or double");
  static_assert(std::is_same_v<value_t<Y>, std::int32_t>, "gradus: softmax_cross_entropy: labels must be int32");
  static_assert(check_shapes<op::softmax_cross_entropy, shape_t<L>, shape_t<Y>>::value);
  using value_type = value_t<L>;
  using shape_type = shape<(shape_t<L>::extents[0] != dyn ? shape_t<L>::extents[0] : shape_t<Y>::extents[0])>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "softmax_cross_entropy";
  L logits;
  Y labels;
  auto operands() const { return std::tie(logits, labels); }
  auto children() const { return std::tie(logits, labels); }
  dims infer(const dims& l, const dims& y) const {
    if (l.d[0] != y.d[0])
      throw shape_error("gradus: softmax_cross_entropy: logits " + to_string(l) + " and labels " + to_string(y) +
                        " disagree on the batch size");
    return dims{l.d[0]};
  }
  template <class Backend>
  void compute(value_type* out, const dims&, tensor_view<const value_type> l,
               tensor_view<const std::int32_t> y) const {
    Backend::softmax_xent(l.data(), y.data(), l.shape().d[0], l.shape().d[1], out);
  }
  bool operator==(const softmax_xent_node&) const = default;
};

/// Per-example loss -log softmax(logits)[label]; mean() it for the usual scalar loss.
/// logits [N, C] float or double, labels int32 [N] -> [N]; the Ns must agree (a compile
/// error where static, else a shape_error), a label outside [0, C) is an index_error. Gradient:
/// (softmax(logits) - one_hot(labels)) g, row by row, to the logits (C must be static);
/// none to the labels.
template <expression L, expression Y>
auto softmax_cross_entropy(const L& logits, const Y& labels) {
  return softmax_xent_node<L, Y>{{}, logits, labels};
}

}  // namespace gradus
