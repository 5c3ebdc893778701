// Must not compile: a double tensor fed to a float placeholder.
#include <gradus/gradus.hpp>
#include <vector>

int main() {
  gradus::placeholder<"x", float, gradus::dyn> x;
  std::vector<double> v(4);
  auto f = (x = gradus::view(v.data(), {4}));
  (void)f;
}
