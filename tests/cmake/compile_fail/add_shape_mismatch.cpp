// Must not compile: (3,4) + (5,4) do not broadcast.
#include <gradus/gradus.hpp>

int main() {
  gradus::variable<"a", float, 3, 4> a;
  gradus::variable<"b", float, 5, 4> b;
  auto c = a + b;
  (void)c;
}
