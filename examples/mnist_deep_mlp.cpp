// MNIST through a deep MLP: 784 -> 512, seven 512 -> 512, 512 -> 10, ReLU between, softmax
// cross-entropy, SGD with momentum (lr 0.02, momentum 0.9, batch 64), on the real data set
// (tools/fetch-mnist.sh). 2.2 million weights against 512 activations per example between
// layers: a model whose weights dominate its activations, so a pipeline's stages balance
// and its transfers are small (a 2-stage cut sends 64 x 512 floats per batch each way,
// where data parallelism all-reduces 9 MB of gradients).
//
//   mnist_deep_mlp [--stages S --micro-batches M --schedule gpipe|1f1b [--rematerialize]]
//                  [--epochs N] [--batch B] [--threads T] [--lr LR] [--momentum M] [--precision fp32|bf16|fp16] [--json] ...
//   gradus-run -np 2 build/examples/mnist_deep_mlp --comm ring --stages 2 --micro-batches 8 --threads 1
//
// The stage cut is computed at compile time from the layers' types (parallel::sequential and
// balanced_cut: each layer's 2·In·Out multiply-adds per row), for S = 1 and 2: each stage
// count compiled in costs about as much to compile as the whole model (its S stage graphs),
// so the example builds only those its tests and benchmarks run (add one to with_stages
// below for more). The training loop of a pipeline is examples/mnist_pipeline.hpp's.
#include <cstdint>
#include <string>

#include "mnist_pipeline.hpp"

namespace g = gradus;
namespace gp = gradus::parallel;
namespace gx = gradus_examples;

namespace {
struct deep_mlp {
  g::nn::dense<"in", 784, 512> in;
  g::nn::dense<"h1", 512, 512> h1;
  g::nn::dense<"h2", 512, 512> h2;
  g::nn::dense<"h3", 512, 512> h3;
  g::nn::dense<"h4", 512, 512> h4;
  g::nn::dense<"h5", 512, 512> h5;
  g::nn::dense<"h6", 512, 512> h6;
  g::nn::dense<"h7", 512, 512> h7;
  g::nn::dense<"out", 512, 10> out;
  template <class Backend>
  void initialize(g::session<Backend>& s, std::uint64_t seed) const {
    for_each_hidden([&](const auto& l) { l.initialize(s, seed); });
    out.initialize(s, seed, g::init::glorot_uniform{});
  }
  template <class F>
  void for_each_hidden(F&& f) const {
    f(in), f(h1), f(h2), f(h3), f(h4), f(h5), f(h6), f(h7);
  }
  template <int S, class X>
  auto logits(const X& x) const {
    return gp::sequential<S>(x, [](const auto& h) { return g::relu(h); }, in, h1, h2, h3, h4, h5, h6, h7, out);
  }
  template <int S>
  static std::string cut() {
    return gp::balanced_cut<S, decltype(in), decltype(h1), decltype(h2), decltype(h3), decltype(h4), decltype(h5),
                            decltype(h6), decltype(h7), decltype(out)>()
        .describe();
  }
};
}  // namespace

int main(int argc, char** argv) {
  gx::mnist_options o;
  double lr = 0.02, momentum = 0.9;
  if (const auto rc = gx::parse_command_line(argc, argv,
                                             "MNIST through a deep MLP (784-512x8-10, ReLU), SGD with momentum; "
                                             "--stages S runs it as an S-stage pipeline.",
                                             o, gx::sgd_options(lr, momentum)))
    return *rc;

  return gx::guarded([&] {
    if (const auto rc = gx::serve_if_ps(o)) return *rc;  // a ps task serves and ends
    const gx::mnist_data data = gx::load_mnist(o);
    g::placeholder<"x", float, g::dyn, 784> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    const deep_mlp m;
    const g::sgd opt{.lr = lr, .momentum = momentum};
    const auto uncut = m.logits<1>(x);  // what is evaluated, for every S (examples/mnist_pipeline.hpp)
    return gx::with_stages<1, 2>("mnist_deep_mlp", o.stages, [&]<int S>() {
      // --precision bf16: pipelined too (S stages); fp16: the unpipelined model (S = 1) only
      return gx::with_precision<true, S == 1>("mnist_deep_mlp", o, [&]<class P>() {
        const auto logits = m.logits<S>(x);
        const auto loss = g::nn::softmax_cross_entropy_loss(logits, y);
        g::session_of<gx::backend, P> s;  // session<gx::backend, P> (spelled for nvcc too)
        s.set_check_numerics(o.check_numerics);
        m.initialize(s, o.seed);
        return gx::train_mnist_staged<S, S == 2>("mnist_deep_mlp", o, data, s, loss, uncut, x, y, opt, m.cut<S>());
      });
    });
  });
}
