#pragma once
// The communication layer, in three concepts, each with its own type-erased holder:
//
//   collectives       (collectives.hpp, any_collectives.hpp)   all-reduce, broadcast,
//                     barrier, sub-groups by split(color, key): the ring, MPI
//   key_value_store   (key_value_store.hpp, any_key_value_store.hpp)   push/pull of dense
//                     and sparse rows, step clocks: the parameter server
//   point_to_point    (point_to_point.hpp, any_point_to_point.hpp)   send/recv between
//                     named ranks: pipelines across processes
//
// and `local` (local.hpp), the world of one, for all three. A trainer is written once
// against them (the data-parallel step, data_parallel.hpp); any_communicator
// (any_communicator.hpp) is the run-time choice a program's --comm option makes
// (collectives, and a store where the policy holds the variables).
//
// This header keeps the names the layer had before it was split: `communicator` (a policy
// with collectives, what the data-parallel step takes), `parameter_server_policy` (one that
// is also a key-value store: the step pushes and pulls instead of averaging), holds_variables,
// and, for hand-written loops, broadcast_variables (broadcast_variables.hpp) and
// reduce_gradients (reduce_gradients.hpp).
#include "gradus/parallel/any_communicator.hpp"
#include "gradus/parallel/broadcast_variables.hpp"
#include "gradus/parallel/collectives.hpp"
#include "gradus/parallel/key_value_store.hpp"
#include "gradus/parallel/local.hpp"
#include "gradus/parallel/point_to_point.hpp"
#include "gradus/parallel/reduce_gradients.hpp"

namespace gradus::parallel {

template <class C>
concept communicator = collectives<C>;

/// A communicator that holds the variables itself — a parameter server: collectives for the
/// workers' agreement and barriers, a key-value store for the variables.
template <class C>
concept parameter_server_policy = communicator<C> && key_value_store<C>;

/// Whether c holds the variables (a parameter server) at run time: any_communicator answers
/// for the policy it wraps.
template <class C>
bool holds_variables(C& c) {
  return key_value_store_of(c) != nullptr;
}

static_assert(communicator<local>);
static_assert(communicator<any_communicator>);
static_assert(!parameter_server_policy<any_communicator>);  ///< its store is any_communicator::store()

}  // namespace gradus::parallel

namespace gradus {
/// gradus::dist: the old name of gradus::parallel (include/gradus/dist/ until 0.1), kept for
/// one release.
namespace dist = parallel;
}  // namespace gradus
