#pragma once
// Ports and hosts: free_ports (free TCP ports on 127.0.0.1, for MASTER_PORT and the
// parameter servers when no --port is given, and for each run of a sweep) and is_local_host
// (whether a name of --hosts is this host).
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace gradus_run {

// n distinct free TCP ports on 127.0.0.1 (bind to port 0, read it back; all sockets stay
// open until every port is known, so the n are distinct).
inline std::vector<int> free_ports(int n) {
  std::vector<int> socks, ports;
  for (int i = 0; i < n; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(s);
      break;
    }
    socks.push_back(s);
    ports.push_back(ntohs(a.sin_port));
  }
  for (const int s : socks) ::close(s);
  if (static_cast<int>(ports.size()) != n) throw std::runtime_error("cannot find a free TCP port on 127.0.0.1");
  return ports;
}

inline bool is_local_host(const std::string& h) {
  if (h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0) return true;
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 && h == name;
}

}  // namespace gradus_run
