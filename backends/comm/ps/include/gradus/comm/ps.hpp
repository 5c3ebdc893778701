#pragma once
// gradus::parameter_server<Mode>: the parameter-server communicator policy over ZeroMQ.
// `ps` tasks hold the variables (sharded: balanced_by_bytes, or any partitioner), workers
// push each gradient as it is final and pull the variables back; the servers' optimizer
// applies the updates. A key-value store (parallel/key_value_store.hpp) with collectives
// through server 0; plugs into the trainer, parallel::minimize and any_communicator like the
// ring:
//
//   auto comm = gradus::parameter_server<gradus::ps_ssp<4>>(cluster::from_env());
//   auto step = parallel::minimize(comm, {}, s, loss, adam{...}, w, b);
//
// and a ps process serves with gradus::ps::serve<gradus::cpu_simd>(cluster::from_env()) (the
// compute policy that applies the optimizer: ps/server.hpp).
//
// Mode: ps_async, ps_bsp, ps_ssp<S>, or ps_dynamic (the default: the mode comes from
// ps_options::consistency, for a program's --consistency option): ps/options.hpp. See
// server.hpp for what each mode guarantees.
//
// Client: push_async / pull_async / push_pull return a handle to wait() on (ps-lite's
// timestamps); payloads go in chunks of ps_options::chunk_bytes (1 MiB: raw ZeroMQ moves
// 1 MiB messages faster than large ones), chunks of 64 KiB and more zero-copy (the caller
// keeps the bytes unchanged until the handle completes). Every wait has a deadline and
// its error names the server, its address and the operation. Collectives (allreduce,
// broadcast, barrier: the trainer's fingerprint and agreement checks) run through server 0,
// and so does the join point where a lost worker's restart comes back (restarted(),
// rejoin_job(), join_point(): ps/server_rejoin.hpp says how).
// The worker's links to its servers (connect, send, wait, rejoin) are ps/client_links.hpp;
// its modes and options ps/options.hpp. What is left here (about 740 lines with its doc comments) is one concept:
// the worker's API, and the variable table and request bookkeeping it keeps for it (its
// goodbye included, which tells the servers whether it leaves after a failure), plus
// ps::serve, the server's entry point that turns the job's verdict into an exit status.
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <unistd.h>

#include "gradus/comm/net/heartbeat.hpp"
#include "gradus/comm/net/socket_monitor.hpp"
#include "gradus/comm/net/zero_copy.hpp"
#include "gradus/comm/ps/options.hpp"
#include "gradus/comm/ps/partition.hpp"
#include "gradus/comm/ps/server.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/half_wire.hpp"
#include "gradus/parallel/communicator.hpp"

namespace gradus {

/// A worker's communicator for parameter servers over ZeroMQ (target gradus::ps;
/// `<gradus/comm/ps.hpp>`): a key-value store (parallel::parameter_server_policy) whose
/// variables live, sharded, on the job's ps tasks, which apply the optimizer to the pushed
/// gradients; plus collectives through server 0. `Mode` is the consistency: ps_async,
/// ps_bsp, `ps_ssp<S>`, or ps_dynamic (the default: ps_options::consistency at run time).
///
/// Every variable is declared (initialize) in the same order on every worker before the
/// first push or pull; payloads move in chunks of ps_options::chunk_bytes, those of 64 KiB
/// and more zero-copy (the caller keeps the bytes unchanged until the handle completes).
/// Every wait has a deadline (ps_options::timeout); its gradus::comm_error names the server,
/// its address and the operation, and leaves the communicator unusable. A server that
/// restarts is rejoined (ps_options::reconnect_timeout). One thread at a time.
///
/// ```
/// auto comm = gradus::parameter_server<gradus::ps_ssp<4>>(gradus::cluster::from_env());
/// auto step = gradus::parallel::minimize(comm, {}, s, loss, gradus::adam{.lr = 1e-3}, w, b);
/// ```
template <class Mode = ps_dynamic>
class parameter_server {
 public:
  /// The communicator's name in messages and in the type-erased holders.
  static constexpr const char* name = "parameter_server";

  /// The requests one asynchronous call posted, to wait() on.
  struct handle {
    /// \var first
    /// The id of the first request posted.
    /// \var last
    /// One past the id of the last request posted: the requests are [first, last).
    std::uint64_t first = 0, last = 0;
  };
  /// What this worker has done so far (stats()).
  struct client_stats {
    /// \var pushes
    /// Push calls (push, push_async, push_pull, push_rows), each counted once whatever its chunks.
    /// \var pulls
    /// Pull calls (pull, pull_async, push_pull, pull_rows), each counted once.
    /// \var bytes_pushed
    /// Gradient bytes sent (for push_rows with their 8-byte row indices).
    /// \var bytes_pulled
    /// Variable bytes asked for by dense pulls, plus the bytes of the rows pull_rows received.
    std::uint64_t pushes = 0, pulls = 0, bytes_pushed = 0, bytes_pulled = 0;
    std::uint64_t max_staleness = 0;  ///< ssp/bsp: the largest clock - (clock the values were known to include)
    double wait_seconds = 0;  ///< seconds spent in wait() (so in pull and pull_rows too)
    std::uint64_t rejoins = 0;  ///< servers this worker rejoined after they restarted
    bool rejoined_job = false;  ///< this process took a lost worker's place (rejoin_job)
  };

  /// Connects to every server in `o.servers` and says hello, waiting for their answers
  /// (ZeroMQ retries, so the servers may start after the workers). Throws gradus::error for
  /// options that are wrong (no servers, a rank outside the world, chunk_bytes below 64) or
  /// a hello the servers refuse, and gradus::comm_error when a server does not answer within
  /// `o.timeout`.
  explicit parameter_server(ps_options o) : o_(std::move(o)) { connect(); }
  /// From a cluster spec (cluster::from_env): the servers are its ps tasks.
  template <class Spec>
    requires requires(const Spec& c) { c.ps; c.rank; c.world_size; }
  explicit parameter_server(const Spec& c, ps_options o = {}) : o_(std::move(o)) {
    if (o_.servers.empty()) o_.servers = c.ps;
    o_.rank = c.rank;
    o_.world_size = c.world_size;
    if (!o_.curve) o_.curve = ps::curve_client_from_env(c.rank);
    if (o_.origin.empty()) o_.origin = c.source == "TF_CONFIG" ? "TF_CONFIG cluster.ps" : "GRADUS_PS";
    // a restart of this process alone takes a lost worker's place; a restart of the whole job
    // (GRADUS_RESTART_SCOPE=job: every process started again) is a fresh start
    if (const char* n = std::getenv("GRADUS_RESTART_COUNT"); n && std::atoi(n) > 0) {
      const char* scope = std::getenv("GRADUS_RESTART_SCOPE");
      o_.restarted = !scope || std::string_view(scope) != "job";
    }
    if (!c.is_worker()) throw error("gradus: parameter_server: this process is a '" + c.task_type + "' task, not a worker (a ps task serves: ps::serve)");
    connect();
  }
  parameter_server(const parameter_server&) = delete;
  parameter_server& operator=(const parameter_server&) = delete;

  ~parameter_server() {
    try {
      {
        // say goodbye (and, from the chief, end the job), briefly; after a failure too, so
        // that the servers do not wait for this worker
        broken_ = false;
        closing_ = true;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(broken_text_.empty() ? 5 : 2);
        std::vector<std::uint64_t> ids;
        const bool failed = !broken_text_.empty() || std::uncaught_exceptions() > 0;
        for (std::size_t k = 0; k < socks_.size(); ++k) {
          auto h = ps::wire::make(o_.rank == 0 && shutdown_on_exit_ ? ps::wire::type::shutdown : ps::wire::type::bye,
                                  failed ? ps::wire::leaving_failed : ps::wire::leaving_ok);
          ids.push_back(request(static_cast<int>(k), h, {}, req_kind::ack));
        }
        for (const auto id : ids) wait_id(id, until, "goodbye", /*throw_on_error=*/false);
      }
    } catch (...) {
    }
    mons_.clear();  // before the sockets they watch (net/socket_monitor.hpp)
    for (auto& sock : socks_) {
      try {
        sock.set(zmq::sockopt::linger, 0);
      } catch (const zmq::error_t&) {  // a destructor must not throw: that socket keeps its linger
      }
    }
    socks_.clear();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!flags_.empty() && std::chrono::steady_clock::now() < until) {
      prune_flags();
      if (!flags_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  /// This worker's rank, 0 ... world_size() - 1 (0: the chief).
  int rank() const { return o_.rank; }
  /// How many workers the job has.
  int world_size() const { return o_.world_size; }
  /// The consistency mode in use (Mode's, or ps_options::consistency with ps_dynamic).
  ps::mode consistency() const { return mode_; }
  /// The ssp staleness bound in steps; 0 for async and bsp.
  int staleness() const { return staleness_; }
  /// How many ps tasks hold the variables.
  int servers() const { return static_cast<int>(o_.servers.size()); }
  /// This worker's counters so far.
  const client_stats& stats() const { return stats_; }
  /// This worker's step count: step_done() calls so far, from the step a resumed
  /// initialize() or rejoin_job() started it at. Pushes and pulls carry it.
  std::uint64_t clock() const { return clock_; }
  /// Whether the chief's destructor ends the servers' run (default true; false keeps them
  /// serving for another client, as tests do).
  void set_shutdown_on_exit(bool v) { shutdown_on_exit_ = v; }

  // ---- collectives, through server 0 ----
  /// x <- the elementwise sum of every live worker's x (float or double), summed by server 0;
  /// in pieces of chunk_bytes. Every worker calls it, in the same order.
  template <class T>
  void allreduce_sum(std::span<T> x) {
    collective(ps::wire::coll_op::sum, std::as_writable_bytes(x), parallel::element_of<T>, x.size(), 0);
  }
  /// x <- the sum divided by the number of workers that took part, as allreduce_sum.
  template <class T>
  void allreduce_average(std::span<T> x) {
    collective(ps::wire::coll_op::average, std::as_writable_bytes(x), parallel::element_of<T>, x.size(), 0);
  }
  /// x <- worker `root`'s x, through server 0. A root outside the world throws
  /// gradus::error; a root that is gone fails the collective on every worker.
  template <class T>
  void broadcast(std::span<T> x, int root) {
    if (root < 0 || root >= o_.world_size)
      throw error("gradus: parameter_server: broadcast from rank " + std::to_string(root) + " of " + std::to_string(o_.world_size));
    collective(ps::wire::coll_op::broadcast, std::as_writable_bytes(x), parallel::element_of<T>, x.size(), root);
  }
  /// Returns once every live worker has entered it (at server 0).
  void barrier() { collective(ps::wire::coll_op::barrier, {}, element_type::none, 0, 0); }

  // ---- a lost worker's restart (async, ssp; server_rejoin.hpp) ----
  /// Whether this process takes the place of a worker the job lost (ps_options::restarted, and
  /// the servers lost it): it must rejoin_job() before its first push or pull, and skip the
  /// start-up collectives the others ran (the data-parallel step does both).
  bool restarted() const { return must_join_; }
  /// Waits at server 0 for the workers' next join point, then comes back on every server at
  /// their clock: returns the step to go on from (this worker's clock), or nothing when the
  /// job ended first (nothing left to train). Collectives then go on with the others' numbering.
  std::optional<std::int64_t> rejoin_job();
  /// A barrier at which the restarts waiting to rejoin are taken back: call it where every
  /// worker stands at the same step with no collective in flight (data_parallel_step's
  /// pull_state, at an epoch's end). Returns the ranks taken back here; every worker then runs
  /// the collectives a newcomer runs first (the run fingerprint), in step with it.
  std::vector<int> join_point() {
    std::vector<std::byte> back(static_cast<std::size_t>(o_.world_size), std::byte{0});
    collective(ps::wire::coll_op::join_point, back, element_type::none, back.size(), 0);
    std::vector<int> ranks;
    for (std::size_t r = 0; r < back.size(); ++r)
      if (back[r] != std::byte{0}) ranks.push_back(static_cast<int>(r));
    return ranks;
  }

  // ---- the parameter-server interface (parallel::parameter_server_policy) ----
  /// The optimizer the servers apply: its name and settings() text (data_parallel_step
  /// sends them before the first initialize).
  void set_optimizer(std::string opt, std::map<std::string, std::string> settings) {
    if (flushed_) throw error("gradus: parameter_server: set_optimizer after the variables went to the servers");
    opt_name_ = std::move(opt);
    opt_settings_ = std::move(settings);
  }
  /// The learning rate of the pushes that follow (the worker's schedule at its step).
  void set_learning_rate(double lr) { lr_ = lr; }
  /// What float gradients travel as in the pushes that follow: float32, bfloat16 or float16
  /// (a precision policy's comm type: data_parallel sets it), converted here, widened back to
  /// float32 by the servers before they are summed or applied. Pulls carry the servers'
  /// float32 values; sparse rows travel as float32. Returns true: the type is carried.
  bool set_push_type(element_type t) {
    if (t != element_type::f32 && !ps::wire::half_width(t))
      throw error("gradus: parameter_server: pushes travel as float32, bfloat16 or float16, not " + std::string(name_of(t)));
    push_type_ = t;
    return true;
  }

  /// Declares a variable and offers its first value (the chief's is kept). Every variable
  /// must be declared, in the same order on every worker, before the first push or pull.
  template <class T>
  void initialize(std::string_view key, std::span<const T> values) {
    initialize(key, values, {}, -1);
  }
  /// With the optimizer's state tensors (each as long as the variable) and the steps
  /// already taken: a resumed checkpoint. The chief's state goes to the servers, and this
  /// worker's clock starts at `step`.
  template <class T>
  void initialize(std::string_view key, std::span<const T> values, std::vector<std::span<const T>> slots, std::int64_t step) {
    if (flushed_) throw error("gradus: parameter_server: '" + std::string(key) + "' declared after the first push or pull");
    if (index_.count(std::string(key))) throw error("gradus: parameter_server: '" + std::string(key) + "' declared twice");
    for (const auto& sl : slots)
      if (sl.size() != values.size()) throw error("gradus: parameter_server: a state tensor of '" + std::string(key) + "' is not the variable's size");
    index_[std::string(key)] = vars_.size();
    vars_.push_back({std::string(key), values.size(), sizeof(T)});
    dtypes_.push_back(parallel::element_of<T>);
    std::vector<std::vector<std::byte>> state;
    const auto b = std::as_bytes(values);
    state.emplace_back(b.begin(), b.end());
    for (const auto& sl : slots) {
      const auto sb = std::as_bytes(sl);
      state.emplace_back(sb.begin(), sb.end());
    }
    first_values_.push_back(std::move(state));
    if (step >= 0) {
      clock_ = static_cast<std::uint64_t>(step);
      start_step_ = step;
    }
  }

  /// The servers' whole state of a variable: its values, each optimizer state tensor, and
  /// the optimizer steps applied (of its first shard). Consistent while no worker pushes:
  /// call it between two barriers (data_parallel_step::pull_state does).
  template <class T>
  std::int64_t snapshot(std::string_view key, std::span<T> values, std::vector<std::span<T>> slots) {
    flush();
    const std::size_t v = var_of(key, values.size(), parallel::element_of<T>, "snapshot");
    std::vector<std::uint64_t> ids;
    for_each_chunk(shards_of_[v], sizeof(T), [&](std::size_t s, std::size_t first, std::size_t n) {  // values and state
      auto h = ps::wire::make(ps::wire::type::snapshot, static_cast<std::uint32_t>(s), first, n, parallel::element_of<T>);
      h.clock = clock_;
      const auto id = request(shards_[s].server, h, {}, req_kind::snapshot);
      auto& r = reqs_.at(id);
      r.dst = std::as_writable_bytes(values.subspan(first, n));
      for (auto& sl : slots) r.extra.push_back(std::as_writable_bytes(sl.subspan(first, n)));
      ids.push_back(id);
    });
    const auto until = std::chrono::steady_clock::now() + o_.timeout;
    std::int64_t updates = -1;
    for (const auto id : ids) {
      wait_id(id, until, "snapshot", true);
      if (updates < 0) updates = last_updates_;
    }
    return updates;
  }

  // ---- sparse rows (an embedding table's rows + indices, as TF's IndexedSlices) ----
  /// Declares variable `key` a table of rows of `row_elements` elements (after initialize,
  /// before the first push or pull): its shards hold whole rows, and push_rows / pull_rows
  /// move rows only.
  void set_rows(std::string_view key, std::size_t row_elements) {
    if (flushed_) throw error(prefix() + "set_rows of '" + std::string(key) + "' after the variables went to the servers");
    const auto it = index_.find(std::string(key));
    if (it == index_.end()) throw error(prefix() + "set_rows of '" + std::string(key) + "', which was never declared (initialize)");
    auto& v = vars_[it->second];
    if (row_elements == 0 || v.elements % row_elements != 0)
      throw error(prefix() + "'" + std::string(key) + "' of " + std::to_string(v.elements) + " elements is not a table of rows of " +
                  std::to_string(row_elements));
    v.row_elements = row_elements;
  }
  /// A sparse-row gradient: values holds rows.size() rows (coalesced: each row once); the
  /// servers update those rows only, and only their optimizer state (lazily). Every shard of
  /// the table gets a message, maybe of no rows (bsp counts every worker's push).
  template <class T>
  handle push_rows(std::string_view key, std::span<const std::int64_t> rows, std::span<const T> values) {
    flush();
    const std::size_t v = var_of(key, vars_[index_of(key, "push_rows")].elements, parallel::element_of<T>, "push_rows");
    const std::size_t L = row_length(v, "push_rows");
    if (values.size() != rows.size() * L)
      throw error(prefix() + "push_rows of '" + std::string(key) + "': " + std::to_string(values.size()) + " values for " + std::to_string(rows.size()) +
                  " rows of " + std::to_string(L));
    const std::size_t table_rows = vars_[v].elements / L;
    std::vector<std::vector<std::size_t>> of_shard(shards_of_[v].size());
    for (std::size_t j = 0; j < rows.size(); ++j) {
      if (rows[j] < 0 || static_cast<std::size_t>(rows[j]) >= table_rows)
        throw error(prefix() + "push_rows of '" + std::string(key) + "': row " + std::to_string(rows[j]) + " of a table of " + std::to_string(table_rows));
      of_shard[shard_of_row(v, static_cast<std::size_t>(rows[j]) * L)].push_back(j);
    }
    handle hd{next_id_, next_id_};
    for (std::size_t q = 0; q < shards_of_[v].size(); ++q) {
      const auto s = shards_of_[v][q];
      const auto& js = of_shard[q];
      std::vector<std::byte> payload(js.size() * (8 + L * sizeof(T)));
      for (std::size_t k = 0; k < js.size(); ++k) {
        const auto r = static_cast<std::uint64_t>(rows[js[k]]);
        std::memcpy(payload.data() + 8 * k, &r, 8);
        std::memcpy(payload.data() + 8 * js.size() + k * L * sizeof(T), values.data() + js[k] * L, L * sizeof(T));
      }
      auto h = ps::wire::make(ps::wire::type::push_rows, static_cast<std::uint32_t>(s), L, js.size(), parallel::element_of<T>);
      h.clock = clock_;
      h.scalar = lr_;
      request(shards_[s].server, h, payload, req_kind::ack, /*copy=*/true);
      stats_.bytes_pushed += payload.size();
    }
    ++stats_.pushes;
    hd.last = next_id_;
    return hd;
  }
  /// Brings `table` (this worker's whole copy of the variable, as a pull left it) up to date
  /// by moving only the rows the servers changed since this worker's last pull_rows (all
  /// rows the first time after a server restarted). Waits as pull does.
  template <class T>
  handle pull_rows_async(std::string_view key, std::span<T> table) {
    flush();
    const std::size_t v = var_of(key, table.size(), parallel::element_of<T>, "pull_rows");
    const std::size_t L = row_length(v, "pull_rows");
    handle hd{next_id_, next_id_};
    for (const std::size_t s : shards_of_[v]) {
      auto h = ps::wire::make(ps::wire::type::pull_rows, static_cast<std::uint32_t>(s), L, since_[s], parallel::element_of<T>);
      h.clock = clock_;
      const auto id = request(shards_[s].server, h, {}, req_kind::rows);
      reqs_.at(id).dst = std::as_writable_bytes(table);
    }
    ++stats_.pulls;
    hd.last = next_id_;
    return hd;
  }
  /// pull_rows_async, then waits for it and for everything posted before it.
  template <class T>
  void pull_rows(std::string_view key, std::span<T> table) {
    const auto h = pull_rows_async(key, table);
    wait({first_open(), h.last});
  }

  /// Posts the gradient of variable `key` (grad.size() and T must be the declared ones, else
  /// gradus::error) to the servers of its shards, in chunks, at this worker's clock and
  /// learning rate, and returns at once; `grad` must stay unchanged until the handle
  /// completes (wait). The servers apply it as the mode says.
  template <class T>
  handle push_async(std::string_view key, std::span<const T> grad) {
    flush();
    const std::size_t v = var_of(key, grad.size(), parallel::element_of<T>, "push");
    handle hd{next_id_, next_id_};
    const bool half = std::is_same_v<T, float> && push_type_ != element_type::f32;
    for_each_chunk(shards_of_[v], sizeof(T), [&](std::size_t s, std::size_t first, std::size_t n) {
      auto h = ps::wire::make(ps::wire::type::push, static_cast<std::uint32_t>(s), first, n,
                              half ? push_type_ : parallel::element_of<T>);
      h.clock = clock_;
      h.scalar = lr_;
      if (half) {  // converted into this worker's wire buffer, which the request copies
        narrow_.resize(n * size_of(push_type_));
        parallel::half_wire::compress(push_type_, grad.data() + first, narrow_.data(), n);
        request(shards_[s].server, h, narrow_, req_kind::ack, /*copy=*/true);
        stats_.bytes_pushed += narrow_.size();
      } else {
        request(shards_[s].server, h, std::as_bytes(grad.subspan(first, n)), req_kind::ack);
        stats_.bytes_pushed += n * sizeof(T);
      }
    });
    ++stats_.pushes;
    hd.last = next_id_;
    return hd;
  }
  /// Asks the servers for variable `key` into `out` (the declared size and T, else
  /// gradus::error), and returns at once; `out` is written as the answers arrive and is
  /// complete when the handle is. In bsp and ssp the servers answer once the mode allows
  /// (this worker's clock).
  template <class T>
  handle pull_async(std::string_view key, std::span<T> out) {
    flush();
    const std::size_t v = var_of(key, out.size(), parallel::element_of<T>, "pull");
    handle hd{next_id_, next_id_};
    for_each_chunk(shards_of_[v], sizeof(T), [&](std::size_t s, std::size_t first, std::size_t n) {
      auto h = ps::wire::make(ps::wire::type::pull, static_cast<std::uint32_t>(s), first, n, parallel::element_of<T>);
      h.clock = clock_;
      const auto id = request(shards_[s].server, h, {}, req_kind::pull);
      reqs_.at(id).dst = std::as_writable_bytes(out.subspan(first, n));
      stats_.bytes_pulled += n * sizeof(T);
    });
    ++stats_.pulls;
    hd.last = next_id_;
    return hd;
  }
  /// Push a gradient and pull the variable it updates into `out` (after the update, as the
  /// mode allows: push then pull at the next clock is the usual pattern instead).
  template <class T>
  handle push_pull(std::string_view key, std::span<const T> grad, std::span<T> out) {
    const auto a = push_async(key, grad);
    const auto b = pull_async(key, out);
    return {a.first, b.last};
  }
  /// Waits until every request of `h` is answered and its zero-copy bytes are released.
  /// Throws gradus::comm_error when a server does not answer within ps_options::timeout
  /// plus 2 s (the communicator is then unusable), and gradus::error with the server's
  /// reason when it refused a request.
  void wait(handle h) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::uint64_t id = h.first; id < h.last; ++id) wait_id(id, t0 + peer_wait(), nullptr, true);
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  /// Everything posted so far has completed.
  void wait_all() { wait({first_open(), next_id_}); }

  /// push_async without a handle: a later pull, pull_rows or wait_all waits for its
  /// completion, and `grad` must stay unchanged until then.
  template <class T>
  void push(std::string_view key, std::span<const T> grad) {
    (void)push_async(key, grad);
  }
  /// Blocking pull: waits for it and for everything posted before it.
  template <class T>
  void pull(std::string_view key, std::span<T> out) {
    const auto h = pull_async(key, out);
    wait({first_open(), h.last});
  }
  /// This worker finished a step: its clock advances on every server.
  void step_done() {
    flush();
    ++clock_;
    for (std::size_t k = 0; k < socks_.size(); ++k) {
      auto h = ps::wire::make(ps::wire::type::clock);
      h.clock = clock_;
      send(static_cast<int>(k), h, {}, nullptr);
    }
  }

 private:
  enum class req_kind { ack, pull, coll, snapshot, rows };
  struct req {
    int server = 0;
    req_kind kind = req_kind::ack;
    ps::wire::type type = ps::wire::type::push;
    std::uint32_t key = 0;
    std::span<std::byte> dst;
    std::vector<std::span<std::byte>> extra;  ///< snapshot: the optimizer state tensors
    std::shared_ptr<net::send_flag> flag;
    bool answered = false;
    std::string failure;
    std::uint64_t clock = 0;
    ps::wire::header sent;                ///< as sent (a rejoin resends it)
    ps::wire::header answer;              ///< the reply's header (hello, join)
    std::span<const std::byte> payload;   ///< the caller's bytes (zero-copy requests)
    std::vector<std::byte> body;          ///< or a copy
  };

  std::size_t chunk_elems(std::size_t elem) const { return std::max<std::size_t>(1, o_.chunk_bytes / elem); }
  /// f(shard key, first element of the chunk in the variable, elements) for each chunk of
  /// chunk_bytes of each shard in `keys`, in order.
  template <class F>
  void for_each_chunk(const std::vector<std::size_t>& keys, std::size_t elem, F&& f) const {
    for (const std::size_t s : keys)
      for (std::size_t at = 0; at < shards_[s].count; at += chunk_elems(elem))
        f(s, shards_[s].offset + at, std::min(chunk_elems(elem), shards_[s].count - at));
  }

  std::string server_name(int k) const {
    return "server " + std::to_string(k) + " (" + o_.servers[static_cast<std::size_t>(k)] + (o_.origin.empty() ? "" : ", from " + o_.origin) + ")";
  }
  std::string prefix() const { return "gradus: parameter_server: worker " + std::to_string(o_.rank) + ": "; }

  /// ---- the links to the servers (client_links.hpp) ----
  void connect();
  std::string hello_text(bool rejoin) const;
  void open_link(std::size_t k);
  void rejoin(std::size_t k, const char* during);
  std::vector<ps::wire::header> everyone(ps::wire::type t, const std::string& text, const char* what);  ///< their answers

  /// The optimizer, then the variables to the servers: the partition, one init per shard.
  void flush() {
    if (flushed_) return;
    flushed_ = true;
    nlohmann::json j;
    j["optimizer"] = opt_name_;
    j["settings"] = opt_settings_;
    config_text_ = j.dump();
    everyone(ps::wire::type::config, config_text_, "config");
    shards_ = o_.partition(vars_, servers());
    ps::check_partition(vars_, servers(), shards_);
    shards_of_.assign(vars_.size(), {});
    for (std::size_t s = 0; s < shards_.size(); ++s) shards_of_[shards_[s].var].push_back(s);
    since_.assign(shards_.size(), 0);
    std::vector<std::uint64_t> ids;
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      ids.push_back(request(shards_[s].server, init_header(s), init_payload(s), req_kind::ack, /*copy=*/true));
      if (o_.rank != 0) continue;
      // the chief's values (and any optimizer state) follow in chunks; its init is answered
      // once the last has arrived
      const auto var = shards_[s].var;
      const std::size_t eb = vars_[var].element_bytes;
      for_each_chunk({s}, eb, [&](std::size_t, std::size_t first, std::size_t n) {
        auto h = init_header(s);
        h.type = static_cast<std::uint8_t>(ps::wire::type::init_values);
        h.offset = first;
        h.count = n;
        std::vector<std::byte> payload;
        payload.reserve(n * eb * first_values_[var].size());
        for (const auto& b : first_values_[var])
          payload.insert(payload.end(), b.begin() + static_cast<std::ptrdiff_t>(first * eb), b.begin() + static_cast<std::ptrdiff_t>((first + n) * eb));
        ids.push_back(request(shards_[s].server, h, payload, req_kind::ack, /*copy=*/true));
      });
    }
    const auto until = std::chrono::steady_clock::now() + peer_wait();
    for (const auto id : ids) wait_id(id, until, "init", true);
    first_values_.clear();
  }

  /// Shard s's declaration: its key, range and dtype; scalar = the variable's elements, clock =
  /// the step this worker starts at. The payload: the name (the chief's values follow as
  /// init_values chunks).
  ps::wire::header init_header(std::size_t s) const {
    const auto& sh = shards_[s];
    auto h = ps::wire::make(ps::wire::type::init, static_cast<std::uint32_t>(s), sh.offset, sh.count, dtypes_[sh.var]);
    h.scalar = static_cast<double>(vars_[sh.var].elements);
    h.clock = static_cast<std::uint64_t>(std::max<std::int64_t>(0, start_step_));
    return h;
  }
  std::vector<std::byte> init_payload(std::size_t s) const {
    const auto& v = vars_[shards_[s].var];
    std::vector<std::byte> payload(4 + v.name.size());
    const auto len = static_cast<std::uint32_t>(v.name.size());
    std::memcpy(payload.data(), &len, 4);
    std::memcpy(payload.data() + 4, v.name.data(), v.name.size());
    return payload;
  }

  std::size_t index_of(std::string_view key, const char* what) const {
    const auto it = index_.find(std::string(key));
    if (it == index_.end()) throw error(prefix() + std::string(what) + " of '" + std::string(key) + "', which was never declared (initialize)");
    return it->second;
  }
  std::size_t row_length(std::size_t v, const char* what) const {
    if (vars_[v].row_elements == 0)
      throw error(prefix() + std::string(what) + " of '" + vars_[v].name + "', which is not a table of rows (set_rows before the first push or pull)");
    return vars_[v].row_elements;
  }
  /// Which of variable v's shards (its position in shards_of_[v]) holds element e.
  std::size_t shard_of_row(std::size_t v, std::size_t e) const {
    for (std::size_t q = 0; q < shards_of_[v].size(); ++q) {
      const auto& sh = shards_[shards_of_[v][q]];
      if (e >= sh.offset && e < sh.offset + sh.count) return q;
    }
    throw error(prefix() + "no shard of '" + vars_[v].name + "' holds element " + std::to_string(e));
  }

  std::size_t var_of(std::string_view key, std::size_t n, element_type dt, const char* what) const {
    const auto it = index_.find(std::string(key));
    if (it == index_.end()) throw error(prefix() + std::string(what) + " of '" + std::string(key) + "', which was never declared (initialize)");
    const auto& v = vars_[it->second];
    if (v.elements != n || dtypes_[it->second] != dt)
      throw error(prefix() + std::string(what) + " of '" + std::string(key) + "' with " + std::to_string(n) + " " + ps::wire::dtype_name(dt) +
                  " elements; it has " + std::to_string(v.elements) + " " + ps::wire::dtype_name(dtypes_[it->second]));
    return it->second;
  }

  std::uint64_t first_open() const { return reqs_.empty() ? next_id_ : reqs_.begin()->first; }

  std::uint64_t request(int server, ps::wire::header h, std::span<const std::byte> payload, req_kind kind, bool copy = false);
  void send(int server, ps::wire::header h, std::span<const std::byte> payload, std::shared_ptr<net::send_flag>* flag);
  [[noreturn]] void fail(const std::string& text);
  void prune_flags();
  void pump(int wait_ms);
  void on_message(int server, std::vector<zmq::message_t>& parts);
  void link_events(std::size_t k);
  void wait_id(std::uint64_t id, std::chrono::steady_clock::time_point until, const char* what, bool throw_on_error,
               ps::wire::header* answer = nullptr);

  std::string key_name(std::uint32_t key) const {
    return key < shards_.size() ? vars_[shards_[key].var].name : "key " + std::to_string(key);
  }

  /// One collective, in pieces of chunk_bytes (each its own collective number: every worker
  /// cuts alike), so that no message passes the servers' max_payload.
  void collective(ps::wire::coll_op op, std::span<std::byte> data, element_type dt, std::size_t count, int root) {
    const std::size_t elem = ps::wire::element_size(ps::wire::type::coll, dt);
    if (data.size() <= o_.chunk_bytes) return collective_piece(op, data, dt, count, root);
    const std::size_t per = std::max<std::size_t>(1, o_.chunk_bytes / elem);
    for (std::size_t at = 0; at < count; at += per) {
      const std::size_t n = std::min(per, count - at);
      collective_piece(op, data.subspan(at * elem, n * elem), dt, n, root);
    }
  }
  void collective_piece(ps::wire::coll_op op, std::span<std::byte> data, element_type dt, std::size_t count, int root) {
    auto h = ps::wire::make(ps::wire::type::coll, static_cast<std::uint32_t>(op), static_cast<std::uint64_t>(root), count, dt);
    h.clock = coll_seq_++;
    const auto id = request(0, h, data, req_kind::coll, /*copy=*/true);
    reqs_.at(id).dst = op == ps::wire::coll_op::barrier ? std::span<std::byte>{} : data;
    wait_id(id, std::chrono::steady_clock::now() + peer_wait(), ps::wire::coll_op_name(static_cast<std::uint32_t>(op)), true);
  }

  /// A wait that other workers can hold up (a bsp or ssp pull, a collective, an init parked
  /// until the chief's) lasts the timeout plus 2 s: a server notices a silent worker at its
  /// heartbeat timeout (net::heartbeat_timeout_for: the timeout - 2 s, at least 3 s) plus up
  /// to a heartbeat interval, and its answer names that worker. Without the margin the
  /// waiting worker's own deadline could come first and blame the server.
  std::chrono::milliseconds peer_wait() const { return o_.timeout + std::chrono::milliseconds(2000); }

  ps_options o_;
  std::unique_ptr<zmq::context_t> own_ctx_;
  std::vector<zmq::socket_t> socks_;
  std::vector<net::socket_monitor> mons_;  ///< after socks_: destroyed first
  struct link {
    bool up = true;     ///< until its connection is seen to close
    bool lost = false;  ///< its connection closed: rejoin() replaces it
    bool joined = false;  ///< the server answered this worker's first hello (a loss is then a restart to rejoin)
    std::chrono::steady_clock::time_point down_since{};
    std::string refused;  ///< why the server refused this client's handshake (CURVE)
    int failed_handshakes = 0;
    /// A TCP connection the server's kernel accepted but its ZeroMQ I/O thread never greeted
    /// (no ZMTP handshake): the process is stopped or hung, not restarting (rejoin()).
    std::optional<std::chrono::steady_clock::time_point> connected_at;
    bool greeted = false;
    bool retried = false;  ///< a connect was refused (nothing listens: the process died), not unanswered
  };
  std::vector<link> links_;
  ps::mode mode_ = ps::mode::bsp;
  int staleness_ = 0;
  bool flushed_ = false, broken_ = false, shutdown_on_exit_ = true;
  bool rejoining_ = false, closing_ = false;
  bool must_join_ = false;  ///< a restart the servers must take back (restarted(), rejoin_job())
  std::uint64_t link_generation_ = 0;
  std::string config_text_;
  std::string broken_text_;
  std::string opt_name_ = "sgd";
  std::map<std::string, std::string> opt_settings_;
  double lr_ = 0.01;
  element_type push_type_ = element_type::f32;  ///< set_push_type
  std::vector<std::byte> narrow_;               ///< a half-width push's chunk, reused
  std::vector<ps::variable_info> vars_;
  std::vector<element_type> dtypes_;
  std::vector<std::vector<std::vector<std::byte>>> first_values_;  ///< per variable: values, then optimizer state
  std::int64_t start_step_ = -1, last_updates_ = 0;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<ps::shard> shards_;
  std::vector<std::vector<std::size_t>> shards_of_;
  std::vector<std::uint64_t> since_;  ///< per shard: the update stamp this worker's rows are current to (pull_rows)
  std::map<std::uint64_t, req> reqs_;
  std::deque<std::shared_ptr<net::send_flag>> flags_;
  std::uint64_t next_id_ = 1, clock_ = 0, coll_seq_ = 0;
  client_stats stats_;
};

static_assert(parallel::parameter_server_policy<parameter_server<ps_bsp>>);
static_assert(parallel::rejoin_store<parameter_server<ps_async>>);

namespace ps {
/// Serves as parameter-server task `c.task_index` of the cluster spec (its address is
/// c.ps[c.task_index]; GRADUS_BIND_ADDR / spec.bind_addr picks another interface) until
/// the chief ends the job, applying the optimizer on the compute policy Compute
/// (`serve<cpu_simd>(spec)`). Throws server::job_failure()'s reason when the job failed.
template <class Compute, class Spec>
void serve(const Spec& c, server_options o = {}) {
  if (c.task_type != "ps") throw error("gradus: ps::serve: this process is a '" + c.task_type + "' task, not a ps task");
  if (c.task_index < 0 || c.task_index >= static_cast<int>(c.ps.size()))
    throw error("gradus: ps::serve: ps task " + std::to_string(c.task_index) + " of " + std::to_string(c.ps.size()));
  if (o.address.empty()) {
    o.address = c.ps[static_cast<std::size_t>(c.task_index)];
    if (!c.bind_addr.empty()) o.address = c.bind_addr + o.address.substr(o.address.rfind(':'));
  }
  o.index = c.task_index;
  if (!o.curve) o.curve = curve_server_from_env(c.task_index);
  zmq::context_t ctx(1);
  server<Compute> s(ctx, o);
  s.run();
  // A failed job fails its servers too (a scheduler reads their exit status). A worker that
  // failed said goodbye just before its process exits: a second's grace lets that exit come
  // first, so that a launcher (gradus-run, which names the first process to fail) names it.
  if (const auto why = s.job_failure()) {
    if (s.worker_failed()) std::this_thread::sleep_for(std::chrono::seconds(1));
    throw error(*why);
  }
}
}  // namespace ps

}  // namespace gradus

// the worker's links to its servers: parameter_server's member functions that connect,
// send, wait and rejoin
#include "gradus/comm/ps/client_links.hpp"
