// A training step of a bag-of-embeddings classifier with a large vocabulary: ids
// [64, 32] -> embedding [V, 64] -> mean over the 32 tokens -> dense 64 -> 10 -> softmax
// cross-entropy, Adam — with the embedding's gradient as sparse rows
// (nn::embedding<..., Sparse = true>: ~2,000 named rows coalesced and updated, lazily) and
// as the dense table-shaped gradient (Sparse = false: V x 64 zeros written, scattered into,
// and every row updated), in one process on the same batches, interleaved rounds.
//
//   bench_embedding [rounds = 11] [steps = 20]
//
// Prints the median seconds per step of each and their ratio for V = 10^4, 10^5, 10^6.
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "bench_common.hpp"

namespace g = gradus;

namespace {

constexpr g::index_t batch = 64, tokens = 32, dim = 64, classes = 10, n_batches = 8;
g::placeholder<"ids", std::int32_t, batch, tokens> ids;
g::placeholder<"y", std::int32_t, batch> labels;

template <g::index_t Vocab, bool Sparse>
struct model {
  g::nn::embedding<"emb", Vocab, dim, float, Sparse> emb;
  g::nn::dense<"out", dim, classes> out;
  auto loss() const { return g::nn::softmax_cross_entropy_loss(out(g::mean<1>(emb(ids))), labels); }
};

struct batches {
  std::vector<std::vector<std::int32_t>> x, y;
};

template <g::index_t Vocab>
batches make_batches() {
  std::mt19937 rng(1);
  // Zipf-like ids (as words): a few frequent rows, a long tail
  std::uniform_real_distribution<double> u(0, 1);
  batches b;
  for (int k = 0; k < n_batches; ++k) {
    std::vector<std::int32_t> x(static_cast<std::size_t>(batch * tokens)), y(static_cast<std::size_t>(batch));
    for (auto& v : x) v = static_cast<std::int32_t>(std::pow(static_cast<double>(Vocab), u(rng))) - 1;
    for (auto& v : y) v = static_cast<std::int32_t>(rng() % classes);
    b.x.push_back(std::move(x));
    b.y.push_back(std::move(y));
  }
  return b;
}

template <g::index_t Vocab, bool Sparse>
struct runner {
  model<Vocab, Sparse> m;
  g::session<g::cpu_simd> s;
  decltype(g::minimize(s, m.loss(), g::adam{})) step;
  const batches& data;
  int next = 0;
  explicit runner(const batches& d) : step(make(s, m)), data(d) {}
  static auto make(g::session<g::cpu_simd>& s, const model<Vocab, Sparse>& m) {
    m.emb.initialize(s, 1);
    m.out.initialize(s, 2);
    return g::minimize(s, m.loss(), g::adam{.lr = 1e-3});
  }
  float run(int steps) {
    float l = 0;
    for (int k = 0; k < steps; ++k, next = (next + 1) % n_batches)
      l = step.run(ids = g::view(data.x[static_cast<std::size_t>(next)].data(), {batch, tokens}),
                   labels = g::view(data.y[static_cast<std::size_t>(next)].data(), {batch}));
    return l;
  }
};

template <g::index_t Vocab>
void compare(int rounds, int steps) {
  const batches data = make_batches<Vocab>();
  runner<Vocab, true> sparse(data);
  runner<Vocab, false> dense(data);
  std::vector<bench::candidate> cs{{"sparse rows", [&] { sparse.run(steps); }},
                                   {"dense", [&] { dense.run(steps); }}};
  bench::run_interleaved(cs, rounds);
  const double ts = bench::median(cs[0].seconds) / steps, td = bench::median(cs[1].seconds) / steps;
  std::printf("| %8lld | %10.3f | %10.3f | %6.1fx |\n", static_cast<long long>(Vocab), ts * 1e3, td * 1e3, td / ts);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 11, steps = argc > 2 ? std::atoi(argv[2]) : 20;
  bench::background_load load;
  std::printf("embedding training step, batch %lld x %lld tokens, dim %lld, Adam; median ms/step of %d rounds x %d steps\n",
              static_cast<long long>(batch), static_cast<long long>(tokens), static_cast<long long>(dim), rounds, steps);
  std::printf("| vocab    | sparse ms  | dense ms   | dense/sparse |\n|---|---|---|---|\n");
  compare<10'000>(rounds, steps);
  compare<100'000>(rounds, steps);
  compare<1'000'000>(rounds, std::max(2, steps / 4));
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
}
