#pragma once
// What a parameter server is told and what it tells: the consistency modes the workers
// choose, its options (where it listens, limits, heartbeats, what to do when a worker is
// lost, CURVE, where a restarted server restores its shards from) and its counters. The
// server itself is server.hpp; these are apart so that the workers' side (ps.hpp) and a
// restore source (restore.hpp) need not see it.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gradus/comm/ps/curve_config.hpp"
#include "gradus/comm/ps/wire.hpp"

namespace gradus::ps {

/// The consistency modes (server.hpp says what each guarantees).
enum class mode : std::uint8_t { async = 0, bsp = 1, ssp = 2 };
/// "async", "bsp" or "ssp".
inline const char* mode_name(mode m) { return m == mode::async ? "async" : m == mode::bsp ? "bsp" : "ssp"; }
/// The largest staleness bound of ssp a worker may ask for (workers and servers refuse more).
inline constexpr int max_staleness = 1000000;

/// A variable's state read back from a checkpoint, for a restarted server (server_options::restore).
struct restored_variable {
  element_type dt = element_type::none;       ///< f32 or f64 (must be what the workers declare)
  std::vector<std::byte> values;              ///< the whole variable, every element
  std::vector<std::vector<std::byte>> slots;  ///< each optimizer state tensor, in the optimizer's order
  std::int64_t step = 0;                      ///< the checkpoint's global step
};
/// restore(variable name, its optimizer state names): what the last checkpoint holds of it,
/// or nothing when it holds no such variable (ps::restore_from_checkpoint reads an .npz).
using restore_source = std::function<std::optional<restored_variable>(const std::string&, const std::vector<std::string>&)>;

/// What a parameter server task (ps::server, ps::serve) is told. Times are milliseconds.
/// ps::serve fills address and index from the cluster spec, and curve from the environment
/// (ps::curve_server_from_env) when they are left empty.
struct server_options {
  /// Where to listen: "host:port" (a name is resolved and every address it has is bound:
  /// "localhost" binds 127.0.0.1 and ::1), "*:port" for every interface, or a full ZeroMQ
  /// endpoint ("tcp://...", "ipc://..."). A name that does not resolve, or an address that
  /// cannot be bound, makes the constructor throw gradus::comm_error.
  std::string address;
  int index = 0;  ///< this task's index among the ps tasks (for messages)
  /// What one message may hold: `limits.max_payload` payload bytes (default 64 MiB) and
  /// element counts and ranges up to `limits.max_elements` (default 2^40). ZeroMQ drops the
  /// connection of a client that sends a larger frame (ZMQ_MAXMSGSIZE); a message past the
  /// element limits is dropped as malformed (server_stats::malformed). The workers'
  /// ps_options::max_payload should not exceed it.
  wire::limits limits;
  /// A worker whose connection is silent this long is dropped (ZMTP heartbeats; its I/O
  /// thread answers while its program computes). Default 10 s; the examples use the
  /// workers' rule, max(3 s, their timeout - 2 s), so that the server names a silent worker
  /// before the other workers' waits run out.
  std::chrono::milliseconds heartbeat_timeout{10000};
  /// bsp: when a worker dies, fail the job at once (default, naming it) or go on with the
  /// survivors (the step's average then counts only them). Async and ssp always go on.
  bool bsp_continue_without_dead = false;
  /// A fresh job whose every worker has not said hello this long after the first one fails,
  /// naming the missing ranks (not started, or given another server list): its collectives
  /// would wait for them for ever. Not applied by a restarted server (its workers rejoin).
  /// Default 60 s.
  std::chrono::milliseconds join_timeout{60000};
  /// Threads of the server's update passes (its compute policy's set_threads). 1: a 1 MiB
  /// chunk's update is memory-bound (33 us on one thread), and a team per chunk cost 40x the
  /// CPU of a raw ZeroMQ server and 0.2x its throughput with 2 servers
  /// (benchmarks/results/ps_bench-d4e0588.md). Values below 1 count as 1.
  int threads = 1;
  /// Stop when nothing at all has been heard for this long (0: never). Tests use it as a
  /// bound; a job's servers end by `shutdown`.
  std::chrono::milliseconds idle_exit{0};
  /// CURVE encryption, workers authenticated by their keys (ps::curve_server_from_env);
  /// none: plaintext, anyone who reaches the port may connect.
  std::optional<curve_server_config> curve;
  /// Server recovery: where a restarted server reloads its shards from when the workers
  /// come back to it (their hello says they rejoin). Empty: a restarted server has nothing
  /// to serve, and tells the rejoining workers so. ps::serve sets it from the checkpoint
  /// the program names when the process is a restart (GRADUS_RESTART_COUNT, gradus-run
  /// `--max-restarts`).
  restore_source restore;
  /// Where the server's log lines go (workers joining and lost, refused clients, dropped
  /// messages, restores), each without its newline; called on the server's thread. Default:
  /// a line on stderr.
  std::function<void(const std::string&)> log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
};

/// Counters, readable from another thread while the server runs.
struct server_stats {
  /// \var messages
  /// Messages received, malformed ones included.
  /// \var malformed
  /// Messages dropped because they do not decode (wrong size, magic, version, limits), and
  /// surplus frames of over-long ones.
  /// \var rejected
  /// Well-formed requests refused: answered with an error (a rank it may not act as, an
  /// unknown variable, a wrong dtype or range, ...).
  /// \var pushes
  /// Push requests taken: each chunk of a dense push, each shard's push_rows.
  /// \var pulls
  /// Dense pull requests taken (each chunk), including those parked until the mode allows.
  /// \var updates
  /// Optimizer passes applied to a shard's elements or rows.
  /// \var collectives
  /// The workers' collectives completed (server 0 runs them).
  /// \var workers_lost
  /// Workers whose connection closed without a goodbye and whom the job went on without
  /// (async, ssp, or bsp_continue_without_dead).
  std::atomic<std::uint64_t> messages{0}, malformed{0}, rejected{0}, pushes{0}, pulls{0}, updates{0}, collectives{0}, workers_lost{0};
  std::atomic<std::uint64_t> restored{0};       ///< shards reloaded from a checkpoint after a restart
  std::atomic<std::uint64_t> stale_dropped{0};  ///< bsp pushes for a step a restarted server skipped
  std::atomic<std::uint64_t> workers_rejoined{0};  ///< restarted workers taken back (async, ssp)
};

}  // namespace gradus::ps
