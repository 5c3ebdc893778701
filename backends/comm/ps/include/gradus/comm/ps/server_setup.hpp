#pragma once
// A parameter server's set-up: server's member functions for what comes before training —
// each worker's hello (world size, rank and consistency mode, checked against the first
// worker's; a worker rejoining a restarted server), the optimizer's config (the first
// worker's, rebuilt by server_optimizer.hpp), each shard's declaration (init) and the
// chief's first values (init, or init_values in chunks), and, after a restart, each shard
// restored from the last checkpoint as the workers declare it again. Included at the end
// of server.hpp; not a header to include alone.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "gradus/comm/net/curve.hpp"
#include "gradus/comm/ps/server.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ps {

template <class Compute>
void server<Compute>::hello(const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
  monitor_events();  // connections closed before this hello: a lost worker is known as lost
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
  const auto staleness = integer("staleness", 0, ps::max_staleness, 0);
  // a worker coming back to a restarted server: the step it is at
  const auto rejoin_clock = static_cast<std::uint64_t>(integer("clock", 0, std::int64_t(1) << 53, 0));
  const auto rj = j.find("rejoin");
  const bool rejoin = rj != j.end() && rj->is_boolean() && rj->get<bool>();
  // a new process in place of a lost worker (server_rejoin.hpp)
  const auto rs = j.find("restart");
  const bool restart = rs != j.end() && rs->is_boolean() && rs->get<bool>() && !rejoin;
  const auto mit = j.find("mode");
  const std::string m = mit != j.end() && mit->is_string() ? mit->get<std::string>() : "";
  if (world < 1 || rank < 0 || rank >= world || h.rank != rank)
    throw error(prefix() + "hello from rank " + std::to_string(rank) + " of a world of " + std::to_string(world));
  if (o_.curve && !may_act_as(last_auth_, rank)) throw error(prefix() + rank_claim_refusal(last_auth_, rank, last_peer_));
  const mode md = m == "async" ? mode::async : m == "bsp" ? mode::bsp : m == "ssp" ? mode::ssp : throw error(prefix() + "unknown consistency '" + m + "'");
  if (workers_.empty()) {
    workers_.resize(static_cast<std::size_t>(world));
    if (!rejoin) first_hello_ = std::chrono::steady_clock::now();
    mode_ = md;
    staleness_ = static_cast<std::uint64_t>(std::max<std::int64_t>(0, staleness));
    o_.log(prefix() + "serving " + std::to_string(world) + " workers, " + mode_name(md) +
           (md == mode::ssp ? " " + std::to_string(staleness_) : "") + ", on " + bound_);
  } else {
    std::string diff;
    if (static_cast<int>(workers_.size()) != world) diff = "world size " + std::to_string(world) + " (first: " + std::to_string(workers_.size()) + ")";
    else if (md != mode_ || static_cast<std::uint64_t>(std::max<std::int64_t>(0, staleness)) != staleness_)
      diff = "consistency " + m + " " + std::to_string(staleness) + " (first: " + mode_name(mode_) + " " + std::to_string(staleness_) + ")";
    if (!diff.empty()) {
      // One job's workers disagree: refusing this one alone would leave the others waiting
      // for it until their timeout, and the servers serving on; the whole job fails now.
      const std::string why = prefix() + "worker " + std::to_string(rank) + " says " + diff +
                              ": every worker of a job must run the same consistency and world size (the examples' "
                              "--consistency); the job fails";
      fail_job(why);
      throw error(why);
    }
  }
  auto& w = workers_[static_cast<std::size_t>(rank)];
  if (restart && w.joined && w.id != id && !w.left) {
    // its old process died and its connection has not been seen to close yet
    o_.log(prefix() + "worker " + std::to_string(rank) + " restarted before its old connection was seen to close");
    worker_lost(rank);
    if (!job_failed_.empty()) throw error(job_failed_);
  }
  if (w.joined && w.id != id && !w.left) {
    // A rejoining worker may reach a restarted server twice (a first connection that
    // ZeroMQ reopened by itself carried its hello, then the one it opened again): the
    // latest is its connection. Otherwise two processes claim one rank.
    if (!rejoin || !restoring_)
      throw error(prefix() + "worker " + std::to_string(rank) + " said hello twice from different connections (two processes with one rank?)");
    o_.log(prefix() + "worker " + std::to_string(rank) + " rejoins on a new connection");
    w.joined = false;
  }
  const bool revived = w.dead && restart;
  if (w.dead && !revived)
    throw error(prefix() + "worker " + std::to_string(rank) + " was declared dead; a process may take its place only as a restart " +
                "(GRADUS_RESTART_COUNT > 0, which gradus-run --max-restarts sets; ps_options::restarted), in an async or ssp job");
  if (revived) {
    revive(rank, id);
    w.fd = -1;  // its old connection's number: not this one's (below)
  }
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
  if (!w.reviving) w.left = false;  // a restart counts once it is taken back (join)
  w.fd = last_fd_;
  if (std::getenv("GRADUS_PS_DEBUG")) o_.log(prefix() + "worker " + std::to_string(rank) + " fd " + std::to_string(w.fd));
  w.peer_address = last_peer_;
  auto r = reply_header(h);
  r.clock = w.clock;  // a reconnecting worker learns where it was
  if (w.reviving) r.key = wire::must_join;
  send(id, r, std::span<const std::byte>{});
}

/// The update rule: the first worker's (every worker sends the same; the run fingerprint
/// compared them already), before any shard exists.
template <class Compute>
void server<Compute>::config(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
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

/// init: payload = u32 name length, name, then the shard's values (the chief) or nothing.
template <class Compute>
void server<Compute>::init(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
  std::uint32_t len = 0;
  if (payload.size() < 4) throw error(prefix() + "init without a name");
  std::memcpy(&len, payload.data(), 4);
  if (len == 0 || len > 4096 || payload.size() < 4 + std::size_t(len)) throw error(prefix() + "init with a malformed name");
  const std::string name(reinterpret_cast<const char*>(payload.data() + 4), len);
  const auto values = payload.subspan(4 + len);
  const auto dt = static_cast<element_type>(h.dtype);
  const std::size_t elem = size_of(dt);
  if (dt != element_type::f32 && dt != element_type::f64) throw error(prefix() + "'" + name + "' has dtype " + wire::dtype_name(dt) + " (float32 or float64)");
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

/// The chief's values are in; the step the job starts at (0, or a resumed checkpoint's)
/// counts as the steps applied so far.
template <class Compute>
void server<Compute>::became_ready(shard_state& s, std::uint64_t start) {
  s.updates = static_cast<std::int64_t>(start);
  s.version = start;
  s.ready = true;
}

/// A chunk of the chief's first values (and optimizer state) for a declared shard.
template <class Compute>
void server<Compute>::init_values(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
  auto& s = find(h);
  if (static_cast<element_type>(h.dtype) != s.dt)
    throw error(prefix() + "init_values of " + wire::dtype_name(static_cast<element_type>(h.dtype)) + " for '" + s.name + "' (" + wire::dtype_name(s.dt) + ")");
  const std::size_t elem = size_of(s.dt), bytes = h.count * elem;
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

template <class Compute>
void server<Compute>::answer_parked_inits() {
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

/// A restored shard: its part of the checkpoint's variable and optimizer state; the step
/// counts from the checkpoint's, and (bsp) from the step the rejoining workers are at.
template <class Compute>
void server<Compute>::restore_shard(shard_state& s) {
  std::vector<std::string> slot_names;
  slot_names.reserve(static_cast<std::size_t>(opt_.slot_count()));
  for (int k = 0; k < opt_.slot_count(); ++k) slot_names.emplace_back(opt_.slot_name(k));
  auto r = o_.restore(s.name, slot_names);
  if (!r) throw error(prefix() + "restarted, but the checkpoint holds no variable '" + s.name + "' to restore its shard from");
  const std::size_t elem = size_of(s.dt);
  if (r->dt != s.dt || r->values.size() != s.total * elem)
    throw error(prefix() + "the checkpoint's '" + s.name + "' is " + std::to_string(r->values.size() / std::max<std::size_t>(1, size_of(r->dt))) +
                " " + wire::dtype_name(r->dt) + " elements; the workers declare " + std::to_string(s.total) + " " + wire::dtype_name(s.dt));
  if (r->slots.size() != s.slots.size())
    throw error(prefix() + "the checkpoint holds " + std::to_string(r->slots.size()) + " optimizer state tensors of '" + s.name + "'; " +
                std::string(opt_.name()) + " has " + std::to_string(s.slots.size()));
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

/// A fresh job's ranks that have not said hello join_timeout after the first one did: the
/// job fails naming them (fail_job answers what waits), as the ring's rendezvous does.
template <class Compute>
void server<Compute>::check_joins() {
  if (!first_hello_ || restoring_ || !job_failed_.empty()) return;
  if (std::chrono::steady_clock::now() - *first_hello_ <= o_.join_timeout) return;
  std::string missing;
  int n = 0;
  for (std::size_t r = 0; r < workers_.size(); ++r)
    if (!workers_[r].joined && !workers_[r].left) missing += (n++ ? ", " : "") + std::to_string(r);
  first_hello_.reset();
  if (n == 0) return;
  fail_job(prefix() + "worker" + (n > 1 ? "s " : " ") + missing + " of " + std::to_string(workers_.size()) + " did not join within " +
           std::to_string(o_.join_timeout.count()) + " ms of the first worker's hello (not started, or started with another server list: "
           "GRADUS_PS, TF_CONFIG cluster.ps, gradus-run --ps); the job fails");
}

/// bsp after a restart: the rejoining workers are at step c, so the shards go on from c
/// (a step in flight when the server died is lost with it, as the steps since the
/// checkpoint are; pushes for it are acknowledged and dropped).
template <class Compute>
void server<Compute>::raise_floor(std::uint64_t c) {
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

}  // namespace gradus::ps
