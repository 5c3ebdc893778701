#pragma once
// Point-to-point messages between any two ranks of a ring communicator: the mesh beside the
// ring, behind ring_allreduce::send / recv and the sub-groups of split (ring/sub_group.hpp).
// It runs over ZeroMQ on the ring's own scheme (tcp, ipc, or inproc for ranks as threads),
// whatever the ring's data path (shared memory and direct TCP connect neighbours only).
//
//   - Every rank binds one PULL socket for point-to-point (zmq_ring's set-up binds it beside
//     its data socket and the rendezvous hands out its address). Every peer's messages land
//     there; a header names the source rank and a channel (the communicator's own
//     send/recv, or one sub-group's send/recv or collectives), and a message waits in the
//     queue of its (channel, source) until a recv asks for it. So per-source order is kept
//     (one connection per ordered pair of ranks, FIFO), and while a recv waits for `from`,
//     other sources' and channels' messages queue. A socket of its own, not the ring's data
//     socket: the ring blames its left neighbour for any connection that closes there.
//   - A rank connects a PUSH socket to a peer's address the first time it sends to it or
//     waits for it: lazily, since a pipeline's stage talks to two ranks, not N (PUSH/PULL,
//     not ROUTER/DEALER: the header carries the source rank, so no identities are needed).
//     Waiting for a peer therefore always watches a connection to that peer, and that is how
//     a dead peer is seen: the connection's socket monitor reports DISCONNECTED when the
//     peer's process dies (its socket closes) or when ZMTP heartbeats stop for the ring's
//     heartbeat timeout (a stopped or hung process); a connection refused before it ever
//     came up is probed. As on the ring (zmq_ring::lost), after a grace for the messages
//     already on their way, a fresh connection to the peer's address tells "gone" from
//     "silent", and the error blames the peer (comm_error::peer and peer_state,
//     GRADUS_FAULT_FILE). A killed peer fails a waiting recv within about half a second; every
//     wait also has the communicator's timeout.
//   - A message is two frames: a p2p_header and the payload. Over tcp and ipc, payloads of
//     8 MiB and more (mesh::copy_below) go zero-copy (net::payload_message) and send() waits until ZeroMQ lets
//     go of them, i.e. until the bytes are in the kernel: the receiving I/O thread reads them
//     whatever its application does, so two ranks sending to each other at once do not
//     deadlock. Smaller payloads, and every inproc:// one (whose bytes ZeroMQ would hold
//     until the receiver dropped the message), are copied and send() returns at once.
//   - A message to itself is copied into its own queue.
//   - A destroyed communicator sends `leave` after its last message to every peer it has a
//     connection to, and lingers up to 0.5 s for its last messages to go out; a failed one
//     sends `abort` with its error. (inproc:// has no connection events: these and the
//     timeout are all a waiting thread-rank learns.)
//   - Between processes on one host the messages go through shared memory instead
//     (p2p_shm.hpp: the segments, their offer and slot protocol); this file routes to them
//     and keeps ZeroMQ for everything else.
// (About 590 lines with its doc comments, one concept: the mesh — its links, their liveness and blame, the
// queues, and the choice of path per pair; the segments themselves are p2p_shm.hpp's.)
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradus/comm/net/heartbeat.hpp"
#include "gradus/comm/net/one_frame.hpp"
#include "gradus/comm/net/peer_state.hpp"
#include "gradus/comm/net/socket_monitor.hpp"
#include "gradus/comm/net/zero_copy.hpp"
#include "gradus/comm/ring/p2p_shm.hpp"
#include "gradus/comm/ring/pair.hpp"
#include "gradus/comm/ring/zmq_ring.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ring {

/// What a point-to-point message carries.
enum class p2p_kind : std::uint16_t {
  data = 1,   ///< a send's payload, or one step of a sub-group's collective
  leave = 2,  ///< the sender's communicator was destroyed; sent after its last message
  abort = 3,  ///< the sender's communicator failed; the payload is its error
};

/// The first frame of every point-to-point message; the payload follows.
struct p2p_header {
  static constexpr std::uint32_t magic_value = 0x70327067;  ///< "gp2p"
  std::uint32_t magic = magic_value;     ///< magic_value; a message without it is malformed (gradus::comm_error)
  p2p_kind kind = p2p_kind::data;        ///< data, leave or abort
  element_type dtype = element_type::none;  ///< of the payload's elements (parallel::element_of; none: bytes)
  std::uint8_t reserved_byte = 0;        ///< padding, 0
  std::int32_t from = -1;                ///< the sending rank (of the whole communicator)
  std::uint32_t channel = 0;             ///< channel_of(group, collective); 0: the communicator's send/recv
  std::uint64_t count = 0;               ///< elements in the payload
  std::uint64_t bytes = 0;               ///< payload bytes
  std::uint32_t step = 0;                ///< a sub-group's collectives: the step within it
  std::uint32_t reserved = 0;            ///< padding, 0
  fingerprint fp;                        ///< a sub-group's collectives: which one (zero for send/recv)
};
static_assert(std::is_trivially_copyable_v<p2p_header>);

/// The channel of sub-group `group`'s send/recv or its collectives (group 0: the whole
/// communicator, whose collectives run on the ring instead).
constexpr std::uint32_t channel_of(std::uint32_t group, bool collective) { return 2 * group + (collective ? 1u : 0u); }

/// "1000 float32", "0 bytes"
inline std::string elements(std::uint64_t count, element_type d) {
  return std::to_string(count) + " " + std::string(parallel::element_name(d));
}

/// A received point-to-point message, queued until a recv takes it.
struct p2p_message {
  p2p_header header;     ///< as the sender wrote it (from and bytes filled in by its mesh)
  zmq::message_t body;   ///< the payload's memory (a ZeroMQ message, or a copy out of shared memory)
  std::size_t skip = 0;  ///< the header's bytes before the payload, when both came as one frame
  /// The payload: body without its first `skip` bytes.
  std::span<const std::byte> payload() const { return {static_cast<const std::byte*>(body.data()) + skip, body.size() - skip}; }
};

/// One rank's point-to-point connections to every other rank of a ring communicator (the
/// mesh beside the ring): behind ring_allreduce::send / recv and its sub-groups. Messages
/// wait in per-(channel, source) queues until asked for; a connection is made to a peer the
/// first time this rank sends to it or waits for it, over shared memory between processes of
/// one host and over ZeroMQ otherwise. A dead or silent peer fails a wait on it with
/// gradus::comm_error naming it. The top of this header has the protocol. Not thread-safe:
/// the communicator's one-call-at-a-time rule covers it.
class mesh {
 public:
  /// A world of one: messages to itself only.
  explicit mesh(int rank) : rank_(rank), world_(1) {}
  /// The mesh of a formed ring (world_size > 1): takes its point-to-point socket.
  explicit mesh(zmq_ring& ring)
      : ring_(&ring), rank_(ring.rank_), world_(ring.world_), inproc_(ring.zmq_scheme_ == "inproc"), pull_(std::move(ring.p2p_pull_)),
        shm_listen_(std::move(ring.p2p_shm_listen_)), links_(static_cast<std::size_t>(world_)), in_(static_cast<std::size_t>(world_)),
        shm_in_(static_cast<std::size_t>(world_)) {
    ring.p2p_pull_.reset();
    ring.p2p_shm_listen_.clear();
    if (!pull_ || ring.p2p_table_.size() != static_cast<std::size_t>(world_))
      throw error("gradus: ring_allreduce: rank " + std::to_string(rank_) + ": no point-to-point socket (internal error)");
  }
  mesh(const mesh&) = delete;
  mesh& operator=(const mesh&) = delete;

  ~mesh() {
    if (closed_) return;
    for (std::size_t p = 0; p < links_.size(); ++p) {
      auto& l = links_[p];
      if (!l || !l->push) continue;
      try {
        // After this rank's last messages, which get up to 0.5 s to go out (the context's
        // termination waits for them; an abort 0.1 s); none to a peer known to be gone,
        // where they would wait for a reconnection until the linger ran out.
        events(*l);
        const bool reachable = !l->gone && !in_[p].left;
        l->push->set(zmq::sockopt::linger, reachable ? (failed_ ? 100 : 500) : 0);
        if (reachable && !failed_) {
          p2p_header h;
          h.kind = p2p_kind::leave;
          h.from = rank_;
          post_now(*l->push, h, {});
        }
      } catch (...) {
      }
      l->mon.stop();
      l->push.reset();
    }
    pull_.reset();
  }

  /// Payloads below this are copied (by libzmq) and send() returns at once; larger ones go
  /// zero-copy and send() waits for the I/O thread to take them. Far above the ring's 64 KiB:
  /// a pipeline's activations (tens of KiB to a few MiB, on the critical path of every
  /// micro-batch) spent 0.2-1.5 ms a send waiting for that thread while both cores computed;
  /// a copy of 1 MiB is ~50 us.
  static constexpr std::size_t copy_below = std::size_t{8} << 20;

  /// This rank.
  int rank() const { return rank_; }
  /// How many ranks the communicator has.
  int world_size() const { return world_; }
  /// How messages to `peer` travel: "shared memory", "zeromq", or "" before the first one.
  std::string_view path_to(int peer) const {
    if (peer < 0 || peer >= static_cast<int>(links_.size()) || !links_[static_cast<std::size_t>(peer)]) return "";
    const link& l = *links_[static_cast<std::size_t>(peer)];
    return !l.shm_decided ? "" : l.shm ? "shared memory" : "zeromq";
  }

  /// The largest sub-group id this rank has taken part in (split agrees on the next one).
  std::uint32_t last_group_id = 0;

  /// Sends header h (its from and bytes filled in here) and `payload` to rank `to`; returns
  /// once the payload's bytes may be reused. `doing` names the operation in errors.
  void send(int to, p2p_header h, std::span<const std::byte> payload, clock::time_point deadline, std::string_view doing) {
    h.from = rank_;
    h.bytes = payload.size();
    if (to == rank_) {
      queue(h.channel, rank_).push_back(p2p_message{h, zmq::message_t(payload.data(), payload.size())});
      return;
    }
    link& l = link_to(to, doing);
    if (!l.shm) pump(0, &l);  // (a segment's sends take no ZeroMQ call: its waits pump)
    check(to, &l, doing);
    if (!l.shm_decided) {  // before the first message to `to`: one path per pair keeps the order
      l.shm_decided = true;
      if (!inproc_) l.shm = p2p_shm::writer<p2p_header>::offer(ring_->p2p_table_[static_cast<std::size_t>(to)], rank_, to);
    }
    if (l.shm) {
      std::size_t done = 0;
      bool started = false;
      for (int spins = 0; !l.shm->put(h, payload, done, started); ++spins) {
        // the segment is full: take what arrives meanwhile (a peer sending to this rank too)
        pump(0, &l);
        check(to, &l, doing);
        if (clock::now() >= deadline) throw ring_->silent(doing, to, false);
        if (spins < 64) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
      return;
    }
    // No high-water mark and a pipe from connect() on: ZeroMQ queues the message at once.
    // Copies are made by libzmq itself (zmq_send of a buffer), not by cppzmq's inline
    // message_t(data, size): ThreadSanitizer does not see libzmq's copy (tsan.supp), so ranks
    // as threads reading a received payload are not a report per element.
    while (!l.push->send(zmq::const_buffer(&h, sizeof h), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      if (clock::now() >= deadline) throw ring_->silent(doing, to, false);
      zmq::pollitem_t item{l.push->handle(), 0, ZMQ_POLLOUT, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(10));
      pump(0, &l);
      check(to, &l, doing);
    }
    // the first frame went, so this one goes too
    if (inproc_ || payload.size() < copy_below) {
      (void)l.push->send(zmq::const_buffer(payload.data(), payload.size()), zmq::send_flags::none);
      return;
    }
    std::shared_ptr<net::send_flag> flag;
    zmq::message_t body = net::payload_message(payload, &flag);
    (void)l.push->send(body, zmq::send_flags::none);
    for (int spins = 0; !flag->done.load(std::memory_order_acquire); ++spins) {
      try {
        pump(0, &l);
        check(to, &l, doing);
        if (clock::now() >= deadline) throw ring_->silent(doing, to, false);
      } catch (...) {
        release(to, flag);  // the caller may free its buffer once this throws
        throw;
      }
      // Completion is set from ZeroMQ's I/O thread: yield a while, then sleep.
      if (spins < 64) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  /// The next message on `channel` from rank `from`, waiting for it; it stays queued until
  /// pop(from, channel). The reference is valid until then.
  p2p_message& next(int from, std::uint32_t channel, clock::time_point deadline, std::string_view doing) {
    auto& q = queue(channel, from);
    if (from == rank_) {
      if (q.empty())
        throw error(prefix(doing) + "rank " + std::to_string(rank_) + " has sent itself nothing" + (channel ? " in this group" : "") +
                    " (it would wait forever)");
      return q.front();
    }
    link& l = link_to(from, doing);  // watches `from` while waiting
    auto& shm = shm_in_[static_cast<std::size_t>(from)];
    if (shm && q.empty()) drain(*shm);  // a segment's message needs no ZeroMQ call
    if (q.empty()) pump(0, &l);
    const auto since = clock::now();
    auto pumped = since;
    while (q.empty()) {
      check(from, &l, doing);
      if (clock::now() >= deadline) throw ring_->silent(doing, from, true);
      if (shm) {
        // its segment (waking the moment a slot is published): yielding for the first 2 ms;
        // ZeroMQ (the peer's liveness, other peers' messages) asked every millisecond
        const auto now = clock::now();
        const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(now - since);
        shm->wait(std::chrono::microseconds(1000), std::max(std::chrono::microseconds(0), std::chrono::microseconds(2000) - waited));
        drain(*shm);
        if (q.empty() && clock::now() - pumped >= std::chrono::milliseconds(1)) {
          pump(0, &l);
          pumped = clock::now();
        }
      } else {
        pump(net::ms_left(deadline, 20), &l);
      }
    }
    return q.front();
  }
  /// Drops the message next() returned for (from, channel); its reference becomes invalid.
  void pop(int from, std::uint32_t channel) { queue(channel, from).pop_front(); }
  /// Whether a message on `channel` from rank `from` has arrived (next() would not wait):
  /// its queue, then its segment (no system call), then ZeroMQ's socket — asked at most
  /// every 200 us where the peer has a segment, since each ask is a poll() (a caller that
  /// probes between short pieces of work would otherwise spend its time there).
  bool arrived(int from, std::uint32_t channel) {
    auto& q = queue(channel, from);
    if (!q.empty() || from == rank_) return !q.empty();
    auto& shm = shm_in_[static_cast<std::size_t>(from)];
    if (shm) drain(*shm);
    const auto now = clock::now();
    if (q.empty() && (!shm || now - probe_pumped_ >= std::chrono::microseconds(200))) {
      pump(0, nullptr);
      probe_pumped_ = now;
    }
    return !q.empty();
  }

  /// `"gradus: ring_allreduce: <doing> on rank r: "`
  std::string prefix(std::string_view doing) const {
    return "gradus: ring_allreduce: " + std::string(doing) + " on rank " + std::to_string(rank_) + ": ";
  }

  /// This rank's communicator failed with `text`: tell every peer it has a connection to.
  /// Never throws.
  void fail(const std::string& text) noexcept {
    if (failed_ || closed_) return;
    failed_ = true;
    for (std::size_t p = 0; p < links_.size(); ++p) {
      auto& l = links_[p];
      if (!l || !l->push || l->gone) continue;
      try {
        p2p_header h;
        h.kind = p2p_kind::abort;
        h.from = rank_;
        h.bytes = text.size();
        post_now(*l->push, h, std::as_bytes(std::span(text)));
      } catch (...) {
      }
    }
  }

  /// The context was shut down under us: close now, so that its termination can finish.
  void close_now() noexcept {
    if (closed_) return;
    closed_ = true;
    for (auto& l : links_)
      if (l) {
        l->mon.stop();
        l->push.reset();
      }
    pull_.reset();
  }

 private:
  /// The connection to one peer (this rank's PUSH socket on the peer's address).
  struct link {
    std::optional<zmq::socket_t> push;
    net::socket_monitor mon;  // after the socket it watches: destroyed first
    std::string dial;         // the peer's point-to-point endpoint as dialled
    bool established = false; // a ZMTP handshake completed
    bool shm_decided = false; // whether messages go through `shm` was decided (at the first send)
    std::unique_ptr<p2p_shm::writer<p2p_header>> shm;  // this rank -> the peer, on one host
    bool gone = false;        // ... and its connection closed since (or heartbeats dropped it)
    bool attempt_failed = false;  // a connection attempt failed before any was established
    int unestablished = 0;    // handshakes failed, whose DISCONNECTED is still to come
    clock::time_point gone_at{}, probed_at{};
  };
  /// What a peer told this rank about itself.
  struct peer_news {
    bool left = false, aborted = false;
    std::string abort_text;
  };

  std::deque<p2p_message>& queue(std::uint32_t channel, int from) { return queues_[{channel, from}]; }

  /// A leave or an abort, if ZeroMQ takes it at once: one frame (net/one_frame.hpp), as the
  /// peer may be closing its connection meanwhile.
  static void post_now(zmq::socket_t& s, const p2p_header& h, std::span<const std::byte> payload) {
    std::vector<std::byte> joined;
    const auto frame = net::one_frame(h, payload, joined);
    (void)s.send(zmq::const_buffer(frame.data(), frame.size()), zmq::send_flags::dontwait);
  }

  link& link_to(int peer, std::string_view doing) {
    auto& slot = links_[static_cast<std::size_t>(peer)];
    if (slot) return *slot;
    if (closed_) throw comm_error(prefix(doing) + "the communicator is closed");
    auto l = std::make_unique<link>();
    zmq::context_t& ctx = *ring_->ctx_;
    l->push.emplace(ctx, zmq::socket_type::push);
    l->push->set(zmq::sockopt::linger, 0);
    l->push->set(zmq::sockopt::sndhwm, 0);  // what a program sends is bounded by what it holds
    l->push->set(zmq::sockopt::ipv6, 1);
    if (!inproc_) {
      net::set_heartbeats(*l->push, std::chrono::milliseconds(ring_->heartbeat_timeout_ms_), /*ask_peer_too=*/true);
      constexpr int events = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
      l->mon = net::socket_monitor(ctx, *l->push, events, "p2p");
    }
    const std::string& address = ring_->p2p_table_[static_cast<std::size_t>(peer)];
    std::string note;
    l->dial = ring_->dial_of(address, "the point-to-point address of rank " + std::to_string(peer), note);
    try {
      l->push->connect(l->dial);
    } catch (const zmq::error_t& e) {
      throw comm_error(prefix(doing) + "cannot connect to rank " + std::to_string(peer) + "'s point-to-point address " + address +
                       (note.empty() ? "" : " (" + note + ")") + ": " + e.what());
    }
    slot = std::move(l);
    return *slot;
  }

  /// Takes what has arrived: connection events of every link, and every message on the
  /// point-to-point socket (data into its queue; leave and abort noted per peer). Waits up
  /// to wait_ms for a message or an event of `watched`.
  void pump(int wait_ms, link* watched) {
    if (closed_ || !pull_) throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + ": the communicator is closed");
    zmq::pollitem_t items[4] = {{pull_->handle(), 0, ZMQ_POLLIN, 0}, {}, {}, {}};
    std::size_t n = 1;
    if (watched && watched->mon) items[n++] = watched->mon.poll_item();
    for (const auto& L : shm_listen_)  // an offer of a segment wakes the wait too
      if (L.fd() >= 0 && n < std::size(items)) items[n++] = {nullptr, L.fd(), ZMQ_POLLIN, 0};
    zmq::poll(items, n, std::chrono::milliseconds(wait_ms));  // also when 0: ZeroMQ processes its commands here
    for (auto& l : links_)
      if (l) events(*l);
    while (true) {
      zmq::message_t head;
      if (!pull_->recv(head, zmq::recv_flags::dontwait)) break;
      // Two frames (header, payload), or one with both (post_now).
      p2p_message m;
      const bool two = head.more();
      if (two ? !pull_->recv(m.body) || head.size() != sizeof(p2p_header) : head.size() < sizeof(p2p_header)) {
        protocol_error_ = "a malformed message arrived on its point-to-point socket (not a gradus ring peer?)";
        continue;
      }
      p2p_header& h = m.header;
      std::memcpy(&h, head.data(), sizeof h);
      if (!two) {
        m.body = std::move(head);
        m.skip = sizeof h;
      }
      if (h.magic != p2p_header::magic_value || h.from < 0 || h.from >= world_ || h.bytes != m.payload().size()) {
        protocol_error_ = "a malformed message arrived on its point-to-point socket (not a gradus ring peer?)";
        continue;
      }
      auto& news = in_[static_cast<std::size_t>(h.from)];
      if (h.kind == p2p_kind::leave) {
        news.left = true;
      } else if (h.kind == p2p_kind::abort) {
        const auto text = m.payload();
        if (!news.aborted) news.abort_text.assign(reinterpret_cast<const char*>(text.data()), text.size());
        news.aborted = true;
      } else {
        keep_heap_for(m.body.size());
        queue(h.channel, h.from).push_back(std::move(m));
      }
    }
    pump_shared_memory();
  }

  /// After ZeroMQ's messages (a peer's leave follows its last message, which may be here):
  /// the segments offered since, then every segment's messages.
  void pump_shared_memory() {
    for (auto& L : shm_listen_)
      for (auto& [from, fd] : L.accept(rank_, world_, protocol_error_)) {
        auto& r = shm_in_[static_cast<std::size_t>(from)];
        if (r) {
          protocol_error_ = "rank " + std::to_string(from) + " offered a second shared-memory segment (not a gradus ring peer of this job?)";
          continue;
        }
        try {
          r = std::make_unique<p2p_shm::reader<p2p_header>>(fd.fd, from);
        } catch (const std::exception& e) {
          protocol_error_ = e.what();
          continue;
        }
        const auto& sh = r->header();
        if (sh.magic != p2p_shm::magic || sh.writer_rank != from || sh.reader_rank != rank_) {
          protocol_error_ = "rank " + std::to_string(from) + "'s shared-memory segment is not a point-to-point segment of this job";
          r.reset();
        }
      }
    for (auto& r : shm_in_)
      if (r) drain(*r);
  }
  /// The messages in one peer's segment, into their queues.
  void drain(p2p_shm::reader<p2p_header>& r) {
    r.drain([&](const p2p_header& h, zmq::message_t&& body) {
      if (h.magic != p2p_header::magic_value || h.from != r.from() || h.kind != p2p_kind::data) {
        protocol_error_ = "a malformed message arrived in rank " + std::to_string(r.from()) + "'s shared-memory segment";
        return;
      }
      keep_heap_for(body.size());
      queue(h.channel, h.from).push_back(p2p_message{h, std::move(body)});
    });
    if (r.broken()) protocol_error_ = "rank " + std::to_string(r.from()) + "'s shared-memory segment breaks its protocol";
  }

  void events(link& l) {
    while (const auto ev = l.mon.next()) {
      const auto id = ev->id;
      if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        l.established = true;
      } else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                 id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) {
        ++l.unestablished;  // its DISCONNECTED follows
        if (!l.established) l.attempt_failed = true;
      } else if (id == ZMQ_EVENT_DISCONNECTED) {
        if (l.unestablished > 0) {
          --l.unestablished;
        } else if (l.established && !l.gone) {
          l.gone = true;
          l.gone_at = clock::now();
        } else if (!l.established) {
          l.attempt_failed = true;
        }
      } else if (id == ZMQ_EVENT_CONNECT_RETRIED) {
        if (!l.established) l.attempt_failed = true;
      }
    }
  }

  /// Throws when a wait on `peer` cannot finish: a malformed message, the peer's abort or
  /// leave, its connection lost (after a grace for what is on its way), or refused.
  void check(int peer, link* l, std::string_view doing) {
    if (!protocol_error_.empty()) throw comm_error(prefix(doing) + protocol_error_);
    const auto& news = in_[static_cast<std::size_t>(peer)];
    if (news.aborted)
      throw comm_error(prefix(doing) + "aborted because rank " + std::to_string(peer) + " failed: " + news.abort_text);
    if (news.left) throw ring_->left_ring(doing, peer);
    if (!l) return;
    const auto now = clock::now();
    constexpr auto grace = std::chrono::milliseconds(300);
    if (l->gone && now - l->gone_at > grace) throw ring_->lost(doing, peer);
    if (!l->established && l->attempt_failed && now - l->probed_at > std::chrono::milliseconds(200)) {
      // Refused before it ever came up: nothing listening means the peer is gone.
      l->attempt_failed = false;
      l->probed_at = now;
      if (net::probe(l->dial, 500) == net::reach::refused) {
        l->gone = true;  // nothing more goes there (an abort, a leave)
        throw ring_->blame(peer, "gone", prefix(doing) + "rank " + std::to_string(peer) + "'s point-to-point address " + l->dial +
                                             " refuses connections: it is gone (nothing listens there: the process died or closed its communicator)");
      }
    }
  }

  /// After a failed zero-copy send: close the connection, so that ZeroMQ lets go of the
  /// caller's bytes (within milliseconds), and wait for it. Never throws.
  void release(int peer, const std::shared_ptr<net::send_flag>& flag) noexcept {
    auto& l = links_[static_cast<std::size_t>(peer)];
    if (l) {
      l->mon.stop();
      l->push.reset();  // linger 0: what is queued is dropped
      l.reset();
    }
    const auto until = clock::now() + std::chrono::seconds(10);
    while (!flag->done.load(std::memory_order_acquire) && clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

  /// Large messages come in blocks ZeroMQ mallocs; keep glibc from mapping and unmapping each
  /// one (zmq_ring.hpp, keep_heap_for_segments), once per size class seen.
  void keep_heap_for(std::size_t bytes) {
    if (bytes <= kept_for_) return;
    kept_for_ = bytes;
    if (bytes >= (std::size_t{1} << 20)) detail::keep_heap_for_segments(bytes / 4);
  }

  zmq_ring* ring_ = nullptr;
  int rank_, world_;
  bool inproc_ = false;
  std::optional<zmq::socket_t> pull_;
  std::vector<p2p_shm::listener> shm_listen_;  ///< offers of segments from peers on this host
  std::vector<std::unique_ptr<link>> links_;  ///< by peer, made on first use
  std::vector<peer_news> in_;                 ///< by peer
  std::vector<std::unique_ptr<p2p_shm::reader<p2p_header>>> shm_in_;  ///< by peer: its segment, once offered
  std::map<std::pair<std::uint32_t, int>, std::deque<p2p_message>> queues_;  ///< by (channel, source)
  clock::time_point probe_pumped_{};  ///< arrived()'s last ask of ZeroMQ
  std::string protocol_error_;
  std::size_t kept_for_ = 0;
  bool failed_ = false, closed_ = false;
};

/// Checks that message m holds `count` elements of `dtype` and copies them into `dst`. A
/// message of another size or dtype throws gradus::error naming the peer and both sizes; it
/// stays queued, and the communicator stays usable (a recv of the right size takes it).
inline void take_payload(const p2p_message& m, element_type dtype, std::size_t count, std::span<std::byte> dst, const std::string& prefix,
                         const std::string& peer) {
  const auto& h = m.header;
  if (h.dtype != dtype || h.count != count)
    throw error(prefix + peer + "'s message holds " + elements(h.count, h.dtype) + " (" + std::to_string(h.bytes) + " bytes), but this recv expects " +
                elements(count, dtype) + " (" + std::to_string(dst.size()) +
                " bytes): the two ranks disagree on the size or dtype (the message stays queued)");
  if (!dst.empty()) std::memcpy(dst.data(), m.payload().data(), dst.size());
}

}  // namespace gradus::ring
