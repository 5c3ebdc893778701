#pragma once
// What a collective carries: every communicator (the ring, MPI, the parameter server's
// collectives) sums and averages float and double buffers, and broadcasts those or raw
// bytes (run fingerprints, serialized state). One definition, so that the communicators
// accept the same element types and a new one (Gloo, NCCL) states the same contract.
//
// In their headers and errors a buffer's elements are element_of<T> (core/dtype.hpp): f32,
// f64, or none for raw bytes, which element_name calls "bytes" and element_bytes counts as 1.
#include <concepts>
#include <cstddef>
#include <string_view>

#include "gradus/core/dtype.hpp"

namespace gradus::parallel {

/// What allreduce_sum and allreduce_average reduce.
template <class T>
concept collective_element = std::same_as<T, float> || std::same_as<T, double>;

/// What broadcast also carries: raw bytes.
template <class T>
concept broadcast_element = collective_element<T> || std::same_as<T, std::byte>;

/// The element type a collective's buffer of T holds: f32, f64, or none (std::byte: raw bytes).
template <broadcast_element T>
inline constexpr element_type element_of = element_type_of<T>;

/// An element type as the communicators' errors name it: name_of ("float32"), or "bytes" for
/// none (raw bytes).
constexpr std::string_view element_name(element_type t) { return t == element_type::none ? "bytes" : name_of(t); }

/// Bytes per element as a collective carries it: size_of, or 1 for none (raw bytes).
constexpr std::size_t element_bytes(element_type t) { return t == element_type::none ? 1 : size_of(t); }

}  // namespace gradus::parallel
