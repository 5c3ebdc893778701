#pragma once
// The data-parallel options every training example takes, and the communicator they name:
//   --comm local|ring|ps|mpi   one process, a ring all-reduce between the processes that
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
//   --comm-compress C      the ring's gradient compression (none | fp16)
//   --bucket-mb M          MiB of gradients all-reduced together
//   --check-replicas N     compare the replicas' bits every N steps (and always at the end)
//   --check-numerics       stop at the first NaN or infinity, naming the node, the
//                          variable or gradient and the step (session::set_check_numerics)
// An example builds its step with g::dist::minimize(comm, data_parallel_options(o), ...),
// trains on its rank's share of the data, and lets rank 0 report.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include <gradus/backends/ring_allreduce.hpp>
#include <gradus/backends/zmq_ps.hpp>
#include <gradus/dist/cluster.hpp>
#include <gradus/dist/data_parallel.hpp>
#ifdef GRADUS_HAVE_MPI
#include <gradus/backends/mpi.hpp>
#endif

namespace gradus_examples {

namespace g = gradus;

struct comm_options {
  std::string comm = "local";    // local | ring | ps | mpi
  double comm_timeout = 30;      // seconds any one wait of a collective may last
  std::int64_t bucket_mb = 25;   // gradient bucket size of the data-parallel step
  // the ring's data path: auto (shared memory between ranks of one host, direct TCP between
  // hosts) | shm | tcp | zmq (ZeroMQ: the data path before shm and direct TCP existed)
  std::string transport = "auto";
  std::string compress = "none";  // the ring's gradient compression: none | fp16
  bool check_numerics = false;   // session::set_check_numerics
  std::int64_t check_replicas = 0;  // data_parallel_options::check_replicas_every
  std::string consistency = "bsp";  // --comm ps: async | bsp | ssp:S
  int slow_rank = -1;               // this rank sleeps slow_ms in every step (-2: every rank)
  double slow_ms = 0;
  double slow_prob = 1;             // ... in a step with this probability (transient stragglers)
  mutable std::uint64_t slow_draws = 0;

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

inline void add_comm_options(CLI::App& app, comm_options& o) {
  app.add_option("--comm", o.comm,
                 "communicator: local (one process), ring (ring all-reduce over ZeroMQ between the processes "
                 "that gradus-run, torchrun, srun, mpirun or a TF_CONFIG describe) or ps (parameter servers: "
                 "the cluster's ps tasks hold the variables; gradus-run --ps M) or mpi (MPI_Allreduce between the "
                 "processes of mpirun or srun --mpi; in a build with MPI)")
      ->check(CLI::IsMember({"local", "ring", "ps", "mpi"}));
  app.add_option("--consistency", o.consistency,
                 "--comm ps: async (apply each push on arrival), bsp (average every worker's step), or ssp:S "
                 "(stale-synchronous: read no parameters missing an update older than S steps)")
      ->check([](const std::string& v) {
        try {
          g::ps_options p;
          g::parse_consistency(v, p);
          return std::string();
        } catch (const g::error& e) {
          return std::string(e.what());
        }
      });
  app.add_option("--slow-rank", o.slow_rank, "this rank sleeps --slow-ms in every step (a straggler; -1: none; -2: every rank)")
      ->check(CLI::Range(-2, 1 << 20));
  app.add_option("--slow-prob", o.slow_prob, "the straggler sleeps in a step with this probability (transient stragglers; default 1)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--slow-ms", o.slow_ms, "milliseconds --slow-rank sleeps in every step")->check(CLI::Range(0.0, 60000.0));
  app.add_option("--comm-timeout", o.comm_timeout, "seconds a collective may wait for a peer before failing")
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--comm-transport", o.transport,
                 "the ring's data path: auto (default: shm when every rank is on one host, else tcp), shm (shared "
                 "memory), tcp (direct sockets), or zmq (ZeroMQ sockets; zmq-tcp / zmq-ipc force their kind)")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "zmq", "zmq-tcp", "zmq-ipc", "ipc"}));
  app.add_option("--comm-compress", o.compress,
                 "the ring's gradient compression: none (default) or fp16 (half the bytes on the wire, 11 significant "
                 "bits per hop, sums in float; Horovod's Compression.fp16)")
      ->check(CLI::IsMember({"none", "fp16"}));
  app.add_option("--bucket-mb", o.bucket_mb, "MiB of gradients all-reduced together (PyTorch DDP's bucket_cap_mb)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  app.add_option("--check-replicas", o.check_replicas,
                 "data-parallel: compare every replica's variables and optimizer state with rank 0's every N steps "
                 "(they are always compared at the end; 0: only then)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_flag("--check-numerics", o.check_numerics,
               "stop at the first NaN or infinity in any node, naming the node, the variable or gradient it reaches "
               "and the global step (tf.debugging.check_numerics; costs a pass over every buffer)");
}

// The communicator --comm names; for ring, the world comes from the environment
// (cluster::from_env: TF_CONFIG, torchrun's, Slurm's, OpenMPI's variables or GRADUS_CLUSTER).
inline g::dist::any_communicator make_communicator(const comm_options& o) {
  if (o.comm == "local") {
    // A process of a cluster that was not asked to join it trains alone on all the data,
    // and every such process writes the same checkpoint path: say so.
    std::string described;
    try {
      const g::cluster::spec c = g::cluster::from_env();
      if (c.source != "default" && (c.world_size > 1 || !c.ps.empty()))
        described = "describes a cluster (" + c.source + ": " + c.task_type + " " + std::to_string(c.task_index) +
                    " of " + std::to_string(c.world_size) + " workers)";
    } catch (const g::error& e) {
      described = "holds a cluster spec that does not parse (" + std::string(e.what()) + ")";
    }
    if (!described.empty())
      std::cerr << "gradus: warning: --comm local, but the environment " << described
                << ": this process trains alone on all the data and writes its own checkpoints (pass --comm ring to "
                   "train together)\n";
    return {};
  }
  const g::cluster::spec c = g::cluster::from_env();
  if (!c.is_worker())
    throw g::error("gradus: --comm " + o.comm + ": this process is a '" + c.task_type + "' task of the " + c.source +
                   " cluster spec, not a worker" + (c.task_type == "ps" ? " (a ps task serves: the program calls serve_if_ps first)" : ""));
  if (o.comm == "ps") {
    g::ps_options po;
    po.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
    g::parse_consistency(o.consistency, po);
    return g::dist::any_communicator::make<g::parameter_server<>>(c, po);
  }
  if (o.comm == "mpi") {
#ifdef GRADUS_HAVE_MPI
    // rank and world from MPI; a spec the environment holds (mpirun's OMPI_COMM_WORLD_*,
    // Slurm's) must agree with them. An MPI whose launcher sets none of the formats
    // cluster::from_env reads (MPICH's mpiexec) gives "default": nothing to check.
    if (c.source == "default") return g::dist::any_communicator::make<g::mpi_allreduce>();
    return g::dist::any_communicator::make<g::mpi_allreduce>(c);
#else
    throw g::error("gradus: --comm mpi: this build has no MPI (install libopenmpi-dev and reconfigure)");
#endif
  }
  g::ring_options ro;
  ro.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
  ro.transport = o.transport;
  ro.compress = o.compress;
  return g::dist::any_communicator::make<g::ring_allreduce>(c, ro);
}

// A ps task of the cluster (gradus-run --ps, GRADUS_ROLE=ps, a TF_CONFIG task of type
// "ps") serves the variables until the chief ends the job and returns its exit status;
// a worker gets nothing and goes on. Every training example calls it first, so one
// program is both (TensorFlow's server.join()); a ps process never loads the data.
// restore: where a restarted ps task reloads its shards from (server recovery; the MNIST
// examples pass their --checkpoint).
inline std::optional<int> serve_if_ps(const comm_options& o, g::ps::restore_source restore = {}) {
  g::cluster::spec c;
  try {
    c = g::cluster::from_env();
  } catch (const g::error&) {
    if (o.comm == "local") return std::nullopt;  // make_communicator warns about it
    throw;
  }
  if (c.task_type != "ps") return std::nullopt;
  if (o.comm != "ps")
    throw g::error("gradus: this process is ps task " + std::to_string(c.task_index) + " of the " + c.source +
                   " cluster spec, but --comm is " + o.comm + " (pass --comm ps to every process of the job)");
  g::ps::server_options so;
  so.heartbeat_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
  so.restore = std::move(restore);
  g::ps::serve(c, so);
  return 0;
}

inline g::dist::data_parallel_options data_parallel_options(const comm_options& o) {
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
