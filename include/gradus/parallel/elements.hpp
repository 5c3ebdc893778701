#pragma once
// What a collective carries: every communicator (the ring, MPI, the parameter server's
// collectives) sums and averages float and double buffers, and broadcasts those or raw
// bytes (run fingerprints, serialized state). One definition, so that the communicators
// accept the same element types and a new one (Gloo, NCCL) states the same contract.
#include <concepts>
#include <cstddef>

namespace gradus::parallel {

/// What allreduce_sum and allreduce_average reduce.
template <class T>
concept collective_element = std::same_as<T, float> || std::same_as<T, double>;

/// What broadcast also carries: raw bytes.
template <class T>
concept broadcast_element = collective_element<T> || std::same_as<T, std::byte>;

}  // namespace gradus::parallel
