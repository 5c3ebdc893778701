#pragma once
// The parameter server's wire format. Every message is a ZeroMQ multi-part message:
//
//   [routing id]  (added by ROUTER on the server side; not part of the format)
//   header        exactly 64 bytes, little-endian, the struct below
//   payload       0 or 1 frame of header.payload_bytes bytes
//
// The header is fixed and versioned; decode() validates every field against the frames
// actually received and against the receiver's limits before anything is used, so a
// malformed, truncated or oversized message is reported (and dropped by the server) and
// never read out of bounds. The fuzz target tests/fuzz/fuzz_ps_wire.cpp feeds decode()
// arbitrary bytes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "gradus/core/dtype.hpp"
#include "gradus/parallel/elements.hpp"

namespace gradus::ps::wire {

inline constexpr std::uint32_t magic = 0x53505247u;  ///< "GRPS"
/// The header format's version: decode refuses a peer of another (2: header::dtype is an
/// element_type).
inline constexpr std::uint16_t version = 2;

enum class type : std::uint8_t {
  hello = 1,     ///< worker -> server: payload = JSON {rank, world_size, mode, staleness}
  init = 2,      ///< worker -> server: declare a shard (key, offset, count; scalar = the variable's elements); payload =
                 /// u32 name length, name, then (the chief) the values, optionally followed by the optimizer's
                 /// state tensors (then clock = the optimizer steps already applied: a resumed checkpoint)
  push = 3,      ///< worker -> server: a gradient range at `clock`, scaled by the server's rule; payload = values
  pull = 4,      ///< worker -> server: a value range, wanted at `clock`; no payload
  clock = 5,     ///< worker -> server: the worker finished step `clock` - 1 (its clock is now `clock`)
  coll = 6,      ///< worker -> server 0: a contribution to collective `clock` (op in `key`, root in `offset`)
  bye = 7,       ///< worker -> server: this worker is done (key: leaving_failed after a failure)
  shutdown = 8,  ///< chief -> server: the job is done, stop serving (key: leaving_failed likewise)
  reply = 9,     ///< server -> worker: answer to request `id` (values for a pull or a collective; empty ack otherwise)
  fail = 10,     ///< server -> worker: request `id` failed; payload = the error text
  snapshot = 11, ///< worker -> server: a whole shard's values and optimizer state (checkpoints); see server.hpp
  config = 12,   ///< worker -> server: payload = JSON {optimizer, settings}: the update rule, before the first init
  push_rows = 13,  ///< worker -> server: a sparse-row gradient for shard `key` (offset = elements per row, count = rows);
                   /// payload = count u64 row indices of the variable, then count rows of values
  pull_rows = 14,  ///< worker -> server: the rows of shard `key` changed since update stamp `count` (offset = elements
                   /// per row), at `clock`; the reply: count = rows, scalar = the shard's stamp now, payload as push_rows
  init_values = 15,  ///< chief -> server: a chunk of a declared shard's first values, elements [offset, offset + count)
                     /// of the variable, then the same range of each optimizer state tensor; clock = the start step
  join = 16,  ///< a restarted worker -> server: take me back. Server 0 answers at the workers' next join point
              // (clock = the step to start at, offset = the next collective number; key = job_over when the
              // job ended first); the others at once, reviving it at `clock`
};
inline constexpr std::uint8_t last_type = 16;

/// The element types a header's dtype names: f32 and f64 (values, gradients), bf16 and f16
/// (a push's float gradient in the precision policy's comm type: the server widens it to
/// float32), or none: no values, except that a collective's none is raw bytes
/// (parallel::element_of<std::byte>).
constexpr bool carried(element_type t) {
  return t == element_type::none || t == element_type::f32 || t == element_type::f64 || t == element_type::bf16 ||
         t == element_type::f16;
}
/// Whether t is a two-byte float type, which only a push carries.
constexpr bool half_width(element_type t) { return t == element_type::bf16 || t == element_type::f16; }
/// Bytes per element of a message of type t carrying dt: size_of(dt), and 1 for a
/// collective's raw bytes; 0 where the message carries no values.
constexpr std::size_t element_size(type t, element_type dt) {
  return t == type::coll ? parallel::element_bytes(dt) : size_of(dt);
}
/// dt as errors name it: "float32", "float64", "bytes".
inline std::string dtype_name(element_type dt) { return std::string(parallel::element_name(dt)); }
inline const char* type_name(type t) {
  switch (t) {
    case type::hello: return "hello";
    case type::init: return "init";
    case type::push: return "push";
    case type::pull: return "pull";
    case type::clock: return "clock";
    case type::coll: return "collective";
    case type::bye: return "bye";
    case type::shutdown: return "shutdown";
    case type::reply: return "reply";
    case type::fail: return "fail";
    case type::snapshot: return "snapshot";
    case type::config: return "config";
    case type::push_rows: return "push_rows";
    case type::pull_rows: return "pull_rows";
    case type::init_values: return "init_values";
    case type::join: return "join";
  }
  return "unknown";
}

/// Collective operations (header.key of a coll message). join_point: a barrier at which the
/// restarted workers waiting to rejoin are taken back; its answer is one byte per rank, 1 for
/// each rank taken back there (count = the world size, dtype none: bytes).
enum class coll_op : std::uint32_t { sum = 1, average = 2, broadcast = 3, barrier = 4, join_point = 5 };
inline constexpr std::uint32_t last_coll_op = 5;
inline const char* coll_op_name(std::uint32_t op) {
  static const char* names[] = {"?", "allreduce_sum", "allreduce_average", "broadcast", "barrier", "join_point"};
  return op <= last_coll_op ? names[op] : "?";
}
/// The answer to a join that comes after the job ended (reply.key): nothing left to train.
inline constexpr std::uint32_t job_over = 1;
/// The answer to a hello (reply.key): this rank was lost and its restart must join (above)
/// before it trains.
inline constexpr std::uint32_t must_join = 1;

/// bye and shutdown: header::key says whether the worker leaves after a failure (an exception
/// unwinding its program, or its link to the servers broken), so that a server can end a
/// failed job with a failure of its own instead of exit status 0.
inline constexpr std::uint32_t leaving_ok = 0, leaving_failed = 1;

struct header {
  std::uint32_t magic = wire::magic;
  std::uint16_t version = wire::version;
  std::uint8_t type = 0;
  std::uint8_t dtype = 0;        ///< an element_type (carried)
  std::uint32_t key = 0;         ///< shard key (init/push/pull/snapshot), coll_op (coll)
  std::int32_t rank = -1;        ///< the sender's worker rank (checked against its connection)
  std::uint64_t offset = 0;      ///< first element of the range within the variable; coll: root
  std::uint64_t count = 0;       ///< elements in the range; init: also `total` below
  std::uint64_t payload_bytes = 0;
  std::uint64_t clock = 0;       ///< the worker's clock (push, pull, clock) or collective number
  std::uint64_t id = 0;          ///< request id, echoed in the reply
  double scalar = 0;             ///< push: learning rate; init: total elements of the variable; reply: the shard's clock
};
static_assert(sizeof(header) == 64 && std::is_trivially_copyable_v<header>);

/// What a receiver accepts.
struct limits {
  /// Bytes in one message's payload. Pushes, pulls, the chief's first values (init_values)
  /// and snapshots go in chunks (ps_options::chunk_bytes, 1 MiB, times 1 + the optimizer's
  /// state tensors); what is not chunked is a step's sparse rows for one shard (push_rows)
  /// and the changed rows a pull_rows answer carries (a whole shard after a restart).
  ///
  /// A server's bound (server_options::limits) is also what anyone who reaches its port can
  /// make it hold per connection: ZeroMQ keeps a frame until it is complete, so a stranger
  /// that sends most of one and waits holds that much until its connection closes (without
  /// CURVE, which refuses strangers before any frame). 64 MiB: 1.3 million rows of 12
  /// floats in one shard's push_rows. Workers read their servers' answers with 1 GiB
  /// (reply_max_payload: a whole embedding shard after a restart).
  std::size_t max_payload = std::size_t(64) << 20;
  std::uint64_t max_elements = std::uint64_t(1) << 40;
};
inline constexpr std::size_t reply_max_payload = std::size_t(1) << 30;

struct decoded {
  header h;
  std::span<const std::byte> payload;
};

/// Validates a received message given as its frames (after any routing id). Returns the
/// header and payload, or the reason it is malformed (error non-empty).
struct decode_result {
  std::optional<decoded> msg;
  std::string error;
};

inline decode_result decode(std::span<const std::span<const std::byte>> frames, const limits& lim = {}) {
  const auto bad = [](std::string why) { return decode_result{std::nullopt, "malformed message: " + std::move(why)}; };
  if (frames.empty()) return bad("no frames");
  if (frames.size() > 2) return bad(std::to_string(frames.size()) + " frames (at most 2: header, payload)");
  if (frames[0].size() != sizeof(header)) return bad("header of " + std::to_string(frames[0].size()) + " bytes (expected 64)");
  header h;
  std::memcpy(&h, frames[0].data(), sizeof h);
  if (h.magic != magic) return bad("bad magic");
  if (h.version != version)
    return bad("protocol version " + std::to_string(h.version) + " (this build speaks " + std::to_string(version) + ")");
  if (h.type == 0 || h.type > last_type) return bad("unknown message type " + std::to_string(h.type));
  if (!carried(static_cast<element_type>(h.dtype))) return bad("unknown dtype " + std::to_string(h.dtype));
  const std::size_t have = frames.size() == 2 ? frames[1].size() : 0;
  if (h.payload_bytes != have)
    return bad(std::string(type_name(static_cast<type>(h.type))) + " announces " + std::to_string(h.payload_bytes) +
               " payload bytes but carries " + std::to_string(have));
  if (have > lim.max_payload)
    return bad("payload of " + std::to_string(have) + " bytes exceeds the limit of " + std::to_string(lim.max_payload));
  // overflow-safe whatever the limits: offset + count and count * element size
  if (h.count > lim.max_elements) return bad("count " + std::to_string(h.count) + " exceeds the limit");
  if (h.offset > lim.max_elements || h.count > lim.max_elements - h.offset) return bad("range past the element limit");
  const auto t = static_cast<type>(h.type);
  const auto dt = static_cast<element_type>(h.dtype);
  if (half_width(dt) && t != type::push)
    return bad(std::string(type_name(t)) + " of " + dtype_name(dt) + " elements (only a push carries bfloat16 or float16)");
  const std::size_t elem = element_size(t, dt);
  // Messages whose payload is a value range must carry exactly count elements.
  if (t == type::push || (t == type::coll && static_cast<coll_op>(h.key) != coll_op::barrier)) {
    if (elem == 0) return bad(std::string(type_name(t)) + " without a dtype");
    if (h.count > std::numeric_limits<std::uint64_t>::max() / elem || h.count * elem != have)
      return bad(std::string(type_name(t)) + " of " + std::to_string(h.count) + " " + dtype_name(dt) + " elements carries " +
                 std::to_string(have) + " bytes");
  }
  // Row messages: each row is a u64 index and `offset` values.
  if (t == type::push_rows || t == type::pull_rows) {
    if (elem == 0) return bad(std::string(type_name(t)) + " without a dtype");
    if (h.offset == 0) return bad(std::string(type_name(t)) + " of rows of 0 elements");
  }
  if (t == type::push_rows) {
    const std::uint64_t per_row = 8 + h.offset * elem;  // offset <= max_elements (2^40): no overflow
    if (h.count > have / per_row || h.count * per_row != have)
      return bad("push_rows of " + std::to_string(h.count) + " rows of " + std::to_string(h.offset) + " " + dtype_name(dt) + " carries " +
                 std::to_string(have) + " bytes");
  }
  if (t == type::init_values && (elem == 0 || h.count == 0 || have == 0 || have % (h.count * elem) != 0))  // count <= 2^40: no overflow
    return bad("init_values of " + std::to_string(h.count) + " " + dtype_name(dt) + " elements carries " + std::to_string(have) + " bytes");
  if (t == type::coll && (h.key < 1 || h.key > last_coll_op)) return bad("unknown collective " + std::to_string(h.key));
  if ((t == type::pull || t == type::push || t == type::init) && h.count == 0 && t != type::init)
    return bad(std::string(type_name(t)) + " of an empty range");
  return {decoded{h, frames.size() == 2 ? frames[1] : std::span<const std::byte>{}}, {}};
}

inline header make(type t, std::uint32_t key = 0, std::uint64_t offset = 0, std::uint64_t count = 0,
                   element_type d = element_type::none) {
  header h;
  h.type = static_cast<std::uint8_t>(t);
  h.key = key;
  h.offset = offset;
  h.count = count;
  h.dtype = static_cast<std::uint8_t>(d);
  return h;
}

}  // namespace gradus::ps::wire
