#pragma once
// Ports and hosts: free_ports (free TCP ports on 127.0.0.1, for MASTER_PORT and the
// parameter servers when no --port is given, for each run of a sweep, and for the tests'
// rendezvous addresses: tests/support/free_port.hpp) and is_local_host (whether a name of
// --hosts is this host).
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
//
// The ports come from below the kernel's ephemeral range (/proc/sys/net/ipv4/
// ip_local_port_range, 32768-60999 by default), not from bind(0): a port read back from
// bind(0) and closed is the kernel's to hand to the next bind(0) or outgoing connection of any
// process on the host, and it did, between gradus-run closing it and rank 0 listening on it
// ("Address already in use", seen in CI with tests running side by side). Below the range only
// another explicit pick can take it: a random start makes that unlikely, and each candidate is
// bound once to check that it is free now.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradus_run {

// n distinct TCP ports of 127.0.0.1 that nobody has bound, drawn at random from
// [20000, the start of the ephemeral range); the sockets that checked them stay open until all
// n are found, so the n are distinct.
inline std::vector<int> free_ports(int n) {
  int low = 32768;
  if (std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range"); f) f >> low;
  const int first = 20000, last = low - 1;
  if (last - first < 1000)
    throw std::runtime_error("cannot pick a free TCP port: the kernel's ephemeral range starts at " +
                             std::to_string(low) + " (net.ipv4.ip_local_port_range); pass --port");
  std::mt19937 rng(static_cast<unsigned>(::getpid()) ^
                   static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> pick(first, last);
  std::vector<int> socks, ports;
  for (int tries = 0; tries < 4000 && static_cast<int>(ports.size()) < n; ++tries) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int p = pick(rng);
    a.sin_port = htons(static_cast<unsigned short>(p));
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(s);
      continue;
    }
    socks.push_back(s);
    ports.push_back(p);
  }
  for (const int s : socks) ::close(s);
  if (static_cast<int>(ports.size()) != n)
    throw std::runtime_error("cannot find " + std::to_string(n) + " free TCP port(s) of 127.0.0.1 in [20000, " +
                             std::to_string(low) + "); pass --port");
  return ports;
}

inline bool is_local_host(const std::string& h) {
  if (h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0) return true;
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 && h == name;
}

}  // namespace gradus_run
