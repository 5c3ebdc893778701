// The communicators examples/comm_options.hpp's options name, compiled once for every
// example (CMake: gradus_examples_common): the ring, the parameter server and its server, MPI
// where the build has it (GRADUS_HAVE_MPI), and the cluster spec.
#include "comm_options.hpp"

#include "cli_checks.hpp"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>

#include <gradus/comm/ring.hpp>
#include <gradus/comm/net/heartbeat.hpp>
#include <gradus/comm/ps.hpp>
#include <gradus/comm/ps/restore.hpp>
#include <gradus/parallel/cluster.hpp>
#include <gradus/util/trace.hpp>
#ifdef GRADUS_HAVE_MPI
#include <gradus/comm/mpi.hpp>
#endif

namespace gradus_examples {

void add_comm_options(CLI::App& app, comm_options& o) {
  app.add_option("--comm", o.comm,
                 "communicator: auto (the default: what the environment describes, below), local (one process), "
                 "ring (ring all-reduce between the processes that gradus-run, torchrun, srun, mpirun or a "
                 "TF_CONFIG describe), ps (parameter servers: the cluster's ps tasks hold the variables; gradus-run "
                 "--ps M) or mpi (MPI_Allreduce between the processes of mpirun or srun --mpi; in a build with "
                 "MPI). auto: local outside a cluster, ps where the cluster has ps tasks, mpi under mpirun in a "
                 "build with MPI, else ring")
      ->check(CLI::IsMember({"auto", "local", "ring", "ps", "mpi"}));
  // --comm auto becomes the communicator it stands for once the command line is read, so that
  // everything after (serve_if_ps, a pipeline's checks, the JSON's "comm") sees the real one.
  app.parse_complete_callback([&o] {
    resolve_comm(o);
    try {
      start_trace(o);
    } catch (const g::error& e) {
      throw CLI::ValidationError("--trace", e.what());
    }
  });
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
      ->check(finite_range(0.0, 1.0));
  app.add_option("--slow-ms", o.slow_ms, "milliseconds --slow-rank sleeps in every step")->check(finite_range(0.0, 60000.0));
  app.add_option("--comm-timeout", o.comm_timeout,
                 "seconds a collective may wait for a peer before failing (the ring's rendezvous waits at least 5 s)")
      ->check(finite_range(0.1, 3600.0));
  app.add_option("--comm-transport", o.transport,
                 "the ring's data path: auto (default: shm when every rank is on one host, else tcp), shm (shared "
                 "memory), tcp (direct sockets), or zmq (ZeroMQ sockets; zmq-tcp / zmq-ipc force their kind)")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "zmq", "zmq-tcp", "zmq-ipc", "ipc"}));
  app.add_option("--comm-compress", o.compress,
                 "the ring's gradient compression: none (default), fp16 (half the bytes on the wire, 11 significant "
                 "bits per hop, sums in float; Horovod's Compression.fp16) or bf16 (float's range, 8 significant bits)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--bucket-mb", o.bucket_mb, "MiB of gradients all-reduced together (PyTorch DDP's bucket_cap_mb)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}));
  app.add_option("--check-replicas", o.check_replicas,
                 "data-parallel: compare every replica's variables and optimizer state with rank 0's every N steps "
                 "(they are always compared at the end; 0: only then)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--trace", o.trace,
                 "write this process's timeline to FILE: a Chrome Trace Event file that Perfetto "
                 "(ui.perfetto.dev) and chrome://tracing open, with the graph's kernels, the forward and "
                 "backward pass, the optimizer update and the all-reduces of the last --trace-steps steps")
      ->type_name("FILE");
  app.add_option("--trace-steps", o.trace_steps, "the steps --trace keeps (a ring buffer; default 100)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  app.add_flag("--check-numerics", o.check_numerics,
               "stop at the first NaN or infinity in any node, naming the node, the variable or gradient it reaches "
               "and the global step (tf.debugging.check_numerics; costs a pass over every buffer)");
}

void start_trace(const comm_options& o) {
  // one recorder for the process, installed until static destruction (its last flush)
  static std::unique_ptr<g::util::trace_recorder> recorder;
  static std::optional<g::util::trace_install> installed;
  // --trace, else GRADUS_TRACE (gradus-run --trace DIR gives each process its file there)
  const char* env = std::getenv("GRADUS_TRACE");
  const std::string path = !o.trace.empty() ? o.trace : env ? env : "";
  if (path.empty() || recorder) return;
  int pid = 0;
  std::string name = "rank 0";
  try {
    const g::cluster::spec c = g::cluster::from_env();
    pid = c.is_worker() ? c.rank : 1000 + c.task_index;
    name = c.is_worker() ? "rank " + std::to_string(c.rank) : c.task_type + " " + std::to_string(c.task_index);
  } catch (const g::error&) {
    // a spec that does not parse: make_communicator reports it; the trace says rank 0
  }
  auto r = std::make_unique<g::util::trace_recorder>(g::util::trace_options{
      .path = path, .rank = pid, .process_name = name, .keep_steps = static_cast<std::size_t>(o.trace_steps)});
  r->name_thread("main");
  r->flush();  // a file that cannot be written fails now, not at the first step
  recorder = std::move(r);
  installed.emplace(*recorder);
}

namespace {
// A launcher's environment: more than one worker, or parameter servers.
bool describes_cluster(const g::cluster::spec& c) {
  return c.source != "default" && (c.world_size > 1 || !c.ps.empty());
}
}  // namespace

void resolve_comm(comm_options& o) {
  if (o.comm != "auto") return;
  g::cluster::spec c;
  try {
    c = g::cluster::from_env();
  } catch (const g::error&) {
    return;  // stays auto: make_communicator reports the spec's error where the example catches it
  }
  if (!describes_cluster(c))
    o.comm = "local";
  else if (!c.ps.empty())
    o.comm = "ps";
#ifdef GRADUS_HAVE_MPI
  else if (c.source == "openmpi")
    o.comm = "mpi";
#endif
  else
    o.comm = "ring";
}

g::parallel::any_communicator make_communicator(const comm_options& o) {
  if (o.comm == "auto") {
    // resolve_comm left it: the environment's cluster spec does not parse
    try {
      (void)g::cluster::from_env();
    } catch (const g::error& e) {
      throw g::error("gradus: --comm auto: the environment holds a cluster spec that does not parse (" +
                     std::string(e.what()) + "); fix it, or pass --comm local");
    }
    throw g::error("gradus: --comm auto was not resolved (internal: resolve_comm runs after parsing)");
  }
  if (o.comm == "local") {
    // A process of a cluster that was not asked to join it trains alone on all the data,
    // and every such process writes the same checkpoint path: say so.
    std::string described;
    try {
      const g::cluster::spec c = g::cluster::from_env();
      if (describes_cluster(c))
        described = "describes a cluster (" + c.source + ": " + c.task_type + " " + std::to_string(c.task_index) +
                    " of " + std::to_string(c.world_size) + " workers)";
    } catch (const g::error& e) {
      described = "holds a cluster spec that does not parse (" + std::string(e.what()) + ")";
    }
    if (!described.empty())
      std::cerr << "gradus: warning: --comm local, but the environment " << described
                << ": this process trains alone on all the data and writes its own checkpoints (leave --comm at auto, "
                   "or pass --comm ring, to train together)\n";
    return {};
  }
  const g::cluster::spec c = g::cluster::from_env();
  if (!c.is_worker())
    throw g::error("gradus: --comm " + o.comm + ": this process is a '" + c.task_type + "' task of the " + c.source +
                   " cluster spec, not a worker" + (c.task_type == "ps" ? " (a ps task serves: the program calls serve_if_ps first)" : ""));
  if (o.comm == "ps") {
    g::ps_options po;
    po.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
    // Waiting for a lost server to come back (restarted by gradus-run --max-restarts) is one
    // wait too: --comm-timeout bounds it, not ps_options' fixed 30 s.
    po.reconnect_timeout = po.timeout;
    g::parse_consistency(o.consistency, po);
    return g::parallel::any_communicator::make<g::parameter_server<>>(c, po);
  }
  if (o.comm == "mpi") {
#ifdef GRADUS_HAVE_MPI
    // rank and world from MPI; a spec the environment holds (mpirun's OMPI_COMM_WORLD_*,
    // Slurm's) must agree with them. An MPI whose launcher sets none of the formats
    // cluster::from_env reads (MPICH's mpiexec) gives "default": nothing to check.
    if (c.source == "default") return g::parallel::any_communicator::make<g::mpi_allreduce>();
    return g::parallel::any_communicator::make<g::mpi_allreduce>(c);
#else
    throw g::error("gradus: --comm mpi: this build has no MPI (install libopenmpi-dev and reconfigure)");
#endif
  }
  g::ring_options ro;
  ro.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
  ro.transport = o.transport;
  ro.compress = o.compress;
  return g::parallel::any_communicator::make<g::ring_allreduce>(c, ro);
}

std::optional<int> serve_if_ps(const comm_options& o, const std::string& restore_checkpoint) {
  g::cluster::spec c;
  try {
    c = g::cluster::from_env();
  } catch (const g::error&) {
    if (o.comm == "local") return std::nullopt;  // make_communicator warns about it
    if (o.comm == "auto") return std::nullopt;   // make_communicator names the error
    throw;
  }
  if (c.task_type != "ps") return std::nullopt;
  if (o.comm != "ps")
    throw g::error("gradus: this process is ps task " + std::to_string(c.task_index) + " of the " + c.source +
                   " cluster spec, but --comm is " + o.comm + " (pass --comm ps to every process of the job)");
  g::ps::server_options so;
  // the ring's and the workers' rule (timeout - 2 s, at least 3 s): a silent worker is named
  // by the server before the other workers' waits (the timeout + 2 s) run out
  const auto timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout * 1000));
  so.heartbeat_timeout = std::chrono::milliseconds(g::net::heartbeat_timeout_for(timeout));
  so.join_timeout = timeout;  // before the workers' first collective (the timeout + 2 s) gives up
  if (!restore_checkpoint.empty()) so.restore = g::ps::restore_from_checkpoint(restore_checkpoint);
  g::ps::serve<g::cpu_simd>(c, so);
  return 0;
}

std::size_t cluster_ps_count() { return g::cluster::from_env().ps.size(); }

}  // namespace gradus_examples
