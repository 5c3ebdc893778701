#pragma once
// The ring's transport over ZeroMQ (cppzmq): each rank binds one PULL socket (its data
// address) and connects one PUSH socket to its right neighbour's; the left neighbour's
// messages arrive on the PULL socket, in order. Messages are two frames: a frame_header
// and the payload, sent zero-copy (zmq_msg_init_data; the free callback marks the send
// complete).
//
// Rendezvous: rank 0 binds a ROUTER at the rendezvous address; every other rank connects a
// DEALER and registers "rank, world_size, hostname, machine, data addresses"; rank 0 checks
// the registrations (duplicate ranks, world sizes), picks the data transport and answers
// with every rank's address. A rank that never registers is named when the timeout passes.
//
// Addresses. libzmq binds only interfaces and numeric addresses, so a tcp rendezvous host
// is resolved (getaddrinfo) first. Rank 0's rendezvous listens on
//   - a numeric address: that one, as given;
//   - "localhost", or any name that resolves only to loopback addresses: each of them
//     (127.0.0.1 and ::1 when both resolve), so that a rank reaches it whichever family
//     its own resolver prefers;
//   - this host's own name, and any other name: every interface (dual-stack "::", or
//     0.0.0.0 where the kernel has no IPv6: libzmq falls back by itself on EAFNOSUPPORT).
//     Debian maps the host's own name to 127.0.1.1 locally while other hosts reach it at
//     its real address, so what the name resolves to here is not what the others dial
//     (PyTorch's TCPStore listens on every interface for the same reason);
//   - ring_options::bind_host (GRADUS_BIND_ADDR) instead, when set: an address, a name,
//     an interface, or "*".
// The other ranks resolve the name themselves and connect to the first address their
// resolver returns (errors name it). Data sockets bind an ephemeral port: rank 0's where
// its rendezvous listens (advertising the rendezvous host, which every rank can reach);
// another rank's on the loopback address of the family it reaches rank 0 by when that is
// a loopback address, else on every interface, advertising its source address on the route
// to rank 0. Every socket has ZMQ_IPV6 on, so "[fd00::1]" works anywhere. ipc data sockets
// are Linux abstract sockets (ipc://@...: nothing on the filesystem, gone with the process,
// so a killed rank leaves nothing behind) unless the rendezvous is an ipc:// path. Abstract
// sockets are per network namespace: transport "auto" picks ipc only when every rank has
// the same host name, boot id and network namespace.
//
// Failure detection, so that no rank waits for a dead peer until the timeout:
//   - socket monitors (ZMQ_EVENT_DISCONNECTED) on both data sockets: a killed process's
//     connections close at once. After a grace for its last messages (0.3 s), a fresh
//     connection to the peer's data address says what became of it: refused -> "gone"
//     (the process died or closed its communicator); accepted (the kernel still listens
//     for a stopped process) or unanswered -> "silent" (stopped, hung or unreachable).
//     Connections that never finish their ZMTP handshake (such probes, port scanners) are
//     not the peer's and are ignored;
//   - ZMTP heartbeats (every second) drop a connection that answers nothing, not even to
//     the peer's I/O thread, for timeout - 2 s (at least 3 s): a rank paused (SIGSTOP, a
//     debugger) for less costs nothing, and a stopped rank's own neighbours notice it before
//     every other rank's wait runs out (each would blame its own waiting neighbour);
//   - a rank that fails sends an abort (its error message) to its right neighbour, which
//     forwards it, so ranks not adjacent to the dead one fail too; a destroyed
//     communicator sends `leave` after its last data (needed for inproc://, which has no
//     connection events).
// The rank that blames a neighbour (gone or silent) says so in comm_error::peer and
// peer_state and, when GRADUS_FAULT_FILE is set, appends one line there with a single
// write(2) on an O_APPEND descriptor (lines of concurrent ranks never interleave):
//   rank 3 blames rank 2 (gone): <the error message>
// Ranks that fail because an abort reached them write nothing.
#include <zmq.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sched.h>
#include <unistd.h>

#include "gradus/comm/ring/options.hpp"
#include "gradus/comm/ring/shm_path.hpp"
#include "gradus/comm/ring/tcp_path.hpp"
#include "gradus/comm/ring/pair.hpp"

namespace gradus::ring {

namespace detail {

inline std::string scheme_of(const std::string& endpoint) {
  const auto p = endpoint.find("://");
  return p == std::string::npos ? std::string() : endpoint.substr(0, p);
}

// "tcp://host:port" -> "host" ("[::1]:5" -> "::1")
inline std::string tcp_host_of(const std::string& endpoint) {
  std::string rest = endpoint.substr(endpoint.find("://") + 3);
  const auto colon = rest.rfind(':');
  if (colon != std::string::npos) rest = rest.substr(0, colon);
  if (rest.size() >= 2 && rest.front() == '[' && rest.back() == ']') rest = rest.substr(1, rest.size() - 2);
  return rest;
}

// "tcp://host:port" -> "port"
inline std::string tcp_port_of(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  return colon == std::string::npos ? std::string() : endpoint.substr(colon + 1);
}

// An IPv6 address in brackets, as endpoints write it.
inline std::string bracketed(const std::string& host) {
  return host.find(':') != std::string::npos ? "[" + host + "]" : host;
}

// "tcp://host:port" from a host (an IPv6 address gets its brackets) and a port.
inline std::string tcp_endpoint(const std::string& host, const std::string& port) {
  return "tcp://" + bracketed(host) + ":" + port;
}

// A socket with ZMQ_IPV6 on binds an IPv4 address as IPv4-mapped IPv6 and reports it so:
// "tcp://[::ffff:127.0.0.1]:5" -> "tcp://127.0.0.1:5", which also a peer without IPv6 dials.
inline std::string unmapped(const std::string& endpoint) {
  const std::string mapped = "tcp://[::ffff:";
  if (endpoint.rfind(mapped, 0) != 0) return endpoint;
  const auto close = endpoint.find(']');
  const std::string v4 = endpoint.substr(mapped.size(), close - mapped.size());
  in_addr a{};
  if (close == std::string::npos || ::inet_pton(AF_INET, v4.c_str(), &a) != 1) return endpoint;
  return "tcp://" + v4 + endpoint.substr(close + 1);
}

// An IPv4 or IPv6 address written out (no name lookup).
inline bool is_numeric_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (res) ::freeaddrinfo(res);
  return rc == 0;
}

// 127.0.0.0/8, ::1 or an IPv4-mapped 127.x address (numeric addresses only).
inline bool is_loopback_address(const std::string& numeric) {
  in_addr a4{};
  in6_addr a6{};
  if (::inet_pton(AF_INET, numeric.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  if (::inet_pton(AF_INET6, numeric.c_str(), &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
  return false;
}

// The numeric addresses `host` resolves to, in the resolver's order, without duplicates;
// when there are none, `failure` says why.
struct resolution {
  std::vector<std::string> addresses;
  std::string failure;
};
inline resolution resolve(const std::string& host) {
  resolution out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    out.failure = rc == EAI_SYSTEM ? std::string(std::strerror(errno)) : std::string(::gai_strerror(rc));
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

inline std::string join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

inline std::string hostname() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown-host";
  return std::string(buf.data());
}

// Whether `name` is this host's own name (either may be the other's first label: "node1"
// and "node1.cluster"); never a "localhost" name, which some containers are called.
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

// Which machine and network namespace this process is in: the kernel's boot id (unique
// per machine and boot) and the namespace's inode. Ranks that share both reach each
// other's abstract ipc sockets; a host name alone is shared by namespaces (and containers).
inline std::string machine_and_netns() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  std::array<char, 64> buf{};
  const auto n = ::readlink("/proc/self/ns/net", buf.data(), buf.size() - 1);
  return (boot.empty() ? "?" : boot) + " " + (n > 0 ? std::string(buf.data(), static_cast<std::size_t>(n)) : "?");
}

// The local address this host uses to reach `host` (the source address of its route: a
// UDP socket is "connected", which sends nothing, and asked for its name); empty when
// there is no route. A rank advertises it, not its host name, which other hosts (or
// network namespaces, whose host name is the host's) may not resolve to this interface.
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

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

inline std::vector<std::string> split_lines(std::string_view s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const auto nl = s.find('\n', start);
    if (nl == std::string_view::npos) {
      if (start < s.size()) out.emplace_back(s.substr(start));
      break;
    }
    out.emplace_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

inline std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    const std::size_t j = s.find(' ', i);
    if (i < s.size()) out.emplace_back(s.substr(i, (j == std::string_view::npos ? s.size() : j) - i));
    i = j == std::string_view::npos ? s.size() : j;
  }
  return out;
}

// Unique per process (its pid, and a random salt: pids repeat across pid namespaces that
// share a network namespace) and per call.
inline std::string unique_suffix() {
  static std::atomic<unsigned long> counter{0};
  static const unsigned salt = std::random_device{}();
  std::array<char, 16> hex{};
  std::snprintf(hex.data(), hex.size(), "%08x", salt);
  return std::to_string(::getpid()) + "-" + hex.data() + "-" + std::to_string(counter.fetch_add(1));
}

// What a fresh connection to a peer's data address says about the peer.
enum class reach {
  alive,    // accepted: its process still listens (the kernel accepts even while it is stopped)
  refused,  // nothing listens there: the process died or closed its communicator
  unknown,  // no answer within the wait (unreachable), or not a tcp:// or ipc:// address
};
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
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), len) == 0) {
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

// Appends `line` to the file GRADUS_FAULT_FILE names, if set: one write(2) on an O_APPEND
// descriptor, so that lines from concurrent ranks never interleave. Never throws.
inline void append_fault_line(const std::string& line) noexcept {
  const char* path = std::getenv("GRADUS_FAULT_FILE");
  if (!path || !*path) return;
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const auto n = ::write(fd, line.data(), line.size());
  (void)n;
  ::close(fd);
}

// ZeroMQ allocates every received message with malloc. glibc serves blocks above its
// mmap threshold (128 KiB at start) by mmap, and gives the top of the heap back to the OS
// once more than its trim threshold (twice the mmap threshold) is free there; so with
// segments of 256 KiB - 1 MiB each message landed in fresh pages, and every page
// faulted (measured: 1 MiB all-reduces 4-6x slower). Freeing one mmapped block raises
// both thresholds to that block's size (glibc's own adaptation, as after any large free;
// capped at 32 MiB): done once with 4 segments' worth, received segments come from a heap
// that stays mapped. Other C libraries: nothing to do.
inline void keep_heap_for_segments(std::size_t segment_bytes) {
#ifdef __GLIBC__
  const std::size_t bytes = std::min<std::size_t>(std::size_t{32} << 20, 4 * segment_bytes + (1 << 20));
  static std::atomic<std::size_t> done{0};
  if (done.load() >= bytes) return;
  if (void* p = std::malloc(bytes)) {
    static_cast<volatile char*>(p)[0] = 0;  // a block the compiler cannot elide
    std::free(p);
  }
  done.store(bytes);
#else
  (void)segment_bytes;
#endif
}

inline int ms_until(clock::time_point deadline, int cap_ms) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap_ms));
}

// Completion of one zero-copy send: set by ZeroMQ (an I/O thread, or the receiving thread
// for inproc://) when it lets go of the bytes.
struct send_flag {
  std::atomic<bool> done{false};
};
inline void release_send(void*, void* hint) {
  auto* flag = static_cast<std::shared_ptr<send_flag>*>(hint);
  (*flag)->done.store(true, std::memory_order_release);
  delete flag;
}

}  // namespace detail

class zmq_ring;

// A view of the ring from one side: the left pair receives, the right pair sends. With two
// ranks both views face the same peer.
class zmq_pair final : public pair {
 public:
  zmq_pair(zmq_ring& ring, int peer, std::string address) : ring_(&ring), peer_(peer), address_(std::move(address)) {}
  int peer() const override { return peer_; }
  const std::string& address() const override { return address_; }
  std::uint64_t send(const frame_header& h, std::span<const std::byte> payload) override;
  bool sent(std::uint64_t ticket) override;
  void wait_sent(std::uint64_t ticket, clock::time_point deadline, std::string_view doing) override;
  message recv(clock::time_point deadline, std::string_view doing) override;

 private:
  zmq_ring* ring_;
  int peer_;
  std::string address_;
};

class zmq_ring final : public control {
 public:
  explicit zmq_ring(const ring_options& o)
      : rank_(o.rank), world_(o.world_size), timeout_(o.timeout), heartbeat_timeout_ms_(heartbeat_timeout_ms(o.timeout)) {
    if (world_ < 1) throw error("gradus: ring_allreduce: world_size " + std::to_string(world_) + " must be at least 1");
    if (rank_ < 0 || rank_ >= world_)
      throw error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " is outside world_size " + std::to_string(world_));
    if (world_ == 1) {
      transport_ = "none";
      return;
    }
    const auto undo = [&] {
      close_sockets(0);
      for (const auto& f : ipc_files_) ::unlink(f.c_str());
    };
    try {
      setup(o);
    } catch (const zmq::error_t& e) {
      undo();
      throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                       " could not set up its communicator (rendezvous " + o.rendezvous + ", " + origin_of(o) +
                       "): ZeroMQ: " + e.what());
    } catch (...) {
      undo();
      throw;
    }
  }

  zmq_ring(const zmq_ring&) = delete;
  zmq_ring& operator=(const zmq_ring&) = delete;

  ~zmq_ring() {
    try {
      if (push_ && !closed_) {
        if (!failed_ && !(path_ && path_->leave(std::chrono::milliseconds(100)))) {
          // After this rank's last data: the right neighbour fails its next collective
          // with "rank r left" instead of waiting. (A data path sends it in the data's
          // own order; over ZeroMQ only when it could not.)
          frame_header h;
          h.kind = frame_kind::leave;
          h.from = rank_;
          send_frames(h, {}, nullptr, /*block=*/false);
        }
      }
    } catch (...) {
    }
    path_.reset();
    close_sockets(100);
    for (const auto& f : ipc_files_) ::unlink(f.c_str());  // libzmq leaves them behind
    // ZeroMQ may still hold the bytes of sends a failed collective posted; give it a moment
    // to let go (an owned context's termination below waits for it anyway).
    const auto until = clock::now() + std::chrono::seconds(1);
    while (!inflight_.empty() && clock::now() < until) {
      prune();
      if (!inflight_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const std::string& transport() const { return transport_; }
  // Every rank's data address: shm://@name (the unix socket its segment was handed over on),
  // tcp://host:port (direct TCP, or ZeroMQ's), ipc://..., inproc://...
  const std::vector<std::string>& addresses() const { return shown_table_.empty() ? table_ : shown_table_; }
  pair& left() { return path_ ? path_->left() : *left_; }
  pair& right() { return path_ ? path_->right() : *right_; }
  // The segment a collective streams in: the data path's choice for `asked`.
  std::size_t segment_bytes(std::size_t asked) const { return path_ ? path_->segment_bytes(asked) : asked; }

  // ---- control, for the data paths ----
  void poll(std::string_view doing, bool left_idle, bool right_busy) override {
    pump(0);
    if (left_idle)
      for (const auto& m : inbox_)  // a leave that came over ZeroMQ (the data path had no room for it)
        if (m.header.kind == frame_kind::leave) throw left_ring(doing, left_->peer());
    check(doing, left_idle, right_busy);
  }
  comm_error silent(std::string_view doing, int peer, bool receiving) override {
    return blame(peer, "silent", prefix(doing) + (receiving ? "no message from " + peer_name(peer) + " " : peer_name(peer) + " did not take this rank's data ") +
                                     silent_for());
  }
  comm_error left_ring(std::string_view doing, int peer) override {
    return blame(peer, "gone", prefix(doing) + peer_name(peer) + " left the ring: it is gone (its communicator was destroyed)");
  }
  comm_error malformed(std::string_view doing, int peer, std::string_view what) override {
    return comm_error(prefix(doing) + peer_name(peer) + " sent " + std::string(what));
  }
  // A neighbour's connection closed (or its heartbeats stopped): ask its address which.
  comm_error lost(std::string_view doing, int peer) override {
    const std::string& dial = peer == right_->peer() && !right_dial_.empty() ? right_dial_ : table_[peer];
    const auto seen = detail::probe(dial, 500);
    const std::string head = prefix(doing) + "lost the connection to " + peer_name(peer) + ": it is ";
    if (seen == detail::reach::refused)
      return blame(peer, "gone", head + "gone (its connection closed and nothing listens at its address: the process died or closed its communicator)");
    if (seen == detail::reach::alive)
      return blame(peer, "silent", head + "silent (it answered nothing, not even heartbeats, for " + std::to_string(heartbeat_timeout_ms_) +
                                       " ms, so its connection was dropped, though its process still listens: stopped, paused or hung)");
    return blame(peer, "silent", head + "silent (its connection was dropped and its address does not answer: its host or the network is down, or it hangs)");
  }

  // This rank failed with `text`: tell the right neighbour (which forwards it), unless the
  // failure came from there. Never throws; the communicator is unusable afterwards.
  void fail(const std::string& text) noexcept {
    if (failed_) return;
    failed_ = true;
    if (!push_ || closed_) return;
    try {
      const int origin = aborted_ ? abort_origin_ : rank_;
      const std::string& what = aborted_ ? abort_text_ : text;
      if ((rank_ + 1) % world_ == origin) return;
      frame_header h;
      h.kind = frame_kind::abort;
      h.from = origin;
      h.bytes = what.size();
      send_frames(h, std::span<const std::byte>(reinterpret_cast<const std::byte*>(what.data()), what.size()), nullptr,
                  /*block=*/false);
    } catch (...) {
    }
    if (path_) path_->drop();
    release_sends(200);
  }

  // The context was shut down under us: close now, so that its termination can finish.
  void close_now() noexcept {
    failed_ = true;
    if (path_) path_->drop();
    close_sockets(0);
    release_sends(0);
  }

 private:
  friend class zmq_pair;

  // ZMTP heartbeats drop a connection that answers nothing for this long: timeout - 2 s
  // (at least 3 s). A peer whose process is stopped answers nothing, not even from its I/O
  // thread (a busy one still does); the 2 s (a heartbeat interval and a margin) let its two
  // neighbours notice before the other ranks' waits, which began no earlier than its
  // silence, run out.
  static int heartbeat_timeout_ms(std::chrono::milliseconds timeout) {
    const long long t = std::max<long long>(3000, static_cast<long long>(timeout.count()) - 2000);
    return static_cast<int>(std::min<long long>(t, std::numeric_limits<int>::max()));
  }

  // Where the rendezvous address came from, for errors.
  static std::string origin_of(const ring_options& o) {
    return o.origin.empty() ? "from ring_options::rendezvous" : "from " + o.origin;
  }

  std::string prefix(std::string_view doing) const {
    return "gradus: ring_allreduce: " + std::string(doing) + " on rank " + std::to_string(rank_) + ": ";
  }
  std::string peer_name(int peer) const {
    return "rank " + std::to_string(peer) + " at " + (peer >= 0 && peer < static_cast<int>(table_.size()) ? table_[peer] : "?");
  }

  // An error that blames neighbour `peer` ("gone" or "silent"); the first one this rank
  // makes goes to GRADUS_FAULT_FILE as well.
  comm_error blame(int peer, const char* state, const std::string& text) {
    if (!blamed_) {
      blamed_ = true;
      std::string flat = text;
      std::replace(flat.begin(), flat.end(), '\n', ' ');
      std::replace(flat.begin(), flat.end(), '\r', ' ');
      detail::append_fault_line("rank " + std::to_string(rank_) + " blames rank " + std::to_string(peer) + " (" + state + "): " + flat + "\n");
    }
    return comm_error(text, peer, state);
  }

  zmq::socket_t data_socket(zmq::socket_type type) {
    zmq::socket_t s(*ctx_, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 0);  // a collective's messages are bounded by its size
    s.set(zmq::sockopt::rcvhwm, 0);
    s.set(zmq::sockopt::ipv6, 1);
    s.set(zmq::sockopt::heartbeat_ivl, 1000);
    s.set(zmq::sockopt::heartbeat_timeout, heartbeat_timeout_ms_);
    // The TTL asks the peer to drop the connection too; it travels in 16 bits of
    // deciseconds (at most 6553.5 s): beyond that, each side's own timeout alone does it.
    s.set(zmq::sockopt::heartbeat_ttl, heartbeat_timeout_ms_ <= 6553500 ? heartbeat_timeout_ms_ : 0);
    return s;
  }

  // A PAIR socket receiving `s`'s connection events; connected before `s` binds or connects.
  zmq::socket_t monitor(zmq::socket_t& s) {
    const std::string ep = "inproc://gradus-ring-monitor-" + detail::unique_suffix();
    constexpr int events = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    if (zmq_socket_monitor(s.handle(), ep.c_str(), events) != 0) throw zmq::error_t();
    zmq::socket_t m(*ctx_, zmq::socket_type::pair);
    m.set(zmq::sockopt::linger, 0);
    m.connect(ep);
    return m;
  }

  // "127.0.0.1:29500", "[::1]:29500", "*:29500 (every interface)", "ipc://@name"
  static std::string shown(const std::string& endpoint) {
    if (detail::scheme_of(endpoint) != "tcp") return endpoint;
    const std::string rest = endpoint.substr(6);
    return rest.rfind("*:", 0) == 0 ? rest + " (every interface)" : rest;
  }

  // "MASTER_PORT" from "MASTER_ADDR=h and MASTER_PORT=29500 (torchrun)": the variable to
  // change; "port" when the origin names none.
  static std::string port_variable(const std::string& origin) {
    const auto at = origin.find("PORT=");
    if (at == std::string::npos) return "port";
    std::size_t b = at;
    while (b > 0 && (std::isupper(static_cast<unsigned char>(origin[b - 1])) || std::isdigit(static_cast<unsigned char>(origin[b - 1])) ||
                     origin[b - 1] == '_'))
      --b;
    return origin.substr(b, at + 4 - b);
  }

  // Binds `s` to `endpoint`; a failure names this rank, the address and port, what it was
  // for and where it came from, and what to do.
  void bind_or_explain(zmq::socket_t& s, const std::string& endpoint, const std::string& what, const ring_options& o) {
    try {
      s.bind(endpoint);
    } catch (const zmq::error_t& e) {
      throw comm_error(listen_failure(endpoint, what, o, e.num()));
    }
  }
  std::string listen_failure(const std::string& endpoint, const std::string& what, const ring_options& o, int err) const {
    std::string hint;
    if (err == EADDRINUSE) hint = " — another job on this port? pick another " + port_variable(o.origin);
    else if (err == EADDRNOTAVAIL) hint = " — it is not an address of this host (rank 0 must run on the host the rendezvous names)";
    else if (err == EACCES) hint = " — ports below 1024 need privileges; pick another " + port_variable(o.origin);
    else if (err == ENODEV) hint = " — no interface or address of this host by that name";
    return "gradus: ring_allreduce: rank " + std::to_string(rank_) + " cannot listen on " + shown(endpoint) + " (" + what + "): " +
           zmq_strerror(err) + hint;
  }

  // The hosts to listen on for `host` ("*": every interface). `chosen`: the user's
  // bind_host, bound as named (an interface name goes to libzmq as it is); otherwise the
  // rendezvous host, by the rules at the top of this file.
  std::vector<std::string> listen_hosts(std::string host, bool chosen, const std::string& what) const {
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host == "*" || detail::is_numeric_host(host)) return {host};
    if (chosen && ::if_nametoindex(host.c_str()) != 0) return {host};
    const auto r = detail::resolve(host);
    if (r.addresses.empty())
      throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " cannot resolve '" + host + "' (" + what +
                       "): " + r.failure + " — is the name spelled right, and known to this host's resolver (/etc/hosts, DNS)?");
    if (chosen) return r.addresses;
    const bool loopback = std::all_of(r.addresses.begin(), r.addresses.end(), detail::is_loopback_address);
    if (loopback && !detail::names_this_host(host)) return r.addresses;
    return {"*"};
  }

  // Rank != 0: the numeric tcp endpoint to dial for `endpoint` (a name resolved here, the
  // first address the resolver returns); `note` tells what a name resolved to.
  std::string dial_of(const std::string& endpoint, const std::string& what, std::string& note) const {
    note.clear();
    if (detail::scheme_of(endpoint) != "tcp") return endpoint;
    const std::string host = detail::tcp_host_of(endpoint);
    if (host.empty() || detail::is_numeric_host(host)) return endpoint;
    const auto r = detail::resolve(host);
    if (r.addresses.empty())
      throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " cannot resolve '" + host + "' (" + what +
                       "): " + r.failure + " — is the name spelled right, and known to this host's resolver (/etc/hosts, DNS)?");
    note = host + " resolved to " + detail::join(r.addresses) + (r.addresses.size() > 1 ? "; the first one dialled" : "");
    return detail::tcp_endpoint(r.addresses.front(), detail::tcp_port_of(endpoint));
  }

  void setup(const ring_options& o) {
    const std::string rdv = o.rendezvous;
    const std::string scheme = detail::scheme_of(rdv);
    if (scheme != "tcp" && scheme != "ipc" && scheme != "inproc")
      throw error("gradus: ring_allreduce: rendezvous '" + rdv + "' must be tcp://host:port, ipc://path or inproc://name");
    std::string want = o.transport;
    // GRADUS_COMM_TRANSPORT picks the data path where the program left it to "auto" (as
    // NCCL_P2P_DISABLE / NCCL_SHM_DISABLE do): a job's launcher, or CTest running every ring
    // test over each path, need not change the program.
    if (const char* env = std::getenv("GRADUS_COMM_TRANSPORT"); want == "auto" && scheme != "inproc" && env && *env) want = env;
    if (want == "ipc") want = "zmq-ipc";  // its name before shared memory and direct TCP
    if (scheme == "inproc" && (want == "auto" || want == "zmq")) want = "inproc";
    if (want != "auto" && want != "shm" && want != "tcp" && want != "zmq" && want != "zmq-tcp" && want != "zmq-ipc" && want != "inproc")
      throw error("gradus: ring_allreduce: transport '" + want + "' must be auto, shm, tcp, zmq, zmq-tcp, zmq-ipc or inproc");
    if ((scheme == "inproc") != (want == "inproc"))
      throw error("gradus: ring_allreduce: transport '" + want + "' with rendezvous '" + rdv +
                  "': inproc:// goes with inproc:// only (ranks as threads of one process)");
    if (o.segment_bytes < 64) throw error("gradus: ring_allreduce: segment_bytes " + std::to_string(o.segment_bytes) + " is below 64");
    if (o.context) {
      ctx_ = o.context;
    } else {
      if (scheme == "inproc")
        throw error("gradus: ring_allreduce: rendezvous '" + rdv + "' is inproc://: give every rank the same ring_options::context");
      own_ctx_ = std::make_unique<zmq::context_t>(std::max(1, o.io_threads));
      ctx_ = own_ctx_.get();
    }

    detail::keep_heap_for_segments(o.segment_bytes);

    // ---- where the ranks meet: rank 0 listens, the others dial (names resolved here) ----
    const std::string rdv_what = "the rendezvous, " + origin_of(o);
    if (scheme == "tcp") {
      if (rank_ == 0) {
        listen_ = o.bind_host.empty() ? listen_hosts(detail::tcp_host_of(rdv), false, rdv_what)
                                      : listen_hosts(o.bind_host, true, "ring_options::bind_host for " + rdv_what);
      } else {
        rdv_dial_ = dial_of(rdv, rdv_what, rdv_note_);
      }
    } else {
      rdv_dial_ = rdv;
    }

    // ---- this rank's data socket: bound before registering ----
    pull_.emplace(data_socket(zmq::socket_type::pull));
    if (scheme != "inproc") pull_mon_.emplace(monitor(*pull_));
    std::vector<std::string> mine;
    if (scheme == "inproc") {
      const std::string ep = rdv + ".rank" + std::to_string(rank_) + "-" + detail::unique_suffix();
      bind_or_explain(*pull_, ep, "its data socket", o);
      mine.push_back(ep);
    } else {
      // ZeroMQ's sockets carry the control plane (and the data, for "zmq*"): tcp where some
      // rank may be on another host, ipc where all may share one.
      const bool want_tcp = scheme == "tcp" ? want != "zmq-ipc" && want != "shm" : want == "zmq-tcp" || want == "tcp";
      const bool want_ipc = want != "zmq-tcp";
      if (want_tcp) {
        const std::string advertised = bind_tcp_data(o, scheme);
        mine.push_back(advertised);
        if (want == "auto" || want == "tcp") {
          // the direct-TCP listener: the interface the ZeroMQ socket bound, another port
          tcp_listen_.emplace(tcp_bound_host_, rank_);
          mine.push_back("tcpd://" + detail::tcp_endpoint(detail::tcp_host_of(advertised), std::to_string(tcp_listen_->port())).substr(6));
        }
      }
      if (want == "auto" || want == "shm") {
        shm_listen_.emplace(detail::unique_suffix(), rank_);
        mine.push_back(shm_listen_->address());
      }
      if (want_ipc) {
        // Beside an ipc:// rendezvous (a path, or an abstract @name); else an abstract
        // socket, which nothing can leave behind.
        const std::string name = scheme == "ipc" ? rdv.substr(6) + ".rank" + std::to_string(rank_)
                                                 : "@gradus-ring-" + detail::unique_suffix() + "-rank" + std::to_string(rank_);
        bind_or_explain(*pull_, "ipc://" + name, "its ipc data socket", o);
        if (name.front() != '@') ipc_files_.push_back(name);
        mine.push_back("ipc://" + name);
      }
    }

    rendezvous(o, scheme, want, mine);

    // ---- connect to the right neighbour ----
    const int right = (rank_ + 1) % world_, left = (rank_ + world_ - 1) % world_;
    push_.emplace(data_socket(zmq::socket_type::push));
    if (zmq_scheme_ != "inproc") push_mon_.emplace(monitor(*push_));
    std::string note;
    right_dial_ = dial_of(table_[right], "the data address of rank " + std::to_string(right), note);
    try {
      push_->connect(right_dial_);
    } catch (const zmq::error_t& e) {
      throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " cannot connect to rank " + std::to_string(right) +
                       "'s data address " + table_[right] + (note.empty() ? "" : " (" + note + ")") + ": " + e.what());
    }
    left_.emplace(*this, left, table_[left]);
    right_.emplace(*this, right, table_[right]);

    // ---- the data path, when it is not ZeroMQ ----
    const auto by = clock::now() + timeout_;
    // More ranks on this machine than cores for this process: waiting ranks yield instead of
    // spinning (OpenMPI's mpi_yield_when_idle, which mpirun --oversubscribe sets).
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int cores = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : static_cast<int>(std::thread::hardware_concurrency());
    const bool crowded = local_ranks_ > std::max(1, cores);
    if (transport_ == "shm") {
      const std::size_t slot = std::min<std::size_t>(o.segment_bytes, shm_slot_bytes);
      path_ = std::make_unique<shm_path>(*this, rank_, left, right, *shm_listen_, data_table_[right], data_table_[left], data_table_[right],
                                         slot, crowded, by);
    } else if (transport_ == "tcp") {
      std::string tnote;
      const std::string ep = dial_of("tcp" + data_table_[right].substr(4), "the direct TCP address of rank " + std::to_string(right), tnote);
      path_ = std::make_unique<tcp_path>(*this, rank_, world_, left, right, *tcp_listen_, detail::tcp_host_of(ep), detail::tcp_port_of(ep),
                                         data_table_[left], data_table_[right], o.segment_bytes, crowded, by);
    }
    shm_listen_.reset();
    tcp_listen_.reset();
    for (const auto& a : data_table_) shown_table_.push_back(a.rfind("tcpd://", 0) == 0 ? "tcp" + a.substr(4) : a);
  }

  // Binds the tcp data socket (an ephemeral port) and returns the address to advertise:
  // numeric, or a name every rank resolves (rank 0's rendezvous host).
  std::string bind_tcp_data(const ring_options& o, const std::string& scheme) {
    std::string what = "its data socket, an ephemeral port";
    std::vector<std::string> hosts;
    if (!o.bind_host.empty()) {
      what += ", ring_options::bind_host";
      hosts = rank_ == 0 && scheme == "tcp" ? listen_ : listen_hosts(o.bind_host, true, what);
    } else if (scheme != "tcp") {
      hosts = {"127.0.0.1"};
    } else if (rank_ == 0) {
      hosts = listen_;
    } else {
      // The loopback of the family rank 0 is dialled by, or every interface.
      const std::string to = detail::tcp_host_of(rdv_dial_);
      if (detail::is_loopback_address(to)) hosts = {to.find(':') != std::string::npos && to.rfind("::ffff:", 0) != 0 ? "::1" : "127.0.0.1"};
      else hosts = {"*"};
    }
    if (hosts.front() != "*") {
      bind_or_explain(*pull_, detail::tcp_endpoint(hosts.front(), "*"), what, o);
      const std::string bound = detail::unmapped(pull_->get(zmq::sockopt::last_endpoint));
      tcp_bound_host_ = detail::tcp_host_of(bound);
      return bound;
    }
    bind_or_explain(*pull_, "tcp://*:*", what, o);
    const std::string ep = pull_->get(zmq::sockopt::last_endpoint);
    tcp_bound_host_ = detail::tcp_host_of(detail::unmapped(ep));
    const std::string port = detail::tcp_port_of(ep);
    if (scheme == "tcp" && rank_ == 0) return detail::tcp_endpoint(detail::tcp_host_of(o.rendezvous), port);
    // The address that routes to rank 0 (other hosts, or network namespaces that share
    // this host's name, may not resolve its name to this interface); else the name.
    std::string me = scheme == "tcp" ? detail::route_source_address(detail::tcp_host_of(rdv_dial_)) : std::string();
    if (me.empty()) me = detail::hostname();
    return detail::tcp_endpoint(me, port);
  }

  std::string registration(int world, const std::string& host, const std::vector<std::string>& addrs) const {
    std::string s = "gradus-ring/4\n" + std::to_string(rank_) + "\n" + std::to_string(world) + "\n" + host + "\n" +
                    detail::machine_and_netns() + "\n";
    for (const auto& a : addrs) s += a + "\n";
    return s;
  }

  void rendezvous(const ring_options& o, const std::string& scheme, const std::string& want, const std::vector<std::string>& mine) {
    const auto deadline = clock::now() + timeout_;
    const std::string host = detail::hostname();
    const std::string where = "gradus: ring_allreduce: rendezvous at " + o.rendezvous + " (rank " + std::to_string(rank_) + " of " +
                              std::to_string(world_) + ", " + origin_of(o) + "): ";
    if (rank_ != 0) {
      // Rank 0 gives up on missing ranks after the timeout and says which; wait a little
      // longer than it, so that its verdict arrives.
      const auto answer_by = deadline + std::chrono::seconds(1);
      zmq::socket_t dealer(*ctx_, zmq::socket_type::dealer);
      dealer.set(zmq::sockopt::linger, 0);
      dealer.set(zmq::sockopt::ipv6, 1);
      const std::string dialled = rdv_dial_ + (rdv_note_.empty() ? "" : " (" + rdv_note_ + ")");
      try {
        dealer.connect(rdv_dial_);
      } catch (const zmq::error_t& e) {
        throw comm_error(where + "cannot connect to " + dialled + ": " + e.what());
      }
      const std::string reg = registration(world_, host, mine);
      dealer.send(zmq::buffer(reg), zmq::send_flags::none);
      zmq::message_t reply;
      while (true) {
        zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(detail::ms_until(answer_by, 100)));
        if (dealer.recv(reply, zmq::recv_flags::dontwait)) break;
        if (clock::now() >= answer_by)
          throw comm_error(where + "no answer from rank 0 at " + dialled + " within " + std::to_string(timeout_.count()) +
                           " ms (is rank 0 running, with the same rendezvous address and world_size, and reachable at that address?)");
      }
      const auto lines = detail::split_lines(reply.to_string_view());
      if (lines.empty()) throw comm_error(where + "empty answer from rank 0");
      if (lines[0] == "error") throw comm_error(lines.size() > 1 ? lines[1] : where + "rank 0 refused the registration");
      const std::size_t w = static_cast<std::size_t>(world_);
      if (lines[0] != "ok" || lines.size() < 4 || lines.size() != 4 + (has_data_path(lines[1]) ? 2 * w : w))
        throw comm_error(where + "malformed answer from rank 0 (a different gradus version?)");
      transport_ = lines[1];
      zmq_scheme_ = lines[2];
      table_.assign(lines.begin() + 3, lines.begin() + 3 + static_cast<std::ptrdiff_t>(w));
      if (has_data_path(transport_)) data_table_.assign(lines.begin() + 3 + static_cast<std::ptrdiff_t>(w), lines.end() - 1);
      const auto counts = detail::split_words(lines.back());
      local_ranks_ = static_cast<std::size_t>(rank_) < counts.size() ? std::atoi(counts[rank_].c_str()) : 1;
      return;
    }

    // ---- rank 0 ----
    zmq::socket_t router(*ctx_, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 2000);  // the answers must get out before close
    router.set(zmq::sockopt::ipv6, 1);
    const std::string what =
        "the rendezvous, " + origin_of(o) + (o.bind_host.empty() ? "" : ", on ring_options::bind_host = " + o.bind_host + " (GRADUS_BIND_ADDR)");
    if (scheme != "tcp") {
      bind_or_explain(router, o.rendezvous, what, o);
      // libzmq leaves an ipc path behind; the destructor (or a failed setup) removes it
      if (scheme == "ipc" && o.rendezvous.size() > 6 && o.rendezvous[6] != '@') ipc_files_.push_back(o.rendezvous.substr(6));
    } else {
      // Every address of listen_; one that this host lacks (::1 without IPv6) is skipped
      // while another one is bound.
      const std::string port = detail::tcp_port_of(o.rendezvous);
      int bound = 0, first_err = 0;
      std::string first_failed;
      for (const auto& h : listen_) {
        const std::string ep = h == "*" ? "tcp://*:" + port : detail::tcp_endpoint(h, port);
        try {
          router.bind(ep);
          ++bound;
        } catch (const zmq::error_t& e) {
          if (listen_.size() == 1 || (e.num() != EADDRNOTAVAIL && e.num() != EAFNOSUPPORT)) throw comm_error(listen_failure(ep, what, o, e.num()));
          if (first_failed.empty()) {
            first_failed = ep;
            first_err = e.num();
          }
        }
      }
      if (bound == 0) throw comm_error(listen_failure(first_failed, what, o, first_err));
    }
    struct entry {
      bool present = false;
      std::string host, machine;
      std::vector<std::string> addrs;
      std::string identity;
    };
    std::vector<entry> reg(static_cast<std::size_t>(world_));
    const std::string machine = detail::machine_and_netns();
    reg[0] = {true, host, machine, mine, {}};
    std::vector<std::string> identities;
    auto refuse = [&](const std::string& text) {
      for (const auto& id : identities) {
        router.send(zmq::buffer(id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        router.send(zmq::buffer("error\n" + text), zmq::send_flags::dontwait);
      }
      throw comm_error(text);
    };
    int present = 1;
    while (present < world_) {
      zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(detail::ms_until(deadline, 100)));
      zmq::message_t id, body;
      if (!router.recv(id, zmq::recv_flags::dontwait)) {
        if (clock::now() >= deadline) {
          std::vector<int> missing;
          for (int r = 0; r < world_; ++r)
            if (!reg[r].present) missing.push_back(r);
          refuse(where + (missing.size() == 1 ? "rank " : "ranks ") + detail::join_ranks(missing) + " of world_size " +
                 std::to_string(world_) + " did not register within " + std::to_string(timeout_.count()) +
                 " ms (not started, or started with another rendezvous address?)");
        }
        continue;
      }
      if (!id.more() || !router.recv(body)) continue;
      identities.push_back(id.to_string());
      const auto lines = detail::split_lines(body.to_string_view());
      if (lines.size() < 6 || lines[0] != "gradus-ring/4")
        refuse(where + "a malformed registration (not a gradus ring rank, or one of another gradus version?)");
      int r = -1, w = -1;
      try {
        r = std::stoi(lines[1]);
        w = std::stoi(lines[2]);
      } catch (...) {
        refuse(where + "a registration with a malformed rank or world_size");
      }
      if (w != world_)
        refuse(where + "rank " + std::to_string(r) + " (host " + lines[3] + ") registered with world_size " + std::to_string(w) +
               ", but rank 0 has world_size " + std::to_string(world_));
      if (r < 0 || r >= world_)
        refuse(where + "a rank registered as rank " + std::to_string(r) + " (host " + lines[3] + "), outside world_size " +
               std::to_string(world_));
      if (reg[r].present)
        refuse(where + "rank " + std::to_string(r) + " registered twice: by host " + reg[r].host + " (" +
               (reg[r].addrs.empty() ? "?" : reg[r].addrs[0]) + ") and by host " + lines[3] + " (" + lines[5] + ")");
      reg[r] = {true, lines[3], lines[4], std::vector<std::string>(lines.begin() + 5, lines.end()), identities.back()};
      ++present;
    }

    // The data path, and the kind of ZeroMQ socket for the control plane (and for the data,
    // on "zmq*"): shared memory and ipc when every rank shares this machine and network
    // namespace (abstract sockets are per namespace), else direct TCP and tcp.
    int stranger = -1;
    for (int r = 0; r < world_ && stranger < 0; ++r)
      if (scheme == "tcp" && (reg[r].host != host || reg[r].machine != machine)) stranger = r;
    const bool same = stranger < 0;
    std::string path = want, zs = scheme == "tcp" && same ? "ipc" : scheme;
    if (want == "auto") path = same ? "shm" : "tcp";
    if (want == "zmq-tcp" || want == "zmq-ipc") zs = want.substr(4);
    if (want == "shm" && !same)
      refuse(where + "transport shm needs every rank on one host, but rank " + std::to_string(stranger) + " is on host " + reg[stranger].host +
             " (machine " + reg[stranger].machine + ") and rank 0 on " + host + " (" + machine + "): use transport tcp or auto");
    const std::string chosen = path == "zmq" || path == "zmq-tcp" || path == "zmq-ipc" ? "zmq-" + zs : path;
    auto pick = [&](int r, const std::string& want_scheme) {
      auto it = std::find_if(reg[r].addrs.begin(), reg[r].addrs.end(), [&](const std::string& a) { return detail::scheme_of(a) == want_scheme; });
      if (it == reg[r].addrs.end())
        refuse(where + "rank " + std::to_string(r) + " (host " + reg[r].host + ") has no " + want_scheme + " address (transport " + want + ")");
      return *it;
    };
    std::string answer = "ok\n" + chosen + "\n" + zs + "\n";
    for (int r = 0; r < world_; ++r) {
      table_.push_back(pick(r, zs));
      answer += table_.back() + "\n";
    }
    if (has_data_path(chosen)) {
      for (int r = 0; r < world_; ++r) {
        data_table_.push_back(pick(r, chosen == "shm" ? "shm" : "tcpd"));
        answer += data_table_.back() + "\n";
      }
    }
    // how many ranks share each rank's machine (a waiting rank spins only where each has a core)
    std::string counts;
    for (int r = 0; r < world_; ++r) {
      int c = 0;
      for (const auto& e : reg) c += e.host == reg[r].host && e.machine == reg[r].machine ? 1 : 0;
      counts += (r ? " " : "") + std::to_string(c);
      if (r == 0) local_ranks_ = c;
    }
    answer += counts + "\n";
    transport_ = chosen;
    zmq_scheme_ = zs;
    for (int r = 1; r < world_; ++r) {
      router.send(zmq::buffer(reg[r].identity), zmq::send_flags::sndmore);
      router.send(zmq::buffer(answer), zmq::send_flags::none);
    }
  }

  // After a failure nothing may go on reading a caller's buffer once its collective has
  // thrown (the caller may free it at once). Closes the sending socket, letting frames
  // already queued (the abort among them) go out for `linger_ms`, and waits for ZeroMQ to
  // let go of every zero-copy payload: on close its I/O thread drops what is left and calls
  // the free callbacks, within milliseconds.
  void release_sends(int linger_ms) noexcept {
    prune();
    if (inflight_.empty()) return;
    try {
      if (push_) push_->set(zmq::sockopt::linger, linger_ms);
    } catch (...) {
    }
    unmonitor(push_, push_mon_);
    push_.reset();
    const auto until = clock::now() + std::chrono::milliseconds(linger_ms) + std::chrono::seconds(10);
    while (!inflight_.empty() && clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      prune();
    }
    if (!inflight_.empty())
      std::fprintf(stderr, "gradus: ring_allreduce: rank %d: ZeroMQ still holds %zu zero-copy sends 10 s after closing its socket\n",
                   rank_, inflight_.size());
  }

  void close_sockets(int linger_ms) noexcept {
    if (closed_) return;
    closed_ = true;
    try {
      if (push_) push_->set(zmq::sockopt::linger, linger_ms);
    } catch (...) {
    }
    unmonitor(push_, push_mon_);
    unmonitor(pull_, pull_mon_);
    push_.reset();
    pull_.reset();
  }

  // Stops a socket's monitor before closing its reader. libzmq 4.3 leaks every event it
  // cannot deliver (socket_base_t::monitor_event does not close a message whose send
  // failed), and closing a socket raises DISCONNECTED events.
  static void unmonitor(std::optional<zmq::socket_t>& s, std::optional<zmq::socket_t>& mon) noexcept {
    if (s && mon) (void)zmq_socket_monitor(s->handle(), nullptr, 0);
    mon.reset();
  }

  // Takes everything that has arrived: connection events, and the left neighbour's
  // messages (an abort is noted at once; data and leave queue in order).
  void pump(int wait_ms) {
    if (closed_) throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + ": the communicator is closed");
    std::array<zmq::pollitem_t, 3> items{};
    std::size_t n = 0;
    items[n++] = {pull_->handle(), 0, ZMQ_POLLIN, 0};
    if (pull_mon_) items[n++] = {pull_mon_->handle(), 0, ZMQ_POLLIN, 0};
    if (push_mon_) items[n++] = {push_mon_->handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(items.data(), n, std::chrono::milliseconds(wait_ms));  // also when 0: recv alone may not see new messages for ~1 ms (ZeroMQ throttles its command processing)
    auto events = [&](std::optional<zmq::socket_t>& mon, link_state& link) {
      if (!mon) return;
      zmq::message_t ev, addr;
      while (mon->recv(ev, zmq::recv_flags::dontwait)) {
        if (ev.more()) (void)mon->recv(addr);
        std::uint16_t id = 0;
        if (ev.size() >= 2) std::memcpy(&id, ev.data(), 2);
        if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
            id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
          ++link.unestablished;  // its DISCONNECTED follows: a connection that was never the peer's
        } else if (id == ZMQ_EVENT_DISCONNECTED) {
          if (link.unestablished > 0) {
            --link.unestablished;
          } else if (!link.gone) {
            link.gone = true;
            link.gone_at = clock::now();
          }
        }
      }
    };
    events(pull_mon_, left_link_);
    events(push_mon_, right_link_);
    while (true) {
      zmq::message_t head;
      if (!pull_->recv(head, zmq::recv_flags::dontwait)) break;
      auto body = std::make_shared<zmq::message_t>();
      if (!head.more() || !pull_->recv(*body) || head.size() != sizeof(frame_header)) {
        protocol_error_ = "a malformed message on its data socket (not a gradus ring peer?)";
        continue;
      }
      frame_header h;
      std::memcpy(&h, head.data(), sizeof h);
      if (h.magic != frame_header::magic_value || h.bytes != body->size()) {
        protocol_error_ = "a malformed message on its data socket (not a gradus ring peer?)";
        continue;
      }
      if (h.kind == frame_kind::abort) {
        if (!aborted_) {
          aborted_ = true;
          abort_origin_ = h.from;
          abort_text_.assign(static_cast<const char*>(body->data()), body->size());
        }
        continue;
      }
      inbox_.push_back(message{h, std::span<const std::byte>(static_cast<const std::byte*>(body->data()), body->size()), body});
    }
  }

  void prune() {
    while (!inflight_.empty() && inflight_.front()->done.load(std::memory_order_acquire)) {
      inflight_.pop_front();
      ++first_ticket_;
    }
  }

  // Throws when the collective cannot finish: an abort from the ring, a lost neighbour.
  // A lost left neighbour matters once its queued messages are used up; a lost right one
  // while sends to it are pending. The grace lets messages already on their way arrive.
  void check(std::string_view doing, bool waiting_on_left, bool need_right) {
    if (aborted_)
      throw comm_error(prefix(doing) + "aborted because rank " + std::to_string(abort_origin_) + " failed: " + abort_text_);
    if (!protocol_error_.empty()) throw comm_error(prefix(doing) + peer_name(left_->peer()) + " sent " + protocol_error_);
    const auto now = clock::now();
    constexpr auto grace = std::chrono::milliseconds(300);
    if (waiting_on_left && left_link_.gone && inbox_.empty() && now - left_link_.gone_at > grace) throw lost(doing, left_->peer());
    if (need_right && right_link_.gone && now - right_link_.gone_at > grace) throw lost(doing, right_->peer());
  }

  // The text of an error that blames a neighbour for sending or taking nothing in time.
  std::string silent_for() const {
    return "within " + std::to_string(timeout_.count()) +
           " ms: it is silent (stopped, paused, hung or unreachable, or the ranks are running different collectives)";
  }

  void send_frames(const frame_header& h, std::span<const std::byte> payload, std::shared_ptr<detail::send_flag>* flag_out,
                   bool block) {
    zmq::message_t head(&h, sizeof h);
    zmq::message_t body;
    // Small payloads are copied: cheaper than tracking when ZeroMQ lets go of them.
    constexpr std::size_t zero_copy_from = 64 << 10;
    if (!payload.empty()) {
      if (flag_out && payload.size() >= zero_copy_from) {
        auto flag = std::make_shared<detail::send_flag>();
        auto* hint = new std::shared_ptr<detail::send_flag>(flag);
        try {
          body = zmq::message_t(const_cast<std::byte*>(payload.data()), payload.size(), &detail::release_send, hint);
        } catch (...) {
          delete hint;
          throw;
        }
        *flag_out = std::move(flag);
      } else {
        body = zmq::message_t(payload.data(), payload.size());
      }
    }
    const auto deadline = clock::now() + timeout_;
    while (!push_->send(head, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      if (!block) return;
      if (clock::now() >= deadline)
        throw blame(right_->peer(), "silent", prefix(to_string(h.fp)) + "could not send to " + peer_name(right_->peer()) + " " + silent_for());
      zmq::pollitem_t item{push_->handle(), 0, ZMQ_POLLOUT, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      pump(0);
      check(to_string(h.fp), false, true);
    }
    // The first frame went out, so the second one does too (multi-part messages are atomic).
    (void)push_->send(body, zmq::send_flags::none);
  }

  static bool has_data_path(const std::string& transport) { return transport == "shm" || transport == "tcp"; }
  // Shared memory moves a ring chunk in slots of at most this much: small enough that one
  // rank's copy into a slot overlaps its neighbour's reduction of the previous one.
  static constexpr std::size_t shm_slot_bytes = std::size_t{256} << 10;

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::string transport_;       // the data path: shm, tcp, zmq-tcp, zmq-ipc, inproc; none for a world of one
  std::string zmq_scheme_;      // ZeroMQ's sockets: tcp, ipc or inproc
  std::vector<std::string> table_;       // every rank's ZeroMQ data address
  std::vector<std::string> data_table_;  // every rank's shm:// or tcpd:// address, for those paths
  std::vector<std::string> shown_table_; // data_table_ as addresses() shows it
  std::optional<shm_listener> shm_listen_;
  std::optional<tcp_listener> tcp_listen_;
  std::string tcp_bound_host_;  // the numeric host the ZeroMQ tcp data socket bound
  int local_ranks_ = 1;         // ranks on this rank's machine (this one included)
  std::unique_ptr<data_path> path_;
  std::vector<std::string> ipc_files_;
  std::unique_ptr<zmq::context_t> own_ctx_;  // destroyed last: after the sockets
  zmq::context_t* ctx_ = nullptr;
  std::optional<zmq::socket_t> pull_, push_, pull_mon_, push_mon_;
  std::optional<zmq_pair> left_, right_;
  std::deque<message> inbox_;
  std::deque<std::shared_ptr<detail::send_flag>> inflight_;
  std::uint64_t first_ticket_ = 0, next_ticket_ = 0;
  // What the socket monitors said about a neighbour's connection.
  struct link_state {
    bool gone = false;         // its connection closed (or heartbeats dropped it)
    clock::time_point gone_at{};
    int unestablished = 0;     // connections that failed their handshake, whose DISCONNECTED is still to come
  };
  link_state left_link_, right_link_;
  int heartbeat_timeout_ms_;
  std::vector<std::string> listen_;   // rank 0, tcp: the hosts its rendezvous binds ("*": every interface)
  std::string rdv_dial_, rdv_note_;   // rank != 0: the rendezvous endpoint dialled, and what its name resolved to
  std::string right_dial_;            // the right neighbour's data endpoint as dialled (numeric)
  bool blamed_ = false;
  bool aborted_ = false;
  int abort_origin_ = -1;
  std::string abort_text_, protocol_error_;
  bool failed_ = false, closed_ = false;
};

inline std::uint64_t zmq_pair::send(const frame_header& h, std::span<const std::byte> payload) {
  std::shared_ptr<detail::send_flag> flag;
  ring_->send_frames(h, payload, &flag, /*block=*/true);
  if (!flag) {
    flag = std::make_shared<detail::send_flag>();
    flag->done.store(true);
  }
  ring_->inflight_.push_back(std::move(flag));
  return ring_->next_ticket_++;
}

inline bool zmq_pair::sent(std::uint64_t ticket) {
  ring_->prune();
  if (ticket < ring_->first_ticket_) return true;
  const auto i = ticket - ring_->first_ticket_;
  return i >= ring_->inflight_.size() || ring_->inflight_[i]->done.load(std::memory_order_acquire);
}

inline void zmq_pair::wait_sent(std::uint64_t ticket, clock::time_point deadline, std::string_view doing) {
  for (int spins = 0;; ++spins) {
    ring_->prune();
    if (ticket < ring_->first_ticket_) return;
    ring_->pump(0);
    ring_->check(doing, false, true);
    if (clock::now() >= deadline)
      throw ring_->blame(peer_, "silent", ring_->prefix(doing) + ring_->peer_name(peer_) + " did not take this rank's data " + ring_->silent_for());
    // Completion is set from another thread (no socket becomes readable for it): yield a
    // while, as it usually comes within microseconds, then sleep.
    if (spins < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

inline message zmq_pair::recv(clock::time_point deadline, std::string_view doing) {
  auto& r = *ring_;
  r.pump(0);
  while (true) {
    // Messages queued before an abort are the sender's last data: take them first, so that
    // an abort never overtakes an earlier collective (or this one's own mismatch check).
    if (!r.inbox_.empty()) {
      message m = std::move(r.inbox_.front());
      r.inbox_.pop_front();
      if (m.header.kind == frame_kind::leave)
        throw r.blame(peer_, "gone", r.prefix(doing) + r.peer_name(peer_) + " left the ring: it is gone (its communicator was destroyed)");
      return m;
    }
    r.prune();
    r.check(doing, true, !r.inflight_.empty());
    if (clock::now() >= deadline) {
      // While the ring connects, the likelier cause is a data address the peer cannot reach.
      const std::string unreachable = doing.rfind("connect", 0) == 0 ? "; or rank " + std::to_string(peer_) + " cannot reach this rank's data address " + r.table_[r.rank_] +
                                                                            " (GRADUS_BIND_ADDR / ring_options::bind_host picks the interface)"
                                                                      : "";
      throw r.blame(peer_, "silent", r.prefix(doing) + "no message from " + r.peer_name(peer_) + " " + r.silent_for() + unreachable);
    }
    r.pump(detail::ms_until(deadline, 20));
  }
}

}  // namespace gradus::ring
