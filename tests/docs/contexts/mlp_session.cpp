// docs/guide.md's fragments: the MNIST MLP of the guide's first pages, a session and a batch.
#include <cstdint>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/io/npz_array.hpp>
// @INCLUDES@
namespace g = gradus;

int main() {
  g::placeholder<"x", float, g::dyn, 784> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::variable<"w1", float, 784, 256> w1;
  g::variable<"b1", float, 256> b1;
  g::variable<"w2", float, 256, 10> w2;
  g::variable<"b2", float, 10> b2;
  g::session<g::cpu_simd> s;
  std::vector<float> xv(64 * 784);
  std::vector<std::int32_t> yv(64);
  const auto xb = g::view(xv.data(), {64, 784});
  const auto yb = g::view(yv.data(), {64});
  const std::vector<std::pair<decltype(xb), decltype(yb)>> batches{{xb, yb}};
  std::vector<float> data(12);                         // an array to write
  std::vector<gradus::io::npz_array_ref> refs{{"w", "float32", {3, 4}, data.data()}};
  (void)x, (void)y, (void)w1, (void)b1, (void)w2, (void)b2, (void)batches;
  // @SNIPPET@
}
