#pragma once
// A loopback TCP port that listens and never accepts: the kernel completes every
// connection (the backlog) and nothing on it ever speaks, as with a process stopped by
// SIGSTOP or a debugger. For the tests of what a peer does when a server goes silent.
#include <arpa/inet.h>
#include <cstdint>
#include <netinet/in.h>
#include <stdexcept>
#include <string>
#include <sys/socket.h>
#include <unistd.h>

namespace gradus_test {

class silent_listener {
 public:
  explicit silent_listener(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (fd_ < 0) throw std::runtime_error("silent_listener: no socket");
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 16) != 0) {
      ::close(fd_);
      throw std::runtime_error("silent_listener: cannot listen on 127.0.0.1:" + std::to_string(port));
    }
  }
  silent_listener(const silent_listener&) = delete;
  silent_listener& operator=(const silent_listener&) = delete;
  ~silent_listener() { ::close(fd_); }

 private:
  int fd_;
};

}  // namespace gradus_test
