// Must not compile: <0, 0> is not a permutation of a rank-2 operand's axes.
#include <gradus/gradus.hpp>

int main() {
  gradus::variable<"a", float, 2, 3> a;
  auto t = gradus::permute<0, 0>(a);
  (void)t;
}
