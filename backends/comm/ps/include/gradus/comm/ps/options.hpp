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

struct ps_async {
  static constexpr ps::mode mode = ps::mode::async;
  static constexpr int staleness = 0;
};
struct ps_bsp {
  static constexpr ps::mode mode = ps::mode::bsp;
  static constexpr int staleness = 0;
};
template <int S>
struct ps_ssp {
  static_assert(S >= 0);
  static constexpr ps::mode mode = ps::mode::ssp;
  static constexpr int staleness = S;
};
struct ps_dynamic {};

struct ps_options {
  std::vector<std::string> servers;  ///< "host:port" of each ps task, in task order
  int rank = 0, world_size = 1;
  ps::mode consistency = ps::mode::bsp;  ///< ps_dynamic only
  int staleness = 0;                     ///< ps_dynamic with ssp
  std::chrono::milliseconds timeout{60000};  ///< one wait's deadline
  /// A server whose connection closes (its process died) may come back: restarted (gradus-run
  /// --max-restarts) and reloaded from the last checkpoint. The worker opens a new
  /// connection, says it rejoins at its step, declares its shards again and resends what the
  /// old server left unanswered; it fails when the server is not back within this time
  /// (0: at once, 1 s after the connection closed).
  std::chrono::milliseconds reconnect_timeout{30000};
  /// This process takes the place of a worker the job lost (async and ssp): it says so in its
  /// hello, and rejoin_job() waits at server 0 for the workers' next join point (an epoch's
  /// end) for at most rejoin_timeout. From a cluster spec: GRADUS_RESTART_COUNT > 0, which
  /// gradus-run --max-restarts sets on a restart.
  bool restarted = false;
  std::chrono::milliseconds rejoin_timeout{std::chrono::minutes(15)};
  std::size_t chunk_bytes = std::size_t(1) << 20;
  /// The servers' limit on one message's payload (server_options::limits.max_payload, 64 MiB
  /// by default): a larger request is refused here, naming it, instead of being dropped there.
  std::size_t max_payload = ps::wire::limits{}.max_payload;
  ps::partitioner partition = ps::balanced_by_bytes;
  std::string origin;  ///< where the server list came from, for errors ("GRADUS_PS", "TF_CONFIG cluster.ps")
  zmq::context_t* context = nullptr;  ///< nullptr: an own context
  std::optional<ps::curve_client_config> curve;  ///< CURVE keys (ps::curve_client_from_env); none: plaintext
};

/// "async", "bsp", "ssp:S" (also "ssp" = ssp:0 and "ssp<S>").
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
    if ((!s.empty() && *end) || v < 0 || v > 1000000)
      throw error("gradus: consistency '" + text + "': the staleness bound of ssp:S is an integer >= 0");
    o.staleness = static_cast<int>(v);
  } else {
    throw error("gradus: consistency '" + text + "' is not async, bsp or ssp:S");
  }
}

}  // namespace gradus
