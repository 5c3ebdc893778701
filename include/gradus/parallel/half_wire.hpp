#pragma once
// The two-byte wire types of float all-reduces (the ring: ring_options::compress, Horovod's
// Compression.fp16; or the session's precision policy, which names what gradients travel as):
//   f16   IEEE binary16: round to nearest even, overflow to infinity, subnormals kept;
//   bf16  bfloat16 (fp32's exponent, 8 significant bits): round to nearest even, fp32's range.
// NaN stays a (quiet) NaN in both. What arrives is widened to float and summed in fp32.
// With F16C (x86, -mf16c / -march=native) eight f16 values convert per instruction; the bf16
// loops are plain integer arithmetic the compiler vectorizes. Every path gives core/half.hpp's
// scalar bits (all round to nearest even; no flush of subnormals), so ranks on different CPUs
// agree.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gradus/core/dtype.hpp"
#include "gradus/core/half.hpp"
#include "gradus/core/intrinsics.hpp"

namespace gradus::parallel::half_wire {

/// Whether t is a two-byte wire type this header converts (f16 or bf16).
constexpr bool is_half(element_type t) { return t == element_type::f16 || t == element_type::bf16; }

namespace detail {

template <class T>
void to_f16(const T* src, std::byte* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__)
  if constexpr (sizeof(T) == 4) {
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(reinterpret_cast<const float*>(src) + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
    }
  }
#endif
  for (; i < n; ++i) {
    const std::uint16_t h = half_bits::f16_from_float(static_cast<float>(src[i]));
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

template <bool add, class T>
void from_f16(T* dst, const std::byte* src, std::size_t n) {
  std::size_t i = 0;
#if defined(__F16C__)
  if constexpr (sizeof(T) == 4) {
    for (; i + 8 <= n; i += 8) {
      const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i)));
      float* d = reinterpret_cast<float*>(dst) + i;
      _mm256_storeu_ps(d, add ? _mm256_add_ps(_mm256_loadu_ps(d), v) : v);
    }
  }
#endif
  for (; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const T v = static_cast<T>(half_bits::f16_to_float(h));
    if constexpr (add) dst[i] += v;
    else dst[i] = v;
  }
}

template <class T>
void to_bf16(const T* src, std::byte* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t h = half_bits::bf16_from_float(static_cast<float>(src[i]));
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

template <bool add, class T>
void from_bf16(T* dst, const std::byte* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    const T v = static_cast<T>(half_bits::bf16_to_float(h));
    if constexpr (add) dst[i] += v;
    else dst[i] = v;
  }
}

}  // namespace detail

/// dst[i] = wire(src[i]); dst may be any 2-byte location (a wire buffer). wire: f16 or bf16.
template <class T>
void compress(element_type wire, const T* src, std::byte* dst, std::size_t n) {
  if (wire == element_type::bf16) detail::to_bf16(src, dst, n);
  else detail::to_f16(src, dst, n);
}

/// dst[i] = float(src[i]) (add: dst[i] += float(src[i])); src may be any 2-byte location.
template <bool add, class T>
void decompress(element_type wire, T* dst, const std::byte* src, std::size_t n) {
  if (wire == element_type::bf16) detail::from_bf16<add>(dst, src, n);
  else detail::from_f16<add>(dst, src, n);
}

/// x[i] = float(wire(x[i])): what every other rank will receive of x.
template <class T>
void round_trip(element_type wire, T* x, std::size_t n) {
  const auto round = [&](auto to_float, auto from_float) {
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(to_float(from_float(static_cast<float>(x[i]))));
  };
  if (wire == element_type::bf16) round(half_bits::bf16_to_float, half_bits::bf16_from_float);
  else round(half_bits::f16_to_float, half_bits::f16_from_float);
}

}  // namespace gradus::parallel::half_wire
