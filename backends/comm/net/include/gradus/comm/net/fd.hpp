#pragma once
// File descriptors and deadlines, for the code that works on sockets below ZeroMQ (the
// ring's shared-memory and direct-TCP data paths): an owner, the milliseconds left before
// a deadline (what a poll may wait), and a bounded wait for a descriptor to become ready.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "gradus/core/error.hpp"

namespace gradus::net {

using clock = std::chrono::steady_clock;

struct unique_fd {
  int fd = -1;
  explicit unique_fd(int f = -1) : fd(f) {}
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  unique_fd(unique_fd&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
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

inline int ms_left(clock::time_point deadline, int cap) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap));
}

inline void wait_fd(int fd, short events, clock::time_point deadline, const std::string& doing) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, ms_left(deadline, 100));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) throw comm_error(doing + ": " + std::strerror(errno));
    if (clock::now() >= deadline) throw comm_error(doing + ": no answer before the timeout");
  }
}

}  // namespace gradus::net
