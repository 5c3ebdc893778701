// One training step of an MLP 784-256-128-10 (ReLU, softmax cross-entropy averaged over
// the batch, batch 64, float, SGD with momentum): gradus' forward pass alone, gradus'
// whole training step (g::minimize), and the same step written by hand in plain C++ over
// the same OpenBLAS, all in one process on the same batches.
//
//   bench_mlp [rounds = 15] [steps = 200]
//
// Every sample runs `steps` steps from the same initial weights (restored before each
// sample, untimed), cycling over 8 fixed batches. Before timing, the program checks that
// gradus' step and the hand-written one give the same loss and the same weight updates
// step after step from identical weights, and fails if they do not.
//
// gradus' backend first: it includes <immintrin.h> under a pragma that silences g++ 12's
// false -Wmaybe-uninitialized in the AVX-512 intrinsics.
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
// CBLAS comes declared by cpu_simd.hpp (xtensor-blas's declarations, linked to OpenBLAS)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>
#include <xtensor/xtensor.hpp>

#include "bench_common.hpp"

namespace g = gradus;

namespace {

constexpr int n_in = 784, n_h1 = 256, n_h2 = 128, n_out = 10, batch = 64, n_batches = 8;
constexpr float learning_rate = 0.05f, momentum = 0.9f;

// ---- the hand-written reference --------------------------------------------------------

// A 64-byte aligned float array, zero-filled.
class fbuf {
 public:
  explicit fbuf(std::size_t n)
      : n_(n), p_(static_cast<float*>(::operator new(std::max<std::size_t>(n, 1) * sizeof(float), std::align_val_t{64}))) {
    std::fill(p_, p_ + n_, 0.0f);
  }
  fbuf(const fbuf&) = delete;
  fbuf& operator=(const fbuf&) = delete;
  ~fbuf() { ::operator delete(p_, std::align_val_t{64}); }
  float* data() { return p_; }
  const float* data() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_;
  float* p_;
};

// Loops over fewer elements than this run on the calling thread. Measured on the 2-core
// machine of benchmarks/README.md: 2^14 (the 64x256 loops on both threads, the 64x128 ones
// on one) gave the fastest step; 2^12, 2^13 and 2^15 were 1-5% slower; all on one
// thread, 40% slower (the SGD loop over w1 needs both cores).
constexpr long parallel_min = 1 << 14;

// C (m x n) = op(A) op(B), row-major; transposes are flags.
void sgemm(bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
              ta ? m : k, b, tb ? k : n, 0.0f, c, n);
}

// h (rows x cols) = max(h + b, 0), b broadcast over rows.
void bias_relu(float* h, const float* b, int rows, int cols) {
#pragma omp parallel for schedule(static) if (long(rows) * cols >= parallel_min)
  for (int r = 0; r < rows; ++r) {
    float* hr = h + static_cast<std::ptrdiff_t>(r) * cols;
#pragma omp simd
    for (int c = 0; c < cols; ++c) {
      const float v = hr[c] + b[c];
      hr[c] = v > 0.0f ? v : 0.0f;
    }
  }
}

// The backward step through a ReLU layer: d (rows x cols) *= (h > 0), with h the layer's
// output, and db = the column sums of the masked d (the bias gradient), in one pass.
// Threads take column blocks (multiples of 16 floats), so each owns its part of db.
void relu_grad_colsum(float* d, const float* h, float* db, int rows, int cols) {
#pragma omp parallel if (long(rows) * cols >= parallel_min)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int per = (cols / nt + 15) / 16 * 16;
    const int c0 = std::min(cols, t * per), c1 = t == nt - 1 ? cols : std::min(cols, c0 + per);
    for (int c = c0; c < c1; ++c) db[c] = 0.0f;
    for (int r = 0; r < rows; ++r) {
      float* dr = d + static_cast<std::ptrdiff_t>(r) * cols;
      const float* hr = h + static_cast<std::ptrdiff_t>(r) * cols;
#pragma omp simd
      for (int c = c0; c < c1; ++c) {
        const float v = hr[c] > 0.0f ? dr[c] : 0.0f;
        dr[c] = v;
        db[c] += v;
      }
    }
  }
}

// Per row of z (rows x cols): z += b, loss_r = logsumexp(z) - z[y], d = (softmax(z) -
// onehot(y)) / rows (the gradient of the mean loss), db = column sums of d. Returns the
// mean loss. Small (64 x 10): one thread.
float softmax_xent_grad(float* z, const float* b, const std::int32_t* y, float* d, float* db, int rows, int cols) {
  const float inv_rows = 1.0f / static_cast<float>(rows);
  float loss = 0.0f;
  for (int c = 0; c < cols; ++c) db[c] = 0.0f;
  for (int r = 0; r < rows; ++r) {
    float* zr = z + static_cast<std::ptrdiff_t>(r) * cols;
    float* dr = d + static_cast<std::ptrdiff_t>(r) * cols;
    float mx = -std::numeric_limits<float>::infinity();
    for (int c = 0; c < cols; ++c) {
      zr[c] += b[c];
      mx = std::max(mx, zr[c]);
    }
    float s = 0.0f;
    for (int c = 0; c < cols; ++c) {
      dr[c] = std::exp(zr[c] - mx);
      s += dr[c];
    }
    loss += std::log(s) - (zr[y[r]] - mx);
    const float k = 1.0f / s;
    for (int c = 0; c < cols; ++c) dr[c] = dr[c] * k * inv_rows;
    dr[y[r]] -= inv_rows;
    for (int c = 0; c < cols; ++c) db[c] += dr[c];
  }
  return loss * inv_rows;
}

// The mean loss alone (forward only).
float softmax_xent(const float* z, const float* b, const std::int32_t* y, int rows, int cols) {
  float loss = 0.0f;
  for (int r = 0; r < rows; ++r) {
    const float* zr = z + static_cast<std::ptrdiff_t>(r) * cols;
    float mx = -std::numeric_limits<float>::infinity();
    for (int c = 0; c < cols; ++c) mx = std::max(mx, zr[c] + b[c]);
    float s = 0.0f;
    for (int c = 0; c < cols; ++c) s += std::exp(zr[c] + b[c] - mx);
    loss += std::log(s) - (zr[y[r]] + b[y[r]] - mx);
  }
  return loss / static_cast<float>(rows);
}

// SGD with momentum (PyTorch's): m = mu m + g; w -= lr m.
void sgd_momentum(float* w, float* m, const float* gr, long n, float lr, float mu) {
#pragma omp parallel for simd schedule(static) if (n >= parallel_min)
  for (long i = 0; i < n; ++i) {
    m[i] = mu * m[i] + gr[i];
    w[i] -= lr * m[i];
  }
}

class hand_mlp {
 public:
  static constexpr int n_params = 6;  // w1 b1 w2 b2 w3 b3
  std::array<fbuf*, n_params> params() { return {&w1_, &b1_, &w2_, &b2_, &w3_, &b3_}; }
  std::array<fbuf*, n_params> moments() { return {&m_[0], &m_[1], &m_[2], &m_[3], &m_[4], &m_[5]}; }

  // One training step on x (batch x n_in), labels y: the loss before the update.
  float step(const float* x, const std::int32_t* y) {
    // forward
    sgemm(false, false, batch, n_h1, n_in, x, w1_.data(), h1_.data());
    bias_relu(h1_.data(), b1_.data(), batch, n_h1);
    sgemm(false, false, batch, n_h2, n_h1, h1_.data(), w2_.data(), h2_.data());
    bias_relu(h2_.data(), b2_.data(), batch, n_h2);
    sgemm(false, false, batch, n_out, n_h2, h2_.data(), w3_.data(), z_.data());
    const float loss = softmax_xent_grad(z_.data(), b3_.data(), y, d3_.data(), g_[5].data(), batch, n_out);
    // backward: dW = h^T d, d_prev = (d W^T) * relu'(h_prev), db = column sums
    sgemm(true, false, n_h2, n_out, batch, h2_.data(), d3_.data(), g_[4].data());
    sgemm(false, true, batch, n_h2, n_out, d3_.data(), w3_.data(), d2_.data());
    relu_grad_colsum(d2_.data(), h2_.data(), g_[3].data(), batch, n_h2);
    sgemm(true, false, n_h1, n_h2, batch, h1_.data(), d2_.data(), g_[2].data());
    sgemm(false, true, batch, n_h1, n_h2, d2_.data(), w2_.data(), d1_.data());
    relu_grad_colsum(d1_.data(), h1_.data(), g_[1].data(), batch, n_h1);
    sgemm(true, false, n_in, n_h1, batch, x, d1_.data(), g_[0].data());
    // update
    const auto p = params();
    for (int i = 0; i < n_params; ++i)
      sgd_momentum(p[i]->data(), m_[i].data(), g_[i].data(), static_cast<long>(p[i]->size()), learning_rate, momentum);
    return loss;
  }

  // The forward pass alone: the mean loss.
  float forward(const float* x, const std::int32_t* y) {
    sgemm(false, false, batch, n_h1, n_in, x, w1_.data(), h1_.data());
    bias_relu(h1_.data(), b1_.data(), batch, n_h1);
    sgemm(false, false, batch, n_h2, n_h1, h1_.data(), w2_.data(), h2_.data());
    bias_relu(h2_.data(), b2_.data(), batch, n_h2);
    sgemm(false, false, batch, n_out, n_h2, h2_.data(), w3_.data(), z_.data());
    return softmax_xent(z_.data(), b3_.data(), y, batch, n_out);
  }

 private:
  fbuf w1_{n_in * n_h1}, b1_{n_h1}, w2_{n_h1 * n_h2}, b2_{n_h2}, w3_{n_h2 * n_out}, b3_{n_out};
  fbuf m_[n_params] = {fbuf(n_in * n_h1), fbuf(n_h1), fbuf(n_h1 * n_h2), fbuf(n_h2), fbuf(n_h2 * n_out), fbuf(n_out)};
  fbuf g_[n_params] = {fbuf(n_in * n_h1), fbuf(n_h1), fbuf(n_h1 * n_h2), fbuf(n_h2), fbuf(n_h2 * n_out), fbuf(n_out)};
  fbuf h1_{batch * n_h1}, h2_{batch * n_h2}, z_{batch * n_out};
  fbuf d1_{batch * n_h1}, d2_{batch * n_h2}, d3_{batch * n_out};
};

// ---- data ------------------------------------------------------------------------------

std::uint32_t hash(std::uint32_t i, std::uint32_t seed) {
  std::uint32_t h = i * 0x9E3779B1u ^ seed;
  h ^= h >> 15;
  h *= 0x85EBCA77u;
  h ^= h >> 13;
  h *= 0xC2B2AE3Du;
  return h ^ (h >> 16);
}
float unit(std::uint32_t i, std::uint32_t seed) { return static_cast<float>(hash(i, seed) >> 8) * (1.0f / 16777216.0f); }

// Inputs in [0, 1) (as pixel intensities), labels from a fixed random linear teacher, so
// the task is learnable and the loss falls steadily rather than blowing up.
struct dataset {
  std::vector<xt::xtensor<float, 2>> x;
  std::vector<xt::xtensor<std::int32_t, 1>> y;
  dataset() {
    std::vector<float> teacher(static_cast<std::size_t>(n_in) * n_out);
    for (std::size_t i = 0; i < teacher.size(); ++i) teacher[i] = unit(static_cast<std::uint32_t>(i), 7) - 0.5f;
    for (int b = 0; b < n_batches; ++b) {
      xt::xtensor<float, 2> xb(std::array<std::size_t, 2>{batch, n_in});
      xt::xtensor<std::int32_t, 1> yb(std::array<std::size_t, 1>{batch});
      for (int r = 0; r < batch; ++r) {
        float score[n_out] = {};
        for (int i = 0; i < n_in; ++i) {
          const float v = unit(static_cast<std::uint32_t>((b * batch + r) * n_in + i), 11);
          xb(static_cast<std::size_t>(r), static_cast<std::size_t>(i)) = v;
          for (int c = 0; c < n_out; ++c) score[c] += (v - 0.5f) * teacher[static_cast<std::size_t>(i) * n_out + c];
        }
        yb(static_cast<std::size_t>(r)) = static_cast<std::int32_t>(std::max_element(score, score + n_out) - score);
      }
      x.push_back(std::move(xb));
      y.push_back(std::move(yb));
    }
  }
};

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "bench_mlp: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 200;
  if (rounds < 1 || steps < 1) fail("usage: bench_mlp [rounds >= 1] [steps >= 1]");

  const dataset data;

  // ---- gradus: the model, its forward loss and its training step ----
  g::placeholder<"x", float, g::dyn, n_in> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::variable<"w1", float, n_in, n_h1> w1;
  g::variable<"b1", float, n_h1> b1;
  g::variable<"w2", float, n_h1, n_h2> w2;
  g::variable<"b2", float, n_h2> b2;
  g::variable<"w3", float, n_h2, n_out> w3;
  g::variable<"b3", float, n_out> b3;
  const auto h1 = g::relu(g::matmul(x, w1) + b1);
  const auto h2 = g::relu(g::matmul(h1, w2) + b2);
  const auto logits = g::matmul(h2, w3) + b3;
  const auto loss = g::mean(g::softmax_cross_entropy(logits, y));

  g::session<g::cpu_simd> s;
  g::initialize(s, w1, g::init::he_normal{}, 42);
  g::initialize(s, b1, g::init::zeros{}, 42);
  g::initialize(s, w2, g::init::he_normal{}, 42);
  g::initialize(s, b2, g::init::zeros{}, 42);
  g::initialize(s, w3, g::init::glorot_uniform{}, 42);
  g::initialize(s, b3, g::init::zeros{}, 42);
  auto step = g::minimize(s, loss, g::sgd{.lr = learning_rate, .momentum = momentum}, w1, b1, w2, b2, w3, b3);

  // The initial values of gradus' variables, in the order w1 b1 w2 b2 w3 b3, and the
  // session's storage of each variable and of its momentum.
  constexpr const char* names[hand_mlp::n_params] = {"w1", "b1", "w2", "b2", "w3", "b3"};
  std::array<float*, hand_mlp::n_params> gw{}, gm{};
  std::array<std::vector<float>, hand_mlp::n_params> init;
  for (int i = 0; i < hand_mlp::n_params; ++i) {
    gw[i] = s.data<float>(names[i]);
    gm[i] = s.data<float>(std::string(names[i]) + "/momentum");
  }
  hand_mlp hand;
  for (int i = 0; i < hand_mlp::n_params; ++i) {
    const std::size_t n = hand.params()[i]->size();
    init[i].assign(gw[i], gw[i] + n);
  }
  // Restore both to the initial weights and zero momentum.
  auto reset_gradus = [&] {
    for (int i = 0; i < hand_mlp::n_params; ++i) {
      std::copy(init[i].begin(), init[i].end(), gw[i]);
      std::fill(gm[i], gm[i] + init[i].size(), 0.0f);
    }
  };
  auto reset_hand = [&] {
    for (int i = 0; i < hand_mlp::n_params; ++i) {
      std::copy(init[i].begin(), init[i].end(), hand.params()[i]->data());
      std::fill(hand.moments()[i]->data(), hand.moments()[i]->data() + init[i].size(), 0.0f);
    }
  };
  auto feeds_step = [&](int i) { return step.run(x = data.x[i % n_batches], y = data.y[i % n_batches]); };
  auto gradus_forward = [&](int i) {
    return s.run(loss, x = data.x[i % n_batches], y = data.y[i % n_batches])[0];
  };
  auto hand_step = [&](int i) { return hand.step(data.x[i % n_batches].data(), data.y[i % n_batches].data()); };
  auto hand_forward = [&](int i) { return hand.forward(data.x[i % n_batches].data(), data.y[i % n_batches].data()); };

  std::printf("MLP %d-%d-%d-%d (ReLU, softmax cross-entropy, mean over the batch), batch %d, float, "
              "SGD lr %.2g momentum %.1f\n",
              n_in, n_h1, n_h2, n_out, batch, static_cast<double>(learning_rate), static_cast<double>(momentum));
  std::printf("%d OpenMP threads, OpenBLAS %d threads (%s); %d rounds x %d steps\n\n", omp_get_max_threads(),
              openblas_get_num_threads(), openblas_get_config(), rounds, steps);

  // ---- the check: same loss and same updates, step after step, from the same weights ----
  // Both run the same GEMM calls on the same data; they differ only in rounding (exp,
  // the order of the mean's sum), so the tolerances are a few float ulps grown over steps.
  {
    constexpr int check_steps = 10;
    constexpr double loss_tol = 1e-5, update_tol = 1e-4;
    reset_gradus();
    reset_hand();
    double worst_loss = 0, worst_update = 0;
    float first = 0, last = 0;
    for (int k = 0; k < check_steps; ++k) {
      const float lg = feeds_step(k), lh = hand_step(k);
      if (k == 0) first = lh;
      last = lh;
      const double dl = std::abs(static_cast<double>(lg) - lh) / std::max(1.0, std::abs(static_cast<double>(lh)));
      worst_loss = std::max(worst_loss, dl);
      if (!(dl <= loss_tol))
        fail("gradus' and the hand-written step disagree on the loss at step " + std::to_string(k) + ": " + num(lg) +
             " vs " + num(lh));
      // The update so far (w - w0) of every parameter: the largest difference, relative to
      // the largest update of that parameter.
      for (int i = 0; i < hand_mlp::n_params; ++i) {
        const float* wh = hand.params()[i]->data();
        double diff = 0, scale = 0;
        for (std::size_t j = 0; j < init[i].size(); ++j) {
          const double uh = static_cast<double>(wh[j]) - init[i][j], ug = static_cast<double>(gw[i][j]) - init[i][j];
          diff = std::max(diff, std::abs(ug - uh));
          scale = std::max(scale, std::abs(uh));
        }
        const double rel = diff / std::max(scale, 1e-30);
        worst_update = std::max(worst_update, rel);
        if (!(rel <= update_tol) || scale == 0)
          fail("gradus' and the hand-written step disagree on the update of " + std::string(names[i]) +
               " after step " + std::to_string(k) + ": max difference " + num(diff) +
               ", largest update " + num(scale));
      }
    }
    // And the forward pass alone, on the trained weights (gradus' and the hand-written
    // ones are the same up to the rounding checked above).
    const float fg = gradus_forward(0), fh = hand_forward(0);
    const double df = std::abs(static_cast<double>(fg) - fh) / std::max(1.0, std::abs(static_cast<double>(fh)));
    if (!(df <= 10 * loss_tol))
      fail("gradus' and the hand-written forward pass disagree on the loss: " + num(fg) + " vs " + num(fh));
    if (!(last < first)) fail("the loss did not fall over the checked steps");
    std::printf("check: %d steps from the same weights: loss %.4f -> %.4f; largest difference gradus vs hand: "
                "loss %.1e (relative), updates %.1e (relative to each parameter's largest update)\n",
                check_steps, static_cast<double>(first), static_cast<double>(last), worst_loss, worst_update);
  }

  // ---- what gradus runs per step (its plan), and the hand-written step's count ----
  {
    reset_gradus();
    gradus_forward(0);
    const auto fwd = s.stats();
    feeds_step(0);
    const auto stp = s.stats();
    auto describe = [](const g::graph_stats& st) {
      std::string r;
      for (const char* op : st.trace) r += std::string(r.empty() ? "" : " ") + op;
      return std::to_string(st.trace.size()) + " steps: " + std::to_string(st.count("matmul")) + " GEMM, " +
             std::to_string(st.fused_passes) + " fused passes, " + std::to_string(st.kernels - st.count("matmul")) +
             " other kernels, " + std::to_string(st.views) + " views [" + r + "]";
    };
    std::printf("gradus forward plan: %s\n", describe(fwd).c_str());
    std::printf("gradus step plan:    %s; then %d optimizer passes\n", describe(stp).c_str(), hand_mlp::n_params);
    std::printf("hand-written step:   8 GEMM, 2 bias+ReLU loops, 1 softmax-xent row loop (bias, loss, "
                "gradient, bias gradient), 2 ReLU'-mask+column-sum loops, %d SGD loops\n\n",
                hand_mlp::n_params);
  }

  // ---- timing: every sample restores the initial weights (untimed), then runs `steps`
  // steps; each step is timed too, for the median of single steps ----
  const bench::background_load load;
  struct row {
    const char* label;
    std::vector<double> single{};
    float last = 0;
  };
  std::array<row, 4> rows = {row{"(a) gradus forward: `s.run(loss, x = ..., y = ...)`"},
                             row{"(b) gradus step: `g::minimize(s, loss, g::sgd{...}, w1, ..., b3).run(...)`"},
                             row{"(c) hand-written step: cblas_sgemm + OpenMP loops"},
                             row{"(d) hand-written forward (reference)"}};
  auto timed = [&](row& r, auto&& one) {
    return [&r, one, steps] {
      for (int i = 0; i < steps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        r.last = one(i);
        r.single.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    };
  };
  std::vector<bench::candidate> cs;
  cs.push_back({"gradus forward", timed(rows[0], gradus_forward), {}, reset_gradus});
  cs.push_back({"gradus step", timed(rows[1], feeds_step), {}, reset_gradus});
  cs.push_back({"hand step", timed(rows[2], hand_step), {}, reset_hand});
  cs.push_back({"hand forward", timed(rows[3], hand_forward), {}, reset_hand});
  bench::run_interleaved(cs, rounds, 1);
  for (const auto& r : rows)
    if (!std::isfinite(r.last)) fail(std::string("non-finite loss in ") + r.label);

  std::vector<double> ms(cs.size()), ms_single(cs.size());
  for (std::size_t i = 0; i < cs.size(); ++i) {
    ms[i] = 1e3 * bench::median(cs[i].seconds) / steps;
    // drop the warm-up sample's steps
    std::vector<double> timed_steps(rows[i].single.begin() + steps, rows[i].single.end());
    ms_single[i] = 1e3 * bench::median(timed_steps);
  }
  std::printf("| implementation | median ms/step (sample means) | median ms (single steps) |\n|---|---:|---:|\n");
  for (std::size_t i = 0; i < cs.size(); ++i) std::printf("| %s | %.3f | %.3f |\n", rows[i].label, ms[i], ms_single[i]);
  std::printf("\n| ratio | sample means | single steps | target |\n|---|---:|---:|---:|\n");
  std::printf("| gradus step / gradus forward (b/a) | %.2f | %.2f | <= 3 |\n", ms[1] / ms[0], ms_single[1] / ms_single[0]);
  std::printf("| gradus step / hand-written step (b/c) | %.3f | %.3f | <= 1.1 |\n", ms[1] / ms[2],
              ms_single[1] / ms_single[2]);
  std::printf("| hand step / hand forward (c/d) | %.2f | %.2f | |\n", ms[2] / ms[3], ms_single[2] / ms_single[3]);
  std::printf("| gradus forward / hand forward (a/d) | %.3f | %.3f | |\n", ms[0] / ms[3], ms_single[0] / ms_single[3]);
  std::printf("\nother processes used %.0f%% of the machine's CPU time during the timed runs\n", load.percent());
  return 0;
}
