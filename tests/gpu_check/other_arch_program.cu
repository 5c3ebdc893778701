// A CUDA program built for sm_80 alone (machine code, no PTX): what tests/gpu_check puts in
// a bundle in place of one of its programs, to see tools/gpu-check.sh refuse a bundle built
// for another architecture than the GPU machines' (H100/H200: sm_90).
#include <cstdio>

__global__ void fill(float* p, float v) { p[threadIdx.x] = v; }

int main() {
  float* p = nullptr;
  if (cudaMalloc(&p, 32 * sizeof(float)) != cudaSuccess) {
    std::printf("skipped: no CUDA device\n");
    return 77;
  }
  fill<<<1, 32>>>(p, 1.0f);
  const cudaError_t e = cudaDeviceSynchronize();
  cudaFree(p);
  return e == cudaSuccess ? 0 : 1;
}
