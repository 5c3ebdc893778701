#pragma once
// The ring's shared-memory data path, for ranks on one host (ring_options::transport "shm",
// and "auto" when every rank reports the same machine and network namespace).
//
// Each rank owns one segment: an anonymous memfd that its left neighbour writes into and it
// reads from, handed over once through a Linux abstract unix socket (SCM_RIGHTS). Nothing is
// ever named in /dev/shm or on any filesystem, so a killed rank leaves nothing behind: the
// memory goes with the last process that maps it.
//
// A segment is a single-producer / single-consumer ring of fixed slots (a frame_header and
// up to slot_bytes of payload each). The writer copies a segment of the caller's buffer into
// the next free slot and publishes it (`head`); the reader reduces straight from the slot
// and releases it (`tail`) when the ring drops the message. So a payload is copied once on
// its way (vader's copy-in / copy-out is two), by the collective's own thread: no extra
// thread, no ZeroMQ I/O thread between two cores. Waiting spins for microseconds, yields
// the core for up to 2 ms, then sleeps on a futex in the segment (the other side wakes it
// only when it announced that it sleeps).
//
// A send whose ring is full is kept (the caller's bytes are not copied) and flushed while
// the rank waits for anything; `wait_sent` on a send that is not this rank's latest copies
// the still-pending payloads aside instead of waiting, so that ranks that all wait for their
// right neighbours' space can never wait for each other in a circle (ZeroMQ's queues are
// unbounded; a shared segment is not). The latest send is always waited for for real: that
// is the end of a collective, when the right neighbour is still reading.
//
// Liveness comes from the control plane (ZeroMQ's connection events and heartbeats): a
// waiting rank asks it at least every 2 ms.
// (Just over 500 lines, one concept: the segment, its hand-over and the slot protocol.)
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
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

#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "gradus/comm/net/fd.hpp"
#include "gradus/comm/ring/pair.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ring {

namespace shm_detail {

inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::microseconds wait) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) && std::atomic<std::uint32_t>::is_always_lock_free);
  timespec ts{static_cast<time_t>(wait.count() / 1000000), static_cast<long>((wait.count() % 1000000) * 1000)};
  // Not FUTEX_PRIVATE: the word is in memory another process maps.
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}
inline void futex_wake(std::atomic<std::uint32_t>& word) {
  (void)::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

constexpr std::uint64_t magic = 0x67726e6773686d31;  ///< "grngshm1"
constexpr std::size_t header_room = 256;              ///< a slot's frame_header, padded: payloads 64-byte aligned
static_assert(sizeof(frame_header) <= header_room);

/// The start of a segment. head and tail live on their own cache lines: the writer stores
/// one, the reader the other.
struct segment_header {
  std::uint64_t magic;
  std::uint32_t slots;       ///< a power of two
  std::uint32_t version;
  std::uint64_t slot_bytes;  ///< payload bytes per slot
  std::int32_t reader_rank, writer_rank;
  alignas(64) std::atomic<std::uint32_t> head;  ///< slots published by the writer (wraps)
  std::atomic<std::uint32_t> reader_sleeps;
  alignas(64) std::atomic<std::uint32_t> tail;  ///< slots released by the reader (wraps)
  std::atomic<std::uint32_t> writer_sleeps;
};
constexpr std::size_t first_slot = 4096;
static_assert(sizeof(segment_header) <= first_slot);

inline std::size_t slot_stride(std::size_t slot_bytes) { return header_room + (slot_bytes + 63) / 64 * 64; }
inline std::size_t segment_size(std::uint32_t slots, std::size_t slot_bytes) { return first_slot + slots * slot_stride(slot_bytes); }

struct mapping {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
  mapping() = default;
  mapping(int fd, std::size_t n) : bytes(n) { base = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); }
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
  ~mapping() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  bool ok() const { return base != MAP_FAILED; }
  segment_header& header() const { return *static_cast<segment_header*>(base); }
  std::byte* slot(std::uint32_t index) const {
    const auto& h = header();
    return static_cast<std::byte*>(base) + first_slot + (index & (h.slots - 1)) * slot_stride(h.slot_bytes);
  }
};

/// `"@gradus-shm-..."` -> an abstract unix socket address
inline socklen_t abstract_address(const std::string& name, sockaddr_un& un) {
  un = {};
  un.sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof un.sun_path);
  std::memcpy(un.sun_path, name.data(), n);
  un.sun_path[0] = '\0';
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
}

/// What the writer says first, and what the reader answers with the segment's descriptor.
struct hello {
  std::uint64_t magic = shm_detail::magic;
  std::int32_t rank = -1;
  std::uint32_t slots = 0;
  std::uint64_t slot_bytes = 0;
};

}  // namespace shm_detail

/// This rank's listener for the shared-memory hand-over: bound before the rendezvous, its
/// name advertised there (`"shm://@gradus-shm-..."`).
class shm_listener {
 public:
  /// Binds and listens on `"@gradus-shm-<unique>-rank<rank>"`. Throws gradus::comm_error when
  /// it cannot.
  shm_listener(const std::string& unique, int rank) : name_("@gradus-shm-" + unique + "-rank" + std::to_string(rank)) {
    fd_.fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    sockaddr_un un;
    const socklen_t len = shm_detail::abstract_address(name_, un);
    if (fd_.fd < 0 || ::bind(fd_.fd, reinterpret_cast<const sockaddr*>(&un), len) != 0 || ::listen(fd_.fd, 4) != 0)
      throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank) + " cannot listen on the unix socket " + name_ +
                       " for its shared-memory segment: " + net::errno_message(errno));
  }
  /// The address to advertise: `"shm://@gradus-shm-..."`.
  std::string address() const { return "shm://" + name_; }
  /// The listening socket.
  int fd() const { return fd_.fd; }

 private:
  std::string name_;
  net::unique_fd fd_;
};

/// The ring's shared-memory data path (transport "shm"): this rank's segment, which its left
/// neighbour writes into, and its right neighbour's, which it writes into. The top of this
/// header has the slot protocol; zmq_ring makes it at set-up and drives it through its pairs.
class shm_path final : public data_path {
 public:
  /// Hands this rank's segment to its left neighbour and maps its right neighbour's, within
  /// `deadline`. `mine`: this rank's listener; `right_listener`: the right neighbour's shm://
  /// address; `shown_*`: how errors name the neighbours; `slot_bytes`: the payload room of a
  /// slot (the neighbours must agree); `crowded`: more ranks than cores on this machine
  /// (waits yield at once). Throws gradus::comm_error when a step fails or the deadline
  /// passes.
  shm_path(control& ctl, int rank, int left, int right, shm_listener& mine, const std::string& right_listener,
           std::string shown_left, std::string shown_right, std::size_t slot_bytes, bool crowded, clock::time_point deadline)
      : ctl_(&ctl), rank_(rank), crowded_(crowded), reader_(std::make_shared<reader_state>()) {
    constexpr std::uint32_t slots = 16;
    const std::string where = "gradus: ring_allreduce: rank " + std::to_string(rank) + ": shared memory: ";
    // 1. dial the right neighbour's listener (its backlog takes it at once) and say who we are
    net::unique_fd to_right(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    {
      sockaddr_un un;
      const socklen_t len = shm_detail::abstract_address(right_listener.substr(6), un);
      if (to_right.fd < 0 || ::connect(to_right.fd, reinterpret_cast<const sockaddr*>(&un), len) != 0)
        throw comm_error(where + "cannot reach rank " + std::to_string(right) + "'s unix socket " + right_listener + ": " +
                         net::errno_message(errno) + " (is it on another host or network namespace? use transport tcp)");
      shm_detail::hello h;
      h.rank = rank;
      send_all(to_right.fd, &h, sizeof h, deadline, where + "telling rank " + std::to_string(right) + " who this is");
    }
    // 2. take the left neighbour's connection, create this rank's segment and hand it over
    {
      net::unique_fd from_left(accept_one(mine.fd(), deadline, where + "waiting for rank " + std::to_string(left) + " to dial"));
      shm_detail::hello h;
      recv_all(from_left.fd, &h, sizeof h, deadline, where + "reading rank " + std::to_string(left) + "'s hello");
      if (h.magic != shm_detail::magic || h.rank != left)
        throw comm_error(where + "a stranger dialled its unix socket (rank " + std::to_string(h.rank) + ", expected rank " +
                         std::to_string(left) + ")");
      const std::size_t bytes = shm_detail::segment_size(slots, slot_bytes);
      net::unique_fd mem(static_cast<int>(::syscall(SYS_memfd_create, "gradus-ring", 1U /* MFD_CLOEXEC */)));
      if (mem.fd < 0 || ::ftruncate(mem.fd, static_cast<off_t>(bytes)) != 0)
        throw comm_error(where + "cannot create a shared segment of " + std::to_string(bytes) + " bytes: " + net::errno_message(errno));
      reader_->map.emplace(mem.fd, bytes);
      if (!reader_->map->ok()) throw comm_error(where + "cannot map its shared segment: " + net::errno_message(errno));
      auto& sh = reader_->map->header();
      sh.magic = shm_detail::magic;
      sh.slots = slots;
      sh.version = 1;
      sh.slot_bytes = slot_bytes;
      sh.reader_rank = rank;
      sh.writer_rank = left;
      sh.head.store(0);
      sh.tail.store(0);
      sh.reader_sleeps.store(0);
      sh.writer_sleeps.store(0);
      reader_->released.assign(slots, 0);
      shm_detail::hello answer;
      answer.rank = rank;
      answer.slots = slots;
      answer.slot_bytes = slot_bytes;
      send_fd(from_left.fd, mem.fd, answer, deadline, where + "handing its segment to rank " + std::to_string(left));
    }
    // 3. the right neighbour's segment, to write into
    {
      shm_detail::hello h;
      net::unique_fd mem(recv_fd(to_right.fd, h, deadline, where + "waiting for rank " + std::to_string(right) + "'s segment"));
      if (h.magic != shm_detail::magic || h.rank != right || h.slots == 0 || (h.slots & (h.slots - 1)) != 0 || h.slot_bytes != slot_bytes)
        throw comm_error(where + "rank " + std::to_string(right) + " handed over a segment this rank cannot use (slots " +
                         std::to_string(h.slots) + ", slot bytes " + std::to_string(h.slot_bytes) + ", expected " +
                         std::to_string(slot_bytes) + ": segment_bytes differs between ranks?)");
      writer_.emplace(mem.fd, shm_detail::segment_size(h.slots, slot_bytes));
      if (!writer_->ok()) throw comm_error(where + "cannot map rank " + std::to_string(right) + "'s segment: " + net::errno_message(errno));
      if (writer_->header().magic != shm_detail::magic || writer_->header().writer_rank != rank)
        throw comm_error(where + "rank " + std::to_string(right) + "'s segment is not addressed to this rank");
    }
    left_.emplace(*this, left, std::move(shown_left));
    right_.emplace(*this, right, std::move(shown_right));
  }

  /// The pair to the left neighbour, read from this rank's segment.
  pair& left() override { return *left_; }
  /// The pair to the right neighbour, written into its segment.
  pair& right() override { return *right_; }
  std::size_t segment_bytes(std::size_t) const override { return writer_->header().slot_bytes; }

  bool leave(std::chrono::milliseconds wait) noexcept override {
    try {
      const auto until = clock::now() + wait;
      frame_header h;
      h.kind = frame_kind::leave;
      h.from = rank_;
      while (true) {
        flush();
        if (pending_.empty() && try_put(h, {})) return true;
        if (clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    } catch (...) {
      return false;
    }
  }
  void drop() noexcept override { pending_.clear(); }

 private:
  friend class path_pair<shm_path>;

  std::uint64_t send(int, const frame_header& h, std::span<const std::byte> payload) { return send(h, payload); }
  bool sent(int, std::uint64_t ticket) { return sent(ticket); }

  void wait_sent(int peer, std::uint64_t ticket, clock::time_point deadline, std::string_view doing) {
    auto& sh = writer_->header();
    const bool latest = ticket + 1 >= next_ticket_;
    waiting w;
    for (int spins = 0;; ++spins) {
      flush();
      if (latest ? pending_.empty() : released_through(ticket)) return;
      if (!latest && spins >= 64) {
        // Not the latest send: set the kept payloads up to it aside rather than wait.
        for (auto& s : pending_) {
          if (s.ticket > ticket) break;
          if (s.copy.empty() && !s.payload.empty()) s.copy.assign(s.payload.begin(), s.payload.end());
        }
        return;
      }
      if (clock::now() >= deadline) throw ctl_->silent(doing, peer, false);
      wait_round(w, sh.tail, sh.writer_sleeps, sh.tail.load(std::memory_order_seq_cst), doing, false);
    }
  }

  message recv(int peer, clock::time_point deadline, std::string_view doing) {
    auto& sh = reader_->map->header();
    waiting w;
    while (true) {
      flush();
      if (readable()) {
        message m = take();
        if (m.header.magic != frame_header::magic_value) throw ctl_->malformed(doing, peer, "a malformed frame in shared memory");
        if (m.header.kind == frame_kind::leave) throw ctl_->left_ring(doing, peer);
        return m;
      }
      if (clock::now() >= deadline) throw ctl_->silent(doing, peer, true);
      wait_round(w, sh.head, sh.reader_sleeps, reader_->next, doing, true);
    }
  }


  struct reader_state {
    std::optional<shm_detail::mapping> map;
    std::uint32_t next = 0;       ///< the next slot to read
    std::uint32_t tail = 0;       ///< slots released, in order
    std::vector<std::uint8_t> released;
    void release(std::uint32_t index) {
      auto& h = map->header();
      released[index & (h.slots - 1)] = 1;
      bool moved = false;
      while (tail != next && released[tail & (h.slots - 1)]) {
        released[tail & (h.slots - 1)] = 0;
        ++tail;
        moved = true;
      }
      if (!moved) return;
      h.tail.store(tail, std::memory_order_seq_cst);
      if (h.writer_sleeps.load(std::memory_order_seq_cst)) shm_detail::futex_wake(h.tail);
    }
  };
  struct pending_send {
    std::uint64_t ticket;
    frame_header header;
    std::span<const std::byte> payload;
    std::vector<std::byte> copy;  ///< the payload, set aside (wait_sent): the caller's bytes are free
  };

  /// ---- the hand-over ----
  static int accept_one(int listener, clock::time_point deadline, const std::string& doing) {
    while (true) {
      const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) return fd;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) throw comm_error(doing + ": " + net::errno_message(errno));
      net::wait_fd(listener, POLLIN, deadline, doing);
    }
  }
  static void send_all(int fd, const void* data, std::size_t n, clock::time_point deadline, const std::string& doing) {
    const auto* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
      } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
        net::wait_fd(fd, POLLOUT, deadline, doing);
      } else {
        throw comm_error(doing + ": " + net::errno_message(errno));
      }
    }
  }
  static void recv_all(int fd, void* data, std::size_t n, clock::time_point deadline, const std::string& doing) {
    auto* p = static_cast<char*>(data);
    while (n > 0) {
      const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
      if (k > 0) {
        p += k;
        n -= static_cast<std::size_t>(k);
      } else if (k == 0) {
        throw comm_error(doing + ": the peer closed the connection");
      } else if (errno == EAGAIN || errno == EINTR) {
        net::wait_fd(fd, POLLIN, deadline, doing);
      } else {
        throw comm_error(doing + ": " + net::errno_message(errno));
      }
    }
  }
  static void send_fd(int sock, int fd, const shm_detail::hello& h, clock::time_point deadline, const std::string& doing) {
    net::wait_fd(sock, POLLOUT, deadline, doing);
    if (net::send_with_fd(sock, &h, sizeof h, fd, 0) != static_cast<ssize_t>(sizeof h)) throw comm_error(doing + ": " + net::errno_message(errno));
  }
  static int recv_fd(int sock, shm_detail::hello& h, clock::time_point deadline, const std::string& doing) {
    net::wait_fd(sock, POLLIN, deadline, doing);
    net::unique_fd fd;
    const ssize_t k = net::recv_with_fd(sock, &h, sizeof h, MSG_WAITALL, fd);
    if (k != static_cast<ssize_t>(sizeof h) || fd.fd < 0)
      throw comm_error(doing + ": " + (k == 0 ? std::string("the peer closed the connection") : net::errno_message(errno)));
    return std::exchange(fd.fd, -1);
  }

  /// ---- writing ----
  bool try_put(const frame_header& h, std::span<const std::byte> payload) {
    auto& sh = writer_->header();
    const std::uint32_t head = sh.head.load(std::memory_order_relaxed);
    if (head - sh.tail.load(std::memory_order_acquire) >= sh.slots) return false;
    std::byte* slot = writer_->slot(head);
    std::memcpy(slot, &h, sizeof h);
    if (!payload.empty()) std::memcpy(slot + shm_detail::header_room, payload.data(), payload.size());
    sh.head.store(head + 1, std::memory_order_seq_cst);
    if (sh.reader_sleeps.load(std::memory_order_seq_cst)) shm_detail::futex_wake(sh.head);
    return true;
  }
  /// Moves kept sends into the segment while it has room; whether any moved.
  bool flush() {
    bool moved = false;
    while (!pending_.empty()) {
      auto& p = pending_.front();
      if (!try_put(p.header, p.copy.empty() ? p.payload : std::span<const std::byte>(p.copy))) break;
      pending_.pop_front();
      moved = true;
    }
    return moved;
  }
  std::uint64_t send(const frame_header& h, std::span<const std::byte> payload) {
    if (payload.size() > writer_->header().slot_bytes)
      throw error("gradus: ring_allreduce: a " + std::to_string(payload.size()) + "-byte segment exceeds the shared slot of " +
                  std::to_string(writer_->header().slot_bytes) + " bytes");
    const std::uint64_t ticket = next_ticket_++;
    if (!pending_.empty()) flush();
    if (pending_.empty() && try_put(h, payload)) return ticket;
    pending_.push_back({ticket, h, payload, {}});
    return ticket;
  }
  /// Whether the caller's bytes of every send up to `ticket` are free: in the segment, or set aside.
  bool released_through(std::uint64_t ticket) const {
    for (const auto& p : pending_) {
      if (p.ticket > ticket) break;
      if (p.copy.empty() && !p.payload.empty()) return false;
    }
    return true;
  }
  bool sent(std::uint64_t ticket) {
    flush();
    return released_through(ticket);
  }

  /// ---- reading ----
  bool readable() const { return reader_->map->header().head.load(std::memory_order_acquire) != reader_->next; }
  message take() {
    auto& st = *reader_;
    const std::byte* slot = st.map->slot(st.next);
    message m;
    std::memcpy(&m.header, slot, sizeof m.header);
    const std::uint32_t index = st.next++;
    const bool sane = m.header.magic == frame_header::magic_value && m.header.bytes <= st.map->header().slot_bytes;
    m.payload = std::span<const std::byte>(slot + shm_detail::header_room, sane ? m.header.bytes : 0);
    m.storage = std::shared_ptr<void>(static_cast<void*>(&st), [keep = reader_, index](void*) { keep->release(index); });
    if (!sane) m.header.magic = 0;
    return m;
  }

  /// How long a wait has gone on.
  struct waiting {
    clock::time_point start = clock::now();
  };
  /// One round of waiting: spin for the first microseconds, then yield the core (to a rank or
  /// thread that shares it) up to spin_for, then sleep on `word`, briefly while sends are
  /// kept (their space frees without waking this rank); asking the control plane at most
  /// every millisecond (one ask is several ZeroMQ calls, tens of microseconds here: asked
  /// in every short wait, it set the latency of small collectives). Sleeping costs a wake-up (tens to hundreds of
  /// microseconds on a virtual machine), which OpenMPI's vader avoids by never sleeping; the
  /// yield keeps most of that latency without burning a core that another process needs.
  void wait_round(waiting& w, std::atomic<std::uint32_t>& word, std::atomic<std::uint32_t>& sleeps, std::uint32_t seen,
                  std::string_view doing, bool left_idle) {
    const auto now = clock::now();
    if (!crowded_ && now - w.start < std::chrono::microseconds(20)) {
      for (int i = 0; i < 16; ++i) shm_detail::cpu_relax();
      return;
    }
    if (now - asked_ >= std::chrono::milliseconds(1)) {
      ctl_->poll(doing, left_idle, !pending_.empty());
      asked_ = clock::now();
    }
    if (now - w.start < spin_for) {
      std::this_thread::yield();
      return;
    }
    sleeps.store(1, std::memory_order_seq_cst);
    if (word.load(std::memory_order_seq_cst) == seen)
      shm_detail::futex_wait(word, seen, pending_.empty() ? std::chrono::microseconds(1000) : std::chrono::microseconds(50));
    sleeps.store(0, std::memory_order_relaxed);
  }
  static constexpr auto spin_for = std::chrono::milliseconds(2);

  control* ctl_;
  int rank_;
  bool crowded_;  ///< more ranks on this machine than cores: yield at once, never spin
  std::shared_ptr<reader_state> reader_;
  std::optional<shm_detail::mapping> writer_;
  std::deque<pending_send> pending_;
  std::uint64_t next_ticket_ = 0;
  clock::time_point asked_{};  ///< when a wait last asked the control plane
  std::optional<path_pair<shm_path>> left_, right_;
};

}  // namespace gradus::ring
