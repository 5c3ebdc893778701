// A page's self-contained fragments: they declare their own model; here only a batch, a list
// of batches, a seed and buffers for the point-to-point examples.
#include <cstdint>
#include <cstdio>
#include <span>
#include <utility>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
// @INCLUDES@
namespace g = gradus;

int main() {
  std::vector<float> xv(64 * 784), activations(64 * 256), gradients(1000);
  std::vector<std::int32_t> yv(64);
  const auto xb = g::view(xv.data(), {64, 784});
  const auto yb = g::view(yv.data(), {64});
  const std::vector<std::pair<decltype(xb), decltype(yb)>> batches{{xb, yb}};
  const std::uint64_t seed = 1, epoch = 0;
  (void)batches, (void)seed, (void)epoch;
  // @SNIPPET@
}
