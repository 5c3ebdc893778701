#pragma once
// The ring's direct-TCP data path, for ranks on different hosts (ring_options::transport
// "tcp", and "auto" when some rank is on another machine or network namespace).
//
// Each rank listens on one more ephemeral port beside its ZeroMQ control socket (same
// interface, advertised at the rendezvous as tcpd://host:port), dials its right neighbour and
// accepts its left one: one plain non-blocking socket per direction (TCP_NODELAY; the
// kernel's buffer autotuning left on, since setting SO_SNDBUF / SO_RCVBUF caps them at
// net.core.[rw]mem_max, 208 KiB by default, below what autotuning reaches). Everything is
// driven from the collective's own thread, as Gloo's tcp pair and NCCL's socket transport
// do: a send is written at once as far as the kernel takes it and the rest is written
// whenever the rank waits for anything; every wait also drains the left socket into
// received messages, so that no two ranks can wait on each other's full socket buffers.
// One socket per direction: several (NCCL_NSOCKS_PERTHREAD) help where one flow cannot fill
// a link (long fat pipes, per-flow limits in the fabric); not written, as nothing here could
// measure the gain (one flow already moves 6 GB/s over loopback).
//
// A neighbour's socket that closes without `leave` is a lost peer (control::lost asks its
// address which); a silent one is dropped by the control plane's heartbeats, which a
// waiting rank asks at least every few milliseconds.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gradus/comm/net/fd.hpp"
#include "gradus/comm/ring/pair.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ring {

namespace tcp_detail {

constexpr std::uint64_t magic = 0x67726e6774637031;  ///< "grngtcp1"

struct hello {
  std::uint64_t magic = tcp_detail::magic;
  std::int32_t rank = -1;
  std::int32_t world = 0;
};

/// Sends `mine` (when given) and reads `theirs` (when given).
inline void exchange(int fd, const hello* mine_or_null, hello* theirs_or_null, clock::time_point deadline, const std::string& doing) {
  const hello none{};
  hello ignored{};
  const auto* out = reinterpret_cast<const char*>(mine_or_null ? mine_or_null : &none);
  auto* in = reinterpret_cast<char*>(theirs_or_null ? theirs_or_null : &ignored);
  constexpr std::size_t size = sizeof(hello);
  std::size_t sent = mine_or_null ? 0 : size, got = theirs_or_null ? 0 : size;
  while (sent < size || got < size) {
    if (sent < size) {
      const ssize_t k = ::send(fd, out + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) sent += static_cast<std::size_t>(k);
      else if (k < 0 && errno != EAGAIN && errno != EINTR) throw comm_error(doing + ": " + net::errno_message(errno));
    }
    if (got < size) {
      const ssize_t k = ::recv(fd, in + got, size - got, MSG_DONTWAIT);
      if (k > 0) got += static_cast<std::size_t>(k);
      else if (k == 0) throw comm_error(doing + ": the peer closed the connection");
      else if (errno != EAGAIN && errno != EINTR) throw comm_error(doing + ": " + net::errno_message(errno));
    }
    if (sent < size || got < size)
      net::wait_fd(fd, static_cast<short>((sent < size ? POLLOUT : 0) | (got < size ? POLLIN : 0)), deadline, doing);
  }
}

inline void tune(int fd) {
  const int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace tcp_detail

/// This rank's direct-TCP listener: bound before the rendezvous on the numeric address its
/// ZeroMQ data socket bound ("0.0.0.0" / "::": every interface), an ephemeral port.
class tcp_listener {
 public:
  /// Binds an ephemeral port on `numeric_host` and listens. Throws gradus::comm_error when it
  /// cannot.
  tcp_listener(const std::string& numeric_host, int rank) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
    addrinfo* res = nullptr;
    const std::string where = "gradus: ring_allreduce: rank " + std::to_string(rank) + " cannot listen on " + numeric_host +
                              " for its direct TCP data path: ";
    if (const int rc = ::getaddrinfo(numeric_host.c_str(), "0", &hints, &res); rc != 0 || !res)
      throw comm_error(where + ::gai_strerror(rc));
    const int family = res->ai_family;
    fd_ = net::unique_fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd_.fd >= 0 && family == AF_INET6) {
      const int zero = 0;  // "::" takes IPv4 as well
      (void)::setsockopt(fd_.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    const bool ok = fd_.fd >= 0 && ::bind(fd_.fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd_.fd, 16) == 0;
    ::freeaddrinfo(res);
    if (!ok) throw comm_error(where + net::errno_message(errno));
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    ::getsockname(fd_.fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  }
  /// The port the system chose.
  int port() const { return port_; }
  /// The listening socket.
  int fd() const { return fd_.fd; }

 private:
  net::unique_fd fd_;
  int port_ = 0;
};

/// The ring's direct-TCP data path (transport "tcp"): one non-blocking socket to each
/// neighbour, written and read from the collective's own thread. The top of this header says
/// how; zmq_ring makes it at set-up and drives it through its pairs.
class tcp_path final : public data_path {
 public:
  /// Dials the right neighbour at (numeric) `right_host`:`right_port`, accepts the left one on
  /// `mine`, and checks both by a hello, within `deadline`. `max_payload`: the largest frame
  /// payload a neighbour may send (a segment). Throws gradus::comm_error when a step fails or
  /// the deadline passes.
  tcp_path(control& ctl, int rank, int world, int left, int right, tcp_listener& mine, const std::string& right_host,
           const std::string& right_port, std::string shown_left, std::string shown_right, std::size_t max_payload,
           bool crowded, clock::time_point deadline)
      : ctl_(&ctl), rank_(rank), crowded_(crowded), max_payload_(max_payload), pool_(std::make_shared<buffer_pool>()) {
    pool_->size = max_payload;
    const std::string where = "gradus: ring_allreduce: rank " + std::to_string(rank) + ": direct TCP: ";
    tcp_detail::hello me;
    me.rank = rank;
    me.world = world;
    // 1. dial the right neighbour (its listen backlog completes the connection at once)
    {
      addrinfo hints{};
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
      addrinfo* res = nullptr;
      const std::string what = "dialling rank " + std::to_string(right) + " at " + shown_right;
      if (const int rc = ::getaddrinfo(right_host.c_str(), right_port.c_str(), &hints, &res); rc != 0 || !res)
        throw comm_error(where + what + ": " + ::gai_strerror(rc));
      send_fd_ = net::unique_fd(::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
      const int rc = send_fd_.fd < 0 ? -1 : ::connect(send_fd_.fd, res->ai_addr, res->ai_addrlen);
      const int err = errno;
      ::freeaddrinfo(res);
      if (rc != 0 && err != EINPROGRESS) throw comm_error(where + what + ": " + net::errno_message(err));
      net::wait_fd(send_fd_.fd, POLLOUT, deadline, where + what);
      int soerr = 0;
      socklen_t len = sizeof soerr;
      ::getsockopt(send_fd_.fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
      if (soerr != 0)
        throw comm_error(where + what + ": " + net::errno_message(soerr) + " (GRADUS_BIND_ADDR / ring_options::bind_host picks the interface)");
      tcp_detail::tune(send_fd_.fd);
      // first words on it: who this is (the right neighbour answers once it accepted)
      tcp_detail::exchange(send_fd_.fd, &me, nullptr, deadline, where + "greeting rank " + std::to_string(right));
    }
    // 2. the left neighbour's connection: the first one that says it is the left neighbour
    while (true) {
      const std::string what = "waiting for rank " + std::to_string(left) + " to dial";
      const int fd = ::accept4(mine.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
          throw comm_error(where + what + ": " + net::errno_message(errno));
        net::wait_fd(mine.fd(), POLLIN, deadline, where + what);
        continue;
      }
      net::unique_fd candidate(fd);
      tcp_detail::hello theirs;
      try {
        tcp_detail::exchange(fd, nullptr, &theirs, deadline, where + "greeting rank " + std::to_string(left));
      } catch (const comm_error&) {
        if (clock::now() >= deadline) throw;
        continue;  // not a ring peer (a port scanner, a probe): next
      }
      if (theirs.magic != tcp_detail::magic || theirs.rank != left || theirs.world != world) continue;
      tcp_detail::tune(fd);
      tcp_detail::exchange(fd, &me, nullptr, deadline, where + "answering rank " + std::to_string(left));
      recv_fd_ = std::move(candidate);
      break;
    }
    // 3. the right neighbour's answer on the dialled socket
    {
      tcp_detail::hello theirs;
      tcp_detail::exchange(send_fd_.fd, nullptr, &theirs, deadline, where + "waiting for rank " + std::to_string(right) + "'s answer");
      if (theirs.magic != tcp_detail::magic || theirs.rank != right || theirs.world != world)
        throw comm_error(where + shown_right + " is not rank " + std::to_string(right) + " of this ring");
    }
    left_.emplace(*this, left, std::move(shown_left));
    right_.emplace(*this, right, std::move(shown_right));
  }

  /// The pair to the left neighbour, the socket it dialled.
  pair& left() override { return *left_; }
  /// The pair to the right neighbour, the socket this rank dialled.
  pair& right() override { return *right_; }

  bool leave(std::chrono::milliseconds wait) noexcept override {
    try {
      frame_header h;
      h.kind = frame_kind::leave;
      h.from = rank_;
      out_.push_back({next_ticket_++, h, {}, 0});
      const auto until = clock::now() + wait;
      while (!out_.empty()) {
        if (!write_some()) {
          if (clock::now() >= until) return false;
          pollfd p{send_fd_.fd, POLLOUT, 0};
          (void)::poll(&p, 1, net::ms_left(until, 10));
        }
      }
      ::shutdown(send_fd_.fd, SHUT_WR);
      return true;
    } catch (...) {
      return false;
    }
  }
  void drop() noexcept override { out_.clear(); }

 private:
  friend class path_pair<tcp_path>;

  std::uint64_t send(int, const frame_header& h, std::span<const std::byte> payload) {
    const std::uint64_t ticket = next_ticket_++;
    out_.push_back({ticket, h, payload, 0});
    write_some(to_string(h.fp));
    return ticket;
  }

  bool sent(int, std::uint64_t ticket) {
    if (ticket < first_unsent_) return true;
    write_some();
    return ticket < first_unsent_;
  }

  void wait_sent(int peer, std::uint64_t ticket, clock::time_point deadline, std::string_view doing) {
    const auto started = clock::now();
    while (ticket >= first_unsent_) {
      const bool wrote = write_some(doing);
      read_some(doing);  // the left neighbour may be waiting for this rank to take its data
      if (ticket < first_unsent_) return;
      if (clock::now() >= deadline) throw ctl_->silent(doing, peer, false);
      if (!wrote) wait_round(started, deadline, doing, false);
    }
  }

  message recv(int peer, clock::time_point deadline, std::string_view doing) {
    const auto started = clock::now();
    while (true) {
      write_some(doing);
      if (inbox_.empty()) read_some(doing);
      if (!inbox_.empty()) {
        message m = std::move(inbox_.front());
        inbox_.pop_front();
        if (m.header.kind == frame_kind::leave) throw ctl_->left_ring(doing, peer);
        return m;
      }
      if (eof_) broken(doing, peer);
      if (clock::now() >= deadline) throw ctl_->silent(doing, peer, true);
      wait_round(started, deadline, doing, true);
    }
  }


  struct buffer_pool {
    std::size_t size = 0;
    std::vector<std::unique_ptr<std::byte[]>> free;
  };
  struct outgoing {
    std::uint64_t ticket;
    frame_header header;
    std::span<const std::byte> payload;
    std::size_t done;  ///< bytes of header + payload written
  };

  std::shared_ptr<void> buffer(std::byte*& data) {
    std::unique_ptr<std::byte[]> b;
    if (!pool_->free.empty()) {
      b = std::move(pool_->free.back());
      pool_->free.pop_back();
    } else {
      b.reset(new std::byte[std::max<std::size_t>(pool_->size, 1)]);
    }
    data = b.get();
    return std::shared_ptr<void>(b.release(), [pool = pool_](void* p) {
      std::unique_ptr<std::byte[]> back(static_cast<std::byte*>(p));
      if (pool->free.size() < 64) pool->free.push_back(std::move(back));
    });
  }

  /// Writes what the kernel takes; whether anything went. Throws when the connection broke.
  bool write_some(std::string_view doing = {}) {
    if (out_.empty()) return false;
    std::array<iovec, 32> io{};
    std::size_t n = 0;
    for (auto it = out_.begin(); it != out_.end() && n + 2 <= io.size(); ++it) {
      const std::size_t head = sizeof(frame_header);
      if (it->done < head) io[n++] = {reinterpret_cast<char*>(&it->header) + it->done, head - it->done};
      const std::size_t from = it->done > head ? it->done - head : 0;
      if (from < it->payload.size()) io[n++] = {const_cast<std::byte*>(it->payload.data()) + from, it->payload.size() - from};
    }
    msghdr msg{};
    msg.msg_iov = io.data();
    msg.msg_iovlen = n;
    const ssize_t k = ::sendmsg(send_fd_.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      broken(doing.empty() ? std::string_view("leave") : doing, right_->peer());
    }
    std::size_t left = static_cast<std::size_t>(k);
    while (left > 0 && !out_.empty()) {
      auto& m = out_.front();
      const std::size_t total = sizeof(frame_header) + m.payload.size();
      const std::size_t take = std::min(left, total - m.done);
      m.done += take;
      left -= take;
      if (m.done == total) {
        first_unsent_ = m.ticket + 1;
        out_.pop_front();
      }
    }
    return k > 0;
  }

  /// Reads everything the left socket has; whether anything came.
  bool read_some(std::string_view doing) {
    bool any = false;
    while (!eof_) {
      ssize_t k;
      if (got_ < sizeof(frame_header)) {
        k = ::recv(recv_fd_.fd, reinterpret_cast<char*>(&in_header_) + got_, sizeof(frame_header) - got_, MSG_DONTWAIT);
      } else {
        const std::size_t have = got_ - sizeof(frame_header);
        k = ::recv(recv_fd_.fd, in_data_ + have, in_header_.bytes - have, MSG_DONTWAIT);
      }
      if (k == 0) {
        eof_ = true;
        break;
      }
      if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
        eof_ = true;  // reset: the same as a close, once what came before is used
        break;
      }
      any = true;
      got_ += static_cast<std::size_t>(k);
      if (got_ == sizeof(frame_header)) {
        if (in_header_.magic != frame_header::magic_value || in_header_.bytes > max_payload_)
          throw ctl_->malformed(doing, left_->peer(), "a malformed frame on its direct TCP connection");
        if (in_header_.bytes > 0) in_storage_ = buffer(in_data_);
      }
      if (got_ >= sizeof(frame_header) && got_ == sizeof(frame_header) + in_header_.bytes) {
        message m;
        m.header = in_header_;
        if (in_header_.bytes > 0) {
          m.payload = std::span<const std::byte>(in_data_, in_header_.bytes);
          m.storage = std::move(in_storage_);
        }
        inbox_.push_back(std::move(m));
        got_ = 0;
        in_data_ = nullptr;
      }
    }
    return any;
  }

  /// A neighbour's socket closed or reset. One that failed sent its abort over the control
  /// plane before closing: give it half a second to arrive, so that the error names the rank
  /// where the failure began rather than the messenger.
  [[noreturn]] void broken(std::string_view doing, int peer) {
    const auto until = clock::now() + std::chrono::milliseconds(500);
    while (clock::now() < until) {
      ctl_->poll(doing, false, false);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    throw ctl_->lost(doing, peer);
  }

  /// Waits until either socket can move (at most 5 ms), asking the control plane at most
  /// every 5 ms. For the first 200 microseconds of a wait it only returns, so that the
  /// caller tries its sockets again: a poll(2) that sleeps costs a wake-up, 50-100
  /// microseconds on these virtual machines (a 4 KiB all-reduce at N = 2 took 18 or 100 us
  /// depending on whether it slept; yielding while retrying measured slower still), which is
  /// most of a small collective.
  void wait_round(clock::time_point started, clock::time_point deadline, std::string_view doing, bool for_left) {
    const auto now = clock::now();
    if (now - started < std::chrono::microseconds(200)) {
      if (crowded_) std::this_thread::yield();  // more ranks than cores: let the others run
      return;
    }
    if (now - last_control_ >= std::chrono::milliseconds(5)) {
      ctl_->poll(doing, for_left && inbox_.empty(), !out_.empty());
      last_control_ = now;
    }
    std::array<pollfd, 2> p{};
    p[0] = {recv_fd_.fd, POLLIN, 0};
    nfds_t n = 1;
    if (!out_.empty()) p[n++] = {send_fd_.fd, POLLOUT, 0};
    (void)::poll(p.data(), n, net::ms_left(deadline, 5));
  }

  control* ctl_;
  int rank_;
  bool crowded_;  ///< more ranks on this machine than cores
  std::size_t max_payload_;
  std::shared_ptr<buffer_pool> pool_;
  net::unique_fd send_fd_, recv_fd_;
  std::deque<outgoing> out_;
  std::uint64_t next_ticket_ = 0, first_unsent_ = 0;
  bool eof_ = false;
  frame_header in_header_{};
  std::size_t got_ = 0;
  std::byte* in_data_ = nullptr;
  std::shared_ptr<void> in_storage_;
  std::deque<message> inbox_;
  clock::time_point last_control_{};
  std::optional<path_pair<tcp_path>> left_, right_;
};

}  // namespace gradus::ring
