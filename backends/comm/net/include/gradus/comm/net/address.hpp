#pragma once
// Network addresses as the ZeroMQ communicators write them ("tcp://host:port",
// "ipc://@name", "inproc://name"): taking an endpoint apart and putting it together
// (IPv6 hosts in brackets, IPv4-mapped addresses unmapped), resolving a host name to its
// numeric addresses (libzmq binds only interfaces and numeric addresses), and what this
// host is: its name, whether a name is its own, its machine and network namespace, and the
// source address of its route to another host. The ring's rendezvous and the parameter
// server's listening socket resolve through the same functions.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gradus/comm/net/fd.hpp"
#include "gradus/core/error.hpp"

namespace gradus::net {

/// "tcp://host:port" -> "tcp"
inline std::string scheme_of(const std::string& endpoint) {
  const auto p = endpoint.find("://");
  return p == std::string::npos ? std::string() : endpoint.substr(0, p);
}

/// "tcp://host:port" -> "host" ("[::1]:5" -> "::1")
inline std::string tcp_host_of(const std::string& endpoint) {
  std::string rest = endpoint.substr(endpoint.find("://") + 3);
  const auto colon = rest.rfind(':');
  if (colon != std::string::npos) rest = rest.substr(0, colon);
  if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') rest = rest.substr(1, rest.size() - 2);
  return rest;
}

/// "tcp://host:port" -> "port"
inline std::string tcp_port_of(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  return colon == std::string::npos ? std::string() : endpoint.substr(colon + 1);
}

/// An IPv6 address in brackets, as endpoints write it.
inline std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

/// "tcp://host:port" from a host (an IPv6 address gets its brackets) and a port.
inline std::string tcp_endpoint(const std::string& host, const std::string& port) {
  return "tcp://" + bracketed(host) + ":" + port;
}

/// A socket with ZMQ_IPV6 on binds an IPv4 address as IPv4-mapped IPv6 and reports it so:
/// "tcp://[::ffff:127.0.0.1]:5" -> "tcp://127.0.0.1:5", which also a peer without IPv6 dials.
inline std::string unmapped(const std::string& endpoint) {
  const std::string mapped = "tcp://[::ffff:";
  if (endpoint.rfind(mapped, 0) != 0) return endpoint;
  const auto close = endpoint.find(']');
  const std::string v4 = endpoint.substr(mapped.size(), close - mapped.size());
  in_addr a{};
  if (close == std::string::npos || ::inet_pton(AF_INET, v4.c_str(), &a) != 1) return endpoint;
  return "tcp://" + v4 + endpoint.substr(close + 1);
}

/// An IPv4 or IPv6 address written out (no name lookup).
inline bool is_numeric_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (res) ::freeaddrinfo(res);
  return rc == 0;
}

/// 127.0.0.0/8, ::1 or an IPv4-mapped 127.x address (numeric addresses only).
inline bool is_loopback_address(const std::string& numeric) {
  in_addr a4{};
  in6_addr a6{};
  if (::inet_pton(AF_INET, numeric.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  if (::inet_pton(AF_INET6, numeric.c_str(), &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
  return false;
}

/// The numeric addresses `host` resolves to, in the resolver's order, without duplicates;
/// when there are none, `failure` says why.
struct resolution {
  std::vector<std::string> addresses;  ///< numeric IPv4 / IPv6 addresses, without brackets
  std::string failure;                 ///< why there are none (the resolver's text); empty when there are some
};
/// Resolves `host` (a name or a numeric address) with getaddrinfo, IPv4 and IPv6 alike.
/// Never throws: a failure is in resolution::failure.
inline resolution resolve(const std::string& host) {
  resolution out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    out.failure = rc == EAI_SYSTEM ? net::errno_message(errno) : std::string(::gai_strerror(rc));
    return out;
  }
  for (const addrinfo* p = res; p; p = p->ai_next) {
    std::array<char, NI_MAXHOST> buf{};
    if (::getnameinfo(p->ai_addr, p->ai_addrlen, buf.data(), buf.size(), nullptr, 0, NI_NUMERICHOST) != 0) continue;
    std::string a = buf.data();
    if (std::find(out.addresses.begin(), out.addresses.end(), a) == out.addresses.end()) out.addresses.push_back(std::move(a));
  }
  ::freeaddrinfo(res);
  if (out.addresses.empty()) out.failure = "no IPv4 or IPv6 address";
  return out;
}

/// This host's name (gethostname), or "unknown-host" when it cannot be read.
inline std::string hostname() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown-host";
  return std::string(buf.data());
}

/// Whether `name` is this host's own name (either may be the other's first label: "node1"
/// and "node1.cluster"); never a "localhost" name, which some containers are called.
inline bool names_this_host(const std::string& name) {
  const auto lower = [](std::string t) {
    for (auto& ch : t) ch = static_cast<char>(ch >= 'A' && ch <= 'Z' ? ch - 'A' + 'a' : ch);
    return t;
  };
  const std::string n = lower(name), me = lower(hostname());
  if (n.rfind("localhost", 0) == 0 || n.empty()) return false;
  const auto label = [](const std::string& t) { return t.substr(0, t.find('.')); };
  return n == me || (n.find('.') == std::string::npos && n == label(me)) || (me.find('.') == std::string::npos && label(n) == me);
}

/// Which machine and network namespace this process is in: the kernel's boot id (unique
/// per machine and boot) and the namespace's inode. Ranks that share both reach each
/// other's abstract ipc sockets; a host name alone is shared by namespaces (and containers).
inline std::string machine_and_netns() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::array<char, 64> buf{};
  const auto n = ::readlink("/proc/self/ns/net", buf.data(), buf.size() - 1);
  return (boot.empty() ? "?" : boot) + " " + (n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : "?");
}

/// What started this process: its parent's pid and start time (clock ticks after boot, field
/// 22 of /proc/PPID/stat) on this machine's boot. Processes started by one shell, script or
/// launcher share it; two launches from different shells, or two runs of one script, differ.
/// ("?" where /proc cannot be read.)
inline std::string launch_identity() {
  const auto parent = static_cast<long>(::getppid());
  std::string stat, start = "?", boot = "?";
  std::getline(std::ifstream("/proc/" + std::to_string(parent) + "/stat"), stat);
  if (const auto close = stat.rfind(')'); close != std::string::npos && close + 2 < stat.size()) {
    std::istringstream fields(stat.substr(close + 2));  // from field 3, the state
    std::string f;
    for (int i = 3; i <= 22 && fields >> f; ++i)
      if (i == 22) start = f;
  }
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return "parent pid " + std::to_string(parent) + " started at tick " + start + " of boot " + boot.substr(0, 8);
}

/// The local address this host uses to reach `host` (the source address of its route: a
/// UDP socket is "connected", which sends nothing, and asked for its name); empty when
/// there is no route. A rank advertises it, not its host name, which other hosts (or
/// network namespaces, whose host name is the host's) may not resolve to this interface.
inline std::string route_source_address(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || !res) return {};
  std::string out;
  const int fd = ::socket(res->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0) {
    sockaddr_storage me{};
    socklen_t len = sizeof me;
    if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0) {
      std::array<char, NI_MAXHOST> buf{};
      if (::getnameinfo(reinterpret_cast<sockaddr*>(&me), len, buf.data(), buf.size(), nullptr, 0, NI_NUMERICHOST) == 0)
        out = buf.data();
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return out;
}

/// A suffix for inproc:// and abstract ipc:// names (socket monitors, shared-memory
/// segments), unique per process (its pid, and a random salt: pids repeat across pid namespaces that
/// share a network namespace) and per call.
inline std::string unique_suffix() {
  static std::atomic<unsigned long> counter{0};
  static const unsigned salt = std::random_device{}();
  std::array<char, 16> hex{};
  std::snprintf(hex.data(), hex.size(), "%08x", salt);
  return std::to_string(::getpid()) + "-" + hex.data() + "-" + std::to_string(counter.fetch_add(1));
}

/// The endpoints a server binds for `address`: "host:port" ("[v6]:port"), or an endpoint
/// with its scheme ("tcp://...", "ipc://...", "inproc://...") taken as it is. A host name is
/// resolved and every address it has is bound; "*" or no host binds every interface; port
/// 0 ("any") can be bound only once, so a name then binds its first address. `who` starts
/// the error messages ("gradus: parameter server").
inline std::vector<std::string> listen_endpoints(const std::string& address, const std::string& who) {
  if (address.find("://") != std::string::npos) return {address};
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) throw error(who + ": address '" + address + "' has no port (host:port)");
  std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "*" || host.empty()) return {"tcp://*:" + port};
  const auto r = resolve(host);
  if (r.addresses.empty()) throw comm_error(who + ": cannot resolve '" + host + "' (from '" + address + "'): " + r.failure);
  std::vector<std::string> out;
  for (const auto& a : r.addresses) out.push_back(tcp_endpoint(a, port));
  if (port == "0" && out.size() > 1) out.resize(1);
  return out;
}

}  // namespace gradus::net
