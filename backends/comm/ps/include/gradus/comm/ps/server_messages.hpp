#pragma once
// A parameter server's messages: server's member functions that take one message off the
// ROUTER socket (a malformed one counted and dropped, logged at powers of two), check who
// sent it (the rank its connection said hello as; with CURVE, the rank its key may act
// as), hand it to its handler, and answer it: an error thrown by a handler goes back to
// the sender as a `fail` carrying its text. find() is the shard a message names, checked
// against the range this server holds. Included at the end of server.hpp; not a header to
// include alone.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/comm/net/curve.hpp"
#include "gradus/comm/ps/server.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ps {

/// One message from the socket; false when none is waiting.
template <class Compute>
bool server<Compute>::receive_one() {
  std::vector<zmq::message_t> parts;
  zmq::message_t m;
  if (!sock_.recv(m, zmq::recv_flags::dontwait)) return false;
  parts.push_back(std::move(m));
  while (parts.back().more() && parts.size() < 8) {
    zmq::message_t p;
    (void)sock_.recv(p, zmq::recv_flags::none);
    parts.push_back(std::move(p));
  }
  while (parts.back().more()) {  // drain what is left of an over-long message
    zmq::message_t p;
    (void)sock_.recv(p, zmq::recv_flags::none);
    parts.back() = std::move(p);
    ++stats_.malformed;
  }
  ++stats_.messages;
  const std::string id = parts[0].to_string();
  std::vector<std::span<const std::byte>> frames;
  for (std::size_t i = 1; i < parts.size(); ++i)
    frames.emplace_back(static_cast<const std::byte*>(parts[i].data()), parts[i].size());
  auto d = wire::decode(frames, o_.limits);
  if (!d.msg) {
    ++stats_.malformed;
    note_malformed(d.error);
    return true;
  }
  last_fd_ = parts[1].get(ZMQ_SRCFD);
  last_auth_ = rank_from_user_id(parts[1]);
  try {
    const char* addr = nullptr;
    try {
      addr = parts[1].gets("Peer-Address");
    } catch (const zmq::error_t&) {
    }
    last_peer_ = addr ? addr : "";
    handle(id, d.msg->h, d.msg->payload);
  } catch (const std::exception& e) {
    ++stats_.rejected;
    send(id, fail_header(d.msg->h), std::string_view(e.what()));
  }
  return true;
}

template <class Compute>
void server<Compute>::note_malformed(const std::string& why) {
  const std::uint64_t n = stats_.malformed.load();
  if (n <= 3 || (n & (n - 1)) == 0) o_.log(prefix() + why + " (dropped; " + std::to_string(n) + " so far)");
}

template <class Compute>
wire::header server<Compute>::reply_header(const wire::header& req) {
  auto h = wire::make(wire::type::reply, req.key, req.offset, 0, element_type::none);
  h.id = req.id;
  h.clock = req.clock;
  h.rank = req.rank;
  return h;
}

template <class Compute>
wire::header server<Compute>::fail_header(const wire::header& req) {
  auto h = reply_header(req);
  h.type = static_cast<std::uint8_t>(wire::type::fail);
  return h;
}

template <class Compute>
void server<Compute>::send(const std::string& id, wire::header h, std::string_view text) {
  send(id, h, std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

template <class Compute>
void server<Compute>::send(const std::string& id, wire::header h, std::span<const std::byte> payload) {
  h.payload_bytes = payload.size();
  try {
    sock_.send(zmq::buffer(id), zmq::send_flags::sndmore);
    if (payload.empty()) {
      sock_.send(zmq::buffer(&h, sizeof h), zmq::send_flags::none);
    } else {
      sock_.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore);
      sock_.send(zmq::buffer(payload.data(), payload.size()), zmq::send_flags::none);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() != EHOSTUNREACH) throw;
    // the worker is gone (router_mandatory): nothing to answer
  }
}

/// The rank a message may speak for: the one its connection said hello as.
template <class Compute>
int server<Compute>::sender(const std::string& id, const wire::header& h) {
  if (o_.curve && !may_act_as(last_auth_, h.rank)) throw error(prefix() + rank_claim_refusal(last_auth_, h.rank, last_peer_));
  for (std::size_t r = 0; r < workers_.size(); ++r)
    if (workers_[r].joined && workers_[r].id == id) {
      if (h.rank != static_cast<int>(r))
        throw error(prefix() + "a message claims to come from worker " + std::to_string(h.rank) + " on the connection of worker " + std::to_string(r));
      return static_cast<int>(r);
    }
  throw error(prefix() + std::string(wire::type_name(static_cast<wire::type>(h.type))) + " from a connection that has not said hello");
}

template <class Compute>
void server<Compute>::handle(const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
  const auto t = static_cast<wire::type>(h.type);
  if (!job_failed_.empty() && t != wire::type::bye && t != wire::type::shutdown) throw error(job_failed_);
  switch (t) {
    case wire::type::hello: return hello(id, h, payload);
    case wire::type::config: return config(sender(id, h), id, h, payload);
    case wire::type::init: return init(sender(id, h), id, h, payload);
    case wire::type::push: return push(sender(id, h), id, h, payload);
    case wire::type::push_rows: return push_rows(sender(id, h), id, h, payload);
    case wire::type::pull_rows:
    case wire::type::pull: return pull(sender(id, h), id, h);
    case wire::type::snapshot: return snapshot(sender(id, h), id, h);
    case wire::type::init_values: return init_values(sender(id, h), id, h, payload);
    case wire::type::clock: return clock(sender(id, h), h);
    case wire::type::coll: return coll(sender(id, h), id, h, payload);
    case wire::type::join: return join(sender(id, h), id, h);
    case wire::type::bye: {
      const int r = sender(id, h);
      auto& w = workers_[static_cast<std::size_t>(r)];
      // a restart that leaves before it was taken back (the job ended first) failed nothing
      const bool was_back = !w.reviving;
      w.left = true;
      w.reviving = false;
      if (h.key == wire::leaving_failed && failed_leaving_.empty() && was_back)
        failed_leaving_ = prefix() + "worker " + std::to_string(r) + " left after a failure (its own error is in its log): the job failed";
      send(id, reply_header(h), std::span<const std::byte>{});
      after_a_worker_left();
      serve_parked();
      return;
    }
    case wire::type::shutdown: {
      // The chief ends the job: it leaves, and the server stops once the others have
      // said goodbye too (their last pulls are answered), or after a grace period.
      const int r = sender(id, h);
      if (r != 0) throw error(prefix() + "shutdown from worker " + std::to_string(r) + " (only the chief, worker 0, ends the job)");
      const bool was_back = !workers_[0].reviving;
      workers_[0].left = true;
      workers_[0].reviving = false;
      if (h.key == wire::leaving_failed && failed_leaving_.empty() && was_back)
        failed_leaving_ = prefix() + "the chief (worker 0) ended the job after a failure (its own error is in its log): the job failed";
      send(id, reply_header(h), std::span<const std::byte>{});
      shutdown_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      end_waiting_joins({});  // restarts waiting to come back: the job is over
      after_a_worker_left();
      serve_parked();
      return;
    }
    default: throw error(prefix() + "unexpected " + wire::type_name(static_cast<wire::type>(h.type)) + " message");
  }
}

template <class Compute>
auto server<Compute>::find(const wire::header& h) -> shard_state& {
  const auto it = shards_.find(h.key);
  if (it == shards_.end()) throw error(prefix() + "no shard with key " + std::to_string(h.key) + " (init it first)");
  auto& s = it->second;
  const auto t = static_cast<wire::type>(h.type);
  if (t == wire::type::push_rows || t == wire::type::pull_rows) {
    // rows of `offset` elements: the shard must hold whole rows, always of that length
    if (s.row_len == 0) {
      if (s.offset % h.offset != 0 || s.count % h.offset != 0)
        throw error(prefix() + "'" + s.name + "' shard [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.count) +
                    ") does not hold whole rows of " + std::to_string(h.offset) + " elements (declare the variable's rows to the partitioner)");
      s.row_len = h.offset;
      if (s.updates > 0 && s.stamp == 0) s.stamp = 1;  // updated before the rows were known: every row counts as changed
      s.row_stamp.assign(s.count / s.row_len, s.stamp);
    } else if (h.offset != s.row_len) {
      throw error(prefix() + "'" + s.name + "' has rows of " + std::to_string(s.row_len) + " elements, not " + std::to_string(h.offset));
    }
    return s;
  }
  if (h.offset < s.offset || h.offset + h.count > s.offset + s.count)
    throw error(prefix() + "'" + s.name + "' elements [" + std::to_string(h.offset) + ", " + std::to_string(h.offset + h.count) +
                ") are not within this server's shard [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.count) + ")");
  return s;
}

}  // namespace gradus::ps
