// bench_cuda: gradus::cuda's kernels against the library or the hardware called directly,
// on one GPU, in the same run. Medians of `reps` timed calls (CUDA events), after warm-up.
//
//   elementwise  y = a * b + c (one fused pass, 16 bytes per element moved: the 16-byte
//                kernel), the same with rows of 4099 (not a multiple of 4: the strided-row
//                kernel, and the one-element kernel it replaced there, called directly)
//                against cudaMemcpy device to device (8 bytes per element): effective
//                bandwidths
//   sgemm        g::cuda::gemm (row-major, through cuBLAS) against cublasSgemm
//   conv         g::cuda::conv2d (descriptors and heuristics per call) against
//                cudnnConvolutionForward with the same algorithm, descriptors made once
//
//   bench_cuda [reps]        (targets: elementwise >= 0.8x copy bandwidth; GEMM and conv
//                             within 5% of the library)
//
// Without a device it says so and exits 77.
#include <gradus/backends/cuda.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace g = gradus;

namespace {

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// median milliseconds of f() over reps calls on the calling thread's stream
double time_ms(int reps, const std::function<void()>& f) {
  cudaStream_t st = g::cuda::stream();
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "cudaEventCreate");
  ok(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    ok(cudaEventRecord(a, st), "record");
    f();
    ok(cudaEventRecord(b, st), "record");
    ok(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

float* device_floats(std::size_t n, float v) {
  float* p = static_cast<float*>(g::cuda::allocate(n * sizeof(float)));
  std::vector<float> h(n, v);
  g::cuda::copy_to_device(p, h.data(), n * sizeof(float));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("bench_cuda: no CUDA device: nothing measured\n");
    return 77;
  }
  g::cuda::context ctx;  // a stream of its own, as a session has
  const auto bound = g::cuda::bind(ctx);
  const int reps = argc > 1 ? std::atoi(argv[1]) : 21;
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int runtime = 0, driver = 0, blas_major = 0, blas_minor = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  cublasGetProperty(MAJOR_VERSION, &blas_major);
  cublasGetProperty(MINOR_VERSION, &blas_minor);
  std::printf("device: %s, %d SMs; CUDA runtime %d, driver API %d, cuBLAS %d.%d, cuDNN %zu; medians of %d calls\n\n",
              prop.name, prop.multiProcessorCount, runtime, driver, blas_major, blas_minor, cudnnGetVersion(), reps);
  std::printf("| benchmark | gradus | peer | ratio (gradus / peer, speed) |\n|---|---|---|---|\n");

  {  // elementwise
    const std::size_t n = std::size_t(1) << 26;
    float *a = device_floats(n, 1.5f), *b = device_floats(n, 2.f), *c = device_floats(n, 0.5f), *y = device_floats(n, 0.f);
    using leaf = g::leaf_plan<float>;
    const leaf la{a, {1}, a, 1}, lb{b, {1}, b, 1}, lc{c, {1}, c, 1};
    const g::binary_plan<g::fn::add, g::binary_plan<g::fn::mul, leaf, leaf>, leaf> plan{{}, {{}, la, lb}, lc};
    g::loop_shape ls;
    ls.rank = 1;
    ls.d[0] = static_cast<g::index_t>(n);
    const double t_fused = time_ms(reps, [&] { g::cuda::assign(y, ls, plan); });
    const double t_copy = time_ms(reps, [&] {
      ok(cudaMemcpyAsync(y, a, n * sizeof(float), cudaMemcpyDeviceToDevice, g::cuda::stream()), "memcpy");
    });
    g::loop_shape odd;  // rows of 4099 floats: not 16-byte multiples
    odd.rank = 2;
    odd.d[0] = static_cast<g::index_t>(n / 4099);
    odd.d[1] = 4099;
    const leaf la2{a, {4099, 1}, a, 1}, lb2{b, {4099, 1}, b, 1}, lc2{c, {4099, 1}, c, 1};
    const g::binary_plan<g::fn::add, g::binary_plan<g::fn::mul, leaf, leaf>, leaf> plan2{{}, {{}, la2, lb2}, lc2};
    const double t_odd = time_ms(reps, [&] { g::cuda::assign(y, odd, plan2); });
    const std::size_t n_odd = static_cast<std::size_t>(odd.d[0] * odd.d[1]);
    const double t_one = time_ms(reps, [&] {
      g::cuda::for_n(static_cast<g::index_t>(n_odd), g::cuda_kernels::assign_fn<float, decltype(plan2)>{y, odd, plan2});
    });
    const double bw_fused = 16.0 * n / t_fused / 1e6, bw_copy = 8.0 * n / t_copy / 1e6;  // GB/s
    const double bw_odd = 16.0 * n_odd / t_odd / 1e6, bw_one = 16.0 * n_odd / t_one / 1e6;
    std::printf("| y = a*b + c, 2^26 floats (16 bytes per thread) | %.0f GB/s | cudaMemcpy D2D %.0f GB/s | %.2f |\n",
                bw_fused, bw_copy, bw_fused / bw_copy);
    std::printf("| y = a*b + c, rows of 4099 floats (%d elements per thread, strided) | %.0f GB/s | cudaMemcpy D2D %.0f GB/s | %.2f |\n",
                g::cuda_kernels::rows_per_thread, bw_odd, bw_copy, bw_odd / bw_copy);
    std::printf("| the same, 1 element per thread (the kernel it replaced) | %.0f GB/s | cudaMemcpy D2D %.0f GB/s | %.2f |\n",
                bw_one, bw_copy, bw_one / bw_copy);
    for (float* p : {a, b, c, y}) g::cuda::deallocate(p);
  }
  {  // sgemm
    const g::index_t m = 4096, n = 4096, k = 4096;
    float *a = device_floats(m * k, 0.01f), *b = device_floats(k * n, 0.02f), *c = device_floats(m * n, 0.f);
    const double t_g = time_ms(reps, [&] { g::cuda::gemm(false, false, m, n, k, 1.f, a, k, 0, b, n, 0, 0.f, c, n, 0, g::index_t(1)); });
    cublasHandle_t h;
    cublasCreate(&h);
    cublasSetStream(h, g::cuda::stream());
    const float one = 1, zero = 0;
    const double t_c = time_ms(reps, [&] {
      cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(m), int(k), &one, b, int(n), a, int(k), &zero, c, int(n));
    });
    cublasDestroy(h);
    std::printf("| sgemm 4096^3 | %.2f ms (%.1f TFLOP/s) | cublasSgemm %.2f ms | %.3f |\n", t_g, 2e-9 * m * n * k / t_g,
                t_c, t_c / t_g);
    for (float* p : {a, b, c}) g::cuda::deallocate(p);
  }
  {  // conv: ResNet-style 3x3, 64 -> 64 channels, 56x56, batch 32
    const g::index_t nb = 32, ch = 64, hw = 56, o = 64, kk = 3;
    float *x = device_floats(nb * ch * hw * hw, 0.1f), *w = device_floats(o * ch * kk * kk, 0.01f),
          *y = device_floats(nb * o * hw * hw, 0.f);
    const g::conv_geometry geo{nb, ch, hw, hw, o, {kk, kk, 1, 1}};
    const double t_g = time_ms(reps, [&] { g::cuda::conv2d(x, w, geo, y); });
    cudnnHandle_t h;
    cudnnCreate(&h);
    cudnnSetStream(h, g::cuda::stream());
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    cudnnCreateTensorDescriptor(&xd);
    cudnnCreateTensorDescriptor(&yd);
    cudnnCreateFilterDescriptor(&wd);
    cudnnCreateConvolutionDescriptor(&cd);
    cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(nb), int(ch), int(hw), int(hw));
    cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(nb), int(o), int(hw), int(hw));
    cudnnSetFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, int(o), int(ch), int(kk), int(kk));
    cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH);
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int got = 0;
    cudnnGetConvolutionForwardAlgorithm_v7(h, xd, wd, cd, yd, 8, &got, perf);
    std::size_t ws = 0;
    cudnnGetConvolutionForwardWorkspaceSize(h, xd, wd, cd, yd, perf[0].algo, &ws);
    void* work = g::cuda::allocate(ws);
    const float one = 1, zero = 0;
    const double t_c = time_ms(reps, [&] {
      cudnnConvolutionForward(h, &one, xd, x, wd, w, cd, perf[0].algo, work, ws, &zero, yd, y);
    });
    g::cuda::deallocate(work);
    cudnnDestroyConvolutionDescriptor(cd);
    cudnnDestroyFilterDescriptor(wd);
    cudnnDestroyTensorDescriptor(yd);
    cudnnDestroyTensorDescriptor(xd);
    cudnnDestroy(h);
    std::printf("| conv 3x3 64->64, 32x56x56 | %.3f ms | cudnnConvolutionForward %.3f ms | %.3f |\n", t_g, t_c, t_c / t_g);
    for (float* p : {x, w, y}) g::cuda::deallocate(p);
  }
  return 0;
}
