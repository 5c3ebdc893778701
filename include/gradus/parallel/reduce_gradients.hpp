#pragma once
// reduce_gradients(comm, step): every gradient of a train step's last compute_gradients()
// averaged over the world, for a hand-written loop —
//
//   step.compute_gradients(feeds...);
//   g::parallel::reduce_gradients(comm, step);
//   step.apply_gradients();
//
// It is not a second road: it runs the data-parallel step's own buckets
// (gradient_buckets.hpp), on the caller's thread, without overlap. A trainer wants
// parallel::minimize (data_parallel.hpp): the same averages during the backward pass, the
// run fingerprint, and parameter servers.
#include <cstddef>
#include <string>
#include <type_traits>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/collectives.hpp"
#include "gradus/parallel/gradient_buckets.hpp"

namespace gradus::parallel {

/// Averages every gradient of `step`'s last compute_gradients() over `comm`'s world, in place
/// (see above); every rank must call it. Does nothing in a world of one. Throws gradus::error
/// on a sparse gradient (call set_sparse_as_dense(true) on the step) or a dtype other than
/// float32/float64.
template <collectives Comm, class Step>
void reduce_gradients(Comm& comm, Step& step) {
  if (comm.world_size() == 1) return;
  const auto bound = step.owner().bind();
  for (const auto& g : step.gradients()) {
    if (g.sparse())
      throw error("gradus: reduce_gradients: the gradient of '" + std::string(g.name) +
                  "' is sparse (embedding_lookup): call set_sparse_as_dense(true) on the step to all-reduce it");
    if (g.dtype != element_type::f32 && g.dtype != element_type::f64)
      throw error("gradus: reduce_gradients: gradient of '" + std::string(g.name) + "' has dtype " +
                  std::string(name_of(g.dtype)));
  }
  gradient_buckets<std::remove_cvref_t<Step>> buckets(default_bucket_bytes);
  buckets.begin_step();
  const auto grads = step.gradients();
  for (std::size_t i = 0; i < grads.size(); ++i) buckets.arrived(i, grads[i], [&](std::size_t k) { buckets.average(comm, k); });
  buckets.upload(grads);
}

}  // namespace gradus::parallel
