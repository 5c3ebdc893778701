#pragma once
// main() of a Boost.Test program built by nvcc to run on a GPU (BOOST_TEST_NO_MAIN,
// BOOST_TEST_DYN_LINK): without a CUDA device it says why and exits 77, which CTest and
// tools/gpu-check.sh report as skipped; with one it names the device and runs the cases.
// Included once, at the end of the program's one translation unit.
#include <boost/test/unit_test.hpp>

#include <cuda_runtime.h>

#include <cstdio>

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("skipped: no CUDA device (cudaGetDeviceCount: %s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
    std::printf("device 0: %s, compute capability %d.%d, %d SMs, %.1f GiB\n", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1u << 30));
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}
