#pragma once
// broadcast_variables(comm, session): every tensor of the session (variables and optimizer
// state) from rank 0 to all, in name order, and then its global step — the replicas start
// identical, and a job that only rank 0 could restore a checkpoint for resumes from rank 0's
// step on every rank. The data-parallel step does it before its first step; a pipeline's
// stage, to its replicas, with `only` its own tensors (every replica's session holds them).
//
// detail::with_host_span: a communicator reads and writes what it is given on the host, so
// a tensor of a device backend (a GPU's) reaches it as a host copy, copied back where it
// changes; a device pointer handed to it would fault.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/parallel/collectives.hpp"

namespace gradus::parallel {

namespace detail {
/// f(span) over the n values of type T at p, a session's tensor: p itself where the backend's
/// memory is the host's; else a host copy (on the session's stream, bound by the caller),
/// copied back to p after f when write_back.
template <class Backend, class T, class F>
void with_host_span(T* p, std::size_t n, bool write_back, F&& f) {
  if constexpr (backend_host_memory<Backend>) {
    f(std::span<T>(p, n));
  } else {
    std::vector<T> h(n);
    if (n) Backend::copy_to_host(h.data(), p, n * sizeof(T));
    f(std::span<T>(h));
    if (write_back && n) Backend::copy_to_device(p, h.data(), n * sizeof(T));
  }
}
}  // namespace detail

/// Rank 0's values of every float32/float64 tensor of `s` (or only those named in `only`) and
/// its global step, broadcast to every rank of `comm` (see above); every rank must call it
/// with the same tensors. Does nothing in a world of one. Throws gradus::error on a tensor of
/// another dtype.
template <collectives Comm, class Session>
void broadcast_variables(Comm& comm, Session& s, const std::vector<std::string>& only = {}) {
  if (comm.world_size() == 1) return;
  using backend = typename Session::backend_type;
  const auto bound = s.bind();
  const bool receives = comm.rank() != 0;
  auto entries = s.entries();
  if (!only.empty())
    std::erase_if(entries, [&](const auto& e) { return std::find(only.begin(), only.end(), e.name) == only.end(); });
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& e : entries) {
    const auto n = static_cast<std::size_t>(e.shape.numel());
    if (e.dtype == element_type::f32)
      detail::with_host_span<backend>(static_cast<float*>(e.data), n, receives, [&](auto sp) { comm.broadcast(sp, 0); });
    else if (e.dtype == element_type::f64)
      detail::with_host_span<backend>(static_cast<double*>(e.data), n, receives, [&](auto sp) { comm.broadcast(sp, 0); });
    else throw error("gradus: broadcast_variables: '" + std::string(e.name) + "' has dtype " + std::string(name_of(e.dtype)));
  }
  double step = static_cast<double>(s.global_step());  // exact below 2^53
  comm.broadcast(std::span<double>(&step, 1), 0);
  s.set_global_step(static_cast<std::int64_t>(step));
}

}  // namespace gradus::parallel
