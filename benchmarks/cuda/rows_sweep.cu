// rows_sweep: assign_rows_fn's elements per thread (U) on rows of L floats, y = a*b + c,
// through g::cuda::for_n and through a plain launch of one call a thread, against cudaMemcpy
// D2D; medians of 21 (CUDA events). A one-off experiment, not a CMake target: built by hand
// with bench_cuda's nvcc flags (results: benchmarks/results/cuda-rows-sweep-h200-2026-11-27.md).
// When it ran, for_n was Thrust's for_each_n; for_n now launches the plain kernel itself,
// so both rows measure the same launch.
#include <gradus/backends/cuda.hpp>
#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>
namespace g = gradus;
static double time_ms(int reps, const std::function<void()>& f) {
  cudaStream_t st = g::cuda::stream();
  cudaEvent_t a, b;
  cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, st); f(); cudaEventRecord(b, st); cudaEventSynchronize(b);
    float ms = 0; cudaEventElapsedTime(&ms, a, b); t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
template <class F>
__global__ void launch32(F f, unsigned n) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) f(static_cast<g::index_t>(i));
}
template <class F>
static void run32(g::index_t n, const F& f) {
  launch32<<<static_cast<unsigned>((n + 255) / 256), 256, 0, g::cuda::stream()>>>(f, static_cast<unsigned>(n));
}
template <int U, class Plan>
static void own(float* y, const g::loop_shape& ls, const Plan& plan, double bw_copy, std::size_t n, int row_len) {
  const g::index_t width = ((row_len + U - 1) / U + 31) / 32 * 32;
  const double t = time_ms(21, [&] { run32(ls.rows() * width, g::cuda_kernels::assign_rows_fn<float, Plan, U>{y, ls, plan, width}); });
  const double bw = 16.0 * n / t / 1e6;
  std::printf("| rows of %d | U = %d, own launch | %.0f GB/s | %.2f |\n", row_len, U, bw, bw / bw_copy);
}
template <int U, class Plan>
static void one(float* y, const g::loop_shape& ls, const Plan& plan, double bw_copy, std::size_t n, int row_len) {
  const g::index_t width = ((row_len + U - 1) / U + 31) / 32 * 32;
  const double t = time_ms(21, [&] { g::cuda::for_n(ls.rows() * width, g::cuda_kernels::assign_rows_fn<float, Plan, U>{y, ls, plan, width}); });
  const double bw = 16.0 * n / t / 1e6;
  std::printf("| rows of %d | U = %d | %.0f GB/s | %.2f |\n", row_len, U, bw, bw / bw_copy);
}
int main() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return 77;
  const std::size_t n = std::size_t(1) << 26;
  auto dev = [&](float v) { float* p = static_cast<float*>(g::cuda::allocate(n * 4)); std::vector<float> h(n, v); g::cuda::copy_to_device(p, h.data(), n * 4); return p; };
  float *a = dev(1.5f), *b = dev(2.f), *c = dev(.5f), *y = dev(0.f);
  const double t_copy = time_ms(21, [&] { cudaMemcpyAsync(y, a, n * 4, cudaMemcpyDeviceToDevice, g::cuda::stream()); });
  const double bw_copy = 8.0 * n / t_copy / 1e6;
  std::printf("copy %.0f GB/s\n| rows | U | GB/s | vs copy |\n|---|---|---|---|\n", bw_copy);
  using leaf = g::leaf_plan<float>;
  for (int len : {4099, 130, 100003}) {
    g::loop_shape ls; ls.rank = 2; ls.d[0] = static_cast<g::index_t>(n / len); ls.d[1] = len;
    const leaf la{a, {len, 1}, a, 1}, lb{b, {len, 1}, b, 1}, lc{c, {len, 1}, c, 1};
    const g::binary_plan<g::fn::add, g::binary_plan<g::fn::mul, leaf, leaf>, leaf> plan{{}, {{}, la, lb}, lc};
    const std::size_t m = static_cast<std::size_t>(ls.d[0]) * len;
    one<1>(y, ls, plan, bw_copy, m, len); one<2>(y, ls, plan, bw_copy, m, len); one<4>(y, ls, plan, bw_copy, m, len);
    one<8>(y, ls, plan, bw_copy, m, len);
    own<1>(y, ls, plan, bw_copy, m, len); own<2>(y, ls, plan, bw_copy, m, len); own<4>(y, ls, plan, bw_copy, m, len); own<8>(y, ls, plan, bw_copy, m, len);
    {
      const double t1 = time_ms(21, [&] { run32(static_cast<g::index_t>(m), g::cuda_kernels::assign_fn<float, decltype(plan)>{y, ls, plan}); });
      std::printf("| rows of %d | one element, own launch | %.0f GB/s | %.2f |\n", len, 16.0 * m / t1 / 1e6, 16.0 * m / t1 / 1e6 / bw_copy);
    }
    const double t_one = time_ms(21, [&] { g::cuda::for_n(static_cast<g::index_t>(m), g::cuda_kernels::assign_fn<float, decltype(plan)>{y, ls, plan}); });
    std::printf("| rows of %d | one element | %.0f GB/s | %.2f |\n", len, 16.0 * m / t_one / 1e6, 16.0 * m / t_one / 1e6 / bw_copy);
  }
  return 0;
}
