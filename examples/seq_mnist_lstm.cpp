// Sequential MNIST: each image read as 28 time steps of 28 pixels (one row a step) by an
// LSTM with 128 units; its last hidden state goes through a dense layer to 10 classes.
// Softmax cross-entropy, Adam (lr 1e-3), batch 64, on the real data set
// (tools/fetch-mnist.sh puts it in data/mnist/), evaluated on the 10,000 test images after
// every epoch. With --stages 2 the LSTM and the dense layer are two pipeline stages
// (examples/mnist_pipeline.hpp); --micro-batches M splits each batch.
//
//   seq_mnist_lstm [--data DIR] [--epochs N] [--batch B] [--threads T] [--seed S] [--lr LR]
//                  [--metrics FILE.csv] [--plot FILE.svg] [--checkpoint FILE.npz [--resume]]
//                  [--train-limit N] [--precision fp32|bf16|fp16] [--quiet] [--json]
//
// The LSTM is one fused op over a run-time sequence length (graph/ops/rnn.hpp): the input
// projection of all 28 steps is one GEMM, each step one [B,128]x[128,512] GEMM and a pass
// over the gates, and backpropagation through time is one kernel shared by every gradient.
#include <cstdint>
#include <string>

#include "mnist_pipeline.hpp"

namespace g = gradus;
namespace gx = gradus_examples;

int main(int argc, char** argv) {
  gx::mnist_options o;
  double lr = 1e-3;
  if (const auto rc = gx::parse_command_line(
          argc, argv,
          "Sequential MNIST: an LSTM(128) over the 28 rows of each image, then dense 128->10; Adam; trained with gradus.",
          o, {{"--lr", "Adam's learning rate", &lr, 0.0, 1.0}}))
    return *rc;

  return gx::guarded([&] {
    if (const auto rc = gx::serve_if_ps(o)) return *rc;  // a ps task serves and ends
    const gx::mnist_data data = gx::load_mnist(o);
    g::placeholder<"x", float, g::dyn, 784> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::lstm<"lstm1", 28, 128> lstm1;
    g::nn::dense<"fc", 128, 10> fc;
    return gx::with_stages<1, 2>("seq_mnist_lstm", o.stages, [&]<int S>() {
      // --precision bf16 / fp16: the unpipelined model (S = 1) only
      return gx::with_precision<S == 1>("seq_mnist_lstm", o, [&]<class P>() {
        // [28,B,28] -> [B,128] -> [B,10]; with 2 stages the LSTM is stage 0, the dense layer stage 1
        const auto h = g::last_step(lstm1(g::time_major<28, 28>(x)));
        const auto uncut = fc(h);  // what is evaluated, for every S (examples/mnist_pipeline.hpp)
        const auto logits = [&] {
          if constexpr (S == 1) return uncut;
          else return g::on<g::stage<1>>(fc(g::on<g::stage<0>>(h)));
        }();
        const auto loss = g::nn::softmax_cross_entropy_loss(logits, y);
        g::session_of<gx::backend, P> s;  // session<gx::backend, P> (spelled for nvcc too)
        s.set_check_numerics(o.check_numerics);
        lstm1.initialize(s, o.seed);
        fc.initialize(s, o.seed, g::init::glorot_uniform{});
        return gx::train_mnist_staged<S>("seq_mnist_lstm", o, data, s, loss, uncut, x, y, g::adam{.lr = lr},
                                         S == 1 ? std::string("one stage") : "stage 0: the LSTM; stage 1: the dense layer");
      });
    });
  });
}
