#pragma once
// A loopback TCP port nobody listens on right now, for a rendezvous address in the
// communicator tests (data ports are ephemeral). Taken below the kernel's ephemeral range
// (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default): a port read back from
// bind(0) is one the kernel hands out again, to the next bind(0) or outgoing connection of
// any test running beside this one, before the rendezvous binds it ("Address already in
// use", once in CI). Below the range only another explicit pick can take it: a random start
// makes that unlikely, and each candidate is bound once to check it is free now.
// tests/support/free_port.py is the same for the scripts.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>

namespace gradus_test {

inline bool port_binds(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("free_port: no socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<unsigned short>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

inline int free_port() {
  int low = 32768;
  if (std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range"); f) f >> low;
  const int first = 20000, last = low - 1;  // [20000, the ephemeral range)
  if (last - first < 1000) throw std::runtime_error("free_port: the ephemeral range starts at " + std::to_string(low));
  std::mt19937 rng(static_cast<unsigned>(::getpid()) ^
                   static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::uniform_int_distribution<int> pick(first, last);
  for (int tries = 0; tries < 1000; ++tries)
    if (const int p = pick(rng); port_binds(p)) return p;
  throw std::runtime_error("free_port: no free port in [20000, " + std::to_string(low) + ") after 1000 tries");
}

}  // namespace gradus_test
