#pragma once
// A parameter server's consistency: server's member functions that apply the pushes and
// answer the pulls as the mode allows (server.hpp says what each mode guarantees): async
// and ssp apply each push on arrival as 1/N of a step; bsp keeps a step's pushes until
// every live worker's is in and applies their average, summed in rank order; a pull waits
// (parked) until its clock may be served. The optimizer runs on the compute policy here
// (apply_typed). Included at the end of server.hpp; not a header to include alone.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "gradus/comm/ps/server.hpp"
#include "gradus/comm/ps/server_optimizer.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/half_wire.hpp"

namespace gradus::ps {

template <class Compute>
int server<Compute>::live_workers() const {
  return static_cast<int>(std::count_if(workers_.begin(), workers_.end(), [](const worker& w) { return !w.left; }));
}

template <class Compute>
std::uint64_t server<Compute>::min_clock() const {
  std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
  for (const auto& w : workers_)
    if (!w.left) m = std::min(m, w.clock);
  return m == std::numeric_limits<std::uint64_t>::max() ? 0 : m;
}

template <class Compute>
template <class T>
void server<Compute>::apply_typed(shard_state& s, std::uint64_t first, std::size_t n, const T* g, double lr, double scale) {
  T* w = reinterpret_cast<T*>(s.values.data()) + first;
  std::vector<T*> slots;
  for (auto& sl : s.slots) slots.push_back(reinterpret_cast<T*>(sl.data()) + first);
  apply_optimizer<Compute, T>(opt_, lr, n, w, g, slots.data(), s.updates, scale);
}

/// g is a received payload: ZeroMQ gives no alignment, so a misaligned one is copied first.
template <class Compute>
void server<Compute>::apply(shard_state& s, std::uint64_t first, std::size_t n, const std::byte* g, double lr, double scale) {
  const std::size_t elem = size_of(s.dt);
  if (reinterpret_cast<std::uintptr_t>(g) % elem != 0) {
    scratch_.resize((n * elem + 7) / 8);
    std::memcpy(scratch_.data(), g, n * elem);
    g = reinterpret_cast<const std::byte*>(scratch_.data());
  }
  if (s.dt == element_type::f64) apply_typed(s, first, n, reinterpret_cast<const double*>(g), lr, scale);
  else apply_typed(s, first, n, reinterpret_cast<const float*>(g), lr, scale);
  ++stats_.updates;
  stamp_rows(s, first, n);
}

/// bsp: a push for a step already applied. After a restart it is one the server skipped
/// (its update lost with the old process), resent by a rejoining worker: acknowledged and
/// dropped (true); otherwise an error.
template <class Compute>
bool server<Compute>::late_push(int rank, const std::string& id, const wire::header& h, const shard_state& s) {
  if (h.clock >= s.version) return false;
  if (!restoring_)
    throw error(prefix() + "worker " + std::to_string(rank) + " pushed '" + s.name + "' for step " + std::to_string(h.clock) +
                " after step " + std::to_string(s.version - 1) + " was applied");
  ++stats_.stale_dropped;
  send(id, reply_header(h), std::span<const std::byte>{});
  return true;
}

template <class Compute>
void server<Compute>::push(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
  auto& s = find(h);
  const auto dt = static_cast<element_type>(h.dtype);
  if (dt != s.dt && !(wire::half_width(dt) && s.dt == element_type::f32))
    throw error(prefix() + "push of " + wire::dtype_name(dt) + " to '" + s.name + "' (" + wire::dtype_name(s.dt) + ")");
  if (!s.ready) throw error(prefix() + "push to '" + s.name + "' before the chief initialised it");
  if (dt != s.dt) {  // a float32 shard's gradient pushed as bfloat16 or float16: widened first
    widened_.resize(static_cast<std::size_t>(h.count) * sizeof(float));
    parallel::half_wire::decompress<false>(dt, reinterpret_cast<float*>(widened_.data()), payload.data(),
                                           static_cast<std::size_t>(h.count));
    payload = widened_;
  }
  ++stats_.pushes;
  const std::size_t elem = size_of(s.dt);
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

template <class Compute>
template <class T>
void server<Compute>::sum_in_rank_order(shard_state& s, pending_step& p) {
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

template <class Compute>
void server<Compute>::maybe_apply_bsp(shard_state& s, std::uint32_t key) {
  while (true) {
    const auto it = s.pending.find(s.version);
    if (it == s.pending.end()) return;
    auto& done = p_done_[{key, s.version}];
    int complete = 0;
    for (std::size_t r = 0; r < workers_.size(); ++r)
      if (!workers_[r].left && std::find(done.begin(), done.end(), static_cast<int>(r)) != done.end()) ++complete;
    if (complete < live_workers()) return;
    if (it->second.sparse) {
      if (s.dt == element_type::f64) sum_rows_in_rank_order<double>(s, it->second);
      else sum_rows_in_rank_order<float>(s, it->second);
    } else if (s.dt == element_type::f64) {
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

/// Whether a pull may be answered now, and the clock its values are known to include.
template <class Compute>
bool server<Compute>::pull_ready(const shard_state& s, const wire::header& h) const {
  if (!s.ready) return false;
  switch (mode_) {
    case mode::async: return true;
    case mode::bsp: return s.version >= h.clock;
    case mode::ssp: return h.clock <= staleness_ || min_clock() >= h.clock - staleness_;
  }
  return true;
}

template <class Compute>
void server<Compute>::pull(int, const std::string& id, const wire::header& h) {
  auto& s = find(h);
  ++stats_.pulls;
  if (!pull_ready(s, h)) {
    parked_.push_back({id, h});
    return;
  }
  answer_pull(s, id, h);
}

/// The whole shard: values, then each optimizer state tensor; scalar = optimizer steps
/// applied (Adam's t), clock = steps applied (bsp). Consistent when the workers stand
/// still between two barriers (data_parallel_step::pull_state).
template <class Compute>
void server<Compute>::snapshot(int, const std::string& id, const wire::header& h) {
  auto& s = find(h);
  if (!s.ready) throw error(prefix() + "a snapshot of '" + s.name + "' before the chief initialised it");
  // elements [h.offset, h.offset + h.count) of the shard (a chunk), then of each state tensor
  const std::size_t elem = size_of(s.dt);
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

template <class Compute>
void server<Compute>::answer_pull(const shard_state& s, const std::string& id, const wire::header& h) {
  const std::size_t elem = size_of(s.dt);
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

template <class Compute>
void server<Compute>::serve_parked() {
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

template <class Compute>
void server<Compute>::clock(int rank, const wire::header& h) {
  auto& w = workers_[static_cast<std::size_t>(rank)];
  if (h.clock < w.clock) throw error(prefix() + "worker " + std::to_string(rank) + "'s clock went back from " + std::to_string(w.clock) + " to " + std::to_string(h.clock));
  w.clock = h.clock;
  serve_parked();
}

}  // namespace gradus::ps
