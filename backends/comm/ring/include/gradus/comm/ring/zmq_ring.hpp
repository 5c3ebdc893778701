#pragma once
// The ring's transport over ZeroMQ (cppzmq): each rank binds one PULL socket (its data
// address) and connects one PUSH socket to its right neighbour's; the left neighbour's
// messages arrive on the PULL socket, in order. Messages are two frames: a frame_header
// and the payload, sent zero-copy (zmq_msg_init_data; the free callback marks the send
// complete).
//
// Rendezvous and addresses (how the ring forms): zmq_ring_setup.hpp. The set-up also binds
// each rank's point-to-point socket and exchanges its address; the mesh that uses it
// (messages between any two ranks, sub-groups) is ring/point_to_point.hpp.
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
//
// About 630 lines with its doc comments, one concept: the running ring of one rank (its sockets, their events,
// the abort and leave messages, blame, zero-copy sends in flight), which the data paths
// drive through `control`; its set-up is zmq_ring_setup.hpp.
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

#include "gradus/comm/net/address.hpp"
#include "gradus/comm/net/fd.hpp"
#include "gradus/comm/net/heartbeat.hpp"
#include "gradus/comm/net/one_frame.hpp"
#include "gradus/comm/net/peer_state.hpp"
#include "gradus/comm/net/socket_monitor.hpp"
#include "gradus/comm/net/zero_copy.hpp"
#include "gradus/comm/ring/options.hpp"
#include "gradus/comm/ring/p2p_shm.hpp"
#include "gradus/comm/ring/rendezvous_messages.hpp"
#include "gradus/comm/ring/shm_path.hpp"
#include "gradus/comm/ring/tcp_path.hpp"
#include "gradus/comm/ring/pair.hpp"

namespace gradus::ring {

namespace detail {

inline std::string join(const std::vector<std::string>& items, const std::string& sep = ", ") {
  std::string s;
  for (std::size_t i = 0; i < items.size(); ++i) s += (i ? sep : "") + items[i];
  return s;
}

inline std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

/// ZeroMQ allocates every received message with malloc. glibc serves blocks above its
/// mmap threshold (128 KiB at start) by mmap, and gives the top of the heap back to the OS
/// once more than its trim threshold (twice the mmap threshold) is free there; so with
/// segments of 256 KiB - 1 MiB each message landed in fresh pages, and every page
/// faulted (measured: 1 MiB all-reduces 4-6x slower). Freeing one mmapped block raises
/// both thresholds to that block's size (glibc's own adaptation, as after any large free;
/// capped at 32 MiB): done once with 4 segments' worth, received segments come from a heap
/// that stays mapped. Other C libraries: nothing to do.
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


}  // namespace detail

class zmq_ring;
class mesh;

/// A view of the ring from one side: the left pair receives, the right pair sends. With two
/// ranks both views face the same peer.
class zmq_pair final : public pair {
 public:
  /// The pair to rank `peer` over `ring`'s sockets; `address` names the peer in errors.
  zmq_pair(zmq_ring& ring, int peer, std::string address) : ring_(&ring), peer_(peer), address_(std::move(address)) {}
  /// The peer's rank.
  int peer() const override { return peer_; }
  /// The peer's data address.
  const std::string& address() const override { return address_; }
  std::uint64_t send(const frame_header& h, std::span<const std::byte> payload) override;
  /// Whether ZeroMQ has released the bytes of the send of `ticket` and of every earlier one.
  bool sent(std::uint64_t ticket) override;
  void wait_sent(std::uint64_t ticket, clock::time_point deadline, std::string_view doing) override;
  message recv(clock::time_point deadline, std::string_view doing) override;

 private:
  zmq_ring* ring_;
  int peer_;
  std::string address_;
};

/// The running ring of one rank: the rendezvous' outcome, its ZeroMQ sockets (a PULL for its
/// data address, a PUSH to its right neighbour) and their connection events, the abort and
/// leave messages, blame of a dead or silent neighbour, and the zero-copy sends in flight.
/// It is the control plane (ring::control) of the shared-memory and direct-TCP data paths
/// and the data path itself for the ZeroMQ transports. ring_allreduce owns one; the top of
/// this header says how failures are detected.
class zmq_ring final : public control {
 public:
  /// Checks rank and world_size (gradus::error), then, for a world of more than one, forms
  /// the ring: rendezvous, sockets, and the data path ring_options::transport asks for (the
  /// set-up is zmq_ring_setup.hpp). Throws gradus::error for options that are wrong and
  /// gradus::comm_error when the ring cannot form within `o.timeout`.
  explicit zmq_ring(const ring_options& o)
      : rank_(o.rank),
        world_(o.world_size),
        timeout_(o.timeout),
        setup_timeout_(o.rendezvous_timeout.count() > 0 ? o.rendezvous_timeout : std::max(o.timeout, min_rendezvous_timeout)),
        heartbeat_timeout_ms_(net::heartbeat_timeout_for(o.timeout)),
        job_id_(o.job_id) {
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

  /// This process's rank.
  int rank() const { return rank_; }
  /// How many ranks the ring has.
  int world_size() const { return world_; }
  /// The data path in use: "shm", "tcp", "zmq-ipc", "zmq-tcp", "inproc", or "none" for a
  /// world of one.
  const std::string& transport() const { return transport_; }
  /// Every rank's data address, by rank: `shm://@name` (the unix socket its segment was
  /// handed over on), `tcp://host:port` (direct TCP, or ZeroMQ's), `ipc://...`,
  /// `inproc://...`.
  const std::vector<std::string>& addresses() const { return shown_table_.empty() ? table_ : shown_table_; }
  /// The pair to the left neighbour (received from), on the data path in use. Not for a
  /// world of one.
  pair& left() { return path_ ? path_->left() : *left_; }
  /// The pair to the right neighbour (sent to), on the data path in use. Not for a world of
  /// one.
  pair& right() { return path_ ? path_->right() : *right_; }
  /// The segment a collective streams in: the data path's choice for `asked`.
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
  /// A neighbour's connection closed (or its heartbeats stopped): ask its address which.
  comm_error lost(std::string_view doing, int peer) override {
    const std::string& dial = peer == right_->peer() && !right_dial_.empty() ? right_dial_ : table_[peer];
    const auto seen = net::probe(dial, 500);
    const std::string head = prefix(doing) + "lost the connection to " + peer_name(peer) + ": it is ";
    if (seen == net::reach::refused)
      return blame(peer, "gone", head + "gone (its connection closed and nothing listens at its address: the process died or closed its communicator)");
    if (seen == net::reach::alive)
      return blame(peer, "silent", head + "silent (it answered nothing, not even heartbeats, for " + std::to_string(heartbeat_timeout_ms_) +
                                       " ms, so its connection was dropped, though its process still listens: stopped, paused or hung)");
    return blame(peer, "silent", head + "silent (its connection was dropped and its address does not answer: its host or the network is down, or it hangs)");
  }

  /// This rank failed with `text`: tell the right neighbour (which forwards it), unless the
  /// failure came from there. Never throws; the communicator is unusable afterwards.
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

  /// The context was shut down under us: close now, so that its termination can finish.
  void close_now() noexcept {
    failed_ = true;
    if (path_) path_->drop();
    close_sockets(0);
    release_sends(0);
  }

 private:
  friend class zmq_pair;
  friend class mesh;  ///< the point-to-point mesh: this ring's context, addresses and blame

  /// Where the rendezvous address came from, for errors.
  static std::string origin_of(const ring_options& o) {
    return o.origin.empty() ? "from ring_options::rendezvous" : "from " + o.origin;
  }

  std::string prefix(std::string_view doing) const {
    return "gradus: ring_allreduce: " + std::string(doing) + " on rank " + std::to_string(rank_) + ": ";
  }
  std::string peer_name(int peer) const {
    return "rank " + std::to_string(peer) + " at " + (peer >= 0 && peer < static_cast<int>(table_.size()) ? table_[peer] : "?");
  }

  /// An error that blames neighbour `peer` ("gone" or "silent"); the first one this rank
  /// makes goes to GRADUS_FAULT_FILE as well.
  comm_error blame(int peer, const char* state, const std::string& text) {
    if (!blamed_) {
      blamed_ = true;
      gradus::detail::record_blame("rank " + std::to_string(rank_), "rank " + std::to_string(peer), state, text);
    }
    return comm_error(text, peer, state);
  }

  /// `heartbeats`: ZMTP heartbeats (net::set_heartbeats); the point-to-point socket goes
  /// without them (zmq_ring::setup says why).
  zmq::socket_t data_socket(zmq::socket_type type, bool heartbeats = true) {
    zmq::socket_t s(*ctx_, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndhwm, 0);  // a collective's messages are bounded by its size
    s.set(zmq::sockopt::rcvhwm, 0);
    s.set(zmq::sockopt::ipv6, 1);
    if (heartbeats) net::set_heartbeats(s, std::chrono::milliseconds(heartbeat_timeout_ms_), /*ask_peer_too=*/true);
    return s;
  }

  /// `s`'s connection events (net/socket_monitor.hpp); made before `s` binds or connects.
  net::socket_monitor monitor(zmq::socket_t& s) {
    constexpr int events = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                           ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
    return net::socket_monitor(*ctx_, s, events, "ring");
  }

  /// ---- set-up: the rendezvous, where to listen and what to dial (zmq_ring_setup.hpp) ----
  static std::string shown(const std::string& endpoint);
  static std::string port_variable(const std::string& origin);
  void bind_or_explain(zmq::socket_t& s, const std::string& endpoint, const std::string& what, const ring_options& o);
  std::string listen_failure(const std::string& endpoint, const std::string& what, const ring_options& o, int err) const;
  std::vector<std::string> listen_hosts(std::string host, bool chosen, const std::string& what) const;
  std::string dial_of(const std::string& endpoint, const std::string& what, std::string& note) const;
  net::resolution resolve_until_timeout(const std::string& host, const std::string& what, int& tries) const;
  void setup(const ring_options& o);
  std::string bind_tcp_data(const ring_options& o, const std::string& scheme);
  std::string registration(int world, const std::string& host, const std::string& want,
                           const std::vector<std::string>& addrs) const;
  void rendezvous(const ring_options& o, const std::string& scheme, const std::string& want, const std::vector<std::string>& mine);

  /// After a failure nothing may go on reading a caller's buffer once its collective has
  /// thrown (the caller may free it at once). Closes the sending socket, letting frames
  /// already queued (the abort among them) go out for `linger_ms`, and waits for ZeroMQ to
  /// let go of every zero-copy payload: on close its I/O thread drops what is left and calls
  /// the free callbacks, within milliseconds.
  void release_sends(int linger_ms) noexcept {
    prune();
    if (inflight_.empty()) return;
    try {
      if (push_) push_->set(zmq::sockopt::linger, linger_ms);
    } catch (...) {
    }
    push_mon_.stop();
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
    push_mon_.stop();
    pull_mon_.stop();
    push_.reset();
    pull_.reset();
    p2p_pull_.reset();  // still here when the mesh never took it (a failed set-up)
  }

  /// Takes everything that has arrived: connection events, and the left neighbour's
  /// messages (an abort is noted at once; data and leave queue in order).
  void pump(int wait_ms) {
    if (closed_) throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + ": the communicator is closed");
    std::array<zmq::pollitem_t, 3> items{};
    std::size_t n = 0;
    items[n++] = {pull_->handle(), 0, ZMQ_POLLIN, 0};
    if (pull_mon_) items[n++] = pull_mon_.poll_item();
    if (push_mon_) items[n++] = push_mon_.poll_item();
    zmq::poll(items.data(), n, std::chrono::milliseconds(wait_ms));  // also when 0: recv alone may not see new messages for ~1 ms (ZeroMQ throttles its command processing)
    auto events = [&](net::socket_monitor& mon, link_state& link) {
      while (const auto ev = mon.next()) {
        const auto id = ev->id;
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
      auto head = std::make_shared<zmq::message_t>();
      if (!pull_->recv(*head, zmq::recv_flags::dontwait)) break;
      // One frame (header and a copied payload, send_frames) or two (header, zero-copy payload).
      auto body = head;
      std::size_t skip = sizeof(frame_header);
      if (head->more()) {
        body = std::make_shared<zmq::message_t>();
        skip = 0;
        if (!pull_->recv(*body) || head->size() != sizeof(frame_header)) {
          protocol_error_ = "a malformed message on its data socket (not a gradus ring peer?)";
          continue;
        }
      }
      frame_header h;
      if (head->size() < sizeof h) {
        protocol_error_ = "a malformed message on its data socket (not a gradus ring peer?)";
        continue;
      }
      std::memcpy(&h, head->data(), sizeof h);
      const std::span<const std::byte> payload(static_cast<const std::byte*>(body->data()) + skip, body->size() - skip);
      if (h.magic != frame_header::magic_value || h.bytes != payload.size()) {
        protocol_error_ = "a malformed message on its data socket (not a gradus ring peer?)";
        continue;
      }
      if (h.kind == frame_kind::abort) {
        if (!aborted_) {
          aborted_ = true;
          abort_origin_ = h.from;
          abort_text_.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
        }
        continue;
      }
      inbox_.push_back(message{h, payload, body});
    }
  }

  void prune() {
    while (!inflight_.empty() && inflight_.front()->done.load(std::memory_order_acquire)) {
      inflight_.pop_front();
      ++first_ticket_;
    }
  }

  /// Throws when the collective cannot finish: an abort from the ring, a lost neighbour.
  /// A lost left neighbour matters once its queued messages are used up; a lost right one
  /// while sends to it are pending. The grace lets messages already on their way arrive.
  void check(std::string_view doing, bool waiting_on_left, bool need_right) {
    if (aborted_)
      throw comm_error(prefix(doing) + "aborted because rank " + std::to_string(abort_origin_) + " failed: " + abort_text_);
    if (!protocol_error_.empty()) throw comm_error(prefix(doing) + peer_name(left_->peer()) + " sent " + protocol_error_);
    const auto now = clock::now();
    constexpr auto grace = std::chrono::milliseconds(300);
    if (waiting_on_left && left_link_.gone && inbox_.empty() && now - left_link_.gone_at > grace) throw lost(doing, left_->peer());
    if (need_right && right_link_.gone && now - right_link_.gone_at > grace) throw lost(doing, right_->peer());
  }

  /// The text of an error that blames a neighbour for sending or taking nothing in time.
  std::string silent_for() const {
    return "within " + std::to_string(timeout_.count()) +
           " ms: it is silent (stopped, paused, hung or unreachable, or the ranks are running different collectives)";
  }

  void send_frames(const frame_header& h, std::span<const std::byte> payload, std::shared_ptr<net::send_flag>* flag_out,
                   bool block) {
    // A payload that would be copied anyway goes out in one frame with its header
    // (net/one_frame.hpp: why); only a zero-copy payload (net/zero_copy.hpp) is a second part.
    const bool one_frame = !flag_out || payload.size() < net::zero_copy_from;
    // The bytes are copied by libzmq itself (zmq_send of a buffer): ThreadSanitizer does not
    // see that copy (tests/sanitizers/tsan.supp), while cppzmq's inline message_t(data, size)
    // made every header a report when ranks are threads.
    // zmq_send copies the frame before it returns, so one buffer per thread serves every send.
    thread_local std::vector<std::byte> joined;
    const auto frame = one_frame ? net::one_frame(h, payload, joined) : std::span<const std::byte>();
    const zmq::const_buffer head = one_frame ? zmq::const_buffer(frame.data(), frame.size()) : zmq::const_buffer(&h, sizeof h);
    const auto flags = one_frame ? zmq::send_flags::dontwait : zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    zmq::message_t body = one_frame ? zmq::message_t() : net::payload_message(payload, flag_out);
    const auto deadline = clock::now() + timeout_;
    while (!push_->send(head, flags)) {
      if (!block) return;
      if (clock::now() >= deadline)
        throw blame(right_->peer(), "silent", prefix(to_string(h.fp)) + "could not send to " + peer_name(right_->peer()) + " " + silent_for());
      zmq::pollitem_t item{push_->handle(), 0, ZMQ_POLLOUT, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      pump(0);
      check(to_string(h.fp), false, true);
    }
    // The first frame went out, so the second one does too (multi-part messages are atomic).
    if (!one_frame) (void)push_->send(body, zmq::send_flags::none);
  }

  /// Shared memory moves a ring chunk in slots of at most this much: small enough that one
  /// rank's copy into a slot overlaps its neighbour's reduction of the previous one.
  static constexpr std::size_t shm_slot_bytes = std::size_t{256} << 10;

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds setup_timeout_;  ///< the rendezvous and the data paths' set-up (ring_options::rendezvous_timeout)
  std::string transport_;       ///< the data path: shm, tcp, zmq-tcp, zmq-ipc, inproc; none for a world of one
  std::string zmq_scheme_;      ///< ZeroMQ's sockets: tcp, ipc or inproc
  std::vector<std::string> table_;       ///< every rank's ZeroMQ data address
  std::vector<std::string> data_table_;  ///< every rank's shm:// or tcpd:// address, for those paths
  std::vector<std::string> shown_table_; ///< data_table_ as addresses() shows it
  std::optional<shm_listener> shm_listen_;
  std::optional<tcp_listener> tcp_listen_;
  std::string tcp_bound_host_;  ///< the numeric host the ZeroMQ tcp data socket bound
  int local_ranks_ = 1;         ///< ranks on this rank's machine (this one included)
  std::unique_ptr<data_path> path_;
  std::vector<std::string> ipc_files_;
  std::unique_ptr<zmq::context_t> own_ctx_;  ///< destroyed last: after the sockets
  zmq::context_t* ctx_ = nullptr;
  std::optional<zmq::socket_t> pull_, push_;
  std::optional<zmq::socket_t> p2p_pull_;   ///< the point-to-point socket, until the mesh takes it
  std::vector<std::string> p2p_table_;      ///< every rank's point-to-point address
  std::vector<p2p_shm::listener> p2p_shm_listen_;  ///< its shared-memory listeners (p2p_shm.hpp), until the mesh takes them
  net::socket_monitor pull_mon_, push_mon_;  ///< after the sockets they watch: destroyed first
  std::optional<zmq_pair> left_, right_;
  std::deque<message> inbox_;
  std::deque<std::shared_ptr<net::send_flag>> inflight_;
  std::uint64_t first_ticket_ = 0, next_ticket_ = 0;
  /// What the socket monitors said about a neighbour's connection.
  struct link_state {
    bool gone = false;         ///< its connection closed (or heartbeats dropped it)
    clock::time_point gone_at{};
    int unestablished = 0;     ///< connections that failed their handshake, whose DISCONNECTED is still to come
  };
  link_state left_link_, right_link_;
  /// ZMTP heartbeats drop a connection that answers nothing for this long (timeout - 2 s, at
  /// least 3 s: net::heartbeat_timeout_for). A stopped peer answers nothing, not even from its
  /// I/O thread (a busy one still does), so both its neighbours notice it before the other
  /// ranks' waits run out.
  int heartbeat_timeout_ms_;
  std::vector<std::string> listen_;   ///< rank 0, tcp: the hosts its rendezvous binds ("*": every interface)
  std::string job_id_;                ///< ring_options::job_id: a rank of another job is refused at the rendezvous
  std::string rdv_dial_, rdv_note_;   ///< rank != 0: the rendezvous endpoint dialled, and what its name resolved to
  std::string right_dial_;            ///< the right neighbour's data endpoint as dialled (numeric)
  bool blamed_ = false;
  bool aborted_ = false;
  int abort_origin_ = -1;
  std::string abort_text_, protocol_error_;
  bool failed_ = false, closed_ = false;
};

inline std::uint64_t zmq_pair::send(const frame_header& h, std::span<const std::byte> payload) {
  std::shared_ptr<net::send_flag> flag;
  ring_->send_frames(h, payload, &flag, /*block=*/true);
  if (!flag) {
    flag = std::make_shared<net::send_flag>();
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
    r.pump(net::ms_left(deadline, 20));
  }
}

}  // namespace gradus::ring

// the set-up half of zmq_ring: its member functions that form the ring
#include "gradus/comm/ring/zmq_ring_setup.hpp"
