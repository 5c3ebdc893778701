#pragma once
// File descriptors and deadlines, for the code that works on sockets below ZeroMQ (the
// ring's shared-memory and direct-TCP data paths, the point-to-point shared memory): an
// owner, the milliseconds left before a deadline (what a poll may wait), a bounded wait for
// a descriptor to become ready, and one message with a descriptor attached (SCM_RIGHTS over
// a unix socket: how a shared-memory segment is handed to a peer).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "gradus/core/error.hpp"

namespace gradus::net {

/// The clock of every deadline in gradus::net.
using clock = std::chrono::steady_clock;

/// Owns a file descriptor: closes it when destroyed or assigned over. Move-only.
struct unique_fd {
  int fd = -1;  ///< the descriptor, or -1 for none
  /// Owns `f` (-1: nothing).
  explicit unique_fd(int f = -1) : fd(f) {}
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  /// Takes `o`'s descriptor; `o` holds none afterwards.
  unique_fd(unique_fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  /// Closes this one's descriptor, then takes `o`'s; `o` holds none afterwards.
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) ::close(fd);
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~unique_fd() {
    if (fd >= 0) ::close(fd);
  }
};

namespace fd_detail {
inline const char* strerror_text(const char* gnu, const char*) { return gnu; }
inline const char* strerror_text(int xsi, const char* buf) { return xsi == 0 ? buf : nullptr; }
}  // namespace fd_detail
/// strerror(e)'s text, through strerror_r: strerror may hand every thread one buffer (POSIX
/// does not require it to be thread-safe), and these messages are made on the ring's and the
/// parameter server's threads. Either strerror_r: GNU's (glibc with _GNU_SOURCE, as g++ and
/// clang++ compile C++) returns the text; XSI's fills the buffer and returns 0. Thread-safe;
/// `"Unknown error <e>"` when there is no text.
inline std::string errno_message(int e) {
  char buf[256] = {};
  const char* text = fd_detail::strerror_text(::strerror_r(e, buf, sizeof buf), buf);
  return text ? std::string(text) : "Unknown error " + std::to_string(e);
}

/// The milliseconds from now to `deadline`, clamped to [0, cap]: what one poll may wait.
inline int ms_left(clock::time_point deadline, int cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap));
}

/// Waits until `fd` is ready for `events` (POLLIN, POLLOUT, as poll's), polling at most
/// 100 ms at a time; throws gradus::comm_error starting with `doing` when poll fails or
/// `deadline` passes first.
inline void wait_fd(int fd, short events, clock::time_point deadline, const std::string& doing) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_left(deadline, 100));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) throw comm_error(doing + ": " + net::errno_message(errno));
    if (clock::now() >= deadline) throw comm_error(doing + ": no answer before the timeout");
  }
}

namespace fd_detail {
/// One message of one buffer with room for one descriptor (what sendmsg/recvmsg take).
struct message {
  iovec io;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  message(void* data, std::size_t n) : io{data, n} {
    msg.msg_iov = &io;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  message(const message&) = delete;
  message& operator=(const message&) = delete;
};
}  // namespace fd_detail

/// Sends the n bytes at data with the descriptor fd attached, in one sendmsg (flags as
/// sendmsg's; MSG_NOSIGNAL is added); sendmsg's result.
inline ssize_t send_with_fd(int sock, const void* data, std::size_t n, int fd, int flags) {
  fd_detail::message m(const_cast<void*>(data), n);
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &m.msg, flags | MSG_NOSIGNAL);
}

/// Receives up to n bytes into data and the descriptor attached to them, if any (owned by the
/// caller; -1 when none came), in one recvmsg (flags as recvmsg's; MSG_CMSG_CLOEXEC is
/// added); recvmsg's result.
inline ssize_t recv_with_fd(int sock, void* data, std::size_t n, int flags, unique_fd& fd) {
  fd_detail::message m(data, n);
  const ssize_t k = ::recvmsg(sock, &m.msg, flags | MSG_CMSG_CLOEXEC);
  fd = unique_fd();
  if (k < 0) return k;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m.msg); c; c = CMSG_NXTHDR(&m.msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c), sizeof got);
      fd = unique_fd(got);
    }
  return k;
}

}  // namespace gradus::net
