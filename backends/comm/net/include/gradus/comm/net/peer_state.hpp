#pragma once
// What became of a peer whose connection closed, and where a rank records whom it blamed.
// A fresh connection to the peer's listening address tells a dead process (refused: the
// kernel holds no listener for it) from a stopped, hung or unreachable one (accepted, or
// unanswered): comm_error::peer_state's "gone" and "silent". The rank that blames a peer
// says so in GRADUS_FAULT_FILE (core/fault_file.hpp).
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gradus/comm/net/address.hpp"
#include "gradus/core/fault_file.hpp"

namespace gradus::net {

/// What a fresh connection to a peer's data address says about the peer.
enum class reach {
  alive,    ///< accepted: its process still listens (the kernel accepts even while it is stopped)
  refused,  ///< nothing listens there: the process died or closed its communicator
  unknown,  ///< no answer within the wait (unreachable), or not a tcp:// or ipc:// address
};
/// Dials `endpoint` (tcp://, or ipc:// with an abstract name or a path) once, sends
/// nothing, and says what answered within `wait_ms` milliseconds. Never throws.
inline reach probe(const std::string& endpoint, int wait_ms) {
  const std::string scheme = scheme_of(endpoint);
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_UNSPEC;
  if (scheme == "tcp") {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (::getaddrinfo(tcp_host_of(endpoint).c_str(), tcp_port_of(endpoint).c_str(), &hints, &res) != 0 || !res) return reach::unknown;
    std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
    len = res->ai_addrlen;
    family = res->ai_family;
    ::freeaddrinfo(res);
  } else if (scheme == "ipc") {
    const std::string path = endpoint.substr(6);
    sockaddr_un un{};
    if (path.empty() || path.size() >= sizeof un.sun_path) return reach::unknown;
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path, path.data(), path.size());
    if (path.front() == '@') un.sun_path[0] = '\0';  // abstract: the name is not NUL-terminated
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + (path.front() == '@' ? 0 : 1));
    std::memcpy(&addr, &un, sizeof un);
    family = AF_UNIX;
  } else {
    return reach::unknown;
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return reach::unknown;
  reach out = reach::unknown;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0) {  // NOLINT(bugprone-branch-clone): alive for two causes, each with its own test
    out = reach::alive;
  } else if (errno == ECONNREFUSED || errno == ENOENT) {
    out = reach::refused;
  } else if (errno == EAGAIN) {
    out = reach::alive;  // a unix socket whose backlog is full: someone listens
  } else if (errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, wait_ms) == 1) {
      int err = 0;
      socklen_t elen = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0)
        out = err == 0 ? reach::alive : err == ECONNREFUSED ? reach::refused : reach::unknown;
    }
  }
  ::close(fd);
  return out;
}

}  // namespace gradus::net
