#pragma once
// The key-value store concept: a store that holds the variables — a parameter server
// (gradus/comm/ps.hpp: sharded servers, BSP / bounded-staleness / asynchronous modes). The
// data-parallel step (data_parallel.hpp, through ps_worker.hpp) sees one and, instead of
// averaging the gradients and applying them locally, pushes each gradient under its
// variable's name as soon as it is final, ends its step, and pulls every variable back; the
// store's optimizer applies the updates.
//
//   initialize(key, values)   offers a variable's first value (the store keeps the first it
//                             gets: rank 0's)
//   push(key, gradient)       this worker's gradient of this step
//   step_done()               this worker's step is over (the consistency clock)
//   pull(key, out)            the variable's value; when and what it waits for is the mode:
//                             BSP waits for every worker's push of this step, bounded
//                             staleness for all but the last few steps, async for nothing
//
// Optional, probed by ps_worker and any_key_value_store (a store without them still trains):
//   initialize(key, values, slots, step) / snapshot(key, values, slots)   the optimizer's
//       state and the global step with the variable (resuming a checkpoint; pull_state)
//   set_optimizer(name, settings) / set_learning_rate(lr)   what the store applies
//   set_push_type(element_type) -> bool   what float gradients travel as (the precision
//       policy's comm type: bf16 or f16 halves the pushes' bytes); false: not carried
//   set_rows / push_rows / pull_rows (`row_store`)   an embedding's gradient as its rows only
//   restarted / rejoin_job / join_point (`rejoin_store`)   a lost worker's restart taken back
//       at the workers' next join point (async and ssp parameter servers)
//
// A store is not a collective; a parameter server is both (parameter_server_policy in
// communicator.hpp): the workers still agree on the run fingerprint and meet at barriers.
#include <cstddef>
#include <concepts>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace gradus::parallel {

template <class C>
concept key_value_store = requires(C& c, std::string_view key, std::span<const float> gf, std::span<float> wf,
                                   std::span<const double> gd, std::span<double> wd) {
  c.initialize(key, gf);
  c.initialize(key, gd);
  c.push(key, gf);
  c.push(key, gd);
  c.step_done();
  c.pull(key, wf);
  c.pull(key, wd);
};

/// A store that moves sparse rows: set_rows(key, row_elements) declares a table, push_rows
/// sends a gradient's rows (sorted, unique) and their values, pull_rows refreshes the rows
/// that changed.
template <class C>
concept row_store = requires(C& c, std::string_view key, std::span<const std::int64_t> rows, std::span<const float> v,
                             std::span<float> t) {
  c.set_rows(key, std::size_t{});
  c.push_rows(key, rows, v);
  c.pull_rows(key, t);
};

/// A store that takes a lost worker's restart back: restarted() says this process is one
/// (it skips the start-up collectives the others ran), rejoin_job() waits for the workers'
/// next join point and returns the step to go on from (nothing: the job ended first), and
/// join_point() is the barrier where the others take it back (returning the ranks that came
/// back: every worker then compares the run fingerprint with them).
template <class C>
concept rejoin_store = requires(C& c) {
  { c.restarted() } -> std::convertible_to<bool>;
  { c.rejoin_job() } -> std::same_as<std::optional<std::int64_t>>;
  { c.join_point() } -> std::same_as<std::vector<int>>;
};

/// The store a communicator offers (what the data-parallel step pushes to): the communicator
/// itself where it is one (a parameter server), the one an any_communicator holds at run time
/// (nullptr when it holds none), or none at all (a no_store pointer, always null).
struct no_store {};

/// A pointer to the store `c` offers (see above): `&c.store()` or null where `c` holds one at
/// run time, `&c` where `c` is a key_value_store, else a null `no_store*`.
template <class C>
auto* key_value_store_of(C& c) {
  if constexpr (requires { c.holds_variables(); c.store(); }) return c.holds_variables() ? &c.store() : nullptr;
  else if constexpr (key_value_store<C>) return &c;
  else return static_cast<no_store*>(nullptr);
}
/// The store type key_value_store_of gives for a communicator C (`no_store` where it has none).
template <class C>
using key_value_store_t = std::remove_pointer_t<decltype(key_value_store_of(std::declval<C&>()))>;

}  // namespace gradus::parallel
