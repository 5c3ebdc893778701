// One rank of gradus' ring all-reduce benchmark: float buffers of 4 KiB ... 64 MiB summed
// over N processes (see allreduce_bench_common.hpp for how it times). Started N times by
// allreduce_vs_mpi.sh (or any launcher) with
//   RANK, WORLD_SIZE                  this process' rank and the number of ranks
//   GRADUS_RENDEZVOUS                 e.g. tcp://127.0.0.1:29500 or ipc:///tmp/x/rdv
//   GRADUS_TRANSPORT                  auto | shm | tcp | zmq | zmq-tcp | zmq-ipc (default auto)
//   GRADUS_SEGMENT_BYTES              optional, default 1 MiB
// Rank 0 prints the table. The result of a last run is checked on every rank.
#include <gradus/comm/ring.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "allreduce_bench_common.hpp"

namespace {
std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}
}  // namespace

int main() try {
  gradus::ring_options o;
  o.rank = std::stoi(env("RANK", "0"));
  o.world_size = std::stoi(env("WORLD_SIZE", "1"));
  o.rendezvous = env("GRADUS_RENDEZVOUS", "");
  o.transport = env("GRADUS_TRANSPORT", "auto");
  o.segment_bytes = std::stoul(env("GRADUS_SEGMENT_BYTES", "1048576"));
  o.small_bytes = std::stoul(env("GRADUS_SMALL_BYTES", std::to_string(o.small_bytes).c_str()));
  o.timeout = std::chrono::seconds(60);
  gradus::ring_allreduce comm(o);
  const int N = comm.world_size();
  if (comm.rank() == 0)
    allreduce_bench::print_header("gradus ring_allreduce, N=" + std::to_string(N) + ", transport " + comm.transport() +
                                  ", segment " + std::to_string(o.segment_bytes) + " bytes");
  for (const std::size_t bytes : allreduce_bench::sizes_bytes()) {
    std::vector<float> x(bytes / sizeof(float), 0.f);  // zeros: sums stay finite however often they repeat
    const int runs = allreduce_bench::iterations(bytes);
    std::vector<double> t(static_cast<std::size_t>(runs));
    for (int i = 0; i < allreduce_bench::warmup + runs; ++i) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      comm.allreduce_sum(std::span<float>(x));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i >= allreduce_bench::warmup) t[i - allreduce_bench::warmup] = s;
    }
    comm.allreduce_average(std::span<double>(t));  // each run's time averaged over ranks
    if (comm.rank() == 0) allreduce_bench::print_row(bytes, N, t);
    // Check: rank r contributes r+1 everywhere.
    std::fill(x.begin(), x.end(), static_cast<float>(comm.rank() + 1));
    comm.allreduce_sum(std::span<float>(x));
    const float want = static_cast<float>(N * (N + 1) / 2);
    for (std::size_t i = 0; i < x.size(); i += 997)
      if (x[i] != want) {
        std::fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", comm.rank(), i, x[i], want);
        return 1;
      }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "allreduce_bench: %s\n", e.what());
  return 1;
}
