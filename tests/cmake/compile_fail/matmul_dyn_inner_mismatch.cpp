// The issue-33 case: a batch of any size ([dyn, 784]) times a [785, 10] weight. The
// diagnostic must spell the run-time extent `dyn` (not -1) and name the inner dimensions.
#include <gradus/gradus.hpp>

int main() {
  gradus::placeholder<"x", float, gradus::dyn, 784> x;
  gradus::variable<"w", float, 785, 10> w;
  auto y = gradus::matmul(x, w);
  (void)y;
}
