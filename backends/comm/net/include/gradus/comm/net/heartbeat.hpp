#pragma once
// ZMTP heartbeats (ZeroMQ 4.2+, RFC 37): a socket pings its peer every second and drops a
// connection that answers nothing for `timeout`, which its socket monitor then reports as
// DISCONNECTED (net/socket_monitor.hpp). That is how a communicator tells a peer that is
// stopped, hung or unreachable from one that is merely slow, without a wait of its own: a
// busy peer's I/O thread still answers the pings. The ring also asks the peer to drop the
// connection from its side (`ask_peer_too`, ZMQ_HEARTBEAT_TTL), so that both neighbours of
// a silent rank notice it.
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <limits>

namespace gradus::net {

/// How often a socket pings its peer (ZMQ_HEARTBEAT_IVL): every second.
inline constexpr int heartbeat_interval_ms = 1000;

/// The heartbeat timeout of a communicator whose waits last `timeout`: a peer may pause for
/// up to timeout - 2 s (at least 3 s) and still be there; the 2 s (a heartbeat interval and
/// a margin) let the heartbeats notice a silent peer before the waits that began no earlier
/// than its silence run out. The ring and the parameter server's workers use it alike.
inline int heartbeat_timeout_for(std::chrono::milliseconds timeout) {
  const long long t = std::max<long long>(3000, static_cast<long long>(timeout.count()) - 2000);
  return static_cast<int>(std::min<long long>(t, std::numeric_limits<int>::max()));
}

/// Turns on ZMTP heartbeats on `s` (before it connects or binds): a ping every second, and a
/// connection that answers nothing for `timeout` is dropped. `ask_peer_too`: the peer drops
/// it as well after `timeout` without pings from here (ZMQ_HEARTBEAT_TTL; timeouts above
/// 6553.5 s are left to each side's own).
inline void set_heartbeats(zmq::socket_t& s, std::chrono::milliseconds timeout, bool ask_peer_too = false) {
  const int ms = static_cast<int>(timeout.count());
  s.set(zmq::sockopt::heartbeat_ivl, heartbeat_interval_ms);
  s.set(zmq::sockopt::heartbeat_timeout, ms);
  // The TTL travels in 16 bits of deciseconds (at most 6553.5 s): beyond that, each side's
  // own timeout alone does it.
  if (ask_peer_too) s.set(zmq::sockopt::heartbeat_ttl, ms <= 6553500 ? ms : 0);
}

}  // namespace gradus::net
