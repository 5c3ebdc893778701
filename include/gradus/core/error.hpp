#pragma once
// Every error gradus throws derives from gradus::error; messages name the operation,
// the shapes or names involved, and what was expected.
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradus {

/// The base of gradus' exceptions (a std::runtime_error): what() names the operation, the
/// shapes or names involved, and what was expected; the classes below say which kind of
/// problem it was.
struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A shape that is only known at run time (a `dyn` extent) does not fit an op.
struct shape_error : error {
  using error::error;
};

/// A feed, variable or placeholder problem: missing, unknown, wrong dtype or shape.
struct feed_error : error {
  using error::error;
};

/// An index input (labels, gather indices) holds a value outside its range.
struct index_error : error {
  using error::error;
};

/// A data file (IDX, CSV, a metrics log) is missing, truncated, corrupt or not what was
/// asked for.
struct data_error : error {
  using error::error;
};

/// A NaN or an infinity where check_numerics is on (TensorFlow's tf.debugging.check_numerics):
/// the message names the node that made it (op, shape, inputs), the variable, feed or
/// gradient it reached, and the global step. `outputs` lists the run's outputs that the
/// node feeds (by position), so a caller that knows their names can add them.
struct numerics_error : error {
  /// `what` is the message; `outs` the positions of the run's outputs the node feeds.
  numerics_error(const std::string& what, std::vector<std::size_t> outs) : error(what), outputs(std::move(outs)) {}
  std::vector<std::size_t> outputs;  ///< positions, in the run's output list, of the outputs the node feeds
};

/// A collective could not finish: a peer died, left, timed out or called a different
/// collective. The message names the operation, the peer's rank and its address. Where the
/// error blames a neighbour, `peer` is its rank and `peer_state` says what became of it:
/// "gone" (its connection closed: the process died or closed its communicator) or "silent"
/// (it sent nothing for the timeout: stopped, paused, hung or unreachable); otherwise -1
/// and "".
struct comm_error : error {
  using error::error;
  /// An error that blames neighbour rank `blamed`, whose fate is `state` ("gone" or "silent").
  comm_error(const std::string& what, int blamed, std::string state) : error(what), peer(blamed), peer_state(std::move(state)) {}
  int peer = -1;           ///< the blamed neighbour's rank; -1 where the error blames none
  std::string peer_state;  ///< "gone" or "silent" (see above); empty where peer is -1
};

}  // namespace gradus
