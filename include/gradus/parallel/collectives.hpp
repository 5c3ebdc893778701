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
//
// A narrower wire is optional too (`wire_collectives`): c.allreduce_average(x, wire) averages
// float x with the values travelling as `wire` (bf16 or f16, summed in fp32): what a mixed-
// precision policy's gradients travel as (core/precision.hpp's Comm). average_as(c, x, wire)
// is the call a trainer makes: where the policy has no such wire, x travels as float32 after
// one warning naming the policy.
#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>

#include "gradus/core/dtype.hpp"

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

/// Collectives whose float averages can travel in a two-byte type: allreduce_average(x, wire)
/// with wire bf16 or f16 (element_type::f32 or none: as allreduce_average(x)).
template <class C>
concept wire_collectives = collectives<C> && requires(C& c, std::span<float> f, element_type w) {
  c.allreduce_average(f, w);
};

/// The average of float x over c's world with x travelling as `wire` where c can (see
/// wire_collectives); elsewhere as float32, after one warning per process naming c's policy.
template <collectives C>
void average_as(C& c, std::span<float> x, element_type wire) {
  if (wire == element_type::f32 || wire == element_type::none) return c.allreduce_average(x);
  if constexpr (wire_collectives<C>) {
    c.allreduce_average(x, wire);
  } else {
    static std::atomic<bool> said{false};
    const char* name = "this communicator";
    if constexpr (requires { std::string(C::name); }) name = C::name;
    if (c.world_size() > 1 && !said.exchange(true))
      std::fprintf(stderr, "gradus: %s: gradients travel as float32: it has no %s wire (the ring's and MPI's "
                   "allreduce have; the precision policy's Comm type asked for it)\n", name, std::string(name_of(wire)).c_str());
    c.allreduce_average(x);
  }
}

}  // namespace gradus::parallel
