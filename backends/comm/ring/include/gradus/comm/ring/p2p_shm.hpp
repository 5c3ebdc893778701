#pragma once
// Shared-memory channels for the point-to-point mesh (point_to_point.hpp), between two ranks
// on one host: what a pipeline's stages send each other (activations forward, gradients
// back, on the critical path of every micro-batch). Over ZeroMQ each such message went
// through two I/O threads competing with the compute for the cores (0.2-1.5 ms a 64 KiB
// send on 2 busy cores); here the sender copies it into a segment the receiver maps, and the
// receiver copies it out: no thread in between.
//
//   - One channel per ordered pair (writer -> reader), made by the writer the first time it
//     sends to that peer: an anonymous memfd (nothing named on any filesystem; the memory goes
//     with the last process that maps it), offered over the reader's abstract unix socket
//     (SCM_RIGHTS), whose name is derived from the reader's point-to-point address. No
//     listener there (another host, another network namespace, a ring over inproc://) and the
//     pair uses ZeroMQ, decided before its first message: one path per pair keeps the order.
//     The offer never waits for the reader: the kernel keeps the connection and the
//     descriptor until the reader accepts them (listener::accept, from the mesh's pump).
//   - A segment is a single-producer / single-consumer ring of fixed slots. A message takes
//     one slot or more: the first carries its p2p_header, each its share of the payload. The
//     writer publishes slots (`head`) as it fills them and the reader releases them (`tail`)
//     as it copies them out, so a message larger than the segment streams through it.
//   - A reader waiting for a message from one peer spins briefly, yields its core for up to
//     2 ms, then sleeps on that segment's `head` (a futex; the writer wakes it only when it
//     announced that it sleeps),
//     at most a millisecond at a time so that the mesh keeps watching the peer's liveness
//     (ZeroMQ's connection events, unchanged). A writer whose segment is full drains its own
//     incoming channels while it waits (the mesh's pump), so two ranks sending to each other
//     at once cannot wait for each other.
//   - GRADUS_P2P_SHM=0 in the environment keeps every pair on ZeroMQ (for comparisons).
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <zmq.hpp>

#include "gradus/comm/net/fd.hpp"
#include "gradus/comm/ring/shm_path.hpp"

namespace gradus::ring {

struct p2p_header;  // point_to_point.hpp

/// Shared-memory channels of the point-to-point mesh between two ranks of one host: the
/// segment layout, its writer and reader, and the listener that takes a peer's offer of one.
/// The top of this header has the protocol.
namespace p2p_shm {

constexpr std::uint64_t magic = 0x67703273686d3031;  ///< "gp2shm01"
constexpr std::uint32_t slot_count = 32;              ///< a power of two
constexpr std::size_t slot_bytes = std::size_t{256} << 10;  ///< payload bytes a slot holds: 256 KiB
constexpr std::size_t slot_room = 256;    ///< a slot's chunk header (and the message's p2p_header), padded
constexpr std::size_t first_slot = 4096;  ///< after the segment header
constexpr std::size_t slot_stride = slot_room + slot_bytes;                   ///< bytes from one slot to the next
constexpr std::size_t segment_bytes = first_slot + slot_count * slot_stride;  ///< a whole segment: about 8 MiB

/// The start of a segment, shared by its writer and its reader.
struct segment_header {
  std::uint64_t magic;  ///< p2p_shm::magic, written by the writer
  /// \var writer_rank
  /// The rank that writes (sends) into the segment.
  /// \var reader_rank
  /// The rank that reads (receives) from it; its reader checks that it is its own.
  std::int32_t writer_rank, reader_rank;
  std::uint64_t target;  ///< hash of the reader's point-to-point address
  alignas(64) std::atomic<std::uint32_t> head;  ///< slots published (wraps)
  std::atomic<std::uint32_t> reader_sleeps;     ///< 1 while the reader sleeps on `head` (the writer then wakes it)
  alignas(64) std::atomic<std::uint32_t> tail;  ///< slots released (wraps)
};
static_assert(sizeof(segment_header) <= first_slot);

/// What the writer sends with the segment's descriptor.
struct offer_msg {
  std::uint64_t magic = p2p_shm::magic;  ///< p2p_shm::magic
  /// \var writer_rank
  /// The offering rank, which will write.
  /// \var reader_rank
  /// The rank offered to, which will read; it drops an offer addressed to another rank.
  std::int32_t writer_rank = -1, reader_rank = -1;
  std::uint64_t target = 0;  ///< hash_of the reader's point-to-point address
  std::uint64_t bytes = 0;   ///< the segment's size: segment_bytes
};

/// FNV-1a of a point-to-point address: names its listener, checked in the segment.
inline std::uint64_t hash_of(std::string_view s) {
  std::uint64_t h = 1469598103934665603ull;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}
/// The abstract unix socket name (`"@gradus-p2p-"` and 16 hex digits) of the listener for
/// the point-to-point address `address`.
inline std::string listener_name(std::string_view address) {
  static const char* hex = "0123456789abcdef";
  std::string n = "@gradus-p2p-";
  for (std::uint64_t h = hash_of(address), i = 0; i < 16; ++i, h >>= 4) n += hex[h & 15];
  return n;
}
/// Whether shared memory may be used: false when GRADUS_P2P_SHM=0 is set (every pair then
/// stays on ZeroMQ).
inline bool enabled() {
  const char* e = std::getenv("GRADUS_P2P_SHM");
  return !(e && std::string_view(e) == "0");
}

/// A slot's chunk: which part of which message it holds.
template <class Header>
struct chunk {
  std::uint64_t bytes = 0;  ///< payload bytes in this slot
  std::uint32_t first = 0;  ///< 1: the message's first slot (`header` valid)
  std::uint32_t reserved = 0;  ///< padding, 0
  Header header{};             ///< the message's header, in its first slot only
};

/// One end's view of a segment.
class segment {
 public:
  /// Maps the segment of memfd `fd` (segment_bytes long); `init`: the writer's end, which
  /// writes a fresh header. Throws gradus::comm_error when it cannot be mapped.
  segment(int fd, bool init) : map_(fd, segment_bytes) {
    if (!map_.ok()) throw comm_error(std::string("gradus: ring_allreduce: cannot map a point-to-point segment: ") + net::errno_message(errno));
    if (init) new (map_.base) segment_header{};
  }
  /// The shared header at the segment's start.
  segment_header& header() const { return *static_cast<segment_header*>(map_.base); }
  /// Slot `i` modulo slot_count: its chunk header, then slot_room bytes on, its payload.
  std::byte* slot(std::uint32_t i) const { return static_cast<std::byte*>(map_.base) + first_slot + (i & (slot_count - 1)) * slot_stride; }

 private:
  shm_detail::mapping map_;
};

/// The writing end of a channel (this rank -> one peer).
template <class Header>
class writer {
  static_assert(sizeof(chunk<Header>) <= slot_room);

 public:
  /// Offers a fresh segment to the rank listening for `address`; null where none listens there.
  static std::unique_ptr<writer> offer(const std::string& address, int from, int to) {
    if (!enabled()) return nullptr;
    net::unique_fd mem(::memfd_create("gradus-p2p", MFD_CLOEXEC));
    if (mem.fd < 0 || ::ftruncate(mem.fd, static_cast<off_t>(segment_bytes)) != 0) return nullptr;
    auto w = std::unique_ptr<writer>(new writer(mem.fd));
    auto& h = w->seg_.header();
    h.magic = magic;
    h.writer_rank = from;
    h.reader_rank = to;
    h.target = hash_of(address);
    net::unique_fd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_un un;
    const socklen_t len = shm_detail::abstract_address(listener_name(address), un);
    if (sock.fd < 0 || ::connect(sock.fd, reinterpret_cast<const sockaddr*>(&un), len) != 0) return nullptr;
    offer_msg o;
    o.writer_rank = from;
    o.reader_rank = to;
    o.target = h.target;
    o.bytes = segment_bytes;
    // a fresh connection's buffer takes these few bytes at once
    if (net::send_with_fd(sock.fd, &o, sizeof o, mem.fd, MSG_DONTWAIT) != static_cast<ssize_t>(sizeof o)) return nullptr;
    return w;
  }

  /// Copies as much of message (h, payload) as the segment has room for, from `done` payload
  /// bytes on (0: nothing of it yet); whether all of it is in.
  bool put(const Header& h, std::span<const std::byte> payload, std::size_t& done, bool& started) {
    auto& sh = seg_.header();
    bool moved = false;
    while (!started || done < payload.size()) {
      const std::uint32_t head = sh.head.load(std::memory_order_relaxed);
      if (head - sh.tail.load(std::memory_order_acquire) >= slot_count) break;
      std::byte* s = seg_.slot(head);
      chunk<Header> c;
      c.bytes = std::min(slot_bytes, payload.size() - done);
      c.first = started ? 0 : 1;
      if (!started) c.header = h;
      std::memcpy(s, &c, sizeof c);
      if (c.bytes) std::memcpy(s + slot_room, payload.data() + done, c.bytes);
      done += c.bytes;
      started = true;
      sh.head.store(head + 1, std::memory_order_seq_cst);
      moved = true;
    }
    if (moved && sh.reader_sleeps.load(std::memory_order_seq_cst)) shm_detail::futex_wake(sh.head);
    return started && done == payload.size();
  }

 private:
  explicit writer(int fd) : seg_(fd, true) {}
  segment seg_;
};

/// The reading end of a channel (one peer -> this rank).
template <class Header>
class reader {
 public:
  /// Maps the segment of memfd `fd` that rank `from` offered; throws gradus::comm_error when
  /// it cannot be mapped.
  reader(int fd, int from) : seg_(fd, false), from_(from) {}
  /// The writing peer's rank.
  int from() const { return from_; }
  /// The segment's shared header (the mesh checks its magic and ranks).
  const segment_header& header() const { return seg_.header(); }

  /// Takes the slots published so far; on_message(header, body) for each message completed.
  template <class F>
  void drain(F&& on_message) {
    auto& sh = seg_.header();
    std::uint32_t tail = sh.tail.load(std::memory_order_relaxed);
    const std::uint32_t head = sh.head.load(std::memory_order_acquire);
    while (tail != head) {
      const std::byte* s = seg_.slot(tail);
      chunk<Header> c;
      std::memcpy(&c, s, sizeof c);
      if (c.first) {
        h_ = c.header;
        body_.rebuild(static_cast<std::size_t>(c.header.bytes));
        got_ = 0;
        open_ = true;
      }
      if (!open_ || c.bytes > slot_bytes || got_ + c.bytes > body_.size()) {
        broken_ = true;  // not a writer that keeps the protocol: the mesh reports it
        return;
      }
      if (c.bytes) std::memcpy(static_cast<std::byte*>(body_.data()) + got_, s + slot_room, c.bytes);
      got_ += c.bytes;
      sh.tail.store(++tail, std::memory_order_release);
      if (got_ == body_.size()) {
        open_ = false;
        on_message(h_, std::move(body_));
        body_ = zmq::message_t();
      }
    }
  }
  /// Waits up to `wait` for the writer to publish a slot: spinning for a moment, then
  /// yielding the core for up to `yield_for` (a wake-up from the futex costs tens of
  /// microseconds on a virtual machine; a yield gives the core to whatever else wants it),
  /// then asleep.
  void wait(std::chrono::microseconds wait, std::chrono::microseconds yield_for) {
    auto& sh = seg_.header();
    const std::uint32_t seen = sh.tail.load(std::memory_order_relaxed);
    for (int i = 0; i < 200; ++i) {
      if (sh.head.load(std::memory_order_acquire) != seen) return;
      shm_detail::cpu_relax();
    }
    const auto until = std::chrono::steady_clock::now() + yield_for;
    do {
      if (sh.head.load(std::memory_order_acquire) != seen) return;
      std::this_thread::yield();
    } while (std::chrono::steady_clock::now() < until);
    sh.reader_sleeps.store(1, std::memory_order_seq_cst);
    if (sh.head.load(std::memory_order_seq_cst) == seen) shm_detail::futex_wait(sh.head, seen, wait);
    sh.reader_sleeps.store(0, std::memory_order_relaxed);
  }
  /// Whether the writer broke the slot protocol (a chunk out of order or too large): the
  /// mesh then fails with an error naming the peer.
  bool broken() const { return broken_; }

 private:
  segment seg_;
  int from_;
  Header h_{};
  zmq::message_t body_;
  std::size_t got_ = 0;
  bool open_ = false, broken_ = false;
};

/// This rank's listener for the offers: an abstract unix socket named for its point-to-point
/// address. Bound before the rendezvous hands that address out, so that no peer can look for
/// it too early.
class listener {
 public:
  /// No listener: accept() returns nothing, and peers use ZeroMQ.
  listener() = default;
  /// Listens for the offers to point-to-point address `address`. Never throws: when the
  /// socket cannot be made (or shared memory is disabled) there is no listener, and peers
  /// use ZeroMQ, slower but not wrong.
  explicit listener(const std::string& address) : target_(hash_of(address)) {
    if (!enabled()) return;
    fd_ = net::unique_fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_un un;
    const socklen_t len = shm_detail::abstract_address(listener_name(address), un);
    // Without it, peers use ZeroMQ: slower, not wrong.
    if (fd_.fd < 0 || ::bind(fd_.fd, reinterpret_cast<const sockaddr*>(&un), len) != 0 || ::listen(fd_.fd, 64) != 0)
      fd_ = net::unique_fd();
  }
  /// The listening socket, for poll; -1 when there is none.
  int fd() const { return fd_.fd; }

  /// Every offer that has arrived: (writer rank, the segment's descriptor). An offer whose
  /// bytes are not there yet is kept for the next call; a malformed one is dropped with a
  /// reason in `bad`.
  std::vector<std::pair<int, net::unique_fd>> accept(int reader_rank, int world, std::string& bad) {
    std::vector<std::pair<int, net::unique_fd>> r;
    if (fd_.fd < 0) return r;
    while (true) {
      const int c = ::accept4(fd_.fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0) break;
      pending_.emplace_back(c);
    }
    for (std::size_t i = 0; i < pending_.size();) {
      offer_msg o;
      net::unique_fd mem;
      const ssize_t k = net::recv_with_fd(pending_[i].fd, &o, sizeof o, MSG_DONTWAIT, mem);
      if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
        ++i;
        continue;
      }
      if (k != static_cast<ssize_t>(sizeof o) || mem.fd < 0 || o.magic != magic || o.reader_rank != reader_rank || o.target != target_ ||
          o.writer_rank < 0 || o.writer_rank >= world || o.bytes != segment_bytes)
        bad = "a malformed shared-memory offer arrived on its point-to-point listener (not a gradus ring peer of this job?)";
      else
        r.emplace_back(o.writer_rank, std::move(mem));
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    return r;
  }

 private:
  std::uint64_t target_ = 0;
  net::unique_fd fd_;
  std::vector<net::unique_fd> pending_;
};

}  // namespace p2p_shm
}  // namespace gradus::ring
