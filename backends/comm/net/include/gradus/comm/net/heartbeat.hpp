#pragma once
// ZMTP heartbeats (ZeroMQ 4.2+, RFC 37): a socket pings its peer every second and drops a
// connection that answers nothing for `timeout`, which its socket monitor then reports as
// DISCONNECTED (net/socket_monitor.hpp). That is how a communicator tells a peer that is
// stopped, hung or unreachable from one that is merely slow, without a wait of its own: a
// busy peer's I/O thread still answers the pings. The ring also asks the peer to drop the
// connection from its side (`ask_peer_too`, ZMQ_HEARTBEAT_TTL), so that both neighbours of
// a silent rank notice it.
#include <zmq.hpp>

#include <chrono>

namespace gradus::net {

inline constexpr int heartbeat_interval_ms = 1000;

inline void set_heartbeats(zmq::socket_t& s, std::chrono::milliseconds timeout, bool ask_peer_too = false) {
  const int ms = static_cast<int>(timeout.count());
  s.set(zmq::sockopt::heartbeat_ivl, heartbeat_interval_ms);
  s.set(zmq::sockopt::heartbeat_timeout, ms);
  // The TTL travels in 16 bits of deciseconds (at most 6553.5 s): beyond that, each side's
  // own timeout alone does it.
  if (ask_peer_too) s.set(zmq::sockopt::heartbeat_ttl, ms <= 6553500 ? ms : 0);
}

}  // namespace gradus::net
