#pragma once
// What allreduce_bench (gradus' ring) and mpi_allreduce_bench (MPI_Allreduce) share, so
// that both time the same sizes the same way and print the same table: float buffers of
// 4 KiB ... 64 MiB, summed in place; per size a few untimed runs, then `iterations`
// timed ones, each after a barrier; a run's time is the average over ranks (as
// nccl-tests does), the table gives the median over runs. algbw = bytes / time; busbw =
// algbw * 2(N-1)/N, the bytes each rank's link carries in a ring all-reduce.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace allreduce_bench {

inline std::vector<std::size_t> sizes_bytes() {
  std::vector<std::size_t> s;
  for (std::size_t b = std::size_t{4} << 10; b <= std::size_t{64} << 20; b *= 4) s.push_back(b);
  return s;
}

// More runs for small sizes; at least 10.
inline int iterations(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{512} << 20) / bytes, 10, 200));
}
constexpr int warmup = 3;

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline void print_header(const std::string& title) {
  std::printf("# %s\n", title.c_str());
  std::printf("%12s %10s %6s %12s %12s %12s\n", "bytes", "floats", "runs", "median_us", "algbw_GB/s", "busbw_GB/s");
}

inline void print_row(std::size_t bytes, int world, const std::vector<double>& seconds) {
  const double t = median(seconds);
  const double algbw = static_cast<double>(bytes) / t / 1e9;
  const double busbw = algbw * 2.0 * (world - 1) / world;
  std::printf("%12zu %10zu %6zu %12.1f %12.3f %12.3f\n", bytes, bytes / sizeof(float), seconds.size(), t * 1e6, algbw, busbw);
  std::fflush(stdout);
}

}  // namespace allreduce_bench
