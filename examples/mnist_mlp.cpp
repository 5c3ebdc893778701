// MNIST, a 784-256-128-10 ReLU MLP trained with softmax cross-entropy and SGD (lr 0.05,
// momentum 0.9, batch 64) on the real data set (tools/fetch-mnist.sh puts it in
// data/mnist/), evaluated on the 10,000 test images after every epoch.
//
//   mnist_mlp [--data DIR] [--epochs N] [--batch B] [--threads T] [--seed S] [--lr LR]
//             [--momentum M] [--metrics FILE.csv] [--plot FILE.svg] [--checkpoint FILE.npz
//             [--resume]] [--train-limit N] [--precision fp32|bf16|fp16] [--quiet] [--json]
//
// The loop, the options they share and the JSON line are examples/mnist_common.hpp's; with
// --stages S (2 or 3) or --micro-batches M it trains as a pipeline (examples/mnist_pipeline.hpp):
//   gradus-run -np 2 mnist_mlp --comm ring --stages 2 --micro-batches 4 --schedule 1f1b
#include <cstdint>
#include <string>

#include "mnist_pipeline.hpp"  // (first: example_backend.hpp)
#include "mnist_mlp_model.hpp"

namespace g = gradus;
namespace gx = gradus_examples;

int main(int argc, char** argv) {
  gx::mnist_options o;
  double lr = 0.05, momentum = 0.9;
  if (const auto rc = gx::parse_command_line(argc, argv, "MNIST 784-256-128-10 ReLU MLP, softmax cross-entropy, SGD with momentum, trained with gradus.", o, gx::sgd_options(lr, momentum)))
    return *rc;

  return gx::guarded([&] {
    if (const auto rc = gx::serve_if_ps(o)) return *rc;  // a ps task serves and ends
    const gx::mnist_data data = gx::load_mnist(o);
    g::placeholder<"x", float, g::dyn, 784> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    const gx::mnist_mlp_model m;  // examples/mnist_mlp_model.hpp: mnist_infer's model too
    // fc3(relu(fc2(relu(fc1(x))))), cut into --stages balanced stages (1: not cut); what is
    // evaluated is the uncut model for every S (examples/mnist_pipeline.hpp)
    const auto uncut = m.logits<1>(x);
    return gx::with_stages<1, 2, 3>("mnist_mlp", o.stages, [&]<int S>() {
      // --precision bf16 / fp16: the unpipelined model (S = 1) only
      return gx::with_precision<S == 1>("mnist_mlp", o, [&]<class P>() {
        const auto logits = m.template logits<S>(x);
        const auto loss = g::nn::softmax_cross_entropy_loss(logits, y);
        g::session_of<gx::backend, P> s;  // session<gx::backend, P> (spelled for nvcc too)
        s.set_check_numerics(o.check_numerics);
        m.initialize(s, o.seed);
        const auto cut = g::parallel::balanced_cut<S, decltype(m.fc1), decltype(m.fc2), decltype(m.fc3)>().describe();
        return gx::train_mnist_staged<S>("mnist_mlp", o, data, s, loss, uncut, x, y,
                                         g::sgd{.lr = lr, .momentum = momentum}, cut);
      });
    });
  });
}
