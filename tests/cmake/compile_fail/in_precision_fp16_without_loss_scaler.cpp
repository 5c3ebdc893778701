// Must not compile: a subexpression put in fp16 (in_precision<g::f16>) in a session whose
// policy does not scale the loss (small gradients underflow fp16): the planner names it.
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

int main() {
  namespace g = gradus;
  g::placeholder<"x", float, g::dyn, 4> x;
  g::variable<"w", float, 4, 2> w;
  g::session<g::cpu_simd> s;
  std::vector<float> xs(8, 1.0f);
  (void)s.run(g::in_precision<g::f16>(g::matmul(x, w)), x = g::view(xs.data(), {2, 4}));
}
