#pragma once
// What the ring algorithm sees of the network: a `pair` is the connection to one peer
// rank (Gloo's pair/buffer split). Sends are posted without copying and completed later
// (`sent` / `wait_sent`); receives come back in the order the peer sent them. Every wait
// has a deadline, and every failure is a gradus::comm_error naming the peer's rank, its
// address and the collective being run. The ZeroMQ implementation is zmq_ring.hpp.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/elements.hpp"

namespace gradus::ring {

/// The clock of every deadline in gradus::ring.
using clock = std::chrono::steady_clock;

/// split: the ring's exchange of (color, key) for ring_allreduce::split; allgather: a
/// sub-group's (ring/sub_group.hpp), whose collectives carry these codes too.
enum class op_code : std::uint16_t { connect = 1, allreduce_sum, allreduce_average, broadcast, barrier, split, allgather };
/// How an all-reduce moves its data: the bandwidth-optimal ring (reduce-scatter, then
/// all-gather of chunks) or, for small buffers, an all-gather of whole buffers.
enum class algo_code : std::uint16_t { ring = 0, gather = 1 };
/// "the ring" or "an all-gather of whole buffers", as errors name an algo_code.
inline const char* algo_name(algo_code a) { return a == algo_code::gather ? "an all-gather of whole buffers" : "the ring"; }

/// "allreduce_sum", "broadcast", ...: an op_code as messages name it.
inline const char* op_name(op_code o) {
  switch (o) {
    case op_code::connect: return "connect";
    case op_code::allreduce_sum: return "allreduce_sum";
    case op_code::allreduce_average: return "allreduce_average";
    case op_code::broadcast: return "broadcast";
    case op_code::barrier: return "barrier";
    case op_code::split: return "split";
    case op_code::allgather: return "allgather";
  }
  return "unknown op";
}

/// What every rank must agree on before a collective runs. It travels in the header of
/// every message, so agreement costs no extra round trip: the first message of a
/// collective that a rank receives either matches its own fingerprint or stops it.
struct fingerprint {
  std::uint64_t seq = 0;    ///< the collective's number on this communicator (0: connect)
  std::uint64_t count = 0;  ///< elements
  op_code op = op_code::connect;            ///< which collective
  element_type dtype = element_type::none;  ///< the caller's (parallel::element_of: none for bytes, barrier, connect)
  std::int32_t root = 0;    ///< broadcast's root, 0 otherwise
  element_type wire = element_type::none;   ///< what the data travels as (f16: fp16 compression); none: as dtype
  algo_code algo = algo_code::ring;         ///< all-reduces: how (ring_options::small_bytes)
  /// Every field equal: the two ranks run the same collective the same way.
  friend bool operator==(const fingerprint&, const fingerprint&) = default;
};

/// "allreduce_sum #12 (float32, 1000 elements)", "broadcast #3 from rank 1 (float64, 10 elements)"
inline std::string to_string(const fingerprint& f) {
  std::string s = std::string(op_name(f.op)) + " #" + std::to_string(f.seq);
  if (f.op == op_code::broadcast) s += " from rank " + std::to_string(f.root);
  if (f.op != op_code::connect && f.op != op_code::barrier)  // the collectives that carry data
    s += " (" + std::string(parallel::element_name(f.dtype)) +
         (f.wire != element_type::none ? " as " + std::string(parallel::element_name(f.wire)) + " on the wire" : "") +
         ", " + std::to_string(f.count) + " elements)";
  return s;
}

/// What a ring frame carries.
enum class frame_kind : std::uint16_t {
  data = 1,   ///< one segment of a collective
  abort = 2,  ///< a rank failed; the payload is its error message. Forwarded along the ring.
  leave = 3,  ///< the sender's communicator was destroyed; sent after its last data
};

/// The first frame of every message; the payload (a segment, or an abort's text) follows.
struct frame_header {
  static constexpr std::uint32_t magic_value = 0x67726e67;  ///< "grng"
  std::uint32_t magic = magic_value;  ///< magic_value; a frame without it is refused as malformed (gradus::comm_error)
  frame_kind kind = frame_kind::data;  ///< data, abort or leave
  std::uint16_t version = 2;           ///< the frame format's version; not checked on receipt (the rendezvous refuses another protocol first)
  std::int32_t from = -1;    ///< the sending rank; for abort, the rank where the failure began
  std::uint32_t step = 0;    ///< ring step within the collective
  std::uint64_t segment = 0; ///< segment within the step
  std::uint64_t bytes = 0;   ///< payload bytes
  fingerprint fp;            ///< the collective it belongs to: the receiver checks it against its own
};
static_assert(std::is_trivially_copyable_v<frame_header>);

/// A received message. `payload` stays valid while `storage` lives; dropping the message
/// lets a zero-copy sender reuse its bytes.
struct message {
  frame_header header;                 ///< as the peer sent it
  std::span<const std::byte> payload;  ///< header.bytes bytes, inside `storage`
  std::shared_ptr<void> storage;       ///< owns the payload's memory (a ZeroMQ message, a buffer, a shared-memory slot)
};

/// The connection to one peer rank on the ring.
class pair {
 public:
  virtual ~pair() = default;
  /// The peer's rank.
  virtual int peer() const = 0;
  /// The peer's address as errors name it (its data address: shm://, tcp://, ipc://...).
  virtual const std::string& address() const = 0;

  /// Posts header + payload to the peer without copying the payload and returns a ticket;
  /// the payload's bytes must stay unchanged until sent(ticket). A transport whose
  /// collective fails lets go of every posted payload before the error reaches the caller,
  /// who may free its buffer at once.
  virtual std::uint64_t send(const frame_header& h, std::span<const std::byte> payload) = 0;
  /// Whether the send of `ticket` (and every earlier one) has released its bytes; never waits.
  virtual bool sent(std::uint64_t ticket) = 0;
  /// Waits until every send up to and including `ticket` has released its bytes.
  virtual void wait_sent(std::uint64_t ticket, clock::time_point deadline, std::string_view doing) = 0;
  /// The next data message from the peer. Throws comm_error when it does not come before
  /// the deadline, when the connection to any ring neighbour is lost, or on an abort.
  virtual message recv(clock::time_point deadline, std::string_view doing) = 0;
};

/// The pair of a data path whose two pairs share its state: every call goes to the path,
/// with the peer (Path::send / sent / wait_sent / recv).
template <class Path>
class path_pair final : public pair {
 public:
  /// The pair to rank `peer` of `path`, which must outlive it; `address` names the peer in errors.
  path_pair(Path& path, int peer, std::string address) : path_(&path), peer_(peer), address_(std::move(address)) {}
  /// The peer's rank.
  int peer() const override { return peer_; }
  /// The peer's address, as given.
  const std::string& address() const override { return address_; }
  std::uint64_t send(const frame_header& h, std::span<const std::byte> payload) override { return path_->send(peer_, h, payload); }
  /// Path::sent for this peer.
  bool sent(std::uint64_t ticket) override { return path_->sent(peer_, ticket); }
  void wait_sent(std::uint64_t ticket, clock::time_point deadline, std::string_view doing) override {
    path_->wait_sent(peer_, ticket, deadline, doing);
  }
  message recv(clock::time_point deadline, std::string_view doing) override { return path_->recv(peer_, deadline, doing); }

 private:
  Path* path_;
  int peer_;
  std::string address_;
};

/// What a data path other than ZeroMQ sees of the ring: the control plane (zmq_ring).
class control {
 public:
  virtual ~control() = default;
  /// Takes ZeroMQ's control traffic and throws comm_error when the collective cannot go on:
  /// an abort along the ring, a lost neighbour (its connection closed, or heartbeats stopped).
  /// `left_idle`: nothing from the left neighbour waits in the data path (a lost left one
  /// matters only then); `right_busy`: sends to the right neighbour are still pending.
  virtual void poll(std::string_view doing, bool left_idle, bool right_busy) = 0;
  /// The error for a neighbour whose data connection broke: "gone" or "silent", by asking
  /// its address (and written to GRADUS_FAULT_FILE).
  virtual comm_error lost(std::string_view doing, int peer) = 0;
  /// The error for a neighbour that sent (`receiving`) or took nothing before the deadline.
  virtual comm_error silent(std::string_view doing, int peer, bool receiving) = 0;
  /// The error for a neighbour that sent `leave` (its communicator was destroyed).
  virtual comm_error left_ring(std::string_view doing, int peer) = 0;
  /// The error for bytes from a neighbour that are not a gradus frame.
  virtual comm_error malformed(std::string_view doing, int peer, std::string_view what) = 0;
};

/// A data path: the pairs to the two neighbours (with two ranks, both face the same peer).
class data_path {
 public:
  virtual ~data_path() = default;
  /// The pair to the left neighbour (rank - 1), which this rank receives from.
  virtual pair& left() = 0;
  /// The pair to the right neighbour (rank + 1), which this rank sends to.
  virtual pair& right() = 0;
  /// Sends `leave` after this rank's last data, in the data's own order; false when it could
  /// not within `wait` (the caller then sends it over ZeroMQ). Never throws.
  virtual bool leave(std::chrono::milliseconds wait) noexcept = 0;
  /// The collective failed: forget every posted send (the caller may free its buffers now).
  virtual void drop() noexcept = 0;
  /// The largest segment this path moves well (a ring chunk streams in pieces of it).
  virtual std::size_t segment_bytes(std::size_t asked) const { return asked; }
};

}  // namespace gradus::ring
