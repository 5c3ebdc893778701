// The peer of allreduce_bench: MPI_Allreduce (in place, MPI_FLOAT, MPI_SUM) over the same
// sizes, timed the same way (allreduce_bench_common.hpp). Run under mpirun, e.g.
//   mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,tcp   mpi_allreduce_bench
//   mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader mpi_allreduce_bench
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "allreduce_bench_common.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, N = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &N);
  const std::string label = argc > 1 ? argv[1] : "";
  if (rank == 0) allreduce_bench::print_header("MPI_Allreduce, N=" + std::to_string(N) + (label.empty() ? "" : ", " + label));
  int rc = 0;
  for (const std::size_t bytes : allreduce_bench::sizes_bytes()) {
    const int count = static_cast<int>(bytes / sizeof(float));
    std::vector<float> x(static_cast<std::size_t>(count), 0.f);
    const int runs = allreduce_bench::iterations(bytes);
    std::vector<double> t(static_cast<std::size_t>(runs));
    for (int i = 0; i < allreduce_bench::warmup + runs; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      MPI_Allreduce(MPI_IN_PLACE, x.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= allreduce_bench::warmup) t[static_cast<std::size_t>(i - allreduce_bench::warmup)] = s;
    }
    MPI_Allreduce(MPI_IN_PLACE, t.data(), runs, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (auto& s : t) s /= N;
    if (rank == 0) allreduce_bench::print_row(bytes, N, t);
    std::fill(x.begin(), x.end(), static_cast<float>(rank + 1));
    MPI_Allreduce(MPI_IN_PLACE, x.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (std::size_t i = 0; i < x.size(); i += 997)
      if (x[i] != static_cast<float>(N * (N + 1) / 2)) rc = 1;
  }
  MPI_Finalize();
  return rc;
}
