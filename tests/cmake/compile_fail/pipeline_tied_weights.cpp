// Must not compile: a pipeline whose stages 0 and 1 both read the variable w (tied weights:
// each stage would update its own copy with its part of the gradient).
#include <gradus/gradus.hpp>
#include <gradus/parallel/pipeline/stage_graph.hpp>

struct no_backend {};

int main() {
  gradus::placeholder<"x", float, gradus::dyn, 4> x;
  gradus::variable<"w", float, 4, 4> w;
  const auto h = gradus::on<gradus::stage<0>>(gradus::matmul(x, w));
  const auto loss = gradus::on<gradus::stage<1>>(gradus::sum(gradus::matmul(h, w)));
  using stage = gradus::parallel::stage_graph<no_backend, 0, 2, decltype(loss)>;
  (void)sizeof(stage);
}
