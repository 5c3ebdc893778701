#pragma once
// The data-parallel options every training example takes, and the communicator they name:
//   --comm auto|local|ring|ps|mpi   auto (the default: what the environment describes, see
//                          resolve_comm), one process, a ring all-reduce between the processes that
//                          gradus-run, torchrun, srun, mpirun or a TF_CONFIG describe, or
//                          their parameter servers (ps tasks: gradus-run --ps M, GRADUS_PS,
//                          TF_CONFIG cluster.ps; a ps task serves (serve_if_ps) and ends),
//                          or MPI_Allreduce between the processes of mpirun / srun --mpi
//                          (gradus::mpi_allreduce: only in a build with MPI, where CMake
//                          defines GRADUS_HAVE_MPI; this is the one file that tests it)
//   --consistency C        --comm ps: async | bsp | ssp:S (stale-synchronous, bound S)
//   --slow-rank R --slow-ms MS   rank R sleeps MS ms in every step (a straggler, for
//                          benchmarks and tests; R = -2: every rank)
//   --slow-prob P          ... in a step with probability P (transient stragglers)
//   --comm-timeout S       how long any one wait of a collective may last
//   --comm-transport T     the ring's data path (auto | shm | tcp | zmq)
//   --comm-compress C      the ring's gradient compression (none | fp16 | bf16)
//   --bucket-mb M          MiB of gradients all-reduced together
//   --check-replicas N     compare the replicas' bits every N steps (and always at the end)
//   --check-numerics       stop at the first NaN or infinity, naming the node, the
//                          variable or gradient and the step (session::set_check_numerics)
//   --trace FILE           this process's timeline, a Chrome Trace Event file (util/trace.hpp):
//                          the graph's kernels, the step's parts, the all-reduces; the last
//                          --trace-steps steps (default: GRADUS_TRACE, which gradus-run --trace
//                          DIR sets to a file per process there)
// An example builds its step with g::parallel::minimize(comm, data_parallel_options(o), ...),
// trains on its rank's share of the data, and lets rank 0 report.
//
// Compiled once: what the options name (the ring, the parameter server and its server, MPI,
// the cluster spec) is built in examples/comm_options.cpp, one translation unit that every
// example links (CMake's gradus_examples_common), and reaches the example through
// parallel::any_communicator (the policy's collectives, and for ps its key-value store), one
// virtual call per collective, push or pull. The communicator stack is 60% of
// an example's object code when each example compiles it; here an example compiles its
// model, its training loop and the data-parallel step (docs/compile-time.md).
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "example_backend.hpp"  // first: cpu_simd.hpp quiets g++ 12's AVX-512 intrinsics warnings
#include <gradus/gradus.hpp>
#include <gradus/parallel/communicator.hpp>
#include <gradus/parallel/data_parallel.hpp>  // after gradus.hpp, which it builds on

namespace CLI {
class App;
}

namespace gradus_examples {

namespace g = gradus;

struct comm_options {
  std::string comm = "auto";     // auto | local | ring | ps | mpi (auto: resolve_comm)
  double comm_timeout = 30;      // seconds any one wait of a collective may last
  std::int64_t bucket_mb = 25;   // gradient bucket size of the data-parallel step
  // the ring's data path: auto (shared memory between ranks of one host, direct TCP between
  // hosts) | shm | tcp | zmq (ZeroMQ: the data path before shm and direct TCP existed)
  std::string transport = "auto";
  std::string compress = "none";  // the ring's gradient compression: none | fp16 | bf16
  bool check_numerics = false;   // session::set_check_numerics
  std::int64_t check_replicas = 0;  // data_parallel_options::check_replicas_every
  std::string consistency = "bsp";  // --comm ps: async | bsp | ssp:S
  int slow_rank = -1;               // this rank sleeps slow_ms in every step (-2: every rank)
  double slow_ms = 0;
  double slow_prob = 1;             // ... in a step with this probability (transient stragglers)
  mutable std::uint64_t slow_draws = 0;
  std::string trace;                // --trace: the timeline's file (empty: no timeline)
  std::int64_t trace_steps = 100;   // --trace-steps: the steps the timeline keeps

  // The straggler's pause, once per step (a no-op on every other rank). With slow_prob < 1
  // a step pauses at random (a splitmix64 draw of rank and step: reproducible, and
  // independent across ranks) — where SSP should beat BSP, which waits for every pause.
  void maybe_slow(int rank) const {
    if ((rank != slow_rank && slow_rank != -2) || slow_ms <= 0) return;
    if (slow_prob < 1) {
      std::uint64_t z = (static_cast<std::uint64_t>(rank) << 40) + slow_draws++ + 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      if (static_cast<double>(z >> 11) * 0x1.0p-53 >= slow_prob) return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<std::int64_t>(slow_ms * 1000)));
  }
};

// --comm and the options after it (above), with their checks.
void add_comm_options(CLI::App& app, comm_options& o);

// --trace FILE: starts this process's timeline (a recorder installed until the program
// ends, its file written once now, so that a directory that is not there fails at once, then
// every two seconds at a step boundary and at the end). The events' pid is the worker's rank
// (a parameter-server task's: 1000 + its index). add_comm_options calls it once the command
// line is read; a file that cannot be written is a usage error naming it.
void start_trace(const comm_options& o);

// --comm auto (the default) made concrete from the environment's cluster spec: local outside a
// cluster (no spec, or a world of one), ps where the spec has ps tasks, mpi under mpirun in a
// build with MPI, else ring; the launched processes train together as torchrun's, Horovod's
// and MultiWorkerMirroredStrategy's do. A spec that does not parse leaves it auto, and
// make_communicator throws its error. add_comm_options calls it once the command line is read.
void resolve_comm(comm_options& o);

// The communicator --comm names; for ring, the world comes from the environment
// (cluster::from_env: TF_CONFIG, torchrun's, Slurm's, OpenMPI's variables or GRADUS_CLUSTER).
g::parallel::any_communicator make_communicator(const comm_options& o);

// A ps task of the cluster (gradus-run --ps, GRADUS_ROLE=ps, a TF_CONFIG task of type
// "ps") serves the variables until the chief ends the job and returns its exit status;
// a worker gets nothing and goes on. Every training example calls it first, so one
// program is both (TensorFlow's server.join()); a ps process never loads the data.
// restore_checkpoint: the .npz a restarted ps task reloads its shards from (server
// recovery; the MNIST examples pass their --checkpoint); empty: none.
std::optional<int> serve_if_ps(const comm_options& o, const std::string& restore_checkpoint = {});

// The parameter-server tasks the environment's cluster spec names (the JSON line's "servers").
std::size_t cluster_ps_count();

inline g::parallel::data_parallel_options data_parallel_options(const comm_options& o) {
  return {.bucket_bytes = static_cast<std::size_t>(o.bucket_mb) << 20, .overlap = true,
          .check_replicas_every = o.check_replicas};
}

// Rows [begin, end) of n that rank `rank` of `world` trains on: equal contiguous shares (the
// last n % world rows are left out, so that every rank takes the same number of steps).
struct shard_range {
  std::int64_t begin, end;
};
inline shard_range shard_of(std::int64_t n, int rank, int world) {
  const std::int64_t m = n / world;
  if (m == 0)
    throw g::error("gradus: " + std::to_string(n) + " training samples for " + std::to_string(world) + " ranks");
  return {rank * m, (rank + 1) * m};
}

}  // namespace gradus_examples
