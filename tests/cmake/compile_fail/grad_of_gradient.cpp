// Must not compile: grad() of a loss that already contains a gradient (a gradient
// penalty, i.e. second order); grad() refuses it with its own static_assert.
#include <gradus/gradus.hpp>

int main() {
  gradus::variable<"w", float, 3> w;
  auto loss = gradus::sum(gradus::tanh(w) * w);
  auto dw = gradus::grad(loss, w);
  auto d2 = gradus::grad(loss + gradus::sum(dw * dw), w);
  (void)d2;
}
