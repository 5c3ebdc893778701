#pragma once
// Sharding: which server holds which elements of which variable. A partitioner maps the
// variable table (in the order every worker declares it) and the number of servers to a
// list of shards, each a contiguous element range of one variable on one server. Every
// worker computes the same map from the same table, so no map is exchanged; the servers
// check each declaration against the shard they already hold.
//
// The default, balanced_by_bytes, is ps-lite's slicer done by size instead of by key
// space (ps-lite's default range split sends every small key to server 0): a variable
// larger than the per-server share is cut into contiguous pieces of about that share, and
// the pieces and the small variables are placed largest first on the least-loaded server.
// Replace it with any function of the same signature (ps_options::partition).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradus::ps {

/// One variable of the table a partitioner places, as the workers declare it.
struct variable_info {
  std::string name;               ///< the variable's name (its key)
  std::size_t elements = 0;       ///< elements in the whole variable
  std::size_t element_bytes = 4;  ///< bytes per element: 4 (float32) or 8 (float64)
  /// > 1: the variable is a table of rows of this many elements, pushed and pulled as
  /// sparse rows: every shard holds whole rows
  std::size_t row_elements = 0;
};

/// A contiguous element range of one variable, held by one server.
struct shard {
  std::size_t var = 0;     ///< index into the variable table
  std::size_t offset = 0;  ///< first element
  std::size_t count = 0;   ///< elements (> 0)
  int server = 0;          ///< the ps task that holds it: 0 ... servers - 1
};

/// Maps the variable table and the number of servers to shards (ps_options::partition):
/// every element of every variable exactly once, whole rows for a table of rows. It must be
/// deterministic: every worker computes the map alone.
using partitioner = std::function<std::vector<shard>(const std::vector<variable_info>&, int servers)>;

/// The default partitioner: a variable larger than the per-server share of the bytes is cut
/// into contiguous pieces of about that share (between rows, for a table of rows), and the
/// pieces and the small variables go largest first onto the least-loaded server (ties: the
/// lower index). Variables of 0 elements get no shard; no servers (<= 0): no shards.
inline std::vector<shard> balanced_by_bytes(const std::vector<variable_info>& vars, int servers) {
  std::vector<shard> pieces;
  if (servers <= 0) return pieces;
  std::size_t total = 0;
  for (const auto& v : vars) total += v.elements * v.element_bytes;
  const std::size_t share = std::max<std::size_t>(1, (total + static_cast<std::size_t>(servers) - 1) / static_cast<std::size_t>(servers));
  for (std::size_t i = 0; i < vars.size(); ++i) {
    const auto& v = vars[i];
    if (v.elements == 0) continue;
    const std::size_t bytes = v.elements * v.element_bytes;
    const std::size_t unit = v.row_elements > 1 ? v.row_elements : 1, units = v.elements / unit;  // cut between rows
    const std::size_t parts = std::min<std::size_t>(units, std::max<std::size_t>(1, (bytes + share - 1) / share));
    const std::size_t base = units / parts, extra = units % parts;
    std::size_t at = 0;
    for (std::size_t p = 0; p < parts; ++p) {
      const std::size_t n = (base + (p < extra ? 1 : 0)) * unit;
      pieces.push_back({i, at, n, 0});
      at += n;
    }
  }
  // Largest first onto the least-loaded server (ties: the lower index), stable for equal
  // sizes so that every worker gets the same answer.
  std::vector<std::size_t> order(pieces.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return pieces[a].count * vars[pieces[a].var].element_bytes > pieces[b].count * vars[pieces[b].var].element_bytes;
  });
  std::vector<std::size_t> load(static_cast<std::size_t>(servers), 0);
  for (const std::size_t k : order) {
    const auto s = static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    pieces[k].server = static_cast<int>(s);
    load[s] += pieces[k].count * vars[pieces[k].var].element_bytes;
  }
  return pieces;
}

/// Checks a partitioner's answer: every element of every variable exactly once, on a
/// server that exists. Throws std::invalid_argument naming the variable.
inline void check_partition(const std::vector<variable_info>& vars, int servers, const std::vector<shard>& shards) {
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> ranges(vars.size());
  for (const auto& s : shards) {
    if (s.var >= vars.size()) throw std::invalid_argument("parameter server partition: a shard of variable #" + std::to_string(s.var) + " of " + std::to_string(vars.size()));
    if (s.server < 0 || s.server >= servers)
      throw std::invalid_argument("parameter server partition: '" + vars[s.var].name + "' placed on server " + std::to_string(s.server) +
                                  " of " + std::to_string(servers));
    if (s.count == 0) throw std::invalid_argument("parameter server partition: an empty shard of '" + vars[s.var].name + "'");
    if (const auto L = vars[s.var].row_elements; L > 1 && (s.offset % L != 0 || s.count % L != 0))
      throw std::invalid_argument("parameter server partition: a shard of '" + vars[s.var].name + "' [" + std::to_string(s.offset) + ", " +
                                  std::to_string(s.offset + s.count) + ") cuts a row of " + std::to_string(L) + " elements");
    ranges[s.var].push_back({s.offset, s.count});
  }
  for (std::size_t i = 0; i < vars.size(); ++i) {
    auto& r = ranges[i];
    std::sort(r.begin(), r.end());
    std::size_t at = 0;
    for (const auto& [o, n] : r) {
      if (o != at)
        throw std::invalid_argument("parameter server partition: '" + vars[i].name + "' elements " + std::to_string(std::min(o, at)) +
                                    (o > at ? " are in no shard" : " are in two shards"));
      at = o + n;
    }
    if (at != vars[i].elements)
      throw std::invalid_argument("parameter server partition: '" + vars[i].name + "' covers " + std::to_string(at) + " of " +
                                  std::to_string(vars[i].elements) + " elements");
  }
}

}  // namespace gradus::ps
