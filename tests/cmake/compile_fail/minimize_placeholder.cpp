// Must not compile: minimize() over a placeholder (only variables are trained).
#include <gradus/gradus.hpp>

struct no_backend {};

int main() {
  gradus::placeholder<"x", float, 3> x;
  gradus::variable<"w", float, 3> w;
  auto loss = gradus::sum(x * w);
  using step = gradus::train_step<no_backend, gradus::sgd, decltype(loss), decltype(w), decltype(x)>;
  step* p = nullptr;
  (void)sizeof(*p);
}
