// Binary logistic regression on a small real data set: Statlog (Heart) in LIBSVM format
// (270 patients, 13 features scaled to [-1, 1], labels +1 / -1: heart disease present or
// absent), as liblinear ships it (tools/fetch-heart.sh puts it at data/heart/heart_scale).
//
//   logistic_regression [--data data/heart/heart_scale]    progress, human-readable
//   logistic_regression --json                              one line of JSON metrics
//
// The file is read strictly: a line that is not `<label> <index>:<value> ...` (label +1,
// 1 or -1; indices 1..13, increasing; values finite numbers) stops the program with
// `<file>:<line>: expected ..., got ...`. A seeded stratified split keeps 80% of each
// class for training and 20% for testing.
//
// The model is z = x·w + b. With labels y in {-1, +1}, binary cross-entropy of
// p = sigmoid(z) is −log sigmoid(y·z) = log(1 + exp(−y·z)) = softplus(−y·z), and gradus'
// softplus is the stable max(v, 0) + log1p(exp(−|v|)): no overflow for large |z| and no
// log(0) as p saturates. The loss is its mean plus l2/2·‖w‖² (the bias not penalised),
// minimised with Adam by g::minimize (full batch, or shuffled minibatches with --batch).
#include "example_backend.hpp"  // first: gradus_examples::backend

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <gradus/gradus.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "regression_cli.hpp"

namespace g = gradus;

namespace {
using gradus_examples::non_negative;
using gradus_examples::positive;
constexpr g::index_t features = 13;

struct dataset {
  std::vector<float> x;  // row-major [n, features], absent features 0
  std::vector<float> y;  // +1 / -1
  std::size_t rows() const { return y.size(); }
};

// Reads a LIBSVM file of `features` features; any deviation is an error naming the file,
// the line and what was expected there. A file whose last line has no newline may have been
// cut short: an error in that line says so, and a last line that reads well is kept with a
// warning on stderr (a value cut in the middle of its digits still reads as a number).
dataset read_libsvm(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw std::runtime_error(path + ": cannot open the file (tools/fetch-heart.sh puts the heart data set at "
                             "data/heart/heart_scale)");
  dataset d;
  std::string line;
  std::size_t lineno = 0;
  bool unterminated = false;  // the last line read ended at the end of the file, not at a newline
  while (std::getline(in, line)) {
    ++lineno;
    unterminated = in.eof();
    const auto fail = [&](const std::string& expected, std::string_view got) {
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": expected " + expected + ", got " +
                               (got.empty() ? std::string("the end of the line") : "'" + std::string(got) + "'") +
                               (unterminated ? " (the file ends in this line, without a newline: cut short?)" : ""));
    };
    std::string_view rest(line);
    auto next_token = [&]() {
      const auto start = rest.find_first_not_of(" \t\r");
      if (start == std::string_view::npos) {
        rest = {};
        return std::string_view{};
      }
      rest.remove_prefix(start);
      const auto end = std::min(rest.find_first_of(" \t\r"), rest.size());
      const std::string_view tok = rest.substr(0, end);
      rest.remove_prefix(end);
      return tok;
    };
    const std::string_view label = next_token();
    if (label == "+1" || label == "1") d.y.push_back(1.f);
    else if (label == "-1") d.y.push_back(-1.f);
    else fail("a label +1 or -1 at the start of the line", label);
    std::array<float, features> row{};
    long last = 0;
    for (std::string_view tok = next_token(); !tok.empty(); tok = next_token()) {
      const auto colon = tok.find(':');
      if (colon == std::string_view::npos) fail("<index>:<value>", tok);
      long index = 0;
      const std::string_view is = tok.substr(0, colon), vs = tok.substr(colon + 1);
      const auto ri = std::from_chars(is.data(), is.data() + is.size(), index);
      if (ri.ec != std::errc() || ri.ptr != is.data() + is.size() || index < 1 || index > features)
        fail("a feature index from 1 to " + std::to_string(features) + " before ':'", tok);
      if (index <= last) fail("feature indices in increasing order (after " + std::to_string(last) + ")", tok);
      double value = 0;
      const auto rv = std::from_chars(vs.data(), vs.data() + vs.size(), value);
      if (vs.empty() || rv.ec != std::errc() || rv.ptr != vs.data() + vs.size() || !std::isfinite(value))
        fail("a finite number after '" + std::string(is) + ":'", tok);
      row[static_cast<std::size_t>(index - 1)] = static_cast<float>(value);
      last = index;
    }
    d.x.insert(d.x.end(), row.begin(), row.end());
  }
  if (in.bad()) throw std::runtime_error(path + ": read error");
  if (d.rows() == 0) throw std::runtime_error(path + ": expected at least one sample, the file is empty");
  if (unterminated)
    std::fprintf(stderr,
                 "logistic_regression: warning: %s:%zu: the file ends in this line, without a newline: if it was cut "
                 "short, this sample's last value is wrong\n",
                 path.c_str(), lineno);
  return d;
}

// Rows `idx` of `d`, in that order.
dataset take(const dataset& d, const std::vector<std::size_t>& idx) {
  dataset r;
  for (std::size_t i : idx) {
    r.x.insert(r.x.end(), d.x.begin() + static_cast<std::ptrdiff_t>(i * features),
               d.x.begin() + static_cast<std::ptrdiff_t>((i + 1) * features));
    r.y.push_back(d.y[i]);
  }
  return r;
}

// Fisher-Yates with gradus' seeded generator (std::shuffle's draws differ between
// standard libraries; this does not).
void shuffle(std::vector<std::size_t>& v, g::init::generator& rng) {
  for (std::size_t i = v.size(); i > 1; --i) {
    const auto j = std::min(static_cast<std::size_t>(rng.unit() * static_cast<double>(i)), i - 1);
    std::swap(v[i - 1], v[j]);
  }
}
}  // namespace

int main(int argc, char** argv) {
  gradus_examples::regression_cli cli{
      "Binary logistic regression on the Statlog heart data set (LIBSVM format, 13 features, labels +1/-1; "
      "get it with tools/fetch-heart.sh): seeded stratified train/test split, loss = mean softplus(-y (x.w + b)) "
      "+ l2/2 ||w||^2 (binary cross-entropy in its stable form), trained with Adam in gradus (g::minimize)."};
  std::string data = "data/heart/heart_scale";
  std::int64_t epochs = 300, batch = 0;
  double lr = 0.05, l2 = 0.01, test_fraction = 0.2;
  CLI::App& app = cli.app;
  app.add_option("--data", data, "the data set, LIBSVM format");
  app.add_option("--epochs", epochs, "passes over the training set")->check(CLI::Range(std::int64_t{1}, std::int64_t{1000000000}));
  app.add_option("--batch", batch, "minibatch size (shuffled each epoch); 0 = the full training set")
      ->check(non_negative);
  app.add_option("--lr", lr, "Adam's learning rate")->check(positive);
  app.add_option("--l2", l2, "L2 penalty on the weights: l2/2 ||w||^2")->check(non_negative);
  app.add_option("--test-fraction", test_fraction, "fraction of each class held out for testing")
      ->check(CLI::Range(0.01, 0.99));
  cli.add_shared_options("seed of the split, the minibatch order and the initial weights");

  return cli.run("logistic_regression", argc, argv, [&] {
    const std::uint64_t seed = cli.seed;
    const gradus_examples::comm_options& co = cli.co;
    bool json = cli.json;
    const dataset all = read_libsvm(data);

    // ---- stratified split: the same fraction of each class in the test set
    g::init::generator rng(g::init::stream_seed(seed, "split"));
    std::vector<std::size_t> train_idx, test_idx;
    for (const float cls : {1.f, -1.f}) {
      std::vector<std::size_t> members;
      for (std::size_t i = 0; i < all.rows(); ++i)
        if (all.y[i] == cls) members.push_back(i);
      shuffle(members, rng);
      const auto n_test = static_cast<std::size_t>(std::lround(test_fraction * static_cast<double>(members.size())));
      test_idx.insert(test_idx.end(), members.begin(), members.begin() + static_cast<std::ptrdiff_t>(n_test));
      train_idx.insert(train_idx.end(), members.begin() + static_cast<std::ptrdiff_t>(n_test), members.end());
    }
    if (train_idx.empty() || test_idx.empty())
      throw std::runtime_error(data + ": " + std::to_string(all.rows()) + " samples are too few to split");
    shuffle(train_idx, rng);  // mix the classes for minibatches
    const dataset train = take(all, train_idx), test = take(all, test_idx);
    const auto n_train = static_cast<g::index_t>(train.rows()), n_test = static_cast<g::index_t>(test.rows());

    // ---- the model, its loss and its accuracy, as expressions
    g::placeholder<"x", float, g::dyn, features> x;
    g::placeholder<"y", float, g::dyn, 1> y;  // +1 / -1
    g::variable<"w", float, features, 1> w;
    g::variable<"b", float, 1> b;
    const auto z = g::matmul(x, w) + b;
    const auto loss = g::mean(g::softplus(-(y * z))) + static_cast<float>(l2 / 2) * g::sum(g::square(w));
    const auto accuracy = g::mean(g::greater(y * z, 0.f));  // the sign of z predicts the label

    g::session<gradus_examples::backend> s;
    s.set_check_numerics(co.check_numerics);
    g::initialize(s, w, g::init::glorot_uniform{}, seed);
    g::initialize(s, b, g::init::zeros{}, seed);
    // data-parallel (--comm ring): each rank trains on an equal contiguous share of the
    // (shuffled) training set; progress and the JSON are rank 0's
    auto comm = gradus_examples::make_communicator(co);
    const int rank = comm.rank(), world = comm.world_size();
    const auto shard = gradus_examples::shard_of(n_train, rank, world);
    std::vector<std::size_t> share;
    for (auto i = shard.begin; i < shard.end; ++i) share.push_back(static_cast<std::size_t>(i));
    const dataset part = take(train, share);
    const auto n_part = static_cast<g::index_t>(part.rows());
    if (rank != 0) json = true;
    auto step = g::parallel::minimize(comm, gradus_examples::data_parallel_options(co), s, loss, g::adam{.lr = lr});
    step.set_run_fingerprint({{"samples", std::to_string(all.rows())}, {"epochs", std::to_string(epochs)}, {"batch", std::to_string(batch)},
                              {"l2", g::shortest_text(l2)}, {"test_fraction", g::shortest_text(test_fraction)},
                              {"seed", std::to_string(seed)}});

    const g::index_t bs = batch == 0 || batch > n_part ? n_part : static_cast<g::index_t>(batch);
    if (!json)
      std::printf("logistic regression on %s: %zu samples (%zu train, %zu test), %lld features; Adam lr %g, l2 %g, "
                  "%lld epochs, %s\n",
                  data.c_str(), all.rows(), train.rows(), test.rows(), static_cast<long long>(features), lr, l2,
                  static_cast<long long>(epochs),
                  bs == n_part ? "full batch" : ("minibatches of " + std::to_string(bs)).c_str());

    std::vector<std::size_t> order(part.rows());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    dataset shuffled = part;
    const auto eval = [&](const dataset& d, g::index_t n) {
      auto [l, a] = s.run(loss, accuracy, x = g::view(d.x.data(), {n, features}), y = g::view(d.y.data(), {n, 1}));
      return std::pair<double, double>{l[0], a[0]};
    };
    const std::int64_t report = std::max<std::int64_t>(1, epochs / 10);
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t steps = 0;
    for (std::int64_t e = 0; e < epochs; ++e) {
      const dataset* src = &part;
      if (bs < n_part) {  // a new order each epoch
        shuffle(order, rng);
        shuffled = take(part, order);
        src = &shuffled;
      }
      double sum = 0;
      g::index_t seen = 0;
      for (g::index_t first = 0; first + bs <= n_part; first += bs) {  // a partial last batch is skipped
        const auto f = static_cast<std::size_t>(first);
        const float l = step.run(x = g::view(src->x.data() + f * features, {bs, features}),
                                 y = g::view(src->y.data() + f, {bs, 1}));
        co.maybe_slow(rank);
        if (!std::isfinite(l)) throw std::runtime_error("the loss is not finite at epoch " + std::to_string(e) + "; lower --lr");
        sum += static_cast<double>(l) * static_cast<double>(bs);
        seen += bs;
        ++steps;
      }
      if (!json && (e % report == 0 || e + 1 == epochs)) {
        const auto [tl, ta] = eval(test, n_test);
        std::printf("epoch %5lld  train loss %.5f  test loss %.5f  test accuracy %.4f\n", static_cast<long long>(e),
                    sum / static_cast<double>(seen), tl, ta);
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step.pull_variables();  // --comm ps: every worker ends on the servers' final values
    const auto [train_loss, train_acc] = eval(train, n_train);
    const auto [test_loss, test_acc] = eval(test, n_test);

    if (rank != 0) return 0;  // the replicas are identical: rank 0 reports
    if (json) {
      nlohmann::ordered_json j;
      j["example"] = "logistic_regression";
      j["world_size"] = world;
      j["comm"] = comm.name();
      j["data"] = data;
      j["samples"] = all.rows();
      j["train_samples"] = train.rows();
      j["test_samples"] = test.rows();
      j["features"] = features;
      j["seed"] = seed;
      j["lr"] = lr;
      j["l2"] = l2;
      j["epochs"] = epochs;
      j["batch"] = bs;
      j["steps"] = steps;
      j["final_loss"] = train_loss;
      j["test_loss"] = test_loss;
      j["train_accuracy"] = train_acc;
      j["test_accuracy"] = test_acc;
      j["threads"] = gradus_examples::threads();
      j["seconds"] = seconds;
      std::cout << j.dump() << std::endl;
    } else {
      std::printf("after %lld steps (%.3f s): train loss %.5f, accuracy %.4f; test loss %.5f, accuracy %.4f\n",
                  static_cast<long long>(steps), seconds, train_loss, train_acc, test_loss, test_acc);
      const auto wv = g::value(s, w);
      std::printf("w =");
      for (g::index_t i = 0; i < features; ++i) std::printf(" %.3f", static_cast<double>(wv[i]));
      std::printf(", b = %.3f\n", static_cast<double>(g::value(s, b)[0]));
    }
    return 0;
  });
}
