// docs/pipelines.md's pipeline across processes: each rank's communicator, session and placed
// loss, and its batches; `step` for the checkpoint fragment.
#include <cstdint>
#include <utility>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>  // first: it quiets g++ 12's AVX-512 intrinsics warnings
#include <gradus/comm/ring.hpp>
#include <gradus/gradus.hpp>
#include <gradus/parallel/cluster.hpp>
#include <gradus/parallel/pipeline/pipeline.hpp>
// @INCLUDES@
namespace g = gradus;

int main() {
  g::placeholder<"x", float, g::dyn, 784> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"fc1", 784, 256> fc1;
  g::nn::dense<"fc2", 256, 10> fc2;
  const auto h = g::on<g::stage<0>>(g::relu(fc1(x)));
  const auto loss = g::on<g::stage<1>>(g::nn::softmax_cross_entropy_loss(fc2(h), y));
  g::ring_allreduce comm(g::cluster::from_env());
  g::session<g::cpu_simd> s;
  std::vector<float> xv(64 * 784);
  std::vector<std::int32_t> yv(64);
  const auto xb = g::view(xv.data(), {64, 784});
  const auto yb = g::view(yv.data(), {64});
  const std::vector<std::pair<decltype(xb), decltype(yb)>> batches{{xb, yb}};
  // @SNIPPET@
}
