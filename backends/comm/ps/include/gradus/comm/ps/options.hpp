#pragma once
// What a parameter-server worker is told: its consistency mode in the type (ps_async,
// ps_bsp, ps_ssp<S>) or at run time (ps_dynamic, with ps_options::consistency from a
// program's --consistency: parse_consistency), and ps_options — the servers, its rank, the
// deadlines, the chunk size, the partitioner, the ZeroMQ context and its CURVE keys.
#include <zmq.hpp>

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "gradus/comm/ps/curve_config.hpp"
#include "gradus/comm/ps/partition.hpp"
#include "gradus/comm/ps/server_options.hpp"
#include "gradus/core/error.hpp"

namespace gradus {

/// Consistency mode in the type, for `parameter_server<ps_async>`: the servers apply each
/// push on arrival and answer pulls at once (no worker waits for another).
struct ps_async {
  static constexpr ps::mode mode = ps::mode::async;  ///< ps::mode::async
  static constexpr int staleness = 0;                ///< unused: async has no bound
};
/// Consistency mode in the type, for `parameter_server<ps_bsp>`: bulk synchronous. The pushes
/// of one step are averaged (summed in rank order) and applied once; a pull at step c waits
/// until every step before c is applied.
struct ps_bsp {
  static constexpr ps::mode mode = ps::mode::bsp;  ///< ps::mode::bsp
  static constexpr int staleness = 0;              ///< none: every pull sees every earlier step
};
/// Consistency mode in the type, for `parameter_server<ps_ssp<S>>`: stale-synchronous with
/// bound `S` (>= 0, checked at compile time). Pushes are applied on arrival, each as 1/N of
/// a step; a pull at step c waits until every live worker has reached step c - S.
template <int S>
struct ps_ssp {
  static_assert(S >= 0);
  static constexpr ps::mode mode = ps::mode::ssp;  ///< ps::mode::ssp
  static constexpr int staleness = S;              ///< the bound S, in steps
};
/// The mode chosen at run time: `parameter_server<ps_dynamic>` (the default) takes it from
/// ps_options::consistency and ps_options::staleness (a program's `--consistency` option,
/// through parse_consistency).
struct ps_dynamic {};

/// What a parameter-server worker (parameter_server) is told: its servers, its rank, the
/// deadlines, the chunk size, the partitioner, the ZeroMQ context and its CURVE keys. The
/// constructor from a cluster spec fills servers, rank, world_size, origin, curve and
/// restarted from the environment. Times are milliseconds.
struct ps_options {
  /// The ps tasks, in task order: "host:port" (tcp), or a whole ZeroMQ endpoint
  /// ("tcp://...", "ipc://..."). Empty: the constructor throws gradus::error. Every worker
  /// must list the same servers in the same order (the shards are placed by index).
  std::vector<std::string> servers;
  /// \var rank
  /// This worker's rank, 0 ... world_size - 1; rank 0 is the chief (its first values are
  /// kept, its destructor ends the job). Default 0.
  /// \var world_size
  /// How many workers the job has (>= 1; default 1). A rank outside [0, world_size) or a
  /// world_size below 1 makes the constructor throw gradus::error; a world_size that differs
  /// from the other workers' fails the job at the servers.
  int rank = 0, world_size = 1;
  /// The consistency mode when the mode is chosen at run time (ps_dynamic); ignored by
  /// ps_async, ps_bsp and ps_ssp. Default bsp. Every worker must run the same mode and
  /// staleness: a worker that differs fails the whole job at the servers.
  ps::mode consistency = ps::mode::bsp;
  /// The staleness bound S of ssp (steps, default 0) with ps_dynamic; ignored otherwise.
  /// Outside [0, 1000000] the constructor throws gradus::error (and a server refuses such a
  /// hello).
  int staleness = 0;
  /// The longest one wait may last (default 60 s): for the servers' answers to hello, to
  /// the optimizer's settings and to snapshots. Waits that other workers can hold up (wait()
  /// on a handle, so every pull; collectives; the variables' declaration at the first push
  /// or pull) get 2 s more, so that a server names a silent worker first. A server that
  /// answers nothing, not even heartbeats, for max(3 s, timeout - 2 s) has its connection
  /// dropped. A wait that runs out throws gradus::comm_error naming the server, its address
  /// and the operation; the communicator is unusable afterwards. Zero or negative: the
  /// constructor throws gradus::error. Keep it well above a step's time.
  std::chrono::milliseconds timeout{60000};
  /// A server whose connection closes (its process died) may come back: restarted (gradus-run
  /// `--max-restarts`) and reloaded from the last checkpoint. The worker opens a new
  /// connection, says it rejoins at its step, declares its shards again and resends what the
  /// old server left unanswered; it fails when the server is not back within this time
  /// (0: at once, 1 s after the connection closed). Default 30 s; the examples set it to
  /// `timeout`. Past it the wait throws gradus::comm_error saying the server is gone.
  /// Negative: the constructor throws gradus::error.
  std::chrono::milliseconds reconnect_timeout{30000};
  /// This process takes the place of a worker the job lost (async and ssp): it says so in its
  /// hello, and rejoin_job() waits at server 0 for the workers' next join point (an epoch's
  /// end) for at most rejoin_timeout. From a cluster spec: GRADUS_RESTART_COUNT > 0, which
  /// gradus-run `--max-restarts` sets on a restart, unless GRADUS_RESTART_SCOPE is "job" (the
  /// whole job restarted: no one to rejoin).
  bool restarted = false;
  /// How long rejoin_job() waits at server 0 for the other workers' next join point (an
  /// epoch's end). Default 15 minutes: an epoch may be long. Past it rejoin_job() throws
  /// gradus::comm_error naming this option. Negative: the constructor throws gradus::error.
  std::chrono::milliseconds rejoin_timeout{std::chrono::minutes(15)};
  /// Bytes per message of pushes, pulls, snapshots and collectives (default 1 MiB: ZeroMQ
  /// moves 1 MiB messages faster than larger ones); a shard goes in chunks of this many
  /// bytes, rounded down to whole elements (at least one). Below 64 the constructor throws
  /// gradus::error. Every worker must use the same (a large collective is cut into pieces
  /// of it on each). The chief's first values travel as chunks of this times 1 + the
  /// optimizer's state tensors, which must fit max_payload.
  std::size_t chunk_bytes = std::size_t(1) << 20;
  /// The servers' limit on one message's payload (server_options::limits.max_payload, 64 MiB
  /// by default): a larger request throws gradus::error here, naming it, instead of being
  /// dropped there. Keep it at or below the servers' limit.
  std::size_t max_payload = ps::wire::limits{}.max_payload;
  /// Which server holds which elements of each variable (default ps::balanced_by_bytes).
  /// Called at the first push or pull with the variable table and the number of servers;
  /// it must give every worker the same answer. Its answer is checked
  /// (ps::check_partition): a gap, an overlap, an unknown server or a shard that cuts a row
  /// throws std::invalid_argument naming the variable.
  ps::partitioner partition = ps::balanced_by_bytes;
  std::string origin;  ///< where the server list came from, for errors ("GRADUS_PS", "TF_CONFIG cluster.ps")
  zmq::context_t* context = nullptr;  ///< the ZeroMQ context, which must outlive the communicator; nullptr: an own one (one I/O thread)
  std::optional<ps::curve_client_config> curve;  ///< CURVE keys (ps::curve_client_from_env); none: plaintext
};

/// Sets `o.consistency` (and, for ssp, `o.staleness`) from "async", "bsp" or "ssp:S" (also
/// "ssp" = ssp:0 and `"ssp<S>"`). Throws gradus::error for any other text, or for a bound S
/// that is not an integer in [0, 1000000].
inline void parse_consistency(const std::string& text, ps_options& o) {
  if (text == "async") o.consistency = ps::mode::async;
  else if (text == "bsp") o.consistency = ps::mode::bsp;
  else if (text.rfind("ssp", 0) == 0) {
    o.consistency = ps::mode::ssp;
    std::string s = text.substr(3);
    if (!s.empty() && (s.front() == ':' || s.front() == '<')) s = s.substr(1);
    if (!s.empty() && s.back() == '>') s.pop_back();
    char* end = nullptr;
    const long v = s.empty() ? 0 : std::strtol(s.c_str(), &end, 10);
    if ((!s.empty() && *end) || v < 0 || v > ps::max_staleness)
      throw error("gradus: consistency '" + text + "': the staleness bound of ssp:S is an integer in [0, " +
                  std::to_string(ps::max_staleness) + "]");
    o.staleness = static_cast<int>(v);
  } else {
    throw error("gradus: consistency '" + text + "' is not async, bsp or ssp:S");
  }
}

}  // namespace gradus
