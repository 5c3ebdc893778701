// Must not compile: (2,3) x (4,5), the inner extents 3 and 4 differ.
#include <gradus/gradus.hpp>

int main() {
  gradus::variable<"a", float, 2, 3> a;
  gradus::variable<"b", float, 4, 5> b;
  auto c = gradus::matmul(a, b);
  (void)c;
}
