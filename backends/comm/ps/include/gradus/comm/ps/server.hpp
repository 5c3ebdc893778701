#pragma once
// A parameter server task: holds shards of the variables, applies the workers' gradients
// with the server-side optimizer, answers pulls when the consistency mode allows, and runs
// the workers' small collectives (server 0). One thread: it polls its ROUTER socket and
// handles each message to the end (no hand-off to another thread, unlike ps-lite's
// Van -> Customer hop). It never needs the model's types: shards are declared by the
// workers (name, element range, dtype) and the optimizer by its name and settings.
//
// Its optimizer runs on a compute policy the program names (Compute; ps::serve<Backend>):
// the server calls Compute::for_each through the optimizer's rule and Compute::set_threads
// for its update passes, and includes no compute backend itself (the program links the
// one it names).
//
//   gradus::ps::serve<Backend>(cluster::from_env());   // in a program whose role is "ps"
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
// without it (it leaves the staleness clock, collectives count the survivors), and take
// its restart back (server_rejoin.hpp): the new process says hello as a restart, waits at
// server 0 for the workers' next join point (a barrier at the end of an epoch), and comes
// back there at their clock.
// GRADUS_PS_DEBUG=1 in the environment logs each worker's connection and every closed one.
//
// The class and its state are here; its member functions, grouped by what they do, are in
// the server_*.hpp files included at the end.
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradus/comm/net/address.hpp"
#include "gradus/comm/net/curve.hpp"
#include "gradus/comm/net/heartbeat.hpp"
#include "gradus/comm/net/socket_monitor.hpp"
#include "gradus/comm/ps/curve_config.hpp"
#include "gradus/comm/ps/server_optimizer.hpp"
#include "gradus/comm/ps/server_options.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ps {

/// One parameter-server task: holds its shards of the variables, applies the workers'
/// gradients with the optimizer they name (on the compute policy `Compute`, e.g.
/// gradus::cpu_simd), answers pulls as the consistency mode allows, and runs the workers'
/// collectives (server 0). One thread serves it, in run(); ps::serve is the usual entry
/// point, which makes one from a cluster spec and turns a failed job into an exception.
/// The top of this header says what each mode guarantees and what happens when a worker is
/// lost.
template <class Compute>
class server {
 public:
  /// Binds `o.address` in `ctx` (a ROUTER socket; every address a name resolves to), with
  /// CURVE and its ZAP handler when `o.curve` is set. Throws gradus::comm_error when a name
  /// cannot be resolved or an endpoint bound, and gradus::error for an address without a
  /// port, a libzmq without CURVE, or a context whose ZAP handler has another allow-list.
  /// Serves nothing until run().
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
  ~server() = default;  ///< mon_ stops before sock_ closes (net/socket_monitor.hpp)

  /// The endpoint actually bound (with the port the system chose for ":0").
  const std::string& endpoint() const { return bound_; }
  /// The counters; their fields are atomics, readable from another thread while run() serves.
  const server_stats& stats() const { return stats_; }
  /// Makes run() return within its poll interval (100 ms), from any thread: what a killed
  /// process looks like to the workers once the server is destroyed (tests).
  void stop() { stop_.store(true); }

  /// Why the job this server served failed, or nothing when it succeeded: a bsp worker lost,
  /// a worker or the chief that said goodbye after a failure of its own, or a job that ended
  /// without the chief's shutdown (every worker lost, or nothing heard for idle_exit). After
  /// run(); ps::serve throws it, so that a failed job's servers fail too. A stop() is no verdict.
  std::optional<std::string> job_failure() const {
    if (!job_failed_.empty()) return job_failed_;
    if (!failed_leaving_.empty()) return failed_leaving_;
    if (shutdown_at_ || stop_.load()) return std::nullopt;
    std::string lost;
    for (std::size_t r = 0; r < workers_.size(); ++r)
      if (workers_[r].dead) lost += (lost.empty() ? "" : ", ") + std::to_string(r);
    return prefix() + "the job ended without the chief's shutdown (" +
           (!ended_how_.empty() ? ended_how_ : lost.empty() ? "every worker left" : "worker(s) " + lost + " lost") +
           "): it failed";
  }

  /// Whether job_failure() comes from a goodbye a worker or the chief sent after its own failure.
  bool worker_failed() const { return job_failed_.empty() && !failed_leaving_.empty(); }

  /// Serves until shutdown, or until every worker that said hello has said bye.
  void run() {
    Compute::set_threads(std::max(1, o_.threads));  // this thread's passes only
    auto last_heard = std::chrono::steady_clock::now();
    while (!done_ && !stop_.load()) {
      zmq::pollitem_t items[2] = {{sock_.handle(), 0, ZMQ_POLLIN, 0}, mon_.poll_item()};
      zmq::poll(items, 2, std::chrono::milliseconds(100));
      if (items[1].revents & ZMQ_POLLIN) monitor_events();
      const bool heard = (items[0].revents & ZMQ_POLLIN) != 0;
      if (heard) {
        last_heard = std::chrono::steady_clock::now();
        while (!done_ && receive_one()) {
        }
      }
      check_joins();
      if (failed_job_over()) {
        o_.log(prefix() + "every worker that joined has left the failed job; stopping");
        return;
      }
      if (heard) continue;
      if (shutdown_at_ && std::chrono::steady_clock::now() > *shutdown_at_) {
        o_.log(prefix() + "the chief ended the job 10 s ago and not every worker has said goodbye; stopping");
        return;
      }
      if (o_.idle_exit.count() > 0 && std::chrono::steady_clock::now() - last_heard > o_.idle_exit) {
        ended_how_ = "nothing heard for " + std::to_string(o_.idle_exit.count()) + " ms";
        o_.log(prefix() + ended_how_ + "; stopping");
        return;
      }
    }
  }

 private:
  struct worker {
    std::string id;  // ZeroMQ routing id
    std::uint64_t clock = 0;
    bool joined = false, left = false, dead = false;
    bool reviving = false;     // a restart of a lost worker, said hello, not yet taken back (left, dead)
    int fd = -1;               // its connection (ZMQ_SRCFD), to recognise its DISCONNECTED
    std::string peer_address;  // where it connects from ("Peer-Address"), for messages
  };
  struct pending_step {
    std::vector<std::vector<std::byte>> grads;  ///< per rank (sparse: its rows' values)
    double lr = 0;
    bool sparse = false;                         ///< pushed as rows
    std::vector<std::vector<std::uint64_t>> rows;  ///< sparse: per rank, its rows (of the shard)
    std::vector<bool> present;                   ///< sparse: the ranks that pushed (maybe no rows)
  };
  struct shard_state {
    std::string name;
    element_type dt = element_type::none;
    std::uint64_t offset = 0, count = 0, total = 0;
    std::vector<std::byte> values;
    std::vector<std::vector<std::byte>> slots;
    std::int64_t updates = 0;   ///< optimizer steps applied (Adam's t - 1)
    std::uint64_t version = 0;  ///< bsp: steps applied
    bool ready = false;         ///< the chief's values have arrived
    std::map<std::uint64_t, pending_step> pending;
    /// sparse rows, once a row message named the row length: each row's last update
    std::uint64_t row_len = 0;
    std::vector<std::uint64_t> row_stamp;
    std::uint64_t stamp = 0;  ///< updates applied to rows so far
    std::set<std::uint64_t> chunks_in;  ///< the chief's first values arriving in chunks (init_values): their offsets
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
    std::vector<std::uint64_t> req_ids;  ///< each worker's request id: its answer echoes it
    std::vector<bool> in;
    int got = 0;
    /// the answer (or failure) to worker k: its own request id
    wire::header to(std::size_t k, bool failed) const {
      auto h = wire::make(failed ? wire::type::fail : wire::type::reply, first.key, first.offset, 0, element_type::none);
      h.clock = first.clock;
      h.id = req_ids[k];
      h.rank = static_cast<std::int32_t>(k);
      return h;
    }
  };

  std::string prefix() const { return "gradus: parameter server " + std::to_string(o_.index) + ": "; }

  /// ---- server_messages.hpp: a message in, its sender, its handler, the answer out
  bool receive_one();
  void note_malformed(const std::string& why);
  static wire::header reply_header(const wire::header& req);
  static wire::header fail_header(const wire::header& req);
  void send(const std::string& id, wire::header h, std::string_view text);
  void send(const std::string& id, wire::header h, std::span<const std::byte> payload);
  int sender(const std::string& id, const wire::header& h);
  void handle(const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  shard_state& find(const wire::header& h);
  /// ---- server_setup.hpp: hello, the optimizer's config, shards declared, initialised or restored
  void hello(const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  void config(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  void init(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  static void became_ready(shard_state& s, std::uint64_t start);
  void init_values(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  void answer_parked_inits();
  void restore_shard(shard_state& s);
  void raise_floor(std::uint64_t c);
  /// ---- server_consistency.hpp: pushes applied and pulls answered as the mode allows
  int live_workers() const;
  std::uint64_t min_clock() const;
  template <class T>
  void apply_typed(shard_state& s, std::uint64_t first, std::size_t n, const T* g, double lr, double scale);
  void apply(shard_state& s, std::uint64_t first, std::size_t n, const std::byte* g, double lr, double scale);
  bool late_push(int rank, const std::string& id, const wire::header& h, const shard_state& s);
  void push(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  template <class T>
  void sum_in_rank_order(shard_state& s, pending_step& p);
  void maybe_apply_bsp(shard_state& s, std::uint32_t key);
  bool pull_ready(const shard_state& s, const wire::header& h) const;
  void pull(int, const std::string& id, const wire::header& h);
  void snapshot(int, const std::string& id, const wire::header& h);
  void answer_pull(const shard_state& s, const std::string& id, const wire::header& h);
  void serve_parked();
  void clock(int rank, const wire::header& h);
  /// ---- server_rows.hpp: sparse rows
  void stamp_rows(shard_state& s, std::uint64_t first, std::uint64_t n);
  void push_rows(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  template <class T>
  void sum_rows_in_rank_order(shard_state& s, pending_step& p);
  /// ---- server_collectives.hpp: the workers' collectives (server 0)
  void coll(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload);
  void finish_collective(std::uint64_t seq);
  template <class T>
  static void combine_typed(collective& c, wire::coll_op op, std::vector<std::byte>& out);
  static std::vector<std::byte> combine(collective& c, wire::coll_op op);
  /// ---- server_rejoin.hpp: a lost worker's restart taken back at a join point
  void revive(int rank, const std::string& id);
  void join(int rank, const std::string& id, const wire::header& h);
  void admit(int rank, std::uint64_t clock);
  std::vector<std::byte> admit_waiting(std::uint64_t seq);
  void end_waiting_joins(const std::string& failure);
  bool every_worker_gone() const;
  std::string no_one_to_rejoin() const;
  void after_a_worker_left();
  /// ---- server_worker_loss.hpp: connections that closed, workers lost
  void monitor_events();
  void worker_lost(int r);
  void fail_job(const std::string& why);
  void check_joins();  ///< server_setup.hpp: a fresh job's ranks not joined by join_timeout fail it
  /// A failed job (fail_job) whose joined workers have all left, by goodbye or lost: nothing
  /// more will come (a worker refused at its hello never joins, and says no goodbye).
  bool failed_job_over() const {
    return !job_failed_.empty() && std::all_of(workers_.begin(), workers_.end(), [](const worker& w) { return !w.joined || w.left; });
  }

  server_options o_;
  zmq::socket_t sock_;
  net::socket_monitor mon_;  ///< after sock_: destroyed first
  std::string bound_;
  std::string job_failed_;  ///< bsp: a worker was lost; every later request fails with this
  std::string failed_leaving_;  ///< the first goodbye that came after a failure (job_failure)
  std::string ended_how_;       ///< run() stopped by idle_exit (job_failure)
  int last_fd_ = -1;
  std::optional<int> last_auth_;  ///< the rank the last message's CURVE key may act as
  std::shared_ptr<zap_handler> zap_;
  std::string last_peer_;
  bool done_ = false, configured_ = false;
  std::optional<std::chrono::steady_clock::time_point> first_hello_;  ///< of a fresh job (check_joins)
  bool restoring_ = false;   ///< a restarted server whose workers rejoin (its shards come from the checkpoint)
  std::uint64_t floor_ = 0;  ///< the latest step a rejoining worker was at
  std::atomic<bool> stop_{false};
  std::optional<std::chrono::steady_clock::time_point> shutdown_at_;
  mode mode_ = mode::bsp;
  std::uint64_t staleness_ = 0;
  any_optimizer opt_;
  std::string opt_name_;
  std::map<std::string, std::string> settings_;
  std::vector<worker> workers_;
  std::map<std::uint32_t, shard_state> shards_;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<int>> p_done_;
  std::vector<parked> parked_, parked_inits_;
  std::vector<parked> parked_joins_;  ///< server 0: restarted workers waiting for the next join point
  std::vector<std::uint64_t> scratch_;  ///< an aligned copy of a misaligned payload
  std::map<std::uint64_t, collective> colls_;
  std::map<std::uint64_t, std::string> failed_colls_;
  server_stats stats_;
  std::vector<std::byte> widened_;  ///< a half-width push widened to float32 (push)
};

}  // namespace gradus::ps

#include "gradus/comm/ps/server_messages.hpp"
#include "gradus/comm/ps/server_setup.hpp"
#include "gradus/comm/ps/server_consistency.hpp"
#include "gradus/comm/ps/server_rows.hpp"
#include "gradus/comm/ps/server_collectives.hpp"
#include "gradus/comm/ps/server_worker_loss.hpp"
#include "gradus/comm/ps/server_rejoin.hpp"
