// Must not compile: 2*3 elements cannot become 4*2.
#include <gradus/gradus.hpp>

int main() {
  gradus::variable<"a", float, 2, 3> a;
  auto r = gradus::reshape<4, 2>(a);
  (void)r;
}
