// Must not compile: stage 0's subexpression reads stage 1's output (stages only read earlier ones).
#include <gradus/gradus.hpp>

int main() {
  gradus::placeholder<"x", float, gradus::dyn, 4> x;
  gradus::variable<"w", float, 4, 4> w;
  const auto later = gradus::on<gradus::stage<1>>(gradus::matmul(x, w));
  const auto h = gradus::on<gradus::stage<0>>(gradus::relu(later));
  (void)h;
}
