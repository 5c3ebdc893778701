#pragma once
// The collectives concept: operations every rank of a group calls together, in the same
// order, as MPI's and NCCL's do. The ring all-reduce and MPI are collectives; so is `local`
// (local.hpp), the world of one. The data-parallel step averages gradients through them
// (data_parallel.hpp); the run fingerprint and the replica check agree through them
// (agree.hpp).
//
//   allreduce_sum / allreduce_average   in place, on host-visible float or double buffers
//   broadcast(x, root)                  in place, of float, double or raw bytes (run
//                                       fingerprints, serialized state)
//   barrier()                           returns once every rank has entered it
//
// Any length, including 0. A policy that cannot finish (a dead peer) throws an error naming
// the peer and the operation; it never blocks forever.
//
// Sub-groups are optional (`splittable`): c.split(color, key) is MPI_Comm_split — every rank
// calls it; the ranks that pass the same color form a new group, ranked by key (ties by
// their rank here), and each gets its own collectives over that group (a pipeline's
// data-parallel replicas of one stage). any_collectives (any_collectives.hpp) reports
// "not supported yet" for a policy without it.
#include <concepts>
#include <cstddef>
#include <span>

namespace gradus::parallel {

template <class C>
concept collectives = requires(C& c, std::span<float> f, std::span<double> d, std::span<std::byte> b) {
  { c.rank() } -> std::convertible_to<int>;
  { c.world_size() } -> std::convertible_to<int>;
  c.allreduce_sum(f);
  c.allreduce_sum(d);
  c.allreduce_average(f);
  c.allreduce_average(d);
  c.broadcast(f, 0);
  c.broadcast(d, 0);
  c.broadcast(b, 0);
  c.barrier();
};

/// Collectives that make sub-groups: split(color, key) returns the collectives of this
/// rank's group (color >= 0; MPI's MPI_UNDEFINED has no counterpart: every rank joins one).
template <class C>
concept splittable = collectives<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> collectives;
};

}  // namespace gradus::parallel
