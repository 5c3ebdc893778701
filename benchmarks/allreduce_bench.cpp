// One rank of gradus' ring all-reduce benchmark: float buffers of 4 KiB ... 64 MiB summed
// over N processes (see allreduce_bench_common.hpp for how it times). Started N times by
// allreduce_vs_mpi.sh (or any launcher) with
//   RANK, WORLD_SIZE                  this process' rank and the number of ranks
//   GRADUS_RENDEZVOUS                 e.g. tcp://127.0.0.1:29500 or ipc:///tmp/x/rdv
//   GRADUS_TRANSPORT                  auto | shm | tcp | zmq | zmq-tcp | zmq-ipc (default auto)
//   GRADUS_SEGMENT_BYTES              optional, default 1 MiB
// Rank 0 prints the table. The result of a last run is checked on every rank.
//
// allreduce_bench --p2p (WORLD_SIZE=2): a ping-pong between ranks 0 and 1 through
// send / recv (the point-to-point mesh, ZeroMQ over ipc on one host, or tcp with
// GRADUS_TRANSPORT=zmq-tcp) for 4 KiB, 1 MiB and 16 MiB of bytes, against the same round trip
// as two ring broadcasts (0 -> 1, then 1 -> 0) over the ring's data path (shared memory under
// "auto" on one host). Per size: 3 untimed round trips, then `iterations` timed ones, each
// after a barrier; one-way time = round trip / 2 on rank 0; the median and bytes / that time.
#include <gradus/comm/ring.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "allreduce_bench_common.hpp"

namespace {
std::string env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// Median one-way seconds of round_trip() over the timed runs, measured on rank 0.
template <class F>
double one_way(gradus::ring_allreduce& comm, int runs, F&& round_trip) {
  std::vector<double> t;
  for (int i = 0; i < allreduce_bench::warmup + runs; ++i) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    round_trip();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i >= allreduce_bench::warmup) t.push_back(s / 2);
  }
  return allreduce_bench::median(t);
}

int ping_pong(gradus::ring_allreduce& comm) {
  if (comm.world_size() != 2) {
    std::fprintf(stderr, "allreduce_bench --p2p: WORLD_SIZE must be 2 (it is %d)\n", comm.world_size());
    return 1;
  }
  const int r = comm.rank(), peer = 1 - r;
  if (r == 0) {
    std::printf("# gradus ring_allreduce point-to-point ping-pong, ranks 0 <-> 1, ring transport %s (the mesh: ZeroMQ %s)\n",
                comm.transport().c_str(), comm.transport() == "zmq-tcp" ? "tcp" : "ipc, on one host");
    std::printf("%12s %6s %12s %12s %12s %12s\n", "bytes", "runs", "p2p_us", "p2p_GB/s", "bcast_us", "bcast_GB/s");
  }
  for (const std::size_t bytes : {std::size_t{4} << 10, std::size_t{1} << 20, std::size_t{16} << 20}) {
    std::vector<std::byte> buf(bytes);
    for (std::size_t i = 0; i < bytes; ++i) buf[i] = static_cast<std::byte>((i * 131 + static_cast<std::size_t>(r)) & 0xff);
    const int runs = allreduce_bench::iterations(bytes);
    const double p2p = one_way(comm, runs, [&] {
      if (r == 0) {
        comm.send(std::span<const std::byte>(buf), peer);
        comm.recv(std::span<std::byte>(buf), peer);
      } else {
        comm.recv(std::span<std::byte>(buf), peer);
        comm.send(std::span<const std::byte>(buf), peer);
      }
    });
    // Check: rank 1 echoes what rank 0 sent.
    if (r == 0)
      for (std::size_t i = 0; i < bytes; i += 4093)
        if (buf[i] != static_cast<std::byte>((i * 131) & 0xff)) {
          std::fprintf(stderr, "rank 0: byte %zu came back changed\n", i);
          return 1;
        }
    const double bcast = one_way(comm, runs, [&] {
      comm.broadcast(std::span<std::byte>(buf), 0);
      comm.broadcast(std::span<std::byte>(buf), 1);
    });
    if (r == 0) {
      std::printf("%12zu %6d %12.1f %12.3f %12.1f %12.3f\n", bytes, runs, p2p * 1e6, static_cast<double>(bytes) / p2p / 1e9, bcast * 1e6,
                  static_cast<double>(bytes) / bcast / 1e9);
      std::fflush(stdout);
    }
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) try {
  gradus::ring_options o;
  o.rank = std::stoi(env("RANK", "0"));
  o.world_size = std::stoi(env("WORLD_SIZE", "1"));
  o.rendezvous = env("GRADUS_RENDEZVOUS", "");
  o.transport = env("GRADUS_TRANSPORT", "auto");
  o.segment_bytes = std::stoul(env("GRADUS_SEGMENT_BYTES", "1048576"));
  o.small_bytes = std::stoul(env("GRADUS_SMALL_BYTES", std::to_string(o.small_bytes).c_str()));
  o.timeout = std::chrono::seconds(60);
  gradus::ring_allreduce comm(o);
  if (argc > 1 && std::strcmp(argv[1], "--p2p") == 0) return ping_pong(comm);
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
