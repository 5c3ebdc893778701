#pragma once
// trainer<Backend, Comm>: a session and a communicator that make data-parallel training
// steps (data_parallel.hpp) — the program the design card writes:
//
//   g::trainer<g::cpu_simd, g::ring_allreduce> t(g::cluster::from_env());
//   auto step = t.minimize(loss, g::sgd{.lr = 0.05, .momentum = 0.9});
//   for (auto [xb, yb] : data.shard(t.rank(), t.world_size()).batches(64))
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

template <class Backend, parallel::communicator Comm>
class trainer {
 public:
  template <class... A>
  explicit trainer(A&&... comm_args) : comm_(std::forward<A>(comm_args)...) {}
  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;

  template <expression Loss, class Opt>
  auto minimize(const Loss& loss, const Opt& opt, const parallel::data_parallel_options& opts = {}) {
    return parallel::minimize(comm_, opts, s_, loss, opt);
  }
  ::gradus::session<Backend>& session() { return s_; }
  Comm& communicator() { return comm_; }
  int rank() const { return comm_.rank(); }
  int world_size() const { return comm_.world_size(); }

 private:
  Comm comm_;
  ::gradus::session<Backend> s_;
};

}  // namespace gradus
