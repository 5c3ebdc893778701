#pragma once
// A parameter server's sparse rows: server's member functions for row-sparse gradients
// (push_rows: only the rows named move, and only their optimizer state, lazily, as
// TensorFlow's sparse apply ops and PyTorch's SparseAdam) and the stamps that let a
// row-sparse pull move only the rows changed since the worker's last (answer_pull, in
// server_consistency.hpp). Included at the end of server.hpp; not a header to include
// alone.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "gradus/comm/ps/server.hpp"
#include "gradus/comm/ps/wire.hpp"
#include "gradus/core/error.hpp"

namespace gradus::ps {

/// Rows that elements [first, first + n) of the shard touch changed (row-sparse pulls).
template <class Compute>
void server<Compute>::stamp_rows(shard_state& s, std::uint64_t first, std::uint64_t n) {
  if (s.row_len == 0 || n == 0) return;
  ++s.stamp;
  for (std::uint64_t r = first / s.row_len; r <= (first + n - 1) / s.row_len; ++r) s.row_stamp[r] = s.stamp;
}

/// A sparse-row gradient: only the rows named are updated, and only their optimizer state
/// moves (lazily, as TensorFlow's sparse apply ops and PyTorch's SparseAdam).
template <class Compute>
void server<Compute>::push_rows(int rank, const std::string& id, const wire::header& h, std::span<const std::byte> payload) {
  auto& s = find(h);
  if (static_cast<element_type>(h.dtype) != s.dt)
    throw error(prefix() + "push_rows of " + wire::dtype_name(static_cast<element_type>(h.dtype)) + " to '" + s.name + "' (" + wire::dtype_name(s.dt) + ")");
  if (!s.ready) throw error(prefix() + "push_rows to '" + s.name + "' before the chief initialised it");
  ++stats_.pushes;
  const std::size_t elem = size_of(s.dt), L = s.row_len, n = h.count;
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

/// bsp, sparse: the rows any worker named, each the sum of the workers' rows in rank
/// order over the workers that pushed, applied in row order.
template <class Compute>
template <class T>
void server<Compute>::sum_rows_in_rank_order(shard_state& s, pending_step& p) {
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

}  // namespace gradus::ps
