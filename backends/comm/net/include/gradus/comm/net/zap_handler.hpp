#pragma once
// The ZAP handler (RFC 27) that decides, for every CURVE socket of one ZeroMQ context,
// whether a client key may connect: it checks the key against an allow-list and tags the
// accepted connection with the rank the key may act as.
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gradus/comm/net/allow_list.hpp"
#include "gradus/comm/net/curve_keys.hpp"
#include "gradus/core/error.hpp"

namespace gradus::net {

/// The ZAP domain of gradus' CURVE sockets; the handler refuses any other. (Named for the
/// parameter server, its first user: the name is on the wire, so it stays.)
inline constexpr const char* curve_zap_domain = "gradus-ps";

/// A connection the ZAP handler refused.
struct refusal {
  std::string public_key;  ///< the client's key (Z85); empty for a mechanism without keys
  std::string address;     ///< the client's IP address, as ZAP gives it
  std::string mechanism;   ///< "CURVE", "NULL", "PLAIN"
  std::string reason;      ///< the status text of the answer
  std::uint64_t times = 1; ///< refusals of this key from this address so far
};

/// Answers libzmq's ZAP requests (RFC 27) for every socket of one ZeroMQ context: a CURVE
/// client key in the allow-list is accepted (200) with User-Id `"worker:<rank>"` (or
/// "worker:*" for any_rank); everything else is refused (400). Runs a thread that owns a
/// REP socket bound at inproc://zeromq.zap.01.
///
/// One ZAP handler per context: that endpoint can be bound once, so a second handler in
/// the same context throws; servers sharing a context share one (for_context). Create it
/// before the sockets that use CURVE begin a handshake (before bind/connect), and destroy
/// it before its context; while it is gone, CURVE servers made by make_curve_server refuse
/// every client (ZMQ_ZAP_ENFORCE_DOMAIN). The destructor stops the thread within
/// milliseconds (a message on an inproc pair).
class zap_handler {
 public:
  /// Where libzmq sends its ZAP requests (RFC 27): bound by the handler in its context.
  static constexpr const char* endpoint = "inproc://zeromq.zap.01";

  /// Starts answering for `ctx` with the keys of `allowed`. Throws gradus::error when this
  /// libzmq cannot do CURVE (require_curve) or when `ctx` already has a ZAP handler.
  zap_handler(zmq::context_t& ctx, allow_list allowed) : allowed_(std::move(allowed)), zap_(ctx, zmq::socket_type::rep) {
    require_curve();
    zap_.set(zmq::sockopt::linger, 0);
    try {
      zap_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      if (e.num() == EADDRINUSE)
        throw error(std::string("gradus: zap_handler: this ZeroMQ context already has a ZAP handler (") + endpoint +
                    " is bound); one handler answers for every socket of a context");
      throw error(std::string("gradus: zap_handler: cannot bind ") + endpoint + ": " + e.what());
    }
    static std::atomic<unsigned long> counter{0};
    const std::string stop_ep = "inproc://gradus-zap-stop-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    stop_rx_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    stop_rx_.set(zmq::sockopt::linger, 0);
    stop_rx_.bind(stop_ep);
    stop_tx_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    stop_tx_.set(zmq::sockopt::linger, 0);
    stop_tx_.connect(stop_ep);
    // zap_ and stop_rx_ belong to the thread from here on (its start orders the hand-over)
    thread_ = std::thread([this] { run(); });
  }
  zap_handler(const zap_handler&) = delete;
  zap_handler& operator=(const zap_handler&) = delete;
  ~zap_handler() {
    stopping_.store(true, std::memory_order_release);
    try {
      (void)stop_tx_.send(zmq::message_t(), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
    if (thread_.joinable()) thread_.join();  // also bounded without the message: the thread polls every 100 ms
    try {
      zap_.unbind(endpoint);  // at once, so that a next handler may bind (closing frees it later)
    } catch (const zmq::error_t&) {
    }
    stop_tx_.close();
    stop_rx_.close();
    zap_.close();
  }

  /// The handler of `ctx`, shared by the servers of one context (tests run several in one
  /// process): made on first use, reused while it lives, for the same allow-list only.
  static std::shared_ptr<zap_handler> for_context(zmq::context_t& ctx, const allow_list& allowed) {
    static std::mutex mu;
    static std::map<void*, std::weak_ptr<zap_handler>> handlers;
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = handlers.begin(); it != handlers.end();) it = it->second.expired() ? handlers.erase(it) : std::next(it);
    auto& slot = handlers[ctx.handle()];
    if (auto h = slot.lock()) {
      if (h->allowed().entries() != allowed.entries())
        throw error("gradus: zap_handler: two parameter servers in one ZeroMQ context with different allow-lists (" +
                    std::to_string(h->allowed().size()) + " and " + std::to_string(allowed.size()) +
                    " keys); a context has one ZAP handler: give each server its own context");
      return h;
    }
    auto h = std::make_shared<zap_handler>(ctx, allowed);
    slot = h;
    return h;
  }

  /// Handshakes accepted so far (a client reconnecting counts again). Any thread.
  std::uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  /// Handshakes refused so far, malformed requests not counted. Any thread.
  std::uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  /// The allow-list it checks keys against (fixed for its life).
  const allow_list& allowed() const { return allowed_; }

  /// The latest refusal, for a server's log.
  std::optional<refusal> last_refusal() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  /// The refusals of keys (and addresses) not reported before, oldest first: a server logs
  /// each refused client once, not at each of its reconnections (every 100 ms by default).
  std::vector<refusal> take_new_refusals() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<refusal> out(fresh_.begin(), fresh_.end());
    fresh_.clear();
    return out;
  }

 private:
  struct answer {
    std::string code, text, user_id;
  };

  void run() {
    while (!stopping_.load(std::memory_order_acquire)) {
      zmq::pollitem_t items[2] = {{zap_.handle(), 0, ZMQ_POLLIN, 0}, {stop_rx_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(100));
      } catch (const zmq::error_t&) {
        return;  // the context is terminating
      }
      if (items[1].revents & ZMQ_POLLIN) return;
      if (items[0].revents & ZMQ_POLLIN) serve_one();
    }
  }

  void serve_one() {
    std::vector<zmq::message_t> req;
    try {
      do {
        zmq::message_t m;
        if (!zap_.recv(m, zmq::recv_flags::dontwait)) break;
        req.push_back(std::move(m));
      } while (req.back().more() && req.size() < 16);
      while (!req.empty() && req.back().more()) {  // more frames than ZAP has: drop the rest
        zmq::message_t m;
        if (!zap_.recv(m, zmq::recv_flags::dontwait)) break;
        req.back() = std::move(m);
      }
    } catch (const zmq::error_t&) {
      return;
    }
    if (req.empty()) return;
    const answer a = decide(req);
    const std::string request_id = req.size() > 1 ? req[1].to_string() : std::string();
    try {
      zap_.send(zmq::buffer(std::string_view("1.0")), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(a.code), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(a.text), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(a.user_id), zmq::send_flags::sndmore);
      zap_.send(zmq::message_t(), zmq::send_flags::none);  // no metadata
    } catch (const zmq::error_t&) {
      // the handshake that asked is gone; REP is ready for the next request
    }
  }

  /// RFC 27 request: version, request id, domain, address, routing id, mechanism,
  /// credentials (CURVE: the client's 32-byte long-term public key).
  answer decide(const std::vector<zmq::message_t>& req) {
    if (req.size() < 6 || req[0].to_string_view() != "1.0") return {"500", "malformed ZAP request (RFC 27, version 1.0)", ""};
    const std::string domain = req[2].to_string(), address = req[3].to_string(), mechanism = req[5].to_string();
    refusal r;
    r.address = address;
    r.mechanism = mechanism;
    if (mechanism == "CURVE" && req.size() == 7 && req[6].size() == 32) {
      std::uint8_t key[32];
      std::memcpy(key, req[6].data(), 32);
      r.public_key = z85_encode_key(key);
    }
    if (domain != curve_zap_domain) r.reason = "ZAP domain '" + domain + "' is not " + curve_zap_domain;
    else if (mechanism != "CURVE") r.reason = "mechanism " + mechanism + " is not allowed (CURVE only)";
    else if (r.public_key.empty()) r.reason = "malformed CURVE credentials";
    else if (const auto rank = allowed_.rank_of(r.public_key)) {
      accepted_.fetch_add(1, std::memory_order_relaxed);
      return {"200", "OK", "worker:" + detail_security::rank_text(*rank)};
    } else {
      r.reason = "key not in the allow-list";
    }
    refused_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    const std::string who = r.public_key + " " + r.address;
    if (times_.size() >= 4096 && !times_.count(who)) times_.erase(times_.begin());  // bounded memory
    r.times = ++times_[who];
    last_ = r;
    if (r.times == 1) {
      fresh_.push_back(r);
      if (fresh_.size() > 64) fresh_.pop_front();
    }
    return {"400", r.reason, ""};
  }

  const allow_list allowed_;
  zmq::socket_t zap_, stop_rx_, stop_tx_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> accepted_{0}, refused_{0};
  mutable std::mutex mu_;
  std::optional<refusal> last_;
  std::deque<refusal> fresh_;
  std::map<std::string, std::uint64_t> times_;
};

}  // namespace gradus::net
