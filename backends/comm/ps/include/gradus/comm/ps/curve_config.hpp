#pragma once
// The parameter server's CURVE settings: a ps task's key pair and allow-list, a worker's
// key pair and the servers' public keys, each from its GRADUS_PS_CURVE_* environment
// variables (a launcher gives every process one environment; "{rank}" and "{index}"
// name each process's own keys). The CURVE machinery itself is gradus::net's
// (gradus/comm/net/curve.hpp); its names are gradus::ps's too, as they were before it moved.

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gradus/comm/net/curve.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ps {

using net::key_pair;
using net::require_curve;
using net::z85_key_problem;
using net::z85_encode_key;
using net::public_key_of;
using net::generate_key_pair;
using net::check_key_pair;
using net::key_prefix;
using net::public_key_file_text;
using net::secret_key_file_text;
using net::save_key_pair;
using net::load_public_key;
using net::load_key_pair;
using net::allow_list;
using net::any_rank;
using net::refusal;
using net::zap_handler;
using net::curve_zap_domain;
using net::handshake_failure_events;
using net::make_curve_server;
using net::make_curve_client;
using net::rank_from_user_id;
using net::may_act_as;
using net::rank_claim_refusal;
using net::describe_handshake_failure;
namespace detail_security {
using namespace net::detail_security;
}  // namespace detail_security


/// A ps task's CURVE settings: its key pair and the client keys it accepts.
struct curve_server_config {
  key_pair keys;       ///< the task's own key pair; workers dial with its public key
  allow_list allowed;  ///< the worker keys it accepts, each with the rank it may act as (empty: nobody can connect; curve_server_from_env refuses that)
};
/// A worker's CURVE settings: its key pair and the servers' public keys (one shared by every
/// server, or one per server in task order).
struct curve_client_config {
  key_pair keys;  ///< the worker's own key pair; its public key must be in the servers' allow-list
  std::vector<std::string> server_public_keys;  ///< Z85: one for every server, or one per server in task order
  /// The public key of server `server` (its index among the ps tasks): the single key when
  /// one is given, else the one at that index. Throws gradus::error when none is given, or
  /// when several are and `server` is past the last.
  const std::string& server_key(std::size_t server) const {
    if (server_public_keys.empty()) throw error("gradus: curve_client_config: no server public key");
    if (server_public_keys.size() == 1) return server_public_keys.front();
    if (server >= server_public_keys.size())
      throw error("gradus: curve_client_config: no public key for server " + std::to_string(server) + " (" +
                  std::to_string(server_public_keys.size()) + " given: one for all servers, or one per server)");
    return server_public_keys[server];
  }
};

/// Reads an environment variable by name: its value, or null when it is not set (tests pass
/// their own).
using env_reader = std::function<const char*(const char*)>;
/// The process's environment (std::getenv): the default env_reader.
inline const char* process_env(const char* name) { return std::getenv(name); }

namespace detail_security {
/// `text` with `"{<name>}"` replaced by `value` (a launcher gives every process one
/// environment: keys/w{rank} names each worker's own key pair).
inline std::string expand(std::string text, const std::string& name, int value, const char* variable) {
  const std::string token = "{" + name + "}";
  for (auto at = text.find(token); at != std::string::npos; at = text.find(token, at)) {
    if (value < 0) throw error(std::string("gradus: ") + variable + " = '" + text + "' names " + token + " but this process has no " + name);
    text.replace(at, token.size(), std::to_string(value));
  }
  return text;
}
}  // namespace detail_security

/// A ps task's settings from GRADUS_PS_CURVE_SERVER_KEY (the key pair's prefix; "{index}"
/// becomes the task's index, for a key pair per server) and GRADUS_PS_CURVE_ALLOW (the
/// allow-list file): nothing when neither is set; an error when only one is (CURVE without
/// an allow-list would authenticate nobody, an allow-list without keys protects nothing).
inline std::optional<curve_server_config> curve_server_from_env(int index = -1, const env_reader& env = process_env) {
  const char* key = env("GRADUS_PS_CURVE_SERVER_KEY");
  const char* allow = env("GRADUS_PS_CURVE_ALLOW");
  const bool k = key && *key, a = allow && *allow;
  if (!k && !a) return std::nullopt;
  if (!k) throw error("gradus: GRADUS_PS_CURVE_ALLOW is set but GRADUS_PS_CURVE_SERVER_KEY is not: a ps task needs its key pair (gradus-keygen ps) to use CURVE");
  if (!a) throw error("gradus: GRADUS_PS_CURVE_SERVER_KEY is set but GRADUS_PS_CURVE_ALLOW is not: a ps task with CURVE needs the allow-list of worker keys");
  curve_server_config c{load_key_pair(detail_security::expand(key, "index", index, "GRADUS_PS_CURVE_SERVER_KEY")), allow_list::load(allow)};
  if (c.allowed.empty()) throw error(std::string("gradus: the allow-list '") + allow + "' (GRADUS_PS_CURVE_ALLOW) lists no key: no worker could connect");
  return c;
}

/// A worker's settings from GRADUS_PS_CURVE_CLIENT_KEY (its key pair's prefix; "{rank}"
/// becomes its rank) and GRADUS_PS_CURVE_SERVER_PUB (the servers' .pub file, or a
/// comma-separated list with one per ps task in order): nothing when neither is set; an
/// error when only one is.
inline std::optional<curve_client_config> curve_client_from_env(int rank = -1, const env_reader& env = process_env) {
  const char* key = env("GRADUS_PS_CURVE_CLIENT_KEY");
  const char* pub = env("GRADUS_PS_CURVE_SERVER_PUB");
  const bool k = key && *key, p = pub && *pub;
  if (!k && !p) return std::nullopt;
  if (!k) throw error("gradus: GRADUS_PS_CURVE_SERVER_PUB is set but GRADUS_PS_CURVE_CLIENT_KEY is not: a worker needs its own key pair (gradus-keygen w0)");
  if (!p) throw error("gradus: GRADUS_PS_CURVE_CLIENT_KEY is set but GRADUS_PS_CURVE_SERVER_PUB is not: a worker needs the servers' public key file");
  curve_client_config c;
  c.keys = load_key_pair(detail_security::expand(key, "rank", rank, "GRADUS_PS_CURVE_CLIENT_KEY"));
  const std::string list = pub;
  for (std::size_t at = 0; at <= list.size();) {
    const auto comma = list.find(',', at);
    const std::string file = detail_security::trim(std::string_view(list).substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (file.empty()) throw error("gradus: GRADUS_PS_CURVE_SERVER_PUB = '" + list + "' has an empty file name");
    c.server_public_keys.push_back(load_public_key(file));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return c;
}

}  // namespace gradus::ps
