#pragma once
// CurveZMQ security for gradus' ZeroMQ sockets (the parameter server's today; any
// communicator's): a server or client socket set up for CURVE, the rank an authenticated
// connection may act as, and the words for a refused handshake. Key pairs and their files
// are in curve_keys.hpp, the allow-list in allow_list.hpp, the ZAP handler in
// zap_handler.hpp; this header includes them all.
//
// How a connection is authenticated (RFC 26 CurveZMQ, RFC 27 ZAP):
//   1. the server's ROUTER is a CURVE server (make_curve_server) with ZAP domain
//      "gradus-ps"; each worker's DEALER is a CURVE client (make_curve_client) that knows
//      the server's public key and holds its own key pair;
//   2. during the handshake libzmq proves that the client holds the secret key of the
//      public key it presents, and asks the context's ZAP handler (zap_handler, at
//      inproc://zeromq.zap.01) whether that key may connect;
//   3. the handler answers 200 with User-Id "worker:<rank>" for a key in the allow-list,
//      400 otherwise: the client gets an ERROR and no connection, its socket monitor sees
//      ZMQ_EVENT_HANDSHAKE_FAILED_AUTH (describe_handshake_failure says what it means);
//   4. every message from an accepted connection carries that User-Id
//      (rank_from_user_id): a worker's rank comes from its key, never from what it writes
//      in a message or its routing id (ps-lite's weakness: node ids taken from an
//      unauthenticated identity frame).
//
// Failing closed: make_curve_server sets ZMQ_ZAP_ENFORCE_DOMAIN, so a CURVE server whose
// context has no ZAP handler refuses every client (libzmq's default would accept any key:
// encryption without authentication). A client without keys (NULL mechanism) never gets
// past the greeting of a CURVE server (mechanism mismatch). The handler itself refuses
// every mechanism but CURVE and every ZAP domain but "gradus-ps" (libzmq asks it about
// NULL connections only where a socket sets a ZAP domain).
//
// Requires libzmq >= 4.3.1 built with CURVE (libsodium): CVE-2019-6250 was a pre-auth
// remote code execution in 4.3.0 and older.
#include <zmq.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "gradus/comm/net/allow_list.hpp"
#include "gradus/comm/net/curve_keys.hpp"
#include "gradus/comm/net/zap_handler.hpp"
#include "gradus/core/error.hpp"

namespace gradus::net {

/// The monitor events that say a handshake failed (for net::socket_monitor).
inline constexpr int handshake_failure_events =
    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

/// A ROUTER (or any socket that binds) as a CURVE server of the "gradus-ps" ZAP domain,
/// failing closed when its context has no ZAP handler. Before bind().
inline void make_curve_server(zmq::socket_t& s, const key_pair& server) {
  require_curve();
  check_key_pair(server, "make_curve_server");
  s.set(zmq::sockopt::curve_server, 1);
  s.set(zmq::sockopt::curve_secretkey, server.secret_key);
  s.set(zmq::sockopt::zap_domain, std::string(curve_zap_domain));
  // ZMQ_ZAP_ENFORCE_DOMAIN (93): a draft constant in zmq.h, honoured by libzmq >= 4.3.0
  const int enforce = 1;
  if (zmq_setsockopt(s.handle(), 93, &enforce, sizeof enforce) != 0)
    throw error("gradus: make_curve_server: this libzmq refuses ZMQ_ZAP_ENFORCE_DOMAIN (" + detail_security::errno_text(errno) +
                "): without it a missing ZAP handler would let any key in");
}

/// A DEALER (or any socket that connects) as a CURVE client with its own key pair, that
/// trusts only the server holding `server_public_key`. Before connect().
inline void make_curve_client(zmq::socket_t& s, const key_pair& client, const std::string& server_public_key) {
  require_curve();
  check_key_pair(client, "make_curve_client");
  if (const auto p = z85_key_problem(server_public_key); !p.empty()) throw error("gradus: make_curve_client: the server's public key " + p);
  s.set(zmq::sockopt::curve_serverkey, server_public_key);
  s.set(zmq::sockopt::curve_publickey, client.public_key);
  s.set(zmq::sockopt::curve_secretkey, client.secret_key);
}

/// The rank a message's connection was authenticated as: the ZAP handler's User-Id
/// `"worker:<rank>"` (any_rank for `"worker:*"`). Nothing for a connection that was not
/// authenticated (NULL mechanism, or no gradus ZAP handler). Read it from a frame that came
/// over the wire: on a ROUTER, parts[1] and later, not the routing-id frame the ROUTER
/// makes itself (it carries no metadata).
inline std::optional<int> rank_from_user_id(const zmq::message_t& m) {
  const char* uid = zmq_msg_gets(m.handle(), "User-Id");
  if (!uid) return std::nullopt;
  const std::string_view s(uid);
  if (!s.starts_with("worker:")) return std::nullopt;
  const std::string_view r = s.substr(7);
  if (r == "*") return any_rank;
  if (r.empty() || r.size() > 7 || !std::all_of(r.begin(), r.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::atoi(std::string(r).c_str());
}

/// Whether a connection authenticated as `authenticated` (rank_from_user_id) may act as
/// worker `claimed`.
inline bool may_act_as(std::optional<int> authenticated, int claimed) {
  return authenticated && (*authenticated == any_rank || *authenticated == claimed);
}

/// Why a claim is refused, for the server's answer and log ("" when it may act so).
inline std::string rank_claim_refusal(std::optional<int> authenticated, int claimed, const std::string& peer_address = {}) {
  if (may_act_as(authenticated, claimed)) return {};
  const std::string from = peer_address.empty() ? std::string() : " from " + peer_address;
  if (!authenticated)
    return "a connection" + from + " without an authenticated CURVE key claims to be worker " + std::to_string(claimed) +
           " (this server accepts only keys in its allow-list)";
  return "a connection" + from + " whose CURVE key is allowed as worker " + std::to_string(*authenticated) + " claims to be worker " +
         std::to_string(claimed) + ": refused (a worker acts only as the rank its key is listed for in the allow-list)";
}

/// What a monitor event of a client socket says about a failed handshake with the server at
/// `server_address`; nothing for other events (a server that is not running gives none:
/// only CONNECT_RETRIED). libzmq 4.3 gives up on a connection after
/// ZMQ_EVENT_HANDSHAKE_FAILED_AUTH (a key not in the allow-list) or _PROTOCOL (one side
/// without CURVE): the socket never connects and requests would wait in vain, so fail at
/// once. After _NO_DETAIL (a wrong server public key; no ZAP handler) it reconnects and the
/// event repeats; it also comes once when a server dies mid-handshake, so fail after a few
/// in a row with no ZMQ_EVENT_HANDSHAKE_SUCCEEDED between, or name it at the deadline.
inline std::optional<std::string> describe_handshake_failure(std::uint16_t event, std::uint32_t value, const std::string& server_address) {
  const std::string at = "the parameter server at " + server_address;
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      if (value == 400)
        return at + " refused this client's CURVE key (ZAP status 400): its public key is not in that server's allow-list "
                    "(GRADUS_PS_CURVE_ALLOW; gradus-keygen --allow <name>.pub --rank R --list <file> adds it), or this client "
                    "uses another key pair than the one listed (GRADUS_PS_CURVE_CLIENT_KEY)";
      if (value == 300) return at + " could not authenticate this client now (ZAP status 300, a temporary failure)";
      return at + " refused the connection (ZAP status " + std::to_string(value) + ": the server's authentication failed)";
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return at + " and this client disagree on security: one uses CURVE and the other does not (give the CURVE keys "
                    "(GRADUS_PS_CURVE_*) to both the ps tasks and the workers, or to neither)";
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC || value == ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE)
        return at + " failed the CURVE handshake (a cryptographic error): the server public key given to this client "
                    "(GRADUS_PS_CURVE_SERVER_PUB) is probably not that server's";
      if (value >= ZMQ_PROTOCOL_ERROR_ZAP_UNSPECIFIED && value <= ZMQ_PROTOCOL_ERROR_ZAP_INVALID_METADATA)
        return at + ": its ZAP handler answered malformed (protocol error " + std::to_string(value) + ")";
      {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", static_cast<unsigned>(value));
        return at + ": the ZMTP handshake failed (protocol error " + hex + "): is it a gradus parameter server of the same security settings?";
      }
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      return at + " closed the connection during the handshake (" + detail_security::errno_text(static_cast<int>(value)) +
             "): with CURVE, most likely the server public key given to this client (GRADUS_PS_CURVE_SERVER_PUB) is not that "
             "server's (it cannot read the client's hello), or the server's ZAP handler is not running; or the server stopped mid-handshake";
    default: return std::nullopt;
  }
}

}  // namespace gradus::net
