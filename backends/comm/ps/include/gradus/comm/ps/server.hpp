#pragma once
// A parameter server task: holds shards of the variables, applies the workers' gradients
// with the server-side optimizer, answers pulls when the consistency mode allows, and runs
// the workers' small collectives (server 0). One thread: it polls its ROUTER socket and
// handles each message to the end (no hand-off to another thread, unlike ps-lite's
// Van -> Customer hop). It never needs the model's types: shards are declared by the
// workers (name, element range, dtype) and the optimizer by its name and settings.
//
//   gradus::ps::serve(cluster::from_env());   // in a program whose role is "ps"
//
// serves until the chief sends `shutdown` (the job is done, as TF's server.join()), or
// until every worker has said goodbye or gone.
//
// Consistency (chosen by the workers, who must agree):
//   async   each push is applied on arrival; pulls are answered at once.
//   bsp     the pushes of step s are averaged (summed in rank order: the result does not
//           depend on arrival order) and applied once; a pull at clock c waits until the
//           shard holds the update of every step < c.
//   ssp S   each push is applied on arrival as 1/N of a step; a pull at clock c waits until
//           every live worker's clock is >= c - S, so no worker computes on parameters
//           missing an update older than S steps (Ho et al. 2013). S = 0 reads as BSP.
//
// A worker whose connection closes without a goodbye (its process died, or its ZMTP
// heartbeats stopped for heartbeat_timeout) is lost: BSP fails the job at once naming it
// (or, with bsp_continue_without_dead, averages the survivors); async and SSP go on
// without it (it leaves the staleness clock, collectives count the survivors).
// GRADUS_PS_DEBUG=1 in the environment logs each worker's connection and every closed one.
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <unistd.h>

#include "gradus/backends/cpu_simd.hpp"
#include "gradus/comm/net/address.hpp"
#include "gradus/comm/net/heartbeat.hpp"
#include "gradus/comm/net/socket_monitor.hpp"
#include "gradus/comm/ps/curve_config.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"
#include "gradus/train/optimizer.hpp"

namespace gradus::ps {

enum class mode : std::uint8_t { async = 0, bsp = 1, ssp = 2 };
inline const char* mode_name(mode m) { return m == mode::async ? "async" : m == mode::bsp ? "bsp" : "ssp"; }

// The optimizer a server applies, rebuilt from the name and settings a worker sends (the
// text of each optimizer's settings(), exact: shortest round-trip decimals). The learning
// rate comes with every push (the worker's schedule at its step), so a schedule never has
// to cross the wire.
class server_optimizer {
 public:
  server_optimizer() = default;
  server_optimizer(const std::string& name, const std::map<std::string, std::string>& s) : name_(name) {
    const auto num = [&](const char* k, double dflt) {
      const auto it = s.find(k);
      if (it == s.end()) return dflt;
      char* end = nullptr;
      const double v = std::strtod(it->second.c_str(), &end);
      if (end == it->second.c_str() || *end) throw error("gradus: parameter server: optimizer setting " + std::string(k) + " = '" + it->second + "' is not a number");
      return v;
    };
    if (num("clip_global_norm", 0) != 0)
      throw error("gradus: parameter server: clip_global_norm needs every gradient of a step at once; the servers each hold a part");
    if (name == "sgd") {
      sgd o;
      o.momentum = num("momentum", 0);
      o.nesterov = s.count("nesterov") && s.at("nesterov") == "true";
      o.weight_decay = num("weight_decay", 0);
      o.validate();
      opt_ = o;
    } else if (name == "adam" || name == "adamw") {
      adam a;
      a.beta1 = num("beta1", 0.9);
      a.beta2 = num("beta2", 0.999);
      a.eps = num("eps", 1e-8);
      a.weight_decay = num("weight_decay", name == "adamw" ? 0.01 : 0);
      a.validate();
      if (name == "adam") opt_ = a;
      else opt_ = adamw{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, 0};
    } else {
      throw error("gradus: parameter server: optimizer '" + name + "' is not one the servers apply (sgd, adam, adamw)");
    }
  }
  const std::string& name() const { return name_; }
  int slot_count() const {
    return std::visit([](const auto& o) { return o.slot_count(); }, opt_);
  }
  // The name of state tensor k ("momentum", "adam_m", ...): "<variable>/<name>" in a checkpoint.
  std::string slot_name(int k) const {
    return std::string(std::visit([k](const auto& o) { return std::string_view(o.slot_name(k)); }, opt_));
  }
  template <class T>
  void apply(std::size_t n, T* w, const T* g, T* const* slots, std::int64_t step, double lr, double scale) const {
    std::visit(
        [&](auto o) {
          o.lr = lr;
          o.template apply<cpu_simd, T>(static_cast<index_t>(n), w, g, slots, step, scale);
        },
        opt_);
  }

 private:
  std::string name_ = "sgd";
  std::variant<sgd, adam, adamw> opt_ = sgd{};
};

// A variable's state read back from a checkpoint, for a restarted server (server_options::restore).
struct restored_variable {
  wire::dtype dt = wire::dtype::none;
  std::vector<std::byte> values;              // the whole variable, every element
  std::vector<std::vector<std::byte>> slots;  // each optimizer state tensor, in the optimizer's order
  std::int64_t step = 0;                      // the checkpoint's global step
};
// restore(variable name, its optimizer state names): what the last checkpoint holds of it,
// or nothing when it holds no such variable (ps::restore_from_checkpoint reads an .npz).
using restore_source = std::function<std::optional<restored_variable>(const std::string&, const std::vector<std::string>&)>;

struct server_options {
  // Where to listen: "host:port" (a name is resolved and every address it has is bound:
  // "localhost" binds 127.0.0.1 and ::1), "*:port" for every interface, or a full ZeroMQ
  // endpoint ("tcp://...", "ipc://...").
  std::string address;
  int index = 0;  // this task's index among the ps tasks (for messages)
  wire::limits limits;
  // A worker whose connection is silent this long is dropped (ZMTP heartbeats; its I/O
  // thread answers while its program computes).
  std::chrono::milliseconds heartbeat_timeout{10000};
  // bsp: when a worker dies, fail the job at once (default, naming it) or go on with the
  // survivors (the step's average then counts only them).
  bool bsp_continue_without_dead = false;
  // OpenMP threads of the server's update passes. 1: a 1 MiB chunk's update is memory-bound
  // (33 us on one thread), and a team per chunk cost 40x the CPU of a raw ZeroMQ server
  // and 0.2x its throughput with 2 servers (benchmarks/results/ps_bench-d4e0588.md).
  int threads = 1;
  // Stop when nothing at all has been heard for this long (0: never). Tests use it as a
  // bound; a job's servers end by `shutdown`.
  std::chrono::milliseconds idle_exit{0};
  // CURVE encryption, workers authenticated by their keys (ps::curve_server_from_env);
  // none: plaintext, anyone who reaches the port may connect.
  std::optional<curve_server_config> curve;
  // Server recovery: where a restarted server reloads its shards from when the workers
  // come back to it (their hello says they rejoin). Empty: a restarted server has nothing
  // to serve, and tells the rejoining workers so. ps::serve sets it from the checkpoint
  // the program names when the process is a restart (GRADUS_RESTART_COUNT, gradus-run
  // --max-restarts).
  restore_source restore;
  std::function<void(const std::string&)> log = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
};

// Counters, readable from another thread while the server runs.
struct server_stats {
  std::atomic<std::uint64_t> messages{0}, malformed{0}, rejected{0}, pushes{0}, pulls{0}, updates{0}, collectives{0}, workers_lost{0};
  std::atomic<std::uint64_t> restored{0};       // shards reloaded from a checkpoint after a restart
  std::atomic<std::uint64_t> stale_dropped{0};  // bsp pushes for a step a restarted server skipped
};

class server {
 public:
  server(zmq::context_t& ctx, server_options o) : o_(std::move(o)), sock_(ctx, zmq::socket_type::router) {
    sock_.set(zmq::sockopt::linger, 0);
    sock_.set(zmq::sockopt::ipv6, 1);
    sock_.set(zmq::sockopt::router_mandatory, 1);
    sock_.set(zmq::sockopt::maxmsgsize, static_cast<std::int64_t>(o_.limits.max_payload + sizeof(wire::header)));
    net::set_heartbeats(sock_, o_.heartbeat_timeout);
    sock_.set(zmq::sockopt::sndhwm, 0);
    sock_.set(zmq::sockopt::rcvhwm, 0);
    if (o_.curve) {
      zap_ = zap_handler::for_context(ctx, o_.curve->allowed);
      make_curve_server(sock_, o_.curve->keys);
    }
    for (const auto& ep : net::listen_endpoints(o_.address, "gradus: parameter server")) {
      try {
        sock_.bind(ep);
      } catch (const zmq::error_t& e) {
        throw comm_error("gradus: parameter server " + std::to_string(o_.index) + ": cannot listen on " + ep + " (from '" + o_.address +
                         "'): " + e.what());
      }
    }
    bound_ = sock_.get(zmq::sockopt::last_endpoint);
    // Lost connections (a worker that died, or whose heartbeats stopped) come as
    // DISCONNECTED events carrying the connection's file descriptor; each worker's is
    // known from its messages (ZMQ_SRCFD).
    mon_ = net::socket_monitor(ctx, sock_, ZMQ_EVENT_DISCONNECTED | handshake_failure_events, "ps");
  }
  server(const server&) = delete;
  server& operator=(const server&) = delete;
  ~server() = default;  // mon_ stops before sock_ closes (net/socket_monitor.hpp)

  // The endpoint actually bound (with the port the system chose for ":0").
  const std::string& endpoint() const { return bound_; }
  const server_stats& stats() const { return stats_; }
  // Makes run() return within its poll interval (100 ms), from any thread: what a killed
  // process looks like to the workers once the server is destroyed (tests).
  void stop() { stop_.store(true); }

  // Serves until shutdown, or until every worker that said hello has said bye.
  void run() {
    omp_set_num_threads(std::max(1, o_.threads));  // this thread's parallel regions only
    auto last_heard = std::chrono::steady_clock::now();
    while (!done_ && !stop_.load()) {
      zmq::pollitem_t items[2] = {{sock_.handle(), 0, ZMQ_POLLIN, 0}, mon_.poll_item()};
      zmq::poll(items, 2, std::chrono::milliseconds(100));
      if (items[1].revents & ZMQ_POLLIN) monitor_events();
      const auto& item = items[0];
      if (item.revents & ZMQ_POLLIN) {
        last_heard = std::chrono::steady_clock::now();
        while (!done_ && receive_one()) {
        }
      } else if (shutdown_at_ && std::chrono::steady_clock::now() > *shutdown_at_) {
        o_.log(prefix() + "the chief ended the job 10 s ago and not every worker has said goodbye; stopping");
        return;
      } else if (o_.idle_exit.count() > 0 && std::chrono::steady_clock::now() - last_heard > o_.idle_exit) {
        o_.log("gradus: parameter server " + std::to_string(o_.index) + ": nothing heard for " +
               std::to_string(o_.idle_exit.count()) + " ms; stopping");
        return;
      }
    }
  }

 private:
  struct worker {
    std::string id;  // ZeroMQ routing id
    std::uint64_t clock = 0;
    bool joined = false, left = false, dead = false;
    int fd = -1;               // its connection (ZMQ_SRCFD), to recognise its DISCONNECTED
    std::string peer_address;  // where it connects from ("Peer-Address"), for messages
  };
  struct pending_step {
    std::vector<std::vector<std::byte>> grads;  // per rank (sparse: its rows' values)
    double lr = 0;
    bool sparse = false;                         // pushed as rows
    std::vector<std::vector<std::uint64_t>> rows;  // sparse: per rank, its rows (of the shard)
    std::vector<bool> present;                   // sparse: the ranks that pushed (maybe no rows)
  };
  struct shard_state {
    std::string name;
    wire::dtype dt = wire::dtype::none;
    std::uint64_t offset = 0, count = 0, total = 0;
    std::vector<std::byte> values;
    std::vector<std::vector<std::byte>> slots;
    std::int64_t updates = 0;   // optimizer steps applied (Adam's t - 1)
    std::uint64_t version = 0;  // bsp: steps applied
    bool ready = false;         // the chief's values have arrived
    std::map<std::uint64_t, pending_step> pending;
    // sparse rows, once a row message named the row length: each row's last update
    std::uint64_t row_len = 0;
    std::vector<std::uint64_t> row_stamp;
    std::uint64_t stamp = 0;  // updates applied to rows so far
    std::set<std::uint64_t> chunks_in;  // the chief's first values arriving in chunks (init_values): their offsets
    std::uint64_t elements_in = 0;
  };
  struct parked {
    std::string id;
    wire::header h;
  };
  struct collective {
    wire::header first;
    std::vector<std::vector<std::byte>> parts;
    std::vector<std::string> ids;
    std::vector<std::uint64_t> req_ids;  // each worker's request id: its answer echoes it
    std::vector<bool> in;
    int got = 0;
    // the answer (or failure) to worker k: its own request id
    wire::header to(std::size_t k, bool failed) const {
      auto h = wire::make(failed ? wire::type::fail : wire::type::reply, first.key, first.offset, 0, wire::dtype::none);
      h.clock = first.clock;
      h.id = req_ids[k];
      h.rank = static_cast<std::int32_t>(k);
      return h;
    }
  };

  std::string who(int rank) const {
    return "worker " + std::to_string(rank);
  }
  std::string prefix() const { return "gradus: parameter server " + std::to_string(o_.index) + ": "; }

  // One message from the socket; false when none is waiting.
  bool receive_one() {
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

  void note_malformed(const std::string& why) {
    const std::uint64_t n = stats_.malformed.load();
    if (n <= 3 || (n & (n - 1)) == 0) o_.log(prefix() + why + " (dropped; " + std::to_string(n) + " so far)");
  }

  static wire::header reply_header(const wire::header& req) {
    auto h = wire::make(wire::type::reply, req.key, req.offset, 0, wire::dtype::none);
    h.id = req.id;
    h.clock = req.clock;
    h.rank = req.rank;
    return h;
  }
  static wire::header fail_header(const wire::header& req) {
    auto h = reply_header(req);
    h.type = static_cast<std::uint8_t>(wire::type::fail);
    return h;
  }

  void send(const std::string& id, wire::header h, std::string_view text) {
    send(id, h, std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size()));
  }
  void send(const std::string& id, wire::header h, std::span<const std::byte> payload) {
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

  // The rank a message may speak for: the one its connection said hello as.
  int sender(const std::string& id, const wire::header& h) {
    if (o_.curve && !may_act_as(last_auth_, h.rank)) throw error(prefix() + rank_claim_refusal(last_auth_, h.rank, last_peer_));
    for (std::size_t r = 0; r < workers_.size(); ++r)
      if (workers_[r].joined && workers_[r].id == id) {
        if (h.rank != static_cast<int>(r))
          throw error(prefix() + "a message claims to come from worker " + std::to_string(h.rank) + " on the connection of worker " + std::to_string(r));
        return static_cast<int>(r);
      }
    throw error(prefix() + std::string(wire::type_name(static_cast<wire::type>(h.type))) + " from a connection that has not said hello");
  }

  void handle(const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    const auto t = static_cast<wire::type>(h.type);
    if (!job_failed_.empty() && t != wire::type::bye && t != wire::type::shutdown) throw error(job_failed_);
    switch (t) {
      case wire::type::hello: return hello(id, h, payload);
      case wire::type::config: return config(sender(id, h), id, h, payload);
      case wire::type::init: return init(sender(id, h), id, h, payload);
      case wire::type::push: return push(sender(id, h), id, h, payload);
      case wire::type::push_rows: return push_rows(sender(id, h), id, h, payload);
      case wire::type::pull_rows: return pull(sender(id, h), id, h);
      case wire::type::pull: return pull(sender(id, h), id, h);
      case wire::type::snapshot: return snapshot(sender(id, h), id, h);
      case wire::type::init_values: return init_values(sender(id, h), id, h, payload);
      case wire::type::clock: return clock(sender(id, h), h);
      case wire::type::coll: return coll(sender(id, h), id, h, payload);
      case wire::type::bye: {
        const int r = sender(id, h);
        workers_[static_cast<std::size_t>(r)].left = true;
        send(id, reply_header(h), std::span<const std::byte>{});
        if (std::all_of(workers_.begin(), workers_.end(), [](const worker& w) { return w.left; })) done_ = true;
        serve_parked();
        return;
      }
      case wire::type::shutdown: {
        // The chief ends the job: it leaves, and the server stops once the others have
        // said goodbye too (their last pulls are answered), or after a grace period.
        const int r = sender(id, h);
        if (r != 0) throw error(prefix() + "shutdown from worker " + std::to_string(r) + " (only the chief, worker 0, ends the job)");
        workers_[0].left = true;
        send(id, reply_header(h), std::span<const std::byte>{});
        shutdown_at_ = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        if (std::all_of(workers_.begin(), workers_.end(), [](const worker& w) { return w.left; })) done_ = true;
        serve_parked();
        return;
      }
      default: throw error(prefix() + "unexpected " + wire::type_name(static_cast<wire::type>(h.type)) + " message");
    }
  }

  void hello(const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    } catch (const std::exception& e) {
      throw error(prefix() + "hello is not JSON: " + e.what());
    }
    // Every field checked for type and range before it is used (any peer can send a hello).
    const auto integer = [&](const char* k, std::int64_t lo, std::int64_t hi, std::int64_t dflt) -> std::int64_t {
      if (!j.is_object()) throw error(prefix() + "hello is not a JSON object");
      const auto it = j.find(k);
      if (it == j.end()) return dflt;
      if (!it->is_number_integer()) throw error(prefix() + "hello: " + k + " is not an integer");
      const auto v = it->get<std::int64_t>();
      if (v < lo || v > hi) throw error(prefix() + "hello: " + k + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return v;
    };
    const int world = static_cast<int>(integer("world_size", 1, 1 << 16, 0));
    const int rank = static_cast<int>(integer("rank", 0, world - 1, -1));
    const auto staleness = integer("staleness", 0, 1000000, 0);
    // a worker coming back to a restarted server: the step it is at
    const auto rejoin_clock = static_cast<std::uint64_t>(integer("clock", 0, std::int64_t(1) << 53, 0));
    const auto rj = j.find("rejoin");
    const bool rejoin = rj != j.end() && rj->is_boolean() && rj->get<bool>();
    const auto mit = j.find("mode");
    const std::string m = mit != j.end() && mit->is_string() ? mit->get<std::string>() : "";
    if (world < 1 || rank < 0 || rank >= world || h.rank != rank)
      throw error(prefix() + "hello from rank " + std::to_string(rank) + " of a world of " + std::to_string(world));
    if (o_.curve && !may_act_as(last_auth_, rank)) throw error(prefix() + rank_claim_refusal(last_auth_, rank, last_peer_));
    const mode md = m == "async" ? mode::async : m == "bsp" ? mode::bsp : m == "ssp" ? mode::ssp : throw error(prefix() + "unknown consistency '" + m + "'");
    if (workers_.empty()) {
      workers_.resize(static_cast<std::size_t>(world));
      mode_ = md;
      staleness_ = static_cast<std::uint64_t>(std::max<std::int64_t>(0, staleness));
      o_.log(prefix() + "serving " + std::to_string(world) + " workers, " + mode_name(md) +
             (md == mode::ssp ? " " + std::to_string(staleness_) : "") + ", on " + bound_);
    } else {
      std::string diff;
      if (static_cast<int>(workers_.size()) != world) diff = "world size " + std::to_string(world) + " (first: " + std::to_string(workers_.size()) + ")";
      else if (md != mode_ || static_cast<std::uint64_t>(std::max<std::int64_t>(0, staleness)) != staleness_)
        diff = "consistency " + m + " " + std::to_string(staleness) + " (first: " + mode_name(mode_) + " " + std::to_string(staleness_) + ")";
      if (!diff.empty()) throw error(prefix() + "worker " + std::to_string(rank) + " says " + diff);
    }
    auto& w = workers_[static_cast<std::size_t>(rank)];
    if (w.joined && w.id != id && !w.left) {
      // A rejoining worker may reach a restarted server twice (a first connection that
      // ZeroMQ reopened by itself carried its hello, then the one it opened again): the
      // latest is its connection. Otherwise two processes claim one rank.
      if (!rejoin || !restoring_)
        throw error(prefix() + "worker " + std::to_string(rank) + " said hello twice from different connections (two processes with one rank?)");
      o_.log(prefix() + "worker " + std::to_string(rank) + " rejoins on a new connection");
      w.joined = false;
    }
    if (w.dead) throw error(prefix() + "worker " + std::to_string(rank) + " was declared dead; it cannot rejoin this job");
    if (rejoin && !w.joined) {
      // This server restarted (its old state is gone): it reloads its shards from the last
      // checkpoint as the workers declare them again, and takes up the clocks they are at.
      if (!o_.restore)
        throw error(prefix() + "worker " + std::to_string(rank) + " rejoins at step " + std::to_string(rejoin_clock) +
                    ", but this server started afresh and has no checkpoint to restore its shards from (give the ps task the"
                    " checkpoint the chief writes: the examples' --checkpoint; gradus-run --max-restarts restarts it with"
                    " GRADUS_RESTART_COUNT set)");
      if (!restoring_) o_.log(prefix() + "workers rejoin a restarted server: restoring its shards from the last checkpoint");
      restoring_ = true;
      w.clock = std::max(w.clock, rejoin_clock);
      raise_floor(rejoin_clock);
    }
    // A closed connection's DISCONNECTED event names its file descriptor, which the system
    // may already have given to this new connection (a worker rejoining a restarted server
    // closes a connection that ZeroMQ had reopened by itself): the I/O thread raised that
    // event before this hello was read, so take it now, before the number means this worker.
    monitor_events();
    w.id = id;
    w.joined = true;
    w.left = false;
    w.fd = last_fd_;
    if (std::getenv("GRADUS_PS_DEBUG")) o_.log(prefix() + "worker " + std::to_string(rank) + " fd " + std::to_string(w.fd));
    w.peer_address = last_peer_;
    auto r = reply_header(h);
    r.clock = w.clock;  // a reconnecting worker learns where it was
    send(id, r, std::span<const std::byte>{});
  }

  // The update rule: the first worker's (every worker sends the same; the run fingerprint
  // compared them already), before any shard exists.
  void config(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
    } catch (const std::exception& e) {
      throw error(prefix() + "config is not JSON: " + e.what());
    }
    const auto opt = j.value("optimizer", std::string("sgd"));
    const auto settings = j.value("settings", std::map<std::string, std::string>{});
    if (!configured_) {
      if (!shards_.empty()) throw error(prefix() + "config after the first shard");
      opt_ = server_optimizer(opt, settings);
      opt_name_ = opt;
      settings_ = settings;
      configured_ = true;
    } else if (opt != opt_name_ || settings != settings_) {
      throw error(prefix() + "worker " + std::to_string(rank) + " applies " + opt + " with other settings than the first worker's " + opt_name_);
    }
    send(id, reply_header(h), std::span<const std::byte>{});
  }

  shard_state& find(const wire::header& h) {
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

  // init: payload = u32 name length, name, then the shard's values (the chief) or nothing.
  void init(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    std::uint32_t len = 0;
    if (payload.size() < 4) throw error(prefix() + "init without a name");
    std::memcpy(&len, payload.data(), 4);
    if (len == 0 || len > 4096 || payload.size() < 4 + std::size_t(len)) throw error(prefix() + "init with a malformed name");
    const std::string name(reinterpret_cast<const char*>(payload.data() + 4), len);
    const auto values = payload.subspan(4 + len);
    const auto dt = static_cast<wire::dtype>(h.dtype);
    const std::size_t elem = wire::dtype_size(dt);
    if (dt != wire::dtype::f32 && dt != wire::dtype::f64) throw error(prefix() + "'" + name + "' has dtype " + wire::dtype_name(dt) + " (float32 or float64)");
    if (h.count == 0) throw error(prefix() + "'" + name + "': an empty shard");
    if (!(h.scalar >= 1) || !(h.scalar <= static_cast<double>(o_.limits.max_elements)) || h.scalar != std::floor(h.scalar))
      throw error(prefix() + "'" + name + "': the variable's size is not a whole number of elements within the limit");
    const auto total = static_cast<std::uint64_t>(h.scalar);
    if (h.offset + h.count > total) throw error(prefix() + "'" + name + "': shard past the variable's end");
    const std::size_t shard_bytes = h.count * elem, with_slots = shard_bytes * (1 + static_cast<std::size_t>(opt_.slot_count()));
    if (!values.empty() && values.size() != shard_bytes && values.size() != with_slots)
      throw error(prefix() + "'" + name + "': init carries " + std::to_string(values.size()) + " bytes for " + std::to_string(h.count) +
                  " elements (" + std::to_string(shard_bytes) + ", or " + std::to_string(with_slots) + " with the optimizer's " +
                  std::to_string(opt_.slot_count()) + " state tensors)");
    if (!configured_) throw error(prefix() + "init of '" + name + "' before the optimizer's config");
    auto [it, fresh] = shards_.try_emplace(h.key);
    auto& s = it->second;
    if (fresh) {
      s.name = name;
      s.dt = dt;
      s.offset = h.offset;
      s.count = h.count;
      s.total = total;
      s.values.assign(h.count * elem, std::byte{0});
      s.slots.assign(static_cast<std::size_t>(opt_.slot_count()), std::vector<std::byte>(h.count * elem, std::byte{0}));
      if (restoring_) {
        try {
          restore_shard(s);
        } catch (...) {
          shards_.erase(it);
          throw;
        }
      }
    } else if (s.name != name || s.dt != dt || s.offset != h.offset || s.count != h.count || s.total != total) {
      throw error(prefix() + "worker " + std::to_string(rank) + " declares key " + std::to_string(h.key) + " as '" + name + "' [" +
                  std::to_string(h.offset) + ", +" + std::to_string(h.count) + ") " + wire::dtype_name(dt) + " but it is '" + s.name + "' [" +
                  std::to_string(s.offset) + ", +" + std::to_string(s.count) + ") " + wire::dtype_name(s.dt) +
                  " (the workers' models or partitioners differ)");
    }
    if (rank == 0 && !values.empty() && !s.ready) {  // the chief's values win; a restarted chief does not overwrite
      std::memcpy(s.values.data(), values.data(), shard_bytes);
      if (values.size() == with_slots)  // and its optimizer state (a resumed checkpoint)
        for (std::size_t k = 0; k < s.slots.size(); ++k) std::memcpy(s.slots[k].data(), values.data() + (k + 1) * shard_bytes, shard_bytes);
      became_ready(s, h.clock);
    }
    auto& w = workers_[static_cast<std::size_t>(rank)];
    w.clock = std::max(w.clock, h.clock);
    // The others are answered once the chief's values are in: nobody pushes to a shard
    // that has no values yet.
    if (s.ready) send(id, reply_header(h), std::span<const std::byte>{});
    else parked_inits_.push_back({id, h});
    answer_parked_inits();
  }

  // The chief's values are in; the step the job starts at (0, or a resumed checkpoint's)
  // counts as the steps applied so far.
  static void became_ready(shard_state& s, std::uint64_t start) {
    s.updates = static_cast<std::int64_t>(start);
    s.version = start;
    s.ready = true;
  }

  // A chunk of the chief's first values (and optimizer state) for a declared shard.
  void init_values(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    auto& s = find(h);
    if (static_cast<wire::dtype>(h.dtype) != s.dt)
      throw error(prefix() + "init_values of " + wire::dtype_name(static_cast<wire::dtype>(h.dtype)) + " for '" + s.name + "' (" + wire::dtype_name(s.dt) + ")");
    const std::size_t elem = wire::dtype_size(s.dt), bytes = h.count * elem;
    if (payload.size() != bytes && payload.size() != bytes * (1 + s.slots.size()))
      throw error(prefix() + "init_values of '" + s.name + "' carries " + std::to_string(payload.size()) + " bytes for " + std::to_string(h.count) +
                  " elements (" + std::to_string(bytes) + ", or " + std::to_string(bytes * (1 + s.slots.size())) + " with the optimizer's state)");
    if (rank != 0) throw error(prefix() + "init_values from worker " + std::to_string(rank) + " (the chief's values count)");
    if (!s.ready && s.chunks_in.insert(h.offset).second) {
      const std::size_t at = (h.offset - s.offset) * elem;
      std::memcpy(s.values.data() + at, payload.data(), bytes);
      if (payload.size() > bytes)
        for (std::size_t k = 0; k < s.slots.size(); ++k) std::memcpy(s.slots[k].data() + at, payload.data() + (k + 1) * bytes, bytes);
      s.elements_in += h.count;
      if (s.elements_in == s.count) {
        became_ready(s, h.clock);
        s.chunks_in.clear();
      } else if (s.elements_in > s.count) {
        throw error(prefix() + "init_values of '" + s.name + "': overlapping chunks");
      }
    }
    send(id, reply_header(h), std::span<const std::byte>{});
    answer_parked_inits();
  }

  void answer_parked_inits() {
    for (std::size_t i = 0; i < parked_inits_.size();) {
      const auto it2 = shards_.find(parked_inits_[i].h.key);
      if (it2 != shards_.end() && it2->second.ready) {
        send(parked_inits_[i].id, reply_header(parked_inits_[i].h), std::span<const std::byte>{});
        parked_inits_.erase(parked_inits_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    serve_parked();
  }

  // A restored shard: its part of the checkpoint's variable and optimizer state; the step
  // counts from the checkpoint's, and (bsp) from the step the rejoining workers are at.
  void restore_shard(shard_state& s) {
    std::vector<std::string> slot_names;
    for (int k = 0; k < opt_.slot_count(); ++k) slot_names.push_back(opt_.slot_name(k));
    auto r = o_.restore(s.name, slot_names);
    if (!r) throw error(prefix() + "restarted, but the checkpoint holds no variable '" + s.name + "' to restore its shard from");
    const std::size_t elem = wire::dtype_size(s.dt);
    if (r->dt != s.dt || r->values.size() != s.total * elem)
      throw error(prefix() + "the checkpoint's '" + s.name + "' is " + std::to_string(r->values.size() / std::max<std::size_t>(1, wire::dtype_size(r->dt))) +
                  " " + wire::dtype_name(r->dt) + " elements; the workers declare " + std::to_string(s.total) + " " + wire::dtype_name(s.dt));
    if (r->slots.size() != s.slots.size())
      throw error(prefix() + "the checkpoint holds " + std::to_string(r->slots.size()) + " optimizer state tensors of '" + s.name + "'; " +
                  opt_.name() + " has " + std::to_string(s.slots.size()));
    const auto from = static_cast<std::ptrdiff_t>(s.offset * elem), to = static_cast<std::ptrdiff_t>((s.offset + s.count) * elem);
    std::copy(r->values.begin() + from, r->values.begin() + to, s.values.begin());
    for (std::size_t k = 0; k < s.slots.size(); ++k) {
      if (r->slots[k].size() != r->values.size())
        throw error(prefix() + "the checkpoint's '" + s.name + "/" + slot_names[k] + "' is not the variable's size");
      std::copy(r->slots[k].begin() + from, r->slots[k].begin() + to, s.slots[k].begin());
    }
    s.updates = r->step;
    s.stamp = 1;  // every row differs from what the workers hold: a row-sparse pull from stamp 0 moves them all
    s.version = std::max(static_cast<std::uint64_t>(std::max<std::int64_t>(0, r->step)), floor_);
    s.ready = true;
    ++stats_.restored;
    o_.log(prefix() + "restored '" + s.name + "' [" + std::to_string(s.offset) + ", " + std::to_string(s.offset + s.count) + ") from the checkpoint of step " +
           std::to_string(r->step) + (mode_ == mode::bsp ? "; serving from step " + std::to_string(s.version) : std::string()));
  }
  // bsp after a restart: the rejoining workers are at step c, so the shards go on from c
  // (a step in flight when the server died is lost with it, as the steps since the
  // checkpoint are; pushes for it are acknowledged and dropped).
  void raise_floor(std::uint64_t c) {
    floor_ = std::max(floor_, c);
    if (mode_ != mode::bsp) return;
    for (auto& [key, s] : shards_) {
      if (s.version >= floor_) continue;
      s.version = floor_;
      for (auto it = s.pending.begin(); it != s.pending.end();) {
        if (it->first < floor_) {
          p_done_.erase({key, it->first});
          it = s.pending.erase(it);
        } else {
          ++it;
        }
      }
      maybe_apply_bsp(s, key);
    }
  }

  int live_workers() const {
    return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const worker& w) { return !w.left; }));
  }
  std::uint64_t min_clock() const {
    std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
    for (const auto& w : workers_)
      if (!w.left) m = std::min(m, w.clock);
    return m == std::numeric_limits<std::uint64_t>::max() ? 0 : m;
  }

  template <class T>
  void apply_typed(shard_state& s, std::uint64_t first, std::size_t n, const T* g, double lr, double scale) {
    T* w = reinterpret_cast<T*>(s.values.data()) + first;
    std::vector<T*> slots;
    for (auto& sl : s.slots) slots.push_back(reinterpret_cast<T*>(sl.data()) + first);
    opt_.apply<T>(n, w, g, slots.data(), s.updates, lr, scale);
  }
  // g is a received payload: ZeroMQ gives no alignment, so a misaligned one is copied first.
  void apply(shard_state& s, std::uint64_t first, std::size_t n, const std::byte* g, double lr, double scale) {
    const std::size_t elem = wire::dtype_size(s.dt);
    if (reinterpret_cast<std::uintptr_t>(g) % elem != 0) {
      scratch_.resize((n * elem + 7) / 8);
      std::memcpy(scratch_.data(), g, n * elem);
      g = reinterpret_cast<const std::byte*>(scratch_.data());
    }
    if (s.dt == wire::dtype::f64) apply_typed(s, first, n, reinterpret_cast<const double*>(g), lr, scale);
    else apply_typed(s, first, n, reinterpret_cast<const float*>(g), lr, scale);
    ++stats_.updates;
    stamp_rows(s, first, n);
  }
  // Rows that elements [first, first + n) of the shard touch changed (row-sparse pulls).
  void stamp_rows(shard_state& s, std::uint64_t first, std::uint64_t n) {
    if (s.row_len == 0 || n == 0) return;
    ++s.stamp;
    for (std::uint64_t r = first / s.row_len; r <= (first + n - 1) / s.row_len; ++r) s.row_stamp[r] = s.stamp;
  }

  // A sparse-row gradient: only the rows named are updated, and only their optimizer state
  // moves (lazily, as TensorFlow's sparse apply ops and PyTorch's SparseAdam).
  void push_rows(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    auto& s = find(h);
    if (static_cast<wire::dtype>(h.dtype) != s.dt)
      throw error(prefix() + "push_rows of " + wire::dtype_name(static_cast<wire::dtype>(h.dtype)) + " to '" + s.name + "' (" + wire::dtype_name(s.dt) + ")");
    if (!s.ready) throw error(prefix() + "push_rows to '" + s.name + "' before the chief initialised it");
    ++stats_.pushes;
    const std::size_t elem = wire::dtype_size(s.dt), L = s.row_len, n = h.count;
    const std::uint64_t first_row = s.offset / L, rows = s.count / L;
    std::vector<std::uint64_t> local(n);
    for (std::size_t j = 0; j < n; ++j) {
      std::uint64_t r = 0;
      std::memcpy(&r, payload.data() + 8 * j, 8);
      if (r < first_row || r - first_row >= rows)
        throw error(prefix() + "push_rows: row " + std::to_string(r) + " of '" + s.name + "' is not in this server's rows [" +
                    std::to_string(first_row) + ", " + std::to_string(first_row + rows) + ")");
      local[j] = r - first_row;
    }
    const auto values = payload.subspan(8 * n);
    if (mode_ != mode::bsp) {
      const double scale = 1.0 / static_cast<double>(std::max(1, live_workers()));
      for (std::size_t j = 0; j < n; ++j) apply(s, local[j] * L, L, values.data() + j * L * elem, h.scalar, scale);
      ++s.updates;
    } else {
      if (late_push(rank, id, h, s)) return;
      auto& p = s.pending[h.clock];
      if (p.grads.empty()) {
        p.grads.resize(workers_.size());
        p.rows.resize(workers_.size());
        p.present.assign(workers_.size(), false);
        p.sparse = true;
      }
      if (!p.sparse) throw error(prefix() + "'" + s.name + "' step " + std::to_string(h.clock) + " mixes dense and sparse-row pushes");
      const auto r = static_cast<std::size_t>(rank);
      if (p.present[r]) throw error(prefix() + "worker " + std::to_string(rank) + " pushed rows of '" + s.name + "' twice in step " + std::to_string(h.clock));
      p.present[r] = true;
      p.rows[r] = std::move(local);
      p.grads[r].assign(values.begin(), values.end());
      if (rank == 0 || p.lr == 0) p.lr = h.scalar;
      p_done_[{h.key, h.clock}].push_back(rank);
      maybe_apply_bsp(s, h.key);
    }
    send(id, reply_header(h), std::span<const std::byte>{});
    serve_parked();
  }

  // bsp: a push for a step already applied. After a restart it is one the server skipped
  // (its update lost with the old process), resent by a rejoining worker: acknowledged and
  // dropped (true); otherwise an error.
  bool late_push(int rank, const std::string& id, const wire::header& h, const shard_state& s) {
    if (h.clock >= s.version) return false;
    if (!restoring_)
      throw error(prefix() + "worker " + std::to_string(rank) + " pushed '" + s.name + "' for step " + std::to_string(h.clock) +
                  " after step " + std::to_string(s.version - 1) + " was applied");
    ++stats_.stale_dropped;
    send(id, reply_header(h), std::span<const std::byte>{});
    return true;
  }

  // bsp, sparse: the rows any worker named, each the sum of the workers' rows in rank
  // order over the workers that pushed, applied in row order.
  template <class T>
  void sum_rows_in_rank_order(shard_state& s, pending_step& p) {
    const std::size_t L = s.row_len;
    std::map<std::uint64_t, std::vector<T>> acc;
    int n = 0;
    for (std::size_t r = 0; r < p.present.size(); ++r) {
      if (!p.present[r]) continue;
      ++n;
      for (std::size_t j = 0; j < p.rows[r].size(); ++j) {
        auto& a = acc[p.rows[r][j]];
        if (a.empty()) a.assign(L, T(0));
        T g[1];
        for (std::size_t e = 0; e < L; ++e) {
          std::memcpy(g, p.grads[r].data() + (j * L + e) * sizeof(T), sizeof(T));
          a[e] += g[0];
        }
      }
    }
    const T inv = n > 1 ? T(1) / static_cast<T>(n) : T(1);
    for (auto& [row, a] : acc) {
      if (n > 1)
        for (auto& v : a) v *= inv;
      apply_typed(s, row * L, L, a.data(), p.lr, 1.0);
      stamp_rows(s, row * L, L);
    }
    ++stats_.updates;
  }

  void push(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    auto& s = find(h);
    if (static_cast<wire::dtype>(h.dtype) != s.dt)
      throw error(prefix() + "push of " + wire::dtype_name(static_cast<wire::dtype>(h.dtype)) + " to '" + s.name + "' (" + wire::dtype_name(s.dt) + ")");
    if (!s.ready) throw error(prefix() + "push to '" + s.name + "' before the chief initialised it");
    ++stats_.pushes;
    const std::size_t elem = wire::dtype_size(s.dt);
    const std::uint64_t first = h.offset - s.offset;
    const double lr = h.scalar;
    if (mode_ != mode::bsp) {
      // 1/N of a step per push: the learning rate means the same in every mode. Adam's
      // step count advances per push.
      apply(s, first, h.count, payload.data(), lr, 1.0 / static_cast<double>(std::max(1, live_workers())));
      if (h.offset + h.count == s.offset + s.count) ++s.updates;
    } else {
      if (late_push(rank, id, h, s)) return;
      auto& p = s.pending[h.clock];
      if (p.grads.empty()) p.grads.resize(workers_.size());
      auto& g = p.grads[static_cast<std::size_t>(rank)];
      if (g.empty()) g.assign(s.count * elem, std::byte{0});  // pieces of one push add up to the shard
      std::memcpy(g.data() + first * elem, payload.data(), payload.size());
      if (rank == 0 || p.lr == 0) p.lr = lr;
      // A step is complete when every live worker's last piece has arrived: pieces come in
      // order on one connection, so the last one ends at the shard's end.
      if (h.offset + h.count == s.offset + s.count) {
        p_done_[{h.key, h.clock}].push_back(rank);
        maybe_apply_bsp(s, h.key);
      }
    }
    send(id, reply_header(h), std::span<const std::byte>{});
    serve_parked();
  }

  template <class T>
  void sum_in_rank_order(shard_state& s, pending_step& p) {
    std::vector<T> acc(s.count, T(0));
    int n = 0;
    for (std::size_t r = 0; r < p.grads.size(); ++r) {
      if (p.grads[r].empty()) continue;
      const T* g = reinterpret_cast<const T*>(p.grads[r].data());
      for (std::size_t i = 0; i < s.count; ++i) acc[i] += g[i];
      ++n;
    }
    if (n > 1) {
      const T inv = T(1) / static_cast<T>(n);
      for (auto& v : acc) v *= inv;
    }
    apply_typed(s, 0, s.count, acc.data(), p.lr, 1.0);
    ++stats_.updates;
    stamp_rows(s, 0, s.count);
  }

  void maybe_apply_bsp(shard_state& s, std::uint32_t key) {
    while (true) {
      const auto it = s.pending.find(s.version);
      if (it == s.pending.end()) return;
      auto& done = p_done_[{key, s.version}];
      int complete = 0;
      for (std::size_t r = 0; r < workers_.size(); ++r)
        if (!workers_[r].left && std::find(done.begin(), done.end(), static_cast<int>(r)) != done.end()) ++complete;
      if (complete < live_workers()) return;
      if (it->second.sparse) {
        if (s.dt == wire::dtype::f64) sum_rows_in_rank_order<double>(s, it->second);
        else sum_rows_in_rank_order<float>(s, it->second);
      } else if (s.dt == wire::dtype::f64) {
        sum_in_rank_order<double>(s, it->second);
      } else {
        sum_in_rank_order<float>(s, it->second);
      }
      ++s.updates;
      p_done_.erase({key, s.version});
      s.pending.erase(it);
      ++s.version;
    }
  }

  // Whether a pull may be answered now, and the clock its values are known to include.
  bool pull_ready(const shard_state& s, const wire::header& h) const {
    if (!s.ready) return false;
    switch (mode_) {
      case mode::async: return true;
      case mode::bsp: return s.version >= h.clock;
      case mode::ssp: return h.clock <= staleness_ || min_clock() >= h.clock - staleness_;
    }
    return true;
  }

  void pull(int, const std::string& id, const wire::header& h) {
    auto& s = find(h);
    ++stats_.pulls;
    if (!pull_ready(s, h)) {
      parked_.push_back({id, h});
      return;
    }
    answer_pull(s, id, h);
  }

  // The whole shard: values, then each optimizer state tensor; scalar = optimizer steps
  // applied (Adam's t), clock = steps applied (bsp). Consistent when the workers stand
  // still between two barriers (data_parallel_step::pull_state).
  void snapshot(int, const std::string& id, const wire::header& h) {
    auto& s = find(h);
    if (!s.ready) throw error(prefix() + "a snapshot of '" + s.name + "' before the chief initialised it");
    // elements [h.offset, h.offset + h.count) of the shard (a chunk), then of each state tensor
    const std::size_t elem = wire::dtype_size(s.dt);
    const auto from = static_cast<std::ptrdiff_t>((h.offset - s.offset) * elem), to = from + static_cast<std::ptrdiff_t>(h.count * elem);
    std::vector<std::byte> out(s.values.begin() + from, s.values.begin() + to);
    for (const auto& sl : s.slots) out.insert(out.end(), sl.begin() + from, sl.begin() + to);
    auto r = reply_header(h);
    r.dtype = static_cast<std::uint8_t>(s.dt);
    r.count = h.count;
    r.scalar = static_cast<double>(s.updates);
    r.clock = s.version;
    send(id, r, std::span<const std::byte>(out));
  }

  void answer_pull(const shard_state& s, const std::string& id, const wire::header& h) {
    const std::size_t elem = wire::dtype_size(s.dt);
    if (static_cast<wire::type>(h.type) == wire::type::pull_rows) {  // the rows changed since stamp h.count
      const std::size_t L = s.row_len;
      std::vector<std::uint64_t> rows;
      for (std::uint64_t r = 0; r < s.row_stamp.size(); ++r)
        if (s.row_stamp[r] > h.count) rows.push_back(r);
      std::vector<std::byte> out(rows.size() * (8 + L * elem));
      const std::uint64_t first_row = s.offset / L;
      for (std::size_t j = 0; j < rows.size(); ++j) {
        const std::uint64_t global = first_row + rows[j];
        std::memcpy(out.data() + 8 * j, &global, 8);
        std::memcpy(out.data() + 8 * rows.size() + j * L * elem, s.values.data() + rows[j] * L * elem, L * elem);
      }
      auto r = reply_header(h);
      r.dtype = static_cast<std::uint8_t>(s.dt);
      r.offset = L;
      r.count = rows.size();
      r.scalar = static_cast<double>(s.stamp);
      send(id, r, std::span<const std::byte>(out));
      return;
    }
    auto r = reply_header(h);
    r.dtype = static_cast<std::uint8_t>(s.dt);
    r.count = h.count;
    r.scalar = static_cast<double>(mode_ == mode::bsp ? s.version : min_clock());
    send(id, r, std::span<const std::byte>(s.values.data() + (h.offset - s.offset) * elem, h.count * elem));
  }

  void serve_parked() {
    for (std::size_t i = 0; i < parked_.size();) {
      const auto it = shards_.find(parked_[i].h.key);
      if (it != shards_.end() && pull_ready(it->second, parked_[i].h)) {
        answer_pull(it->second, parked_[i].id, parked_[i].h);
        parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }

  void clock(int rank, const wire::header& h) {
    auto& w = workers_[static_cast<std::size_t>(rank)];
    if (h.clock < w.clock) throw error(prefix() + "worker " + std::to_string(rank) + "'s clock went back from " + std::to_string(w.clock) + " to " + std::to_string(h.clock));
    w.clock = h.clock;
    serve_parked();
  }

  // Collectives through server 0: every worker's contribution to collective number
  // h.clock, combined in rank order once all are in.
  void coll(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
    if (const auto f = failed_colls_.find(h.clock); f != failed_colls_.end()) {
      send(id, fail_header(h), std::string_view(f->second));  // a late arrival at a collective that failed
      return;
    }
    auto& c = colls_[h.clock];
    if (c.ids.empty()) {
      c.first = h;
      c.parts.resize(workers_.size());
      c.ids.resize(workers_.size());
      c.req_ids.resize(workers_.size());
      c.in.assign(workers_.size(), false);
    }
    const auto op_name = [](const wire::header& x) {
      static const char* names[] = {"?", "allreduce_sum", "allreduce_average", "broadcast", "barrier"};
      return std::string(names[x.key]) + " of " + std::to_string(x.count) + " " + wire::dtype_name(static_cast<wire::dtype>(x.dtype)) +
             (x.key == 3 ? " from rank " + std::to_string(x.offset) : "");
    };
    if (h.key != c.first.key || h.dtype != c.first.dtype || h.count != c.first.count || (h.key == 3 && h.offset != c.first.offset)) {
      const std::string text = prefix() + "collective #" + std::to_string(h.clock) + ": worker " + std::to_string(rank) + " calls " + op_name(h) +
                               " but worker " + std::to_string(c.first.rank) + " called " + op_name(c.first) +
                               ": every worker must call the same collectives in the same order with the same sizes";
      for (std::size_t r = 0; r < c.ids.size(); ++r)
        if (c.in[r]) send(c.ids[r], c.to(r, true), std::string_view(text));
      send(id, fail_header(h), std::string_view(text));
      failed_colls_[h.clock] = text;
      colls_.erase(h.clock);
      return;
    }
    if (c.in[static_cast<std::size_t>(rank)]) throw error(prefix() + "worker " + std::to_string(rank) + " entered collective #" + std::to_string(h.clock) + " twice");
    const auto op = static_cast<wire::coll_op>(h.key);
    if ((op == wire::coll_op::sum || op == wire::coll_op::average) && h.dtype != static_cast<std::uint8_t>(wire::dtype::f32) &&
        h.dtype != static_cast<std::uint8_t>(wire::dtype::f64))
      throw error(prefix() + "a sum of " + wire::dtype_name(static_cast<wire::dtype>(h.dtype)) + " (float32 or float64 only)");
    c.in[static_cast<std::size_t>(rank)] = true;
    c.ids[static_cast<std::size_t>(rank)] = id;
    c.req_ids[static_cast<std::size_t>(rank)] = h.id;
    c.parts[static_cast<std::size_t>(rank)].assign(payload.begin(), payload.end());
    ++c.got;
    finish_collective(h.clock);
  }

  // Completes collective `seq` once every live worker is in (dead ones are not waited for).
  void finish_collective(std::uint64_t seq) {
    auto& c = colls_.at(seq);
    for (std::size_t r = 0; r < workers_.size(); ++r)
      if (!workers_[r].left && !c.in[r]) return;
    ++stats_.collectives;
    std::vector<std::byte> result;
    const auto op = static_cast<wire::coll_op>(c.first.key);
    if (op == wire::coll_op::broadcast) {
      if (c.first.offset >= workers_.size() || !c.in[c.first.offset]) {
        const std::string text = prefix() + "broadcast from worker " + std::to_string(c.first.offset) + ", which is gone";
        for (std::size_t k = 0; k < c.ids.size(); ++k)
          if (c.in[k]) send(c.ids[k], c.to(k, true), std::string_view(text));
        colls_.erase(seq);
        return;
      }
      result = c.parts[c.first.offset];
    } else if (op != wire::coll_op::barrier) {
      result = combine(c, op);
    }
    for (std::size_t k = 0; k < c.ids.size(); ++k) {
      if (!c.in[k]) continue;
      auto r = c.to(k, false);
      r.dtype = c.first.dtype;
      r.count = c.first.count;
      send(c.ids[k], r, std::span<const std::byte>(result));
    }
    colls_.erase(seq);
  }

  template <class T>
  static void combine_typed(collective& c, wire::coll_op op, std::vector<std::byte>& out) {
    const std::size_t n = c.first.count;
    std::vector<T> acc(n, T(0));
    std::size_t in = 0;
    for (std::size_t r = 0; r < c.parts.size(); ++r) {
      if (!c.in[r]) continue;
      const T* x = reinterpret_cast<const T*>(c.parts[r].data());
      for (std::size_t i = 0; i < n; ++i) acc[i] += x[i];
      ++in;
    }
    if (op == wire::coll_op::average)
      for (auto& v : acc) v /= static_cast<T>(in);
    out.resize(n * sizeof(T));
    std::memcpy(out.data(), acc.data(), out.size());
  }
  static std::vector<std::byte> combine(collective& c, wire::coll_op op) {
    std::vector<std::byte> out;
    switch (static_cast<wire::dtype>(c.first.dtype)) {
      case wire::dtype::f32: combine_typed<float>(c, op, out); break;
      case wire::dtype::f64: combine_typed<double>(c, op, out); break;
      default: throw error("gradus: parameter server: a sum of " + std::string(wire::dtype_name(static_cast<wire::dtype>(c.first.dtype))));
    }
    return out;
  }

  void monitor_events() {
    for (int budget = 0; budget < 256; ++budget) {
      const auto ev = mon_.next();
      if (!ev) return;
      const std::uint16_t event = ev->id;
      const std::uint32_t value = ev->value;
      if (std::getenv("GRADUS_PS_DEBUG")) o_.log(prefix() + "event " + std::to_string(event) + " fd " + std::to_string(value));
      if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && zap_)
        for (const auto& r : zap_->take_new_refusals())
          o_.log(prefix() + "refused a client at " + r.address + " (" + r.mechanism + " key " + r.public_key + "): " + r.reason);
      if (event != ZMQ_EVENT_DISCONNECTED) continue;
      for (std::size_t r = 0; r < workers_.size(); ++r)
        if (workers_[r].joined && !workers_[r].left && workers_[r].fd == static_cast<int>(value))
          worker_lost(static_cast<int>(r));
    }
  }

  // A worker's connection closed without a goodbye: it died, or its heartbeats stopped.
  void worker_lost(int r) {
    auto& w = workers_[static_cast<std::size_t>(r)];
    w.left = w.dead = true;
    const std::string who = "worker " + std::to_string(r) + (w.peer_address.empty() ? "" : " (" + w.peer_address + ")");
    if (mode_ == mode::bsp && !o_.bsp_continue_without_dead) {
      job_failed_ = prefix() + who + " was lost at clock " + std::to_string(w.clock) +
                    " (its connection closed: the process died, or it answered no heartbeat for " +
                    std::to_string(o_.heartbeat_timeout.count()) + " ms); bsp cannot finish a step without it";
      o_.log(job_failed_);
      for (const auto& p : parked_) send(p.id, fail_header(p.h), std::string_view(job_failed_));
      for (const auto& p : parked_inits_) send(p.id, fail_header(p.h), std::string_view(job_failed_));
      parked_.clear();
      parked_inits_.clear();
      for (auto& [seq, c] : colls_)
        for (std::size_t k = 0; k < c.ids.size(); ++k)
          if (c.in[k]) send(c.ids[k], c.to(k, true), std::string_view(job_failed_));
      colls_.clear();
      return;
    }
    o_.log(prefix() + who + " was lost at clock " + std::to_string(w.clock) + "; " + std::to_string(live_workers()) +
           " workers go on without it (" + mode_name(mode_) + ")");
    ++stats_.workers_lost;
    for (auto& [key, sh] : shards_) maybe_apply_bsp(sh, key);
    std::vector<std::uint64_t> seqs;
    for (const auto& [seq, c] : colls_) seqs.push_back(seq);
    for (const auto seq : seqs) finish_collective(seq);
    serve_parked();
    if (std::all_of(workers_.begin(), workers_.end(), [](const worker& x) { return x.left; })) done_ = true;
  }

  server_options o_;
  zmq::socket_t sock_;
  net::socket_monitor mon_;  // after sock_: destroyed first
  std::string bound_;
  std::string job_failed_;  // bsp: a worker was lost; every later request fails with this
  int last_fd_ = -1;
  std::optional<int> last_auth_;  // the rank the last message's CURVE key may act as
  std::shared_ptr<zap_handler> zap_;
  std::string last_peer_;
  bool done_ = false, configured_ = false;
  bool restoring_ = false;   // a restarted server whose workers rejoin (its shards come from the checkpoint)
  std::uint64_t floor_ = 0;  // the latest step a rejoining worker was at
  std::atomic<bool> stop_{false};
  std::optional<std::chrono::steady_clock::time_point> shutdown_at_;
  mode mode_ = mode::bsp;
  std::uint64_t staleness_ = 0;
  server_optimizer opt_;
  std::string opt_name_;
  std::map<std::string, std::string> settings_;
  std::vector<worker> workers_;
  std::map<std::uint32_t, shard_state> shards_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<int>> p_done_;
  std::vector<parked> parked_, parked_inits_;
  std::vector<std::uint64_t> scratch_;  // an aligned copy of a misaligned payload
  std::map<std::uint64_t, collective> colls_;
  std::map<std::uint64_t, std::string> failed_colls_;
  server_stats stats_;
};

}  // namespace gradus::ps
