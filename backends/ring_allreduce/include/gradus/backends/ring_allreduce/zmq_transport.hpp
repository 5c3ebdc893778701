#pragma once
// The ring's transport over ZeroMQ (cppzmq): each rank binds one PULL socket (its data
// address) and connects one PUSH socket to its right neighbour's; the left neighbour's
// messages arrive on the PULL socket, in order. Messages are two frames: a frame_header
// and the payload, sent zero-copy (zmq_msg_init_data; the free callback marks the send
// complete).
//
// Rendezvous: rank 0 binds a ROUTER at the rendezvous address; every other rank connects a
// DEALER and registers "rank, world_size, hostname, data addresses"; rank 0 checks the
// registrations (duplicate ranks, world sizes), picks the data transport and answers with
// every rank's address. A rank that never registers is named when the timeout passes.
//
// Failure detection, so that no rank waits for a dead peer until the timeout:
//   - socket monitors (ZMQ_EVENT_DISCONNECTED) on both data sockets: a killed process's
//     connections drop at once; ZMTP heartbeats (1 s, 3 s timeout) drop a silent one;
//   - a rank that fails sends an abort (its error message) to its right neighbour, which
//     forwards it, so ranks not adjacent to the dead one fail too; a destroyed
//     communicator sends `leave` after its last data (needed for inproc://, which has no
//     connection events).
#include <zmq.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gradus/backends/ring_allreduce/options.hpp"
#include "gradus/backends/ring_allreduce/transport.hpp"

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

inline bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

inline std::string hostname() {
  std::array<char, 256> buf{};
  if (::gethostname(buf.data(), buf.size() - 1) != 0) return "unknown-host";
  return std::string(buf.data());
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

inline std::string unique_suffix() {
  static std::atomic<unsigned long> counter{0};
  return std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
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

class zmq_ring {
 public:
  explicit zmq_ring(const ring_options& o) : rank_(o.rank), world_(o.world_size), timeout_(o.timeout) {
    if (world_ < 1) throw error("gradus: ring_allreduce: world_size " + std::to_string(world_) + " must be at least 1");
    if (rank_ < 0 || rank_ >= world_)
      throw error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " is outside world_size " + std::to_string(world_));
    if (world_ == 1) {
      transport_ = "none";
      return;
    }
    try {
      setup(o);
    } catch (...) {
      close_sockets(0);
      for (const auto& f : ipc_files_) ::unlink(f.c_str());
      throw;
    }
  }

  zmq_ring(const zmq_ring&) = delete;
  zmq_ring& operator=(const zmq_ring&) = delete;

  ~zmq_ring() {
    try {
      if (push_ && !closed_) {
        if (!failed_) {
          // After this rank's last data: the right neighbour fails its next collective
          // with "rank r left" instead of waiting.
          frame_header h;
          h.kind = frame_kind::leave;
          h.from = rank_;
          send_frames(h, {}, nullptr, /*block=*/false);
        }
      }
    } catch (...) {
    }
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
  const std::vector<std::string>& addresses() const { return table_; }
  pair& left() { return *left_; }
  pair& right() { return *right_; }

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
  }

  // The context was shut down under us: close now, so that its termination can finish.
  void close_now() noexcept {
    failed_ = true;
    close_sockets(0);
  }

 private:
  friend class zmq_pair;

  std::string prefix(std::string_view doing) const {
    return "gradus: ring_allreduce: " + std::string(doing) + " on rank " + std::to_string(rank_) + ": ";
  }
  std::string peer_name(int peer) const {
    return "rank " + std::to_string(peer) + " at " + (peer >= 0 && peer < static_cast<int>(table_.size()) ? table_[peer] : "?");
  }

  zmq::socket_t data_socket(zmq::socket_type type) {
    zmq::socket_t s(*ctx_, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 0);  // a collective's messages are bounded by its size
    s.set(zmq::sockopt::rcvhwm, 0);
    s.set(zmq::sockopt::heartbeat_ivl, 1000);
    s.set(zmq::sockopt::heartbeat_timeout, 3000);
    s.set(zmq::sockopt::heartbeat_ttl, 6000);
    return s;
  }

  // A PAIR socket receiving `s`'s connection events; connected before `s` binds or connects.
  zmq::socket_t monitor(zmq::socket_t& s) {
    const std::string ep = "inproc://gradus-ring-monitor-" + detail::unique_suffix();
    if (zmq_socket_monitor(s.handle(), ep.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) throw zmq::error_t();
    zmq::socket_t m(*ctx_, zmq::socket_type::pair);
    m.set(zmq::sockopt::linger, 0);
    m.connect(ep);
    return m;
  }

  void setup(const ring_options& o) {
    const std::string rdv = o.rendezvous;
    const std::string scheme = detail::scheme_of(rdv);
    if (scheme != "tcp" && scheme != "ipc" && scheme != "inproc")
      throw error("gradus: ring_allreduce: rendezvous '" + rdv + "' must be tcp://host:port, ipc://path or inproc://name");
    const std::string want = o.transport;
    if (want != "auto" && want != "tcp" && want != "ipc" && want != "inproc")
      throw error("gradus: ring_allreduce: transport '" + want + "' must be tcp, ipc, inproc or auto");
    if ((scheme == "inproc") != (want == "inproc" || (want == "auto" && scheme == "inproc")))
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

    // ---- this rank's data socket: bound before registering ----
    pull_.emplace(data_socket(zmq::socket_type::pull));
    if (scheme != "inproc") pull_mon_.emplace(monitor(*pull_));
    std::vector<std::string> mine;
    auto bind = [&](const std::string& ep) {
      pull_->bind(ep);
      mine.push_back(pull_->get(zmq::sockopt::last_endpoint));
    };
    if (scheme == "inproc") {
      bind(rdv + ".rank" + std::to_string(rank_) + "-" + detail::unique_suffix());
    } else {
      const bool want_tcp = want == "tcp" || (want == "auto" && scheme == "tcp");
      const bool want_ipc = want == "ipc" || want == "auto";
      if (want_tcp) {
        std::string host = o.bind_host;
        std::string advertise;
        if (host.empty()) {
          if (scheme == "tcp") {
            const std::string rh = detail::tcp_host_of(rdv);
            if (rank_ == 0 || detail::is_loopback(rh)) host = detail::is_loopback(rh) ? "127.0.0.1" : rh;
          } else {
            host = "127.0.0.1";
          }
        }
        if (host.empty()) {  // every interface, advertised as the address that routes to rank 0
          pull_->bind("tcp://*:*");
          const std::string ep = pull_->get(zmq::sockopt::last_endpoint);
          std::string me = scheme == "tcp" ? detail::route_source_address(detail::tcp_host_of(rdv)) : std::string();
          if (me.empty()) me = detail::hostname();
          else if (me.find(':') != std::string::npos) me = "[" + me + "]";
          mine.push_back("tcp://" + me + ep.substr(ep.rfind(':')));
        } else {
          const bool v6 = host.find(':') != std::string::npos;
          if (v6) pull_->set(zmq::sockopt::ipv6, 1);
          bind("tcp://" + (v6 ? "[" + host + "]" : host) + ":*");
        }
      }
      if (want_ipc) {
        std::string path;
        if (scheme == "ipc") {
          path = rdv.substr(6) + ".rank" + std::to_string(rank_);
        } else {
          path = (std::filesystem::temp_directory_path() / ("gradus-ring-" + detail::unique_suffix() + "-rank" + std::to_string(rank_))).string();
        }
        bind("ipc://" + path);
        ipc_files_.push_back(path);
      }
    }

    rendezvous(o, scheme, want, mine);

    // ---- connect to the right neighbour ----
    const int right = (rank_ + 1) % world_, left = (rank_ + world_ - 1) % world_;
    push_.emplace(data_socket(zmq::socket_type::push));
    if (transport_ != "inproc") push_mon_.emplace(monitor(*push_));
    if (table_[right].rfind("tcp://[", 0) == 0) push_->set(zmq::sockopt::ipv6, 1);
    push_->connect(table_[right]);
    left_.emplace(*this, left, table_[left]);
    right_.emplace(*this, right, table_[right]);
  }

  std::string registration(int world, const std::string& host, const std::vector<std::string>& addrs) const {
    std::string s = "gradus-ring/1\n" + std::to_string(rank_) + "\n" + std::to_string(world) + "\n" + host + "\n";
    for (const auto& a : addrs) s += a + "\n";
    return s;
  }

  void rendezvous(const ring_options& o, const std::string& scheme, const std::string& want, const std::vector<std::string>& mine) {
    const auto deadline = clock::now() + timeout_;
    const std::string host = detail::hostname();
    const std::string where = "gradus: ring_allreduce: rendezvous at " + o.rendezvous + " (rank " + std::to_string(rank_) + " of " +
                              std::to_string(world_) + "): ";
    if (rank_ != 0) {
      // Rank 0 gives up on missing ranks after the timeout and says which; wait a little
      // longer than it, so that its verdict arrives.
      const auto answer_by = deadline + std::chrono::seconds(1);
      zmq::socket_t dealer(*ctx_, zmq::socket_type::dealer);
      dealer.set(zmq::sockopt::linger, 0);
      dealer.connect(o.rendezvous);
      const std::string reg = registration(world_, host, mine);
      dealer.send(zmq::buffer(reg), zmq::send_flags::none);
      zmq::message_t reply;
      while (true) {
        zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(detail::ms_until(answer_by, 100)));
        if (dealer.recv(reply, zmq::recv_flags::dontwait)) break;
        if (clock::now() >= answer_by)
          throw comm_error(where + "no answer from rank 0 within " + std::to_string(timeout_.count()) +
                           " ms (is rank 0 running, with the same rendezvous address and world_size?)");
      }
      const auto lines = detail::split_lines(reply.to_string_view());
      if (lines.empty()) throw comm_error(where + "empty answer from rank 0");
      if (lines[0] == "error") throw comm_error(lines.size() > 1 ? lines[1] : where + "rank 0 refused the registration");
      if (lines[0] != "ok" || lines.size() != static_cast<std::size_t>(world_) + 2)
        throw comm_error(where + "malformed answer from rank 0 (a different gradus version?)");
      transport_ = lines[1];
      table_.assign(lines.begin() + 2, lines.end());
      return;
    }

    // ---- rank 0 ----
    zmq::socket_t router(*ctx_, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 2000);  // the answers must get out before close
    router.bind(o.rendezvous);
    struct entry {
      bool present = false;
      std::string host;
      std::vector<std::string> addrs;
      std::string identity;
    };
    std::vector<entry> reg(static_cast<std::size_t>(world_));
    reg[0] = {true, host, mine, {}};
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
      if (lines.size() < 5 || lines[0] != "gradus-ring/1") refuse(where + "a malformed registration (not a gradus ring rank?)");
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
               (reg[r].addrs.empty() ? "?" : reg[r].addrs[0]) + ") and by host " + lines[3] + " (" + lines[4] + ")");
      reg[r] = {true, lines[3], std::vector<std::string>(lines.begin() + 4, lines.end()), identities.back()};
      ++present;
    }

    // The data transport: what was asked for, or for auto the rendezvous' scheme, with ipc
    // when all ranks share a host.
    std::string chosen = want;
    if (want == "auto") {
      chosen = scheme;
      if (scheme == "tcp") {
        bool same = true;
        for (const auto& e : reg) same = same && e.host == host;
        if (same) chosen = "ipc";
      }
    }
    std::string answer = "ok\n" + chosen + "\n";
    for (int r = 0; r < world_; ++r) {
      auto it = std::find_if(reg[r].addrs.begin(), reg[r].addrs.end(), [&](const std::string& a) { return detail::scheme_of(a) == chosen; });
      if (it == reg[r].addrs.end())
        refuse(where + "rank " + std::to_string(r) + " (host " + reg[r].host + ") has no " + chosen + " address");
      table_.push_back(*it);
      answer += *it + "\n";
    }
    transport_ = chosen;
    for (int r = 1; r < world_; ++r) {
      router.send(zmq::buffer(reg[r].identity), zmq::send_flags::sndmore);
      router.send(zmq::buffer(answer), zmq::send_flags::none);
    }
  }

  void close_sockets(int linger_ms) noexcept {
    if (closed_) return;
    closed_ = true;
    try {
      if (push_) push_->set(zmq::sockopt::linger, linger_ms);
    } catch (...) {
    }
    push_mon_.reset();
    pull_mon_.reset();
    push_.reset();
    pull_.reset();
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
    auto events = [&](std::optional<zmq::socket_t>& mon, bool& gone, clock::time_point& at) {
      if (!mon) return;
      zmq::message_t ev, addr;
      while (mon->recv(ev, zmq::recv_flags::dontwait)) {
        if (ev.more()) (void)mon->recv(addr);
        std::uint16_t id = 0;
        if (ev.size() >= 2) std::memcpy(&id, ev.data(), 2);
        if (id == ZMQ_EVENT_DISCONNECTED && !gone) {
          gone = true;
          at = clock::now();
        }
      }
    };
    events(pull_mon_, left_gone_, left_gone_at_);
    events(push_mon_, right_gone_, right_gone_at_);
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
    if (waiting_on_left && left_gone_ && inbox_.empty() && now - left_gone_at_ > grace)
      throw comm_error(prefix(doing) + "lost the connection to " + peer_name(left_->peer()) +
                       " (the peer process died or closed its communicator)");
    if (need_right && right_gone_ && now - right_gone_at_ > grace)
      throw comm_error(prefix(doing) + "lost the connection to " + peer_name(right_->peer()) +
                       " (the peer process died or closed its communicator)");
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
        throw comm_error(prefix(to_string(h.fp)) + "could not send to " + peer_name(right_->peer()) + " within " +
                         std::to_string(timeout_.count()) + " ms");
      zmq::pollitem_t item{push_->handle(), 0, ZMQ_POLLOUT, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      pump(0);
      check(to_string(h.fp), false, true);
    }
    // The first frame went out, so the second one does too (multi-part messages are atomic).
    (void)push_->send(body, zmq::send_flags::none);
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::string transport_;
  std::vector<std::string> table_;
  std::vector<std::string> ipc_files_;
  std::unique_ptr<zmq::context_t> own_ctx_;  // destroyed last: after the sockets
  zmq::context_t* ctx_ = nullptr;
  std::optional<zmq::socket_t> pull_, push_, pull_mon_, push_mon_;
  std::optional<zmq_pair> left_, right_;
  std::deque<message> inbox_;
  std::deque<std::shared_ptr<detail::send_flag>> inflight_;
  std::uint64_t first_ticket_ = 0, next_ticket_ = 0;
  bool left_gone_ = false, right_gone_ = false;
  clock::time_point left_gone_at_{}, right_gone_at_{};
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
      throw comm_error(ring_->prefix(doing) + ring_->peer_name(peer_) + " did not take this rank's data within " +
                       std::to_string(ring_->timeout_.count()) + " ms");
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
        throw comm_error(r.prefix(doing) + r.peer_name(peer_) + " left the ring (its communicator was destroyed)");
      return m;
    }
    r.prune();
    r.check(doing, true, !r.inflight_.empty());
    if (clock::now() >= deadline)
      throw comm_error(r.prefix(doing) + "no message from " + r.peer_name(peer_) + " within " + std::to_string(r.timeout_.count()) +
                       " ms (a rank stopped, or the ranks are running different collectives)");
    r.pump(detail::ms_until(deadline, 20));
  }
}

}  // namespace gradus::ring
