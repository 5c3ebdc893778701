#pragma once
// IEEE half precision for the ring's gradient compression (ring_options::compress = "fp16",
// Horovod's Compression.fp16): float <-> binary16 with round-to-nearest-even, overflow to
// infinity, subnormals kept, NaN kept a (quiet) NaN. With F16C (x86, -mf16c / -march=native)
// eight values convert per instruction; without it (and for the tail) the scalar conversions
// of core/half.hpp, which give the same bits (both are IEEE round-to-nearest-even), so ranks
// on different CPUs still agree.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "gradus/core/half.hpp"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace gradus::ring::fp16 {

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
    const std::uint16_t h = half_bits::f16_from_float(static_cast<float>(src[i]));
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
    const T v = static_cast<T>(half_bits::f16_to_float(h));
    if constexpr (add) dst[i] += v;
    else dst[i] = v;
  }
}

/// x[i] = float(half(x[i])): what every other rank will receive of x.
template <class T>
void round_trip(T* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<T>(half_bits::f16_to_float(half_bits::f16_from_float(static_cast<float>(x[i]))));
}

}  // namespace gradus::ring::fp16
