// Must not compile: float + double; gradus never converts dtypes silently.
#include <gradus/gradus.hpp>

int main() {
  gradus::variable<"a", float, 3, 4> a;
  gradus::variable<"b", double, 3, 4> b;
  auto c = a + b;
  (void)c;
}
