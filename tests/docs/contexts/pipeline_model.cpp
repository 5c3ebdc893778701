// docs/pipelines.md: the placeholders and layers its first program declares, three layers for
// the computed cut, and a batch.
#include <cstdint>
#include <cstdio>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/parallel/pipeline/partition.hpp>
// @INCLUDES@
namespace g = gradus;

int main() {
  g::placeholder<"x", float, g::dyn, 784> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"fc1", 784, 256> fc1;
  g::nn::dense<"fc2", 256, 128> fc2;
  g::nn::dense<"fc3", 128, 10> fc3;
  std::vector<float> xv(64 * 784);
  std::vector<std::int32_t> yv(64);
  const auto xb = g::view(xv.data(), {64, 784});
  const auto yb = g::view(yv.data(), {64});
  (void)x, (void)y, (void)fc1, (void)fc2, (void)fc3, (void)xb, (void)yb;
  // @SNIPPET@
}
