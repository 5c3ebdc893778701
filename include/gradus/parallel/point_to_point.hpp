#pragma once
// The point-to-point concept: one rank sends a buffer to another named rank, which receives
// it — what the ring's pairs do inside its all-reduce, and what a pipeline across processes
// needs for its activations and gradients (stage k sends to stage k + 1).
//
//   send(x, to)     x (bytes, float or double) to rank `to`; returns once x may be reused
//   recv(x, from)   fills x with the next message from rank `from`, which must hold exactly
//                   x.size() elements (a mismatch throws, naming the peer and both sizes)
//
//   probe(from)     optional: whether the next message from `from` has arrived, so that
//                   recv would not wait (MPI_Iprobe); waits for nothing. A pipeline stage
//                   computes its weight gradients while it says no (`probing`)
//
// Messages between one pair of ranks arrive in the order they were sent. A policy that
// cannot finish (a dead peer) throws an error naming the peer; it never blocks forever.
// `local` (local.hpp) implements it for a world of one (a rank sending to itself);
// `mpi_allreduce` with MPI_Send / MPI_Recv; `ring_allreduce` over a mesh of ZeroMQ
// connections beside its ring, made on first use (gradus/comm/ring/point_to_point.hpp), and
// so do the ring's and MPI's sub-groups (split).
#include <concepts>
#include <cstddef>
#include <span>

namespace gradus::parallel {

template <class C>
concept point_to_point = requires(C& c, std::span<const std::byte> cb, std::span<std::byte> b, std::span<const float> cf,
                                  std::span<float> f, std::span<const double> cd, std::span<double> d) {
  { c.rank() } -> std::convertible_to<int>;
  { c.world_size() } -> std::convertible_to<int>;
  c.send(cb, 0);
  c.send(cf, 0);
  c.send(cd, 0);
  c.recv(b, 0);
  c.recv(f, 0);
  c.recv(d, 0);
};
/// A point-to-point policy that can tell whether a message has arrived without waiting for
/// it: the ring (and its sub-groups), MPI, `local`, `thread_world`.
template <class C>
concept probing = point_to_point<C> && requires(C& c) {
  { c.probe(0) } -> std::convertible_to<bool>;
};

}  // namespace gradus::parallel
