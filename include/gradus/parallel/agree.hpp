#pragma once
// Agreement between data-parallel ranks on what they are running, not only on tensor
// sizes. Two ranks given a different learning rate, batch size or data seed run the same
// collectives with the same sizes, so the ring's per-message fingerprint cannot see it:
// they train on, exit 0, and their weights diverge. So:
//
//   parallel::agree(comm, "run fingerprint", fields)
//       every rank holds a list of (name, exact text) fields; rank 0's list is broadcast,
//       each rank compares, and if any rank differs every rank throws run_mismatch_error
//       naming the first differing field, the lowest rank that differs, both values, and
//       the other ranks that differ. Collectives: two broadcasts and one all-reduce when
//       the ranks agree, two more broadcasts when they do not, the same on every rank, so
//       a mismatch never leaves a rank waiting.
//   parallel::session_fields(session)
//       the graph's tensors (variables and optimizer state): name, dtype, shape;
//   parallel::optimizer_fields(opt)
//       the optimizer's name and every hyper-parameter it reports (settings());
//   parallel::replica_fields(session)
//       the same tensors' contents, as an FNV-1a checksum each, and the global step:
//       agree(comm, "replica check", replica_fields(s)) names the first tensor whose
//       bits differ between replicas (parallel::data_parallel_step::check_replicas()).
//
// A communicator whose world is one agrees with itself at no cost.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/parallel/communicator.hpp"

namespace gradus {

/// Ranks that disagree on their run (fingerprint) or on their replicas' contents.
struct run_mismatch_error : error {
  using error::error;
  std::string field;           ///< the first field that differs
  int rank = -1;               ///< the lowest rank that differs from rank 0
  /// \var value
  /// The field's value on rank `rank` (empty where that rank has no field there).
  std::string value, value0;   ///< the field's value on rank 0 (empty where it has none there)
};

}  // namespace gradus

namespace gradus::parallel {

/// One field of a run fingerprint or a replica check (agree()): a name and its value as
/// exact text, "optimizer.lr" = "0.05". A NUL in either is sent as a space.
struct run_field {
  std::string name;   ///< what the field is: "world_size", "optimizer.lr", "tensor w1"
  std::string value;  ///< its value, compared as text
  /// Same name and same value.
  friend bool operator==(const run_field&, const run_field&) = default;
};

namespace agree_detail {

/// name '\0' value '\0' ... (names and values hold no NUL: they are printable text)
inline std::vector<std::byte> pack(const std::vector<run_field>& fields) {
  std::vector<std::byte> out;
  const auto put = [&](std::string_view s) {
    for (char c : s) out.push_back(static_cast<std::byte>(c == '\0' ? ' ' : c));
    out.push_back(std::byte{0});
  };
  for (const auto& f : fields) {
    put(f.name);
    put(f.value);
  }
  return out;
}

inline std::vector<run_field> unpack(std::span<const std::byte> bytes) {
  std::vector<std::string> parts(1);
  for (std::byte b : bytes) {
    if (b == std::byte{0}) parts.emplace_back();
    else parts.back().push_back(static_cast<char>(b));
  }
  parts.pop_back();  // after the last terminator (or the empty list's only part)
  std::vector<run_field> out;
  for (std::size_t i = 0; i + 1 < parts.size(); i += 2) out.push_back({parts[i], parts[i + 1]});
  return out;
}

/// Root's list to every rank: its length (a double holds every size below 2^53 exactly),
/// then its bytes.
template <communicator Comm>
std::vector<run_field> broadcast_fields(Comm& comm, const std::vector<run_field>& mine, int root) {
  std::vector<std::byte> bytes = comm.rank() == root ? pack(mine) : std::vector<std::byte>{};
  double size = static_cast<double>(bytes.size());
  comm.broadcast(std::span<double>(&size, 1), root);
  bytes.resize(static_cast<std::size_t>(size));
  comm.broadcast(std::span<std::byte>(bytes), root);
  return comm.rank() == root ? mine : unpack(bytes);
}

/// 1 + the index of the first field where `a` and `b` differ (a missing field counts as
/// differing); 0 when they are equal.
inline std::size_t first_difference(const std::vector<run_field>& a, const std::vector<run_field>& b) {
  const std::size_t n = std::min(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i)
    if (!(a[i] == b[i])) return i + 1;
  return a.size() == b.size() ? 0 : n + 1;
}

}  // namespace agree_detail

/// Every rank must hold the same fields as rank 0; otherwise every rank throws
/// run_mismatch_error ("gradus: run fingerprint differs between ranks: rank 1 has
/// optimizer.lr = 0.1, rank 0 has optimizer.lr = 0.05 ..."). `what` names the check.
template <communicator Comm>
void agree(Comm& comm, std::string_view what, const std::vector<run_field>& fields) {
  const int world = comm.world_size(), me = comm.rank();
  if (world == 1) return;
  const auto rank0 = agree_detail::broadcast_fields(comm, fields, 0);
  // Where each rank first differs from rank 0 (an all-gather through a sum: slot r is
  // rank r's alone; a double holds every index below 2^53 exactly).
  std::vector<double> where(static_cast<std::size_t>(world), 0.0);
  where[static_cast<std::size_t>(me)] = static_cast<double>(agree_detail::first_difference(fields, rank0));
  comm.allreduce_sum(std::span<double>(where));
  std::vector<int> differ;
  for (int r = 0; r < world; ++r)
    if (where[static_cast<std::size_t>(r)] != 0) differ.push_back(r);
  if (differ.empty()) return;
  // The lowest differing rank's list to everyone, so that every rank can name both values.
  const int culprit = differ.front();
  const auto theirs = agree_detail::broadcast_fields(comm, fields, culprit);
  const std::size_t i = static_cast<std::size_t>(where[static_cast<std::size_t>(culprit)]) - 1;
  // Each side's field at i (the names differ too when a rank has another optimizer or graph).
  const auto side = [&](const std::vector<run_field>& f) {
    return i < f.size() ? f[i].name + " = " + f[i].value : std::string("no more fields");
  };
  std::string msg = "gradus: " + std::string(what) + " differs between ranks: rank " + std::to_string(culprit) +
                    " has " + side(theirs) + ", rank 0 has " + side(rank0);
  if (differ.size() == 2) msg += " (rank " + std::to_string(differ[1]) + " differs from rank 0 too)";
  if (differ.size() > 2) {
    msg += " (ranks";
    for (std::size_t k = 1; k < differ.size(); ++k) msg += (k > 1 ? ", " : " ") + std::to_string(differ[k]);
    msg += " differ from rank 0 too)";
  }
  msg += "; noticed on rank " + std::to_string(me);
  run_mismatch_error out(msg);
  out.field = i < rank0.size() ? rank0[i].name : i < theirs.size() ? theirs[i].name : std::string();
  out.rank = culprit;
  out.value = i < theirs.size() ? theirs[i].value : std::string();
  out.value0 = i < rank0.size() ? rank0[i].value : std::string();
  throw out;
}

/// The session's precision policy: "precision" = "fp32", "bf16" or "fp16" (core/precision.hpp).
template <class Session>
run_field precision_field(const Session&) {
  return {"precision", precision_of_backend_t<typename Session::backend_type>::name};
}

/// The session's tensors (variables and optimizer state) by name: "tensor w1" =
/// "float32 (784, 256)".
template <class Session>
std::vector<run_field> session_fields(const Session& s) {
  auto entries = s.entries();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<run_field> out;
  for (const auto& e : entries)
    out.push_back({"tensor " + std::string(e.name), std::string(name_of(e.dtype)) + " " + to_string(e.shape)});
  return out;
}

/// The optimizer's name and hyper-parameters: "optimizer" = "adam", "optimizer.lr" = "0.001"...
template <class Opt>
std::vector<run_field> optimizer_fields(const Opt& opt) {
  std::vector<run_field> out{{"optimizer", std::string(Opt::name)}};
  if constexpr (requires { opt.settings([](std::string_view, const std::string&) {}); })
    opt.settings([&](std::string_view k, const std::string& v) { out.push_back({"optimizer." + std::string(k), v}); });
  return out;
}

/// FNV-1a (64-bit) of each tensor's bytes, in hex, by name, and the global step.
template <class Session>
std::vector<run_field> replica_fields(Session& s) {
  auto entries = s.entries();
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  std::vector<run_field> out{{"global_step", std::to_string(s.global_step())}};
  std::vector<unsigned char> host;
  for (const auto& e : entries) {
    const std::size_t bytes = static_cast<std::size_t>(e.shape.numel()) * size_of(e.dtype);
    host.resize(bytes);
    if (bytes) Session::backend_type::copy_to_host(host.data(), e.data, bytes);
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    out.push_back({"checksum of " + std::string(e.name), hex});
  }
  return out;
}

}  // namespace gradus::parallel
