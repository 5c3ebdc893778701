// Must not compile: a loss forced into fp16. A loss is computed in fp32 whatever the
// precision; minimize names the rule and where the scope belongs.
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

int main() {
  namespace g = gradus;
  g::placeholder<"x", float, g::dyn, 4> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::variable<"w", float, 4, 2> w;
  g::session<g::cpu_simd, g::mixed_fp16> s;
  const auto loss = g::nn::softmax_cross_entropy_loss(g::matmul(x, w), y);
  auto step = g::minimize(s, g::in_precision<g::f16>(loss), g::sgd{.lr = 0.1}, w);
  (void)step;
}
