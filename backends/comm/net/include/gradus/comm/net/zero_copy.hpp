#pragma once
// Zero-copy sends over ZeroMQ, with ownership that is joint and never leaked. A payload of
// at least `zero_copy_from` bytes goes out from the caller's buffer (zmq_msg_init_data);
// ZeroMQ calls back from its I/O thread (or, for inproc://, the receiving thread) when it
// lets go of the bytes, and the caller's `send_flag` says so: until then the caller keeps
// the buffer alive. The flag is shared between the caller and the callback (the callback's
// hint holds one reference and frees it), so either may finish first. Smaller payloads
// are copied: cheaper than tracking when ZeroMQ lets go of them.
#include <zmq.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <span>

namespace gradus::net {

/// Completion of one zero-copy send: set when ZeroMQ lets go of the bytes.
struct send_flag {
  std::atomic<bool> done{false};  ///< true once ZeroMQ released the bytes (set with release order)
};

/// Payloads of this many bytes (64 KiB) and more go zero-copy; smaller ones are copied.
inline constexpr std::size_t zero_copy_from = std::size_t{64} << 10;

/// ZeroMQ's free callback: marks the send complete and drops the callback's reference.
inline void release_send(void*, void* hint) {
  auto* flag = static_cast<std::shared_ptr<send_flag>*>(hint);
  (*flag)->done.store(true, std::memory_order_release);
  delete flag;
}

/// The message that sends `payload`. With `flag_out` and a payload of zero_copy_from bytes or
/// more, the message refers to the caller's bytes and *flag_out is the flag that says when
/// ZeroMQ is done with them; otherwise the bytes are copied and *flag_out is left alone.
inline zmq::message_t payload_message(std::span<const std::byte> payload, std::shared_ptr<send_flag>* flag_out) {
  if (!flag_out || payload.size() < zero_copy_from) return zmq::message_t(payload.data(), payload.size());
  auto flag = std::make_shared<send_flag>();
  auto* hint = new std::shared_ptr<send_flag>(flag);
  try {
    zmq::message_t body(const_cast<std::byte*>(payload.data()), payload.size(), &release_send, hint);
    *flag_out = std::move(flag);
    return body;
  } catch (...) {
    delete hint;  // zmq_msg_init_data failed: the callback will never run
    throw;
  }
}

}  // namespace gradus::net
