// docs/pipelines.md's in-process pipeline (a CPU stage and a GPU stage): built against
// gradus::cuda_omp, the CUDA backend's kernels on Thrust's OpenMP system.  @CUDA_OMP@
#include <cstdint>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/backends/cuda.hpp>
// @INCLUDES@
namespace g = gradus;

int main() {
  g::placeholder<"x", float, g::dyn, 784> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"fc1", 784, 256> fc1;
  g::nn::dense<"fc2", 256, 10> fc2;
  std::vector<float> xv(64 * 784);
  std::vector<std::int32_t> yv(64);
  const auto xb = g::view(xv.data(), {64, 784});
  const auto yb = g::view(yv.data(), {64});
  // @SNIPPET@
}
