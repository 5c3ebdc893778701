#pragma once
// Connection events of one ZeroMQ socket (zmq_socket_monitor): how the communicators learn
// at once that a peer's connection closed (its process died, or its heartbeats stopped:
// ZMQ_EVENT_DISCONNECTED) or that a handshake failed (CURVE refused, another protocol),
// instead of at a deadline. The events arrive on a PAIR socket connected to an inproc://
// endpoint of a unique name; the owner polls `poll_item()` beside its own sockets and takes
// the events with `next()`.
//
// Order of teardown: `stop()` before the watched socket closes (the destructor stops too).
// libzmq 4.3 leaks every event it cannot deliver (socket_base_t::monitor_event does not
// close a message whose send failed), and closing a socket raises DISCONNECTED events: the
// reports stop first, then the reader closes, then the watched socket may.
#include <zmq.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "gradus/comm/net/address.hpp"

namespace gradus::net {

/// The connection events of one ZeroMQ socket (zmq_socket_monitor), read without waiting:
/// how a communicator learns at once that a peer's connection closed or that a handshake
/// failed. Poll poll_item() beside the owner's sockets, then take the events with next().
/// Call stop() (or destroy the monitor) before the watched socket closes. Move-only; not
/// thread-safe (the owner's thread uses it).
class socket_monitor {
 public:
  /// One connection event.
  struct event {
    std::uint16_t id = 0;     ///< which event: one ZMQ_EVENT_* bit
    std::uint32_t value = 0;  ///< the event's value: a file descriptor, an error number
  };

  /// No socket watched: converts to false, and next() returns nothing.
  socket_monitor() = default;
  /// Reports `events` (ZMQ_EVENT_* bits) of `watched`; made before `watched` binds or
  /// connects, so that no event is missed. `name` goes into the inproc:// endpoint's name.
  socket_monitor(zmq::context_t& ctx, zmq::socket_t& watched, int events, std::string_view name)
      : watched_(watched.handle()) {
    const std::string ep = "inproc://gradus-" + std::string(name) + "-monitor-" + unique_suffix();
    if (zmq_socket_monitor(watched_, ep.c_str(), events) != 0) throw zmq::error_t();
    reader_.emplace(ctx, zmq::socket_type::pair);
    reader_->set(zmq::sockopt::linger, 0);
    reader_->connect(ep);
  }
  /// Takes over `o`'s watch; `o` watches nothing afterwards.
  socket_monitor(socket_monitor&& o) noexcept : watched_(std::exchange(o.watched_, nullptr)), reader_(std::move(o.reader_)) {
    o.reader_.reset();
  }
  /// Stops this monitor's own watch, then takes over `o`'s; `o` watches nothing afterwards.
  socket_monitor& operator=(socket_monitor&& o) noexcept {
    if (this != &o) {
      stop();
      watched_ = std::exchange(o.watched_, nullptr);
      reader_ = std::move(o.reader_);
      o.reader_.reset();
    }
    return *this;
  }
  socket_monitor(const socket_monitor&) = delete;
  socket_monitor& operator=(const socket_monitor&) = delete;
  ~socket_monitor() { stop(); }

  /// Stops the reports, then closes the reader (see the top of this file).
  void stop() noexcept {
    if (watched_ && reader_) (void)zmq_socket_monitor(watched_, nullptr, 0);
    watched_ = nullptr;
    reader_.reset();
  }

  /// Whether it watches a socket (false when default-made, moved from or stopped).
  explicit operator bool() const { return reader_.has_value(); }
  /// A ZMQ_POLLIN item for zmq::poll: ready when an event waits for next(). Only while the
  /// monitor watches a socket (operator bool).
  zmq::pollitem_t poll_item() { return {reader_->handle(), 0, ZMQ_POLLIN, 0}; }

  /// The next event that has arrived, without waiting; nothing when none has.
  std::optional<event> next() {
    if (!reader_) return std::nullopt;
    zmq::message_t ev, addr;
    if (!reader_->recv(ev, zmq::recv_flags::dontwait)) return std::nullopt;
    if (ev.more()) (void)reader_->recv(addr, zmq::recv_flags::none);
    event e;
    if (ev.size() >= 2) std::memcpy(&e.id, ev.data(), 2);
    if (ev.size() >= 6) std::memcpy(&e.value, static_cast<const char*>(ev.data()) + 2, 4);
    return e;
  }

 private:
  void* watched_ = nullptr;
  std::optional<zmq::socket_t> reader_;
};

}  // namespace gradus::net
