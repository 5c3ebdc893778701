#pragma once
// Losses (expressions, so grad() differentiates them) and metrics (host functions over
// run results).
//
//   softmax_cross_entropy_loss(logits [N, C], labels int32 [N])  mean over the batch
//   mse(pred, target)                                            mean of squared errors
//   binary_cross_entropy_with_logits(z, y)                       mean of
//       softplus(z) - y*z  (= -y log sigmoid(z) - (1-y) log(1 - sigmoid(z))), stable for
//       any z; y in [0, 1] of z's dtype
//   accuracy(logits_view, labels_view) / confusion_matrix(...)   on host results
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/ops/argmax_at.hpp"
#include "gradus/graph/ops/elementwise.hpp"
#include "gradus/graph/ops/reduce.hpp"
#include "gradus/graph/ops/softmax.hpp"

namespace gradus::nn {

/// Softmax cross-entropy, the mean over the batch of `-log softmax(logits[n])[labels[n]]`: a
/// scalar expression of the logits' dtype. logits `[N, C]` float or double, labels int32 `[N]`
/// (class indices in `[0, C)`, an index_error when run otherwise; a batch-size mismatch is a
/// shape_error). Its gradient with respect to the logits is `(softmax(logits) - one_hot(labels)) / N`,
/// which needs C static (a compile error otherwise); the labels get none.
template <expression L, expression Y>
auto softmax_cross_entropy_loss(const L& logits, const Y& labels) {
  return mean(softmax_cross_entropy(logits, labels));
}

/// Mean squared error, `mean((pred - target)^2)` over every element: a scalar expression.
/// pred and target have the same dtype and broadcast-compatible shapes.
template <expression P, expression Q>
auto mse(const P& pred, const Q& target) {
  return mean(square(pred - target));
}

/// Binary cross-entropy on logits, `mean(softplus(z) - y * z)` over every element, which is
/// `-y log sigmoid(z) - (1 - y) log(1 - sigmoid(z))` computed without overflow for any z: a
/// scalar expression. z are logits, y targets in [0, 1] of z's dtype and shape.
template <expression Z, expression Y>
auto binary_cross_entropy_with_logits(const Z& z, const Y& y) {
  return mean(softplus(z) - y * z);
}

/// The predicted class of each row of [N, C] scores (first maximum on ties; a NaN never
/// wins over a number, as g::argmax: graph/ops/argmax_at.hpp). Scores and
/// labels below are any tensor_like: a run's result, an xt::xtensor, a tensor_view. Scores of
/// another rank are a shape_error.
template <tensor_like S>
std::vector<std::int32_t> predictions(const S& scores_in) {
  const auto scores = as_view(scores_in, "scores of predictions");
  if (scores.shape().rank != 2)
    throw shape_error("gradus: predictions: scores must be [N, C], got " + to_string(scores.shape()));
  const index_t n = scores.shape().d[0], c = scores.shape().d[1];
  std::vector<std::int32_t> r(static_cast<std::size_t>(n));
  if (c == 0) throw shape_error("gradus: predictions: scores of " + to_string(scores.shape()) + " have no classes");
  for (index_t i = 0; i < n; ++i) r[static_cast<std::size_t>(i)] = argmax_at(scores.data(), c, 1, i);
  return r;
}

namespace detail {
template <tensor_like L>
auto checked_labels(const char* what, index_t n, const L& labels_in, index_t classes) {
  static_assert(std::is_integral_v<tensor_elem_t<L>>, "gradus: class labels must be integers (e.g. xt::xtensor<std::int32_t, 1>)");
  const auto labels = as_view(labels_in, std::string("labels of ") + what);
  if (labels.shape().rank != 1 || labels.shape().d[0] != n)
    throw shape_error(std::string("gradus: ") + what + ": " + std::to_string(n) + " predictions but labels of shape " +
                      to_string(labels.shape()));
  for (index_t i = 0; i < n; ++i)
    if (std::cmp_less(labels[i], 0) || std::cmp_greater_equal(labels[i], classes))
      throw index_error(std::string("gradus: ") + what + ": label " + std::to_string(labels[i]) + " at position " +
                        std::to_string(i) + " is outside [0, " + std::to_string(classes) + ")");
  return labels;
}
}  // namespace detail

/// Fraction of rows of scores `[N, C]` whose highest score is the label, labels integer `[N]`
/// (0 for an empty batch). Labels of another shape are a shape_error, a label outside
/// `[0, C)` an index_error.
template <tensor_like S, tensor_like L>
double accuracy(const S& scores, const L& labels_in) {
  const auto p = predictions(scores);
  const index_t n = static_cast<index_t>(p.size());
  const auto labels = detail::checked_labels("accuracy", n, labels_in, as_view(scores, "scores of accuracy").shape().d[1]);
  if (n == 0) return 0;
  index_t hits = 0;
  for (index_t i = 0; i < n; ++i) hits += std::cmp_equal(p[static_cast<std::size_t>(i)], labels[i]);
  return static_cast<double>(hits) / static_cast<double>(n);
}

/// counts[true_label * C + predicted], C x C, row-major; accumulates into `counts` (an empty
/// vector is sized and zeroed first; one of another size is a shape_error). Labels as for
/// accuracy.
template <tensor_like S, tensor_like L>
void confusion_matrix(const S& scores, const L& labels_in, std::vector<std::int64_t>& counts) {
  const auto p = predictions(scores);
  const index_t n = static_cast<index_t>(p.size()), c = as_view(scores, "scores of confusion_matrix").shape().d[1];
  const auto labels = detail::checked_labels("confusion_matrix", n, labels_in, c);
  if (counts.empty()) counts.assign(static_cast<std::size_t>(c * c), 0);
  if (static_cast<index_t>(counts.size()) != c * c)
    throw shape_error("gradus: confusion_matrix: counts hold " + std::to_string(counts.size()) + " cells, not " +
                      std::to_string(c) + " x " + std::to_string(c));
  for (index_t i = 0; i < n; ++i)
    ++counts[static_cast<std::size_t>(static_cast<index_t>(labels[i]) * c + p[static_cast<std::size_t>(i)])];
}

}  // namespace gradus::nn
