#pragma once
// trainer<Backend, Comm>: a session and a communicator that make data-parallel training
// steps (data_parallel.hpp) — the program the design card writes:
//
//   g::trainer<g::cpu_simd, g::ring_allreduce> t(g::cluster::from_env());
//   auto step = t.minimize(loss, g::sgd{.lr = 0.05, .momentum = 0.9});
//   for (auto [xb, yb] : data.shard(t.rank(), t.world_size()).batch(64))
//     step.run(x = xb, y = yb);
//
// The communicator is built from the constructor's arguments (a cluster spec, options, or
// nothing for parallel::local). A trainer makes steps; it is not one: a class whose backend
// and communicator are given cannot deduce the loss and optimizer types, so minimize()
// returns the typed step (docs/design.md).
#include <utility>

#include "gradus/parallel/communicator.hpp"
#include "gradus/parallel/data_parallel.hpp"

namespace gradus {

/// A session and a communicator that make data-parallel training steps
/// (parallel::data_parallel_step): Backend is the session's (cpu_simd, cuda), Comm the
/// communicator type (ring_allreduce, mpi_allreduce, any_communicator, parallel::local).
/// Every rank of the job makes one:
/// ```
/// g::trainer<g::cpu_simd, g::ring_allreduce> t(g::cluster::from_env());
/// auto step = t.minimize(loss, g::sgd{.lr = 0.05, .momentum = 0.9});
/// for (auto [xb, yb] : data.shard(t.rank(), t.world_size()).batch(64))
///   step.run(x = xb, y = yb);
/// ```
/// Not copyable: the steps it makes refer to its session and communicator, and must not
/// outlive it.
template <class Backend, parallel::communicator Comm>
class trainer {
 public:
  /// The communicator built from comm_args (a cluster spec and options, or nothing for
  /// parallel::local) and an empty session. Throws what Comm's constructor throws (a failed
  /// rendezvous, a malformed spec).
  template <class... A>
  explicit trainer(A&&... comm_args) : comm_(std::forward<A>(comm_args)...) {}
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  /// A data-parallel step minimizing loss over every variable it reads, opt applied to the
  /// gradients averaged over the ranks (or, where Comm holds the variables, by the parameter
  /// servers): parallel::minimize. Nothing is communicated until its first run(), which every
  /// rank makes with the same graph and optimizer (it compares them). Throws `error` for bad
  /// opts or a variable that is not float32 or float64.
  template <expression Loss, class Opt>
  auto minimize(const Loss& loss, const Opt& opt, const parallel::data_parallel_options& opts = {}) {
    return parallel::minimize(comm_, opts, s_, loss, opt);
  }
  /// The session holding the variables and optimizer state (initialize, evaluate or
  /// checkpoint through it).
  ::gradus::session<Backend>& session() { return s_; }
  /// The communicator the steps reduce through.
  Comm& communicator() { return comm_; }
  /// This process's rank: 0 .. world_size() - 1 (shard the data by it).
  int rank() const { return comm_.rank(); }
  /// The number of ranks training together.
  int world_size() const { return comm_.world_size(); }

 private:
  Comm comm_;
  ::gradus::session<Backend> s_;
};

}  // namespace gradus
