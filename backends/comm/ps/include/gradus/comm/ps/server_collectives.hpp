#pragma once
// A parameter server's collectives: server's member functions that run the workers'
// allreduce (sum, average), broadcast and barrier through server 0 — each worker's part of
// collective number h.clock collected, combined in rank order once every live worker's is
// in, and the result sent to each; a worker that calls another collective than the others
// fails it for all, naming both calls. Included at the end of server.hpp; not a header to
// include alone.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/comm/ps/server.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ps {

/// Collectives through server 0: every worker's contribution to collective number
/// h.clock, combined in rank order once all are in.
template <class Compute>
void server<Compute>::coll(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
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
    return std::string(wire::coll_op_name(x.key)) + " of " + std::to_string(x.count) + " " + wire::dtype_name(static_cast<element_type>(x.dtype)) +
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
  if (op == wire::coll_op::join_point && (h.dtype != static_cast<std::uint8_t>(element_type::none) || h.count != workers_.size()))
    throw error(prefix() + "a join point of " + std::to_string(h.count) + " " + wire::dtype_name(static_cast<element_type>(h.dtype)) +
                " (one byte per worker: " + std::to_string(workers_.size()) + ")");
  if ((op == wire::coll_op::sum || op == wire::coll_op::average) && h.dtype != static_cast<std::uint8_t>(element_type::f32) &&
      h.dtype != static_cast<std::uint8_t>(element_type::f64))
    throw error(prefix() + "a sum of " + wire::dtype_name(static_cast<element_type>(h.dtype)) + " (float32 or float64 only)");
  c.in[static_cast<std::size_t>(rank)] = true;
  c.ids[static_cast<std::size_t>(rank)] = id;
  c.req_ids[static_cast<std::size_t>(rank)] = h.id;
  c.parts[static_cast<std::size_t>(rank)].assign(payload.begin(), payload.end());
  ++c.got;
  finish_collective(h.clock);
}

/// Completes collective `seq` once every live worker is in (dead ones are not waited for).
template <class Compute>
void server<Compute>::finish_collective(std::uint64_t seq) {
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
  } else if (op == wire::coll_op::join_point) {
    result = admit_waiting(seq);  // the restarts waiting come back here
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

template <class Compute>
template <class T>
void server<Compute>::combine_typed(collective& c, wire::coll_op op, std::vector<std::byte>& out) {
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

template <class Compute>
std::vector<std::byte> server<Compute>::combine(collective& c, wire::coll_op op) {
  std::vector<std::byte> out;
  switch (static_cast<element_type>(c.first.dtype)) {
    case element_type::f32: combine_typed<float>(c, op, out); break;
    case element_type::f64: combine_typed<double>(c, op, out); break;
    default: throw error("gradus: parameter server: a sum of " + std::string(wire::dtype_name(static_cast<element_type>(c.first.dtype))));
  }
  return out;
}

}  // namespace gradus::ps
