#pragma once
// Every error gradus throws derives from gradus::error; messages name the operation,
// the shapes or names involved, and what was expected.
#include <stdexcept>
#include <string>

namespace gradus {

struct error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A shape that is only known at run time (a `dyn` extent) does not fit an op.
struct shape_error : error {
  using error::error;
};

// A feed, variable or placeholder problem: missing, unknown, wrong dtype or shape.
struct feed_error : error {
  using error::error;
};

// An index input (labels, gather indices) holds a value outside its range.
struct index_error : error {
  using error::error;
};

// A collective could not finish: a peer died, left, timed out or called a different
// collective. The message names the operation, the peer's rank and its address.
struct comm_error : error {
  using error::error;
};

}  // namespace gradus
