#pragma once
// A message header and a small payload as one ZeroMQ frame. Two frames (header, then
// payload with ZMQ_SNDMORE before it) are not atomic against the peer's connection closing
// between the two sends: libzmq 4.3.4 then drops the second part and never frees the first,
// still unflushed in the pipe it terminated (LeakSanitizer saw the 64-byte header of a ring
// `leave`, sent as the neighbour exited). So whatever is copied anyway (a leave, an abort,
// a small chunk) goes as one frame; receivers tell the two shapes apart by ZMQ_RCVMORE.
// zmq_send of this buffer copies it inside libzmq, which ThreadSanitizer does not see
// (tests/sanitizers/tsan.supp), as with the header alone before.
#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace gradus::net {

/// The frame of header h and `payload`, in `out` (resized; a buffer the caller reuses keeps
/// its capacity, so a collective's sends allocate nothing once it has grown). Returns out's bytes.
template <class Header>
std::span<const std::byte> one_frame(const Header& h, std::span<const std::byte> payload, std::vector<std::byte>& out) {
  static_assert(std::is_trivially_copyable_v<Header>);
  out.resize(sizeof h + payload.size());
  std::memcpy(out.data(), &h, sizeof h);
  if (!payload.empty()) std::memcpy(out.data() + sizeof h, payload.data(), payload.size());
  return out;
}

}  // namespace gradus::net
