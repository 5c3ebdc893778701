#pragma once
// IEEE half precision for the ring's gradient compression (ring_options::compress = "fp16",
// Horovod's Compression.fp16): float <-> binary16 with round-to-nearest-even, overflow to
// infinity, subnormals kept, NaN kept a (quiet) NaN. With F16C (x86, -mf16c / -march=native)
// eight values convert per instruction; without it the scalar conversions below, which give
// the same bits (both are IEEE round-to-nearest-even), so ranks on different CPUs still agree.
// Written here rather than taken from a library: <stdfloat>'s std::float16_t is C++23, and
// _Float16 is not in clang 14 on x86.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace gradus::ring::fp16 {

/// After F. Giesen, "float->half variants" (RTNE) and "half to float" (2016).
inline std::uint16_t from_float(float f) {
  constexpr std::uint32_t f32_inf = 255u << 23;
  constexpr std::uint32_t f16_limit = (127u + 16u) << 23;            // 65536: at or above, infinity
  constexpr std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint16_t out;
  if (u >= f16_limit) {
    out = u > f32_inf ? 0x7e00 : 0x7c00;  // NaN stays NaN; the rest overflows to infinity
  } else if (u < (113u << 23)) {           // below 2^-14: a subnormal half, or zero
    const float sum = std::bit_cast<float>(u) + std::bit_cast<float>(denorm_magic);
    out = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(sum) - denorm_magic);
  } else {
    const std::uint32_t odd = (u >> 13) & 1u;
    u += ((15u - 127u) << 23) + 0xfffu;  // rebias the exponent, round half up...
    u += odd;                            // ...and half to even
    out = static_cast<std::uint16_t>(u >> 13);
  }
  return static_cast<std::uint16_t>(out | (sign >> 16));
}

inline float to_float(std::uint16_t h) {
  constexpr std::uint32_t shifted_exp = 0x7c00u << 13;
  std::uint32_t o = (static_cast<std::uint32_t>(h) & 0x7fffu) << 13;
  const std::uint32_t exp = shifted_exp & o;
  o += (127u - 15u) << 23;
  if (exp == shifted_exp) {
    o += (128u - 16u) << 23;  // infinity or NaN
  } else if (exp == 0) {
    o += 1u << 23;  // zero or subnormal: renormalise
    o = std::bit_cast<std::uint32_t>(std::bit_cast<float>(o) - std::bit_cast<float>(113u << 23));
  }
  o |= (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
  return std::bit_cast<float>(o);
}

/// dst[i] = half(src[i]); dst may be any 2-byte location (a wire buffer).
template <class T>
void compress(const T* src, std::byte* dst, std::size_t n) {
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
    const std::uint16_t h = from_float(static_cast<float>(src[i]));
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

/// dst[i] = float(src[i]) (add: dst[i] += float(src[i])); src may be any 2-byte location.
template <bool add, class T>
void decompress(T* dst, const std::byte* src, std::size_t n) {
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
    const T v = static_cast<T>(to_float(h));
    if constexpr (add) dst[i] += v;
    else dst[i] = v;
  }
}

/// x[i] = float(half(x[i])): what every other rank will receive of x.
template <class T>
void round_trip(T* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(to_float(from_float(static_cast<float>(x[i]))));
}

}  // namespace gradus::ring::fp16
