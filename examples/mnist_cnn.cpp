// MNIST with LeNet-5: conv 1->6 5x5, ReLU, max-pool 2, conv 6->16 5x5, ReLU, max-pool 2,
// dense 256->120->84->10, softmax cross-entropy, SGD (lr 0.05, momentum 0.9, batch 64), on
// the real data set (tools/fetch-mnist.sh puts it in data/mnist/), evaluated on the 10,000
// test images after every epoch.
//
//   mnist_cnn [--data DIR] [--epochs N] [--batch B] [--threads T] [--seed S] [--lr LR]
//             [--momentum M] [--metrics FILE.csv] [--plot FILE.svg] [--checkpoint FILE.npz
//             [--resume]] [--train-limit N] [--precision fp32|bf16|fp16] [--quiet] [--json]
//
// The images are fed as rows of 784 and seen as [B, 1, 28, 28] inside the graph (a view).
// Each convolution is a conv2d node: oneDNN where gradus was built with it, else im2col
// and one GEMM over the whole batch (graph/ops/conv.hpp, cpu_simd/dnnl.hpp).
#include <cstdint>
#include <string>

#include "mnist_common.hpp"

namespace g = gradus;
namespace gx = gradus_examples;

int main(int argc, char** argv) {
  gx::mnist_options o;
  double lr = 0.05, momentum = 0.9;
  if (const auto rc = gx::parse_command_line(argc, argv, "MNIST LeNet-5 (two 5x5 convolutions, max-pooling, three dense layers), SGD with momentum, trained with gradus.", o, gx::sgd_options(lr, momentum)))
    return *rc;

  return gx::guarded([&] {
    if (const auto rc = gx::serve_if_ps(o)) return *rc;  // a ps task serves and ends
    const gx::mnist_data data = gx::load_mnist(o);
    g::placeholder<"x", float, g::dyn, 784> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::conv2d<"conv1", 1, 6, 5> conv1;    // [B,1,28,28] -> [B,6,24,24]
    g::nn::conv2d<"conv2", 6, 16, 5> conv2;   // [B,6,12,12] -> [B,16,8,8]
    g::nn::dense<"fc1", 256, 120> fc1;
    g::nn::dense<"fc2", 120, 84> fc2;
    g::nn::dense<"fc3", 84, 10> fc3;
    const auto images = g::reshape<g::dyn, 1, 28, 28>(x);
    const auto h1 = g::max_pool2d<2>(g::relu(conv1(images)));  // [B,6,12,12]
    const auto h2 = g::max_pool2d<2>(g::relu(conv2(h1)));      // [B,16,4,4]
    const auto logits = fc3(g::relu(fc2(g::relu(fc1(g::flatten(h2))))));
    const auto loss = g::nn::softmax_cross_entropy_loss(logits, y);

    return gx::with_precision<true>("mnist_cnn", o, [&]<class P>() {
      g::session_of<gx::backend, P> s;  // session<gx::backend, P> (spelled for nvcc too)
      s.set_check_numerics(o.check_numerics);
      conv1.initialize(s, o.seed);
      conv2.initialize(s, o.seed);
      fc1.initialize(s, o.seed);
      fc2.initialize(s, o.seed);
      fc3.initialize(s, o.seed, g::init::glorot_uniform{});
      auto comm = gx::make_communicator(o);
      auto step = g::parallel::minimize(comm, gx::data_parallel_options(o), s, loss, g::sgd{.lr = lr, .momentum = momentum});
      return gx::train_mnist("mnist_cnn", o, data, s, step, logits, x, y);
    });
  });
}
