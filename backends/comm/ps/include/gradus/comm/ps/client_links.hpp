#pragma once
// A parameter-server worker's links to its servers: parameter_server's member functions
// that connect (a DEALER per server with its socket monitor and heartbeats, the hello),
// send requests (chunks of 64 KiB and more zero-copy, net/zero_copy.hpp), take the
// answers and connection events as they arrive, wait for an answer with a deadline whose
// error names the server, and rejoin a server that came back after its connection closed
// (a restarted ps task: hello at this worker's clock, the optimizer, its shards, then every
// unanswered request again). The API those serve (push, pull, rows, snapshots,
// collectives) is ps.hpp's. About 520 lines, one concept: the link's life — connecting,
// sending, waiting and rejoining share the link state and the request table, and a
// restarted process's join (rejoin_job) is one more hello-like exchange on them.
// Included at the end of ps.hpp; not a header to include alone.
#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/comm/net/heartbeat.hpp"
#include "gradus/comm/net/socket_monitor.hpp"
#include "gradus/comm/net/zero_copy.hpp"
#include "gradus/comm/ps.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/fault_file.hpp"

namespace gradus {

template <class Mode>
inline void parameter_server<Mode>::connect() {
  if constexpr (std::is_same_v<Mode, ps_dynamic>) {
    mode_ = o_.consistency;
    staleness_ = mode_ == ps::mode::ssp ? o_.staleness : 0;
  } else {
    mode_ = Mode::mode;
    staleness_ = Mode::staleness;
  }
  if (o_.servers.empty())
    throw error("gradus: parameter_server: no ps tasks (gradus-run --ps M, GRADUS_PS=host:port,..., or TF_CONFIG cluster.ps)");
  if (o_.world_size < 1 || o_.rank < 0 || o_.rank >= o_.world_size)
    throw error("gradus: parameter_server: rank " + std::to_string(o_.rank) + " of a world of " + std::to_string(o_.world_size));
  if (o_.chunk_bytes < 64) throw error("gradus: parameter_server: chunk_bytes must be at least 64");
  if (o_.timeout.count() <= 0)  // every wait would fail at once
    throw error("gradus: parameter_server: timeout must be positive, got " + std::to_string(o_.timeout.count()) +
                " ms (ps_options::timeout; the examples' --comm-timeout)");
  if (o_.reconnect_timeout.count() < 0 || o_.rejoin_timeout.count() < 0)
    throw error("gradus: parameter_server: reconnect_timeout and rejoin_timeout must be >= 0, got " +
                std::to_string(o_.reconnect_timeout.count()) + " and " + std::to_string(o_.rejoin_timeout.count()) + " ms");
  if (mode_ == ps::mode::ssp && (staleness_ < 0 || staleness_ > ps::max_staleness))
    throw error("gradus: parameter_server: staleness " + std::to_string(staleness_) + " is outside [0, " +
                std::to_string(ps::max_staleness) + "]");
  if (!o_.context) {
    own_ctx_ = std::make_unique<zmq::context_t>(1);
    o_.context = own_ctx_.get();
  }
  for (std::size_t k = 0; k < o_.servers.size(); ++k) open_link(k);
  // Hello to every server, waited for: a worker that cannot reach its servers says so
  // here (ZeroMQ retries the connection, so servers may start after the workers).
  const auto answers = everyone(ps::wire::type::hello, hello_text(false), "hello");
  for (auto& l : links_) l.joined = true;
  // server 0 lost this rank (and runs the collectives): this restart must join before training
  must_join_ = o_.restarted && answers.front().key == ps::wire::must_join;
}

template <class Mode>
inline std::optional<std::int64_t> parameter_server<Mode>::rejoin_job() {
  if (!must_join_) throw error(prefix() + "rejoin_job: this worker is not a restart the servers wait to take back (restarted() is false)");
  if (flushed_) throw error(prefix() + "rejoin_job after the first push or pull");
  ps::wire::header answer;
  try {
    wait_id(request(0, ps::wire::make(ps::wire::type::join), {}, req_kind::ack), std::chrono::steady_clock::now() + o_.rejoin_timeout,
            "join", true, &answer);
  } catch (const comm_error& e) {
    if (std::string_view(e.what()).find("no answer from") == std::string_view::npos) throw;
    fail(prefix() + "restarted, it waited " + std::to_string(o_.rejoin_timeout.count()) + " ms at " + server_name(0) +
         " for the other workers' next join point (an epoch's end) and none came: are they training? (ps_options::rejoin_timeout)");
  }
  must_join_ = false;
  if (answer.key == ps::wire::job_over) return std::nullopt;
  clock_ = answer.clock;
  coll_seq_ = answer.offset;
  // the other servers take it back at that clock
  std::vector<std::uint64_t> ids;
  for (std::size_t k = 1; k < socks_.size(); ++k) {
    auto h = ps::wire::make(ps::wire::type::join);
    h.clock = clock_;
    ids.push_back(request(static_cast<int>(k), h, {}, req_kind::ack));
  }
  const auto until = std::chrono::steady_clock::now() + o_.timeout;
  for (const auto id : ids) wait_id(id, until, "join", true);
  stats_.rejoined_job = true;
  return static_cast<std::int64_t>(clock_);
}

template <class Mode>
inline std::string parameter_server<Mode>::hello_text(bool rejoin) const {
  nlohmann::json j;
  j["rank"] = o_.rank;
  j["world_size"] = o_.world_size;
  j["mode"] = ps::mode_name(mode_);
  j["staleness"] = staleness_;
  if (rejoin) {
    j["rejoin"] = true;
    j["clock"] = clock_;
  } else if (o_.restarted) {
    j["restart"] = true;  // in place of a worker the job lost (server_rejoin.hpp)
  }
  return j.dump();
}

/// A DEALER to server k, with a monitor that reports its connection's events.
template <class Mode>
inline void parameter_server<Mode>::open_link(std::size_t k) {
  zmq::socket_t d(*o_.context, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 200);
  d.set(zmq::sockopt::ipv6, 1);
  d.set(zmq::sockopt::sndhwm, 0);
  d.set(zmq::sockopt::rcvhwm, 0);
  // a server may pause for up to --comm-timeout - 2 s (the ring's rule), not half of it
  net::set_heartbeats(d, std::chrono::milliseconds(net::heartbeat_timeout_for(o_.timeout)));
  if (o_.curve) ps::make_curve_client(d, o_.curve->keys, o_.curve->server_key(k));
  // A server whose connection closes (its process died, or its heartbeats stopped) is
  // noticed by the waits at once, not at their deadline.
  net::socket_monitor m(*o_.context, d,
                        ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                            ZMQ_EVENT_HANDSHAKE_SUCCEEDED | (o_.curve ? ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL : 0),
                        "ps-client");
  // connected after the monitor is attached: a fast connection's CONNECTED is not missed
  // (the greeting check in rejoin() counts on it)
  const auto& s = o_.servers[k];
  const std::string ep = s.find("://") != std::string::npos ? s : "tcp://" + s;
  try {
    d.connect(ep);
  } catch (const zmq::error_t& e) {
    throw comm_error(prefix() + "cannot connect to " + server_name(static_cast<int>(k)) + ": " + e.what());
  }
  ++link_generation_;
  if (k == socks_.size()) {
    socks_.push_back(std::move(d));
    mons_.push_back(std::move(m));
    links_.push_back({});
  } else {  // a new connection in place of a lost one
    mons_[k].stop();  // before the socket it watches closes (net/socket_monitor.hpp)
    socks_[k].set(zmq::sockopt::linger, 0);  // what it still queues goes: it is resent below, on the new one
    socks_[k] = std::move(d);
    mons_[k] = std::move(m);
    links_[k] = {};
    links_[k].joined = true;
  }
}

/// Server k's connection closed: wait for the server to come back (restarted), rejoin it
/// on a new connection (hello at this worker's clock, the optimizer, the shards it holds:
/// it reloads them from the checkpoint), then resend every request it left unanswered,
/// with its id. Throws when it is not back within reconnect_timeout.
template <class Mode>
inline void parameter_server<Mode>::rejoin(std::size_t k, const char* during) {
  const auto since = links_[k].down_since;
  // kind: what the launcher is told (core/fault_file.hpp): "gone" (it died), "silent" (it
  // answers nothing), "job" (it is back but cannot serve this job: the job must restart)
  const auto gone = [&](const std::string& why, std::string_view kind) {
    links_[k].lost = true;  // the goodbye does not wait for it
    const std::string text = prefix() + server_name(static_cast<int>(k)) + " is gone: its connection closed" +
                             (during ? std::string(" during ") + during : std::string()) + " and " + why;
    const std::string me = "rank " + std::to_string(o_.rank);
    if (kind == "job") gradus::detail::record_job_failure(me, text);
    else gradus::detail::record_blame(me, "ps " + std::to_string(k), kind, text);
    fail(text);
  };
  if (o_.reconnect_timeout.count() <= 0 || closing_) {
    if (std::chrono::steady_clock::now() - since > std::chrono::seconds(1))
      gone("did not come back within 1 s (the ps process died or was stopped)", "gone");
    return;
  }
  std::vector<std::uint64_t> resend;
  for (const auto& [id, r] : reqs_)
    if (r.server == static_cast<int>(k) && !r.answered) resend.push_back(id);
  if (std::getenv("GRADUS_PS_DEBUG"))
    std::fprintf(stderr, "%srejoining server %zu at clock %llu during %s, down %.3f s, %zu to resend, gen %llu\n", prefix().c_str(), k,
                 static_cast<unsigned long long>(clock_), during ? during : "?",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count(), resend.size(),
                 static_cast<unsigned long long>(link_generation_));
  rejoining_ = true;
  struct reset {
    bool& b;
    ~reset() { b = false; }
  } reset_flag{rejoining_};
  open_link(k);
  const auto until = since + o_.reconnect_timeout;
  const auto text = hello_text(true);
  const auto answer = [&](std::uint64_t id, const char* what) {
    try {
      wait_id(id, until, what, true);
    } catch (const comm_error& e) {
      if (std::string_view(e.what()).find("no answer from") != std::string_view::npos)
        gone("did not come back within " + std::to_string(o_.reconnect_timeout.count()) + " ms " +
             (links_[k].retried || links_[k].connected_at
                  ? std::string("(its port refuses connections: the ps process died; restart it with gradus-run --max-restarts, it reloads the last checkpoint)")
                  : std::string("(nothing answers at its address: its host or the network is down)")),
             links_[k].retried || links_[k].connected_at ? "gone" : "silent");
      throw;
    } catch (const std::exception& e) {
      gone(std::string("refused this worker's rejoining: ") + e.what(), "job");
    }
  };
  // The hello, on a connection that may itself fail before the server answers (a dying
  // server's listener still completes a connect, then resets it): a connection lost before
  // the answer is replaced and the hello sent again; once answered, the server knows this
  // connection, and what closed before the answer was an earlier attempt.
  const auto hello = [&] {
    return request(static_cast<int>(k), ps::wire::make(ps::wire::type::hello), std::as_bytes(std::span<const char>(text.data(), text.size())),
                   req_kind::ack, /*copy=*/true);
  };
  auto hid = hello();
  for (int attempt = 0;; ++attempt) {  // bounded by `until`
    const auto it = reqs_.find(hid);
    if (it != reqs_.end() && it->second.answered) break;
    if (std::chrono::steady_clock::now() > until || it == reqs_.end()) break;  // answer() below reports it
    pump(50);
    if (!links_[k].refused.empty()) break;  // answer() reports the refusal
    // A restarted server's I/O thread greets a connection at once, even while its main
    // thread loads the checkpoint; a stopped or hung process's kernel accepts the
    // connection and nothing greets it. Its heartbeats had stopped already: say so now,
    // not at reconnect_timeout.
    if (const auto c = links_[k].connected_at; c && !links_[k].greeted && std::chrono::steady_clock::now() - *c > std::chrono::seconds(1))
      gone("a new connection was accepted but not greeted within 1 s: the ps process is stopped "
           "(SIGSTOP, a debugger) or hung; resume it, or end it and restart it (gradus-run --max-restarts reloads the last checkpoint)",
           "silent");
    const auto again = reqs_.find(hid);
    if (again != reqs_.end() && !again->second.answered && links_[k].lost) {
      reqs_.erase(again);
      open_link(k);
      hid = hello();
    }
  }
  answer(hid, "rejoin");
  links_[k].lost = false;
  links_[k].up = true;
  if (flushed_) {
    answer(request(static_cast<int>(k), ps::wire::make(ps::wire::type::config), std::as_bytes(std::span<const char>(config_text_.data(), config_text_.size())),
                   req_kind::ack, /*copy=*/true),
           "config");
    std::vector<std::uint64_t> ids;
    for (std::size_t s = 0; s < shards_.size(); ++s)
      if (shards_[s].server == static_cast<int>(k)) ids.push_back(request(shards_[s].server, init_header(s), init_payload(s), req_kind::ack, /*copy=*/true));
    for (const auto id : ids) answer(id, "init");
    for (std::size_t s = 0; s < shards_.size(); ++s)  // its rows all changed (the checkpoint's): pull_rows moves them all
      if (shards_[s].server == static_cast<int>(k)) since_[s] = 0;
  }
  for (const auto id : resend) {
    const auto it = reqs_.find(id);
    if (it == reqs_.end() || it->second.answered) continue;
    auto& r = it->second;
    send(r.server, r.sent, r.body.empty() ? r.payload : std::span<const std::byte>(r.body), r.body.empty() && !r.payload.empty() ? &r.flag : nullptr);
  }
  ++stats_.rejoins;
}

/// One message to every server, and their answers.
template <class Mode>
inline std::vector<ps::wire::header> parameter_server<Mode>::everyone(ps::wire::type t, const std::string& text, const char* what) {
  std::vector<std::uint64_t> ids;
  for (std::size_t k = 0; k < socks_.size(); ++k)
    ids.push_back(request(static_cast<int>(k), ps::wire::make(t), std::as_bytes(std::span<const char>(text.data(), text.size())),
                          req_kind::ack, /*copy=*/true));
  const auto until = std::chrono::steady_clock::now() + o_.timeout;
  std::vector<ps::wire::header> answers(ids.size());
  for (std::size_t k = 0; k < ids.size(); ++k) wait_id(ids[k], until, what, true, &answers[k]);
  return answers;
}

/// Posts a request and returns its id.
template <class Mode>
inline std::uint64_t parameter_server<Mode>::request(int server, ps::wire::header h, std::span<const std::byte> payload, req_kind kind, bool copy) {
  if (broken_) throw comm_error(prefix() + "the communicator failed earlier: " + broken_text_);
  if (payload.size() > o_.max_payload)
    throw error(prefix() + "a " + ps::wire::type_name(static_cast<ps::wire::type>(h.type)) + " of '" + key_name(h.key) + "' to " +
                server_name(server) + " carries " + std::to_string(payload.size()) + " bytes, over the servers' limit of " +
                std::to_string(o_.max_payload) + " per message (server_options::limits.max_payload and ps_options::max_payload" +
                (h.type == static_cast<std::uint8_t>(ps::wire::type::push_rows) ? ": a step's rows of one shard go as one message)"
                                                                                  : "; lower ps_options::chunk_bytes)"));
  h.id = next_id_++;
  h.rank = o_.rank;
  req r;
  r.server = server;
  r.kind = kind;
  r.type = static_cast<ps::wire::type>(h.type);
  r.key = h.key;
  r.clock = h.clock;
  r.sent = h;
  // what a rejoin resends: the caller's bytes (kept until the handle completes) or a copy
  if (copy) r.body.assign(payload.begin(), payload.end());
  else r.payload = payload;
  send(server, h, payload, copy ? nullptr : &r.flag);
  reqs_.emplace(h.id, std::move(r));
  return h.id;
}

template <class Mode>
inline void parameter_server<Mode>::send(int server, ps::wire::header h, std::span<const std::byte> payload, std::shared_ptr<net::send_flag>* flag) {
  h.rank = o_.rank;
  h.payload_bytes = payload.size();
  auto& s = socks_[static_cast<std::size_t>(server)];
  try {
    if (payload.empty()) {
      s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::none);
      return;
    }
    // large payloads zero-copy (net/zero_copy.hpp): the request keeps its flag, and so
    // does flags_ until ZeroMQ lets go of the bytes
    std::shared_ptr<net::send_flag> f;
    zmq::message_t body = net::payload_message(payload, flag ? &f : nullptr);
    if (f) {
      *flag = f;
      flags_.push_back(std::move(f));
    }
    s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore);
    s.send(body, zmq::send_flags::none);
  } catch (const zmq::error_t& e) {
    fail(prefix() + "cannot send " + ps::wire::type_name(static_cast<ps::wire::type>(h.type)) + " to " + server_name(server) + ": " + e.what());
  }
}

template <class Mode>
inline void parameter_server<Mode>::fail(const std::string& text) {
  broken_ = true;
  broken_text_ = text;
  throw comm_error(text);
}

template <class Mode>
inline void parameter_server<Mode>::prune_flags() {
  while (!flags_.empty() && flags_.front()->done.load(std::memory_order_acquire)) flags_.pop_front();
}

/// Reads every message waiting on any socket (up to wait_ms for the first).
template <class Mode>
inline void parameter_server<Mode>::pump(int wait_ms) {
  std::vector<zmq::pollitem_t> items;
  for (auto& s : socks_) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  for (auto& m : mons_) items.push_back(m.poll_item());
  zmq::poll(items.data(), items.size(), std::chrono::milliseconds(wait_ms));
  for (std::size_t k = 0; k < mons_.size(); ++k)
    if (items[socks_.size() + k].revents & ZMQ_POLLIN) link_events(k);
  for (std::size_t k = 0; k < socks_.size(); ++k) {
    if (!(items[k].revents & ZMQ_POLLIN)) continue;
    for (int budget = 0; budget < 1024; ++budget) {
      std::vector<zmq::message_t> parts;
      zmq::message_t m;
      if (!socks_[k].recv(m, zmq::recv_flags::dontwait)) break;
      parts.push_back(std::move(m));
      while (parts.back().more() && parts.size() < 4) {
        zmq::message_t p;
        (void)socks_[k].recv(p, zmq::recv_flags::none);
        parts.push_back(std::move(p));
      }
      on_message(static_cast<int>(k), parts);
    }
  }
}

template <class Mode>
inline void parameter_server<Mode>::on_message(int server, std::vector<zmq::message_t>& parts) {
  std::vector<std::span<const std::byte>> frames;
  frames.reserve(parts.size());
  for (auto& p : parts) frames.emplace_back(static_cast<const std::byte*>(p.data()), p.size());
  ps::wire::limits lim;  // the job's servers' answers: a whole shard's changed rows, a snapshot chunk with its state
  lim.max_payload = std::max<std::size_t>(ps::wire::reply_max_payload, 4 * o_.chunk_bytes);
  const auto d = ps::wire::decode(frames, lim);
  if (!d.msg) fail(prefix() + server_name(server) + " sent a " + d.error);
  const auto& h = d.msg->h;
  const auto it = reqs_.find(h.id);
  if (it == reqs_.end()) return;  // an answer to a request already failed or abandoned
  auto& r = it->second;
  r.answered = true;
  r.answer = h;
  if (static_cast<ps::wire::type>(h.type) == ps::wire::type::fail) {
    r.failure = std::string(reinterpret_cast<const char*>(d.msg->payload.data()), d.msg->payload.size());
    return;
  }
  if (r.kind == req_kind::snapshot) {
    const std::size_t part = r.dst.size(), want = part * (1 + r.extra.size());
    if (d.msg->payload.size() != want)
      fail(prefix() + server_name(server) + " answered a snapshot of '" + key_name(r.key) + "' with " +
           std::to_string(d.msg->payload.size()) + " bytes; expected " + std::to_string(want) + " (values and " +
           std::to_string(r.extra.size()) + " optimizer state tensors: do the workers and servers use the same optimizer?)");
    std::memcpy(r.dst.data(), d.msg->payload.data(), part);
    for (std::size_t k = 0; k < r.extra.size(); ++k) std::memcpy(r.extra[k].data(), d.msg->payload.data() + (k + 1) * part, part);
    last_updates_ = static_cast<std::int64_t>(h.scalar);
    return;
  }
  if (r.kind == req_kind::rows) {  // rows changed since the stamp: u64 indices, then the rows
    const std::size_t elem = size_of(static_cast<element_type>(h.dtype)), L = h.offset, n = h.count;
    const auto& sh = shards_[r.key];
    const auto& var = vars_[sh.var];
    if (elem != var.element_bytes || L != var.row_elements || d.msg->payload.size() != n * (8 + L * elem))
      fail(prefix() + server_name(server) + " answered pull_rows of '" + var.name + "' with " + std::to_string(n) + " rows of " +
           std::to_string(L) + " in " + std::to_string(d.msg->payload.size()) + " bytes");
    for (std::size_t j = 0; j < n; ++j) {
      std::uint64_t row = 0;
      std::memcpy(&row, d.msg->payload.data() + 8 * j, 8);
      if (row * L < sh.offset || row * L + L > sh.offset + sh.count)
        fail(prefix() + server_name(server) + " answered pull_rows of '" + var.name + "' with row " + std::to_string(row) + ", not in its shard");
      std::memcpy(r.dst.data() + row * L * elem, d.msg->payload.data() + 8 * n + j * L * elem, L * elem);
    }
    since_[r.key] = static_cast<std::uint64_t>(h.scalar);
    stats_.bytes_pulled += d.msg->payload.size();
    return;
  }
  if (r.kind == req_kind::pull || r.kind == req_kind::coll) {
    if (d.msg->payload.size() != r.dst.size())
      fail(prefix() + server_name(server) + " answered a " + ps::wire::type_name(r.type) + " of " + std::to_string(r.dst.size()) +
           " bytes with " + std::to_string(d.msg->payload.size()));
    if (!r.dst.empty()) std::memcpy(r.dst.data(), d.msg->payload.data(), r.dst.size());
    if (r.kind == req_kind::pull && r.clock > 0) {
      const auto known = static_cast<std::uint64_t>(h.scalar);
      if (r.clock > known) stats_.max_staleness = std::max(stats_.max_staleness, r.clock - known);
    }
  }
}

template <class Mode>
inline void parameter_server<Mode>::link_events(std::size_t k) {
  for (int budget = 0; budget < 64; ++budget) {
    const auto ev = mons_[k].next();
    if (!ev) return;
    const std::uint16_t event = ev->id;
    const std::uint32_t value = ev->value;
    if (std::getenv("GRADUS_PS_DEBUG"))
      std::fprintf(stderr, "%sserver %zu link event %u value %u (up %d lost %d)\n", prefix().c_str(), k, unsigned(event), unsigned(value), int(links_[k].up), int(links_[k].lost));
    if (const auto why = ps::describe_handshake_failure(event, value, o_.servers[k])) {
      // refused (auth, protocol) is final; "closed during the handshake" once may be a dying server
      if (event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL || ++links_[k].failed_handshakes >= 3) links_[k].refused = *why;
    } else if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      links_[k].failed_handshakes = 0;
      links_[k].greeted = true;
    }
    if (event == ZMQ_EVENT_CONNECT_RETRIED) links_[k].retried = true;
    if (event == ZMQ_EVENT_CONNECTED) {
      links_[k].connected_at = std::chrono::steady_clock::now();
      links_[k].greeted = false;
    }
    if (event == ZMQ_EVENT_DISCONNECTED && links_[k].up) {
      // lost for good: ZeroMQ would reconnect this socket by itself, but to a restarted
      // server that knows nothing of it; rejoin() opens a new one
      links_[k].up = false;
      links_[k].lost = true;
      links_[k].down_since = std::chrono::steady_clock::now();
    } else if (event == ZMQ_EVENT_CONNECTED && !links_[k].lost) {
      links_[k].up = true;
    }
  }
}

/// Waits for request `id` (answered, and its zero-copy payload released).
template <class Mode>
inline void parameter_server<Mode>::wait_id(std::uint64_t id, std::chrono::steady_clock::time_point until, const char* what, bool throw_on_error,
                                            ps::wire::header* answer) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return;
  while (true) {
    auto& r = it->second;
    if (r.answered && (!r.flag || r.flag->done.load(std::memory_order_acquire))) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      const std::string text = prefix() + "no answer from " + server_name(r.server) + " to " + (what ? what : ps::wire::type_name(r.type)) +
                               (r.type == ps::wire::type::pull || r.type == ps::wire::type::push ? " of '" + key_name(r.key) + "'" : std::string()) +
                               " at clock " + std::to_string(r.clock) + " within " + std::to_string(o_.timeout.count()) +
                               " ms (is it running and reachable? in bsp/ssp a pull also waits for the slowest worker)";
      reqs_.erase(it);
      if (!throw_on_error) return;
      fail(text);
    }
    pump(static_cast<int>(std::min<long long>(left, r.answered ? 1 : 50)));
    it = reqs_.find(id);
    if (it == reqs_.end()) return;
    const auto& link = links_[static_cast<std::size_t>(it->second.server)];
    if (!link.refused.empty() && !it->second.answered) {
      const std::string text = prefix() + link.refused;
      reqs_.erase(it);
      if (!throw_on_error) return;
      fail(text);
    }
    if (!rejoining_) {
      // a server whose connection closed: rejoin it when it is back (or fail), for every
      // lost link, not only this request's: its answer may wait on a peer that waits there
      const char* during = what ? what : ps::wire::type_name(it->second.type);
      for (std::size_t k = 0; k < links_.size(); ++k) {
        if (!links_[k].lost) continue;
        if (!links_[k].joined) {  // before the first hello was answered: nothing to rejoin
          if (static_cast<int>(k) == it->second.server && !it->second.answered &&
              std::chrono::steady_clock::now() - links_[k].down_since > std::chrono::seconds(3)) {
            // 3 s, not 1: a CURVE refusal closes the connection first and names itself
            // through the monitor a moment later, which took over 1 s on a loaded CI machine
            const std::string text = prefix() + server_name(static_cast<int>(k)) + " is gone: its connection closed during " + during +
                                     " and did not come back within 3 s (the ps process died or was stopped)";
            reqs_.erase(it);
            if (!throw_on_error) return;
            fail(text);
          }
          continue;
        }
        if (!throw_on_error) {  // a goodbye does not wait for a lost server
          if (static_cast<int>(k) == it->second.server) {
            reqs_.erase(it);
            return;
          }
          continue;
        }
        rejoin(k, during);
      }
      it = reqs_.find(id);
      if (it == reqs_.end()) return;
    }
  }
  auto r = std::move(it->second);
  reqs_.erase(it);
  prune_flags();
  if (answer) *answer = r.answer;
  if (!r.failure.empty() && throw_on_error) {
    // every worker got the same refusal: the connections and the collective count stay sound
    if (r.kind == req_kind::coll) throw comm_error(r.failure);
    throw error(r.failure);
  }
}

}  // namespace gradus
