// Must not compile: stage 1 is placed on CUDA device 0 and its session is a cpu_simd one (what
// a build without the CUDA backend can give it): pipeline_in_process names the mismatch.
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/parallel/pipeline/in_process.hpp>

int main() {
  namespace g = gradus;
  g::placeholder<"x", float, g::dyn, 4> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"a", 4, 8> a;
  g::nn::dense<"b", 8, 2> b;
  const auto h = g::on<g::device::cpu>(g::relu(a(x)));
  const auto loss = g::on<g::device::cuda<0>>(g::nn::softmax_cross_entropy_loss(b(h), y));
  g::session<g::cpu_simd> s0, s1;
  auto step = g::parallel::pipeline_in_process<2>({}, loss, g::sgd{.lr = 0.1}, s0, s1);
  (void)step;
}
