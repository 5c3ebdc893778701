#pragma once
// Premade models, as tf.estimator's: a model family as a type, with train / evaluate /
// predict, checkpoints in a model directory, and the same backend and communicator
// policies a hand-written graph uses.
//
//   g::dnn_classifier<784, g::hidden<256, 128>, 10> m({.seed = 1, .model_dir = "run"}, g::sgd{.lr = 0.05, .momentum = 0.9});
//   m.train(train_set, 3);                        // a data::dataset (or x, y arrays); 3 epochs
//   const auto r = m.evaluate(test_x, test_y);    // r.accuracy, r.loss
//   const auto classes = m.predict(x);            // argmax per row; predict_proba for softmax
//
//   g::linear_regressor<13> lr;                   g::dnn_regressor<8, g::hidden<64>, 1> dr;
//   g::linear_classifier<784, 10> lc;
//
// Template parameters after the shapes: the backend (default cpu_simd: include
// <gradus/backends/cpu_simd.hpp>), the communicator (default parallel::local; a ring or a
// parameter server trains the same model on many processes: rank 0's initial variables are
// broadcast, each rank trains on its shard of every epoch) and the optimizer type (default
// adam, lr 1e-3). Every step is the data-parallel step (parallel/data_parallel.hpp), as
// parallel::minimize makes it: the gradients averaged in buckets during the backward pass
// (run_config::data_parallel), the ranks' run fingerprint compared before the first
// broadcast (with the batch size and the seed), or, over a parameter server, pushed to the
// servers and the variables pulled back (and the servers' state pulled before each
// checkpoint).
//
// Variables are named as TensorFlow's premade models name theirs: "dnn/hiddenlayer_0/w",
// ..., "dnn/logits/w", "linear/linear_model/w". With a model_dir, model_dir/model.npz is
// restored (variables, optimizer state, global step) when the estimator is made and written
// (atomically) after every train(); epoch e of a run shuffles with (seed, e), e counted from
// the restored global step, so training resumed from a checkpoint sees the batches an
// uninterrupted one would have.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/data/dataset.hpp"
#include "gradus/parallel/data_parallel.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/graph/ops/softmax.hpp"
#include "gradus/io/checkpoint.hpp"
#include "gradus/nn/dense.hpp"
#include "gradus/nn/losses.hpp"
#include "gradus/train/optimizer.hpp"
#include "gradus/train/train_step.hpp"

namespace gradus {

struct cpu_simd;  ///< the default backend (complete in <gradus/backends/cpu_simd.hpp>)

/// The widths of a DNN's hidden layers, as a type: hidden<256, 128>.
template <index_t... Units>
struct hidden {};

namespace estimator {

/// How an estimator trains and where it keeps its checkpoint (tf.estimator.RunConfig).
struct run_config {
  std::uint64_t seed = 1;           ///< initial variables and the shuffling of each epoch
  index_t batch_size = 64;          ///< per rank
  std::filesystem::path model_dir = {};  ///< empty: no checkpoints
  parallel::data_parallel_options data_parallel = {};  ///< buckets, overlap, replica checks
};

/// What train() did.
struct train_result {
  std::int64_t global_step = 0;  ///< after training
  double mean_loss = 0;          ///< over the last epoch's batches (this rank's)
  index_t examples = 0;          ///< trained on by this rank, all epochs
  double seconds = 0;            ///< wall-clock time of the epochs (the checkpoint's write not included)
};

/// evaluate()'s metrics over the examples given; those that do not apply to the model stay 0.
struct eval_result {
  double loss = 0;      ///< the training loss over the examples (mean)
  double accuracy = 0;  ///< classifiers: fraction of argmax == label
  double mse = 0;       ///< regressors: mean squared error (= loss)
  double mae = 0;       ///< regressors: mean absolute error, over every output
  index_t examples = 0;  ///< examples evaluated
  std::int64_t global_step = 0;  ///< the model's global step when evaluated
};

namespace detail {

template <std::size_t I>
constexpr fixed_string digit() {
  static_assert(I < 10, "gradus: dnn estimators take at most 10 hidden layers");
  fixed_string r;
  r.chars[0] = static_cast<char>('0' + I);
  r.length = 1;
  return r;
}
template <std::size_t I, std::size_t Hidden>
constexpr auto dnn_layer_name() {
  if constexpr (I < Hidden) return fixed_string("dnn/hiddenlayer_") + digit<I>();
  else return fixed_string("dnn/logits");
}

/// Bodies: features [N, In] -> outputs [N, Out].
template <index_t In, class Hidden, index_t Out, class T>
struct dnn_body;
template <index_t In, index_t... H, index_t Out, class T>
struct dnn_body<In, hidden<H...>, Out, T> {
  static_assert(sizeof...(H) > 0, "gradus: dnn estimators need at least one hidden layer (use a linear one)");
  static_assert(((H > 0) && ...) && In > 0 && Out > 0, "gradus: layer widths must be positive");
  static constexpr std::size_t depth = sizeof...(H);
  static constexpr std::array<index_t, depth + 2> widths{In, H..., Out};
  template <std::size_t I>
  using layer = nn::dense<dnn_layer_name<I, depth>(), widths[I], widths[I + 1], T>;

  template <std::size_t I, class X>
  static auto apply(const X& x) {
    if constexpr (I == depth) return layer<I>{}(x);
    else return apply<I + 1>(relu(layer<I>{}(x)));
  }
  template <class X>
  auto operator()(const X& x) const {
    return apply<0>(x);
  }
  template <class Backend>
  void initialize(session<Backend>& s, std::uint64_t seed) const {
    [&]<std::size_t... I>(std::index_sequence<I...>) { (layer<I>{}.initialize(s, seed), ...); }(
        std::make_index_sequence<depth>{});
    layer<depth>{}.initialize(s, seed, init::glorot_uniform{});
  }
};

template <index_t In, index_t Out, class T>
struct linear_body {
  static_assert(In > 0 && Out > 0, "gradus: linear estimators: widths must be positive");
  using layer = nn::dense<"linear/linear_model", In, Out, T>;
  template <class X>
  auto operator()(const X& x) const {
    return layer{}(x);
  }
  template <class Backend>
  void initialize(session<Backend>& s, std::uint64_t seed) const {
    layer{}.initialize(s, seed, init::zeros{});  // a convex model: zeros, as TensorFlow's
  }
};

/// Heads: the labels, the loss, the metrics.
template <index_t Classes>
struct classification_head {
  static_assert(Classes >= 2, "gradus: a classifier needs at least 2 classes");
  static constexpr bool classifier = true;
  static constexpr index_t outputs = Classes;
  using label_type = std::int32_t;
  using labels = placeholder<"labels", std::int32_t, dyn>;
  template <class L, class Y>
  static auto loss(const L& logits, const Y& y) {
    return nn::softmax_cross_entropy_loss(logits, y);
  }
};
template <index_t Out, class T>
struct regression_head {
  static constexpr bool classifier = false;
  static constexpr index_t outputs = Out;
  using label_type = T;
  using labels = placeholder<"labels", T, dyn, Out>;
  template <class P, class Y>
  static auto loss(const P& pred, const Y& y) {
    return nn::mse(pred, y);
  }
};

}  // namespace detail

/// A premade model: the class behind dnn_classifier, dnn_regressor, linear_classifier and
/// linear_regressor (name it through those). It owns its session, the training step on
/// Comm and optimizer Opt, and a checkpoint in run_config::model_dir. With a communicator
/// of several ranks, construction and train() are collective: every rank makes the model
/// and trains it with the same config. Not thread-safe (its session).
template <class Body, class Head, index_t In, class Backend, class Comm, class Opt>
class model {
  static_assert(parallel::communicator<Comm>, "gradus: estimator: Comm is not a communicator policy");
  using features = placeholder<"features", float, dyn, In>;
  using labels = typename Head::labels;
  using label_type = typename Head::label_type;
  static constexpr index_t outputs = Head::outputs;
  using logits_t = decltype(std::declval<const Body&>()(std::declval<const features&>()));
  using loss_t = decltype(Head::loss(std::declval<const logits_t&>(), std::declval<const labels&>()));
  using probs_t = decltype(softmax(std::declval<const logits_t&>()));
  using step_t = decltype(parallel::minimize(std::declval<Comm&>(), std::declval<const parallel::data_parallel_options&>(),
                                             std::declval<session<Backend>&>(), std::declval<const loss_t&>(),
                                             std::declval<const Opt&>()));

 public:
  static constexpr index_t inputs = In;  ///< features per example

  /// Initialises the variables from cfg.seed, restores model_dir/model.npz where it exists
  /// (variables, optimizer state, global step), then broadcasts rank 0's variables. Throws
  /// gradus::error when cfg.batch_size < 1, and what restore_checkpoint throws.
  explicit model(run_config cfg = {}, const Opt& opt = {}, Comm comm = {})
      : cfg_(std::move(cfg)),
        comm_(std::move(comm)),
        logits_(body_(x_)),
        loss_(Head::loss(logits_, y_)),
        probs_(softmax(logits_)),
        step_(parallel::minimize(comm_, cfg_.data_parallel, s_, loss_, opt)) {
    if (cfg_.batch_size < 1)
      throw error("gradus: estimator: batch_size must be >= 1, got " + std::to_string(cfg_.batch_size));
    body_.initialize(s_, cfg_.seed);
    if (!cfg_.model_dir.empty() && std::filesystem::exists(checkpoint_file())) restore(checkpoint_file());
    // every rank shuffles with the seed and shards the same batches: they must agree on both
    step_.set_run_fingerprint({{"estimator.batch_size", std::to_string(cfg_.batch_size)},
                               {"estimator.seed", std::to_string(cfg_.seed)}});
    step_.broadcast_variables();  // evaluate() and predict() before training see rank 0's
  }

  // ---- training --------------------------------------------------------------------

  /// Trains for epochs passes over x, each shuffled with (seed, epoch) and sharded across
  /// the ranks, in batches of run_config::batch_size; writes the checkpoint after (rank 0,
  /// with a model_dir). Throws shape_error for mismatched shapes and gradus::error for a
  /// class label out of range or epochs < 0.
  /// x [n, In], y [n] int32 classes (classifiers) or [n, Out] / [n] (Out == 1) targets.
  train_result train(tensor_view<const float> x, tensor_view<const label_type> y, int epochs = 1) {
    const index_t n = check_inputs("train", x, y);
    const index_t ly = label_width();
    std::vector<float> xb(static_cast<std::size_t>(cfg_.batch_size * In));
    std::vector<label_type> yb(static_cast<std::size_t>(cfg_.batch_size * ly));
    const index_t world = comm_.world_size(), mine = n > comm_.rank() ? (n - comm_.rank() + world - 1) / world : 0;
    return run_epochs(epochs, (mine + cfg_.batch_size - 1) / cfg_.batch_size, [&](std::uint64_t epoch, auto&& on_batch) {
      const std::vector<index_t> order = epoch_order(n, epoch);
      for (std::size_t b0 = 0; b0 < order.size(); b0 += static_cast<std::size_t>(cfg_.batch_size)) {
        const index_t m = static_cast<index_t>(std::min(order.size() - b0, static_cast<std::size_t>(cfg_.batch_size)));
        for (index_t r = 0; r < m; ++r) {
          const index_t src = order[b0 + static_cast<std::size_t>(r)];
          std::copy_n(x.data() + src * In, In, xb.data() + r * In);
          std::copy_n(y.data() + src * ly, ly, yb.data() + r * ly);
        }
        on_batch(tensor_view<const float>{xb.data(), dims{std::array<index_t, 2>{m, In}}},
                 tensor_view<const label_type>{yb.data(), label_dims(m)});
      }
    });
  }
  /// Classifiers: a data::dataset of [In]-shaped examples with int32 labels.
  train_result train(const data::dataset& ds, int epochs = 1)
    requires Head::classifier
  {
    check_examples("train", ds);
    const index_t steps = ds.shard(comm_.rank(), comm_.world_size()).batch(cfg_.batch_size).count();
    return run_epochs(epochs, steps, [&](std::uint64_t epoch, auto&& on_batch) {
      for (auto [xb, yb] : ds.shuffle(cfg_.seed, epoch).shard(comm_.rank(), comm_.world_size()).batch(cfg_.batch_size)) {
        const index_t m = xb.shape().d[0];
        on_batch(tensor_view<const float>{xb.data(), dims{std::array<index_t, 2>{m, In}}}, yb);
      }
    });
  }

  // ---- evaluation and prediction ----------------------------------------------------

  /// The loss and metrics over every example of x, y (shapes as train's; not sharded: each
  /// rank evaluates all of them), in batches of 1024. Throws shape_error or gradus::error
  /// for x and y as train does.
  eval_result evaluate(tensor_view<const float> x, tensor_view<const label_type> y) {
    const index_t n = check_inputs("evaluate", x, y);
    eval_result r;
    double loss_sum = 0, hits = 0, abs_sum = 0;
    for (index_t b0 = 0; b0 < n; b0 += eval_batch) {
      const index_t m = std::min(eval_batch, n - b0);
      const tensor_view<const float> xb{x.data() + b0 * In, dims{std::array<index_t, 2>{m, In}}};
      const tensor_view<const label_type> yb{y.data() + b0 * label_width(), label_dims(m)};
      const auto [out, l] = s_.run(logits_, loss_, x_ = xb, y_ = yb);
      loss_sum += static_cast<double>(host_scalar(l)) * static_cast<double>(m);
      if constexpr (Head::classifier) {
        hits += nn::accuracy(out, yb) * static_cast<double>(m);
      } else {
        for (index_t i = 0; i < m * outputs; ++i) abs_sum += std::abs(double(out[i]) - double(yb.data()[i]));
      }
    }
    r.examples = n;
    r.loss = n ? loss_sum / static_cast<double>(n) : 0;
    if constexpr (Head::classifier) r.accuracy = n ? hits / static_cast<double>(n) : 0;
    else r.mse = r.loss, r.mae = n ? abs_sum / static_cast<double>(n * outputs) : 0;
    r.global_step = s_.global_step();
    return r;
  }
  /// Classifiers: the loss and accuracy over every example of ds, in order, in batches of
  /// 1024. The dataset's examples must have In values each (a shape_error, as train's).
  eval_result evaluate(const data::dataset& ds)
    requires Head::classifier
  {
    check_examples("evaluate", ds);
    eval_result r;
    double loss_sum = 0, hits = 0;
    for (auto [xb, yb] : ds.batch(eval_batch)) {
      const index_t m = xb.shape().d[0];
      const auto [out, l] = s_.run(logits_, loss_, x_ = tensor_view<const float>{xb.data(), dims{std::array<index_t, 2>{m, In}}}, y_ = yb);
      loss_sum += static_cast<double>(host_scalar(l)) * static_cast<double>(m);
      hits += nn::accuracy(out, yb) * static_cast<double>(m);
      r.examples += m;
    }
    r.loss = r.examples ? loss_sum / static_cast<double>(r.examples) : 0;
    r.accuracy = r.examples ? hits / static_cast<double>(r.examples) : 0;
    r.global_step = s_.global_step();
    return r;
  }

  /// Classifiers: the class of each row; regressors: the [n, Out] outputs, row-major.
  auto predict(tensor_view<const float> x) {
    const index_t n = check_features("predict", x);
    std::conditional_t<Head::classifier, std::vector<std::int32_t>, std::vector<float>> r;
    for (index_t b0 = 0; b0 < n; b0 += eval_batch) {
      const index_t m = std::min(eval_batch, n - b0);
      const auto out = s_.run(logits_, x_ = tensor_view<const float>{x.data() + b0 * In, dims{std::array<index_t, 2>{m, In}}});
      if constexpr (Head::classifier) {
        const auto p = nn::predictions(out);
        r.insert(r.end(), p.begin(), p.end());
      } else {
        r.insert(r.end(), out.begin(), out.end());
      }
    }
    return r;
  }
  /// Classifiers: softmax probabilities, [n, Classes] row-major.
  std::vector<float> predict_proba(tensor_view<const float> x)
    requires Head::classifier
  {
    const index_t n = check_features("predict_proba", x);
    std::vector<float> r;
    r.reserve(static_cast<std::size_t>(n * outputs));
    for (index_t b0 = 0; b0 < n; b0 += eval_batch) {
      const index_t m = std::min(eval_batch, n - b0);
      const auto p = s_.run(probs_, x_ = tensor_view<const float>{x.data() + b0 * In, dims{std::array<index_t, 2>{m, In}}});
      r.insert(r.end(), p.begin(), p.end());
    }
    return r;
  }

  // ---- state ---------------------------------------------------------------------------

  /// Writes the variables, optimizer state and global step to file (save_checkpoint).
  void save(const std::filesystem::path& file) const { save_checkpoint(s_, file); }
  /// Reads them back from file (restore_checkpoint; its errors leave the model unchanged).
  void restore(const std::filesystem::path& file) { restore_checkpoint(s_, file); }
  /// model_dir/model.npz: where the model is restored from and saved to.
  std::filesystem::path checkpoint_file() const { return cfg_.model_dir / "model.npz"; }
  /// Training steps taken, restored ones included.
  std::int64_t global_step() const { return s_.global_step(); }
  /// The session holding the model's variables ("dnn/hiddenlayer_0/w", ..., "dnn/logits/b",
  /// or "linear/linear_model/w" and "linear/linear_model/b") and the optimizer's state.
  session<Backend>& get_session() { return s_; }
  /// The configuration it was made with.
  const run_config& config() const { return cfg_; }
  /// The communicator its training steps use.
  Comm& communicator() { return comm_; }

 private:
  /// A dataset's examples must hold In values each: a shape_error naming op and both shapes.
  static void check_examples(const char* op, const data::dataset& ds) {
    if (ds.example_shape().numel() != In)
      throw shape_error("gradus: estimator::" + std::string(op) + ": the dataset's examples have shape " +
                        to_string(ds.example_shape()) + ", the model takes " + std::to_string(In) + " features");
  }
  static constexpr index_t eval_batch = 1024;

  run_config cfg_;
  Comm comm_;
  features x_;
  labels y_;
  Body body_;
  logits_t logits_;
  loss_t loss_;
  probs_t probs_;
  session<Backend> s_;
  step_t step_;

  /// a run's result: host memory on every backend (a device backend's run copies it out)
  template <class T>
  static T host_scalar(tensor_view<const T> v) {
    return v.data()[0];
  }
  static constexpr index_t label_width() { return Head::classifier ? 1 : outputs; }
  static dims label_dims(index_t m) {
    if constexpr (Head::classifier) return dims{std::array<index_t, 1>{m}};
    else return dims{std::array<index_t, 2>{m, outputs}};
  }
  index_t check_features(const char* what, tensor_view<const float> x) const {
    if (x.shape().rank != 2 || x.shape().d[1] != In)
      throw shape_error(std::string("gradus: estimator::") + what + ": features of shape " + to_string(x.shape()) +
                        ", the model takes [n, " + std::to_string(In) + "]");
    return x.shape().d[0];
  }
  index_t check_inputs(const char* what, tensor_view<const float> x, tensor_view<const label_type> y) const {
    const index_t n = check_features(what, x);
    const bool ok = Head::classifier ? (y.shape().rank == 1 && y.shape().d[0] == n)
                                     : ((y.shape().rank == 2 && y.shape().d[0] == n && y.shape().d[1] == outputs) ||
                                        (outputs == 1 && y.shape().rank == 1 && y.shape().d[0] == n));
    if (!ok)
      throw shape_error(std::string("gradus: estimator::") + what + ": labels of shape " + to_string(y.shape()) +
                        " for " + std::to_string(n) + " examples (expected " +
                        (Head::classifier ? "[" + std::to_string(n) + "] class indices"
                                          : "[" + std::to_string(n) + ", " + std::to_string(outputs) + "] targets") +
                        ")");
    if constexpr (Head::classifier)
      for (index_t i = 0; i < n; ++i)
        if (y.data()[i] < 0 || y.data()[i] >= outputs)
          throw error(std::string("gradus: estimator::") + what + ": label " + std::to_string(y.data()[i]) +
                      " of example " + std::to_string(i) + " is not a class in [0, " + std::to_string(outputs) + ")");
    return n;
  }
  /// This rank's examples of epoch `epoch`, in order: the dataset's shuffle and shard.
  std::vector<index_t> epoch_order(index_t n, std::uint64_t epoch) const {
    std::vector<index_t> all(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) all[static_cast<std::size_t>(i)] = i;
    std::mt19937_64 rng(cfg_.seed * 0x9e3779b97f4a7c15ull + epoch + 1);
    for (std::size_t i = all.size(); i > 1; --i) std::swap(all[i - 1], all[rng() % i]);
    std::vector<index_t> mine;
    for (std::size_t i = static_cast<std::size_t>(comm_.rank()); i < all.size(); i += static_cast<std::size_t>(comm_.world_size()))
      mine.push_back(all[i]);
    return mine;
  }
  /// Runs `epochs` epochs of `epoch_steps` steps; each_epoch(epoch, on_batch) calls
  /// on_batch(x, y) per batch. The epoch's number (its shuffle) comes from the global step,
  /// so a model restored from a checkpoint goes on where the checkpoint stopped.
  template <class EachEpoch>
  train_result run_epochs(int epochs, index_t epoch_steps, EachEpoch&& each_epoch) {
    if (epochs < 0) throw error("gradus: estimator::train: epochs must be >= 0, got " + std::to_string(epochs));
    train_result r;
    const auto t0 = std::chrono::steady_clock::now();
    for (int e = 0; e < epochs; ++e) {
      const std::uint64_t epoch = epoch_steps ? static_cast<std::uint64_t>(s_.global_step() / epoch_steps) : 0;
      double sum = 0;
      index_t steps = 0;
      each_epoch(epoch, [&](tensor_view<const float> xb, tensor_view<const label_type> yb) {
        sum += static_cast<double>(step_.run(x_ = xb, y_ = yb));
        ++steps;
        r.examples += xb.shape().d[0];
      });
      r.mean_loss = steps ? sum / static_cast<double>(steps) : 0;
    }
    step_.pull_state();  // a parameter server: its variables and optimizer state, for the checkpoint
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.global_step = s_.global_step();
    if (!cfg_.model_dir.empty() && comm_.rank() == 0) {
      std::filesystem::create_directories(cfg_.model_dir);
      save(checkpoint_file());
    }
    return r;
  }
};

}  // namespace estimator

/// The premade models. Trailing parameters: backend, communicator, optimizer.
template <index_t In, class Hidden, index_t Classes, class Backend = cpu_simd, class Comm = parallel::local, class Opt = adam>
using dnn_classifier = estimator::model<estimator::detail::dnn_body<In, Hidden, Classes, float>,
                                        estimator::detail::classification_head<Classes>, In, Backend, Comm, Opt>;
/// A regressor: `In` float features through ReLU hidden layers (`hidden<H...>`) to `Out` float
/// outputs, trained on mean squared error against float labels [N, Out].
template <index_t In, class Hidden, index_t Out = 1, class Backend = cpu_simd, class Comm = parallel::local, class Opt = adam>
using dnn_regressor = estimator::model<estimator::detail::dnn_body<In, Hidden, Out, float>,
                                       estimator::detail::regression_head<Out, float>, In, Backend, Comm, Opt>;
/// A linear classifier (one dense layer, logits of `Classes` >= 2 classes): softmax cross-entropy
/// against int32 class labels.
template <index_t In, index_t Classes, class Backend = cpu_simd, class Comm = parallel::local, class Opt = adam>
using linear_classifier = estimator::model<estimator::detail::linear_body<In, Classes, float>,
                                           estimator::detail::classification_head<Classes>, In, Backend, Comm, Opt>;
/// A linear regressor (one dense layer, `In` -> `Out` float outputs): mean squared error against
/// float labels [N, Out].
template <index_t In, index_t Out = 1, class Backend = cpu_simd, class Comm = parallel::local, class Opt = adam>
using linear_regressor = estimator::model<estimator::detail::linear_body<In, Out, float>,
                                          estimator::detail::regression_head<Out, float>, In, Backend, Comm, Opt>;

}  // namespace gradus
