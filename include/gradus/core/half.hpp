#pragma once
// The two 16-bit floats of mixed precision, as storage types with exact conversions from and
// to float:
//   f16   IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits): range 6.1e-5 .. 65504 (normal),
//         epsilon 2^-10; small gradients underflow, hence loss scaling (train/loss_scale.hpp).
//   bf16  bfloat16 (1, 8, 7): float's range, epsilon 2^-7; the top half of a float's bits.
// float -> half rounds to nearest even, overflows to infinity (f16), keeps subnormals, and keeps
// a NaN a NaN; half -> float is exact (every half is a float) and keeps a NaN's sign and
// payload, as numpy's and PyTorch's conversions do. Written here rather than taken from a
// library: <stdfloat>'s std::float16_t / std::bfloat16_t are C++23, and _Float16 is not in
// clang 14 on x86. The ring's compression (comm/ring/half_wire.hpp), the file readers
// (io/stored_type.hpp) and the backends' conversions all use these.
#include <bit>
#include <cstdint>

namespace gradus {

namespace half_bits {

/// float -> binary16 bits. After F. Giesen, "float->half variants" (round to nearest even).
constexpr std::uint16_t f16_from_float(float f) {
  constexpr std::uint32_t f32_inf = 255u << 23;
  constexpr std::uint32_t f16_limit = (127u + 16u) << 23;  // 65536: at or above, infinity
  constexpr std::uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = u & 0x80000000u;
  u ^= sign;
  std::uint16_t out = 0;
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

/// binary16 bits -> float, exact. After F. Giesen, "half to float".
constexpr float f16_to_float(std::uint16_t h) {
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

/// float -> bfloat16 bits, round to nearest even; a NaN stays a (quiet) NaN of its sign.
constexpr std::uint16_t bf16_from_float(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// bfloat16 bits -> float, exact.
constexpr float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

}  // namespace half_bits

/// IEEE binary16 as a storage type: 2 bytes, converts from and to float (half_bits).
struct f16 {
  std::uint16_t bits = 0;  ///< the binary16 bits
  constexpr f16() = default;
  /// f rounded to nearest even (overflow: infinity).
  constexpr explicit f16(float f) : bits(half_bits::f16_from_float(f)) {}
  /// The float of the same value (exact).
  constexpr explicit operator float() const { return half_bits::f16_to_float(bits); }
  /// The half whose bits are b.
  static constexpr f16 from_bits(std::uint16_t b) {
    f16 h;
    h.bits = b;
    return h;
  }
  friend constexpr bool operator==(f16, f16) = default;  ///< bitwise
};

/// bfloat16 as a storage type: 2 bytes, converts from and to float (half_bits).
struct bf16 {
  std::uint16_t bits = 0;  ///< the bfloat16 bits (a float's top half)
  constexpr bf16() = default;
  /// f rounded to nearest even.
  constexpr explicit bf16(float f) : bits(half_bits::bf16_from_float(f)) {}
  /// The float of the same value (exact).
  constexpr explicit operator float() const { return half_bits::bf16_to_float(bits); }
  /// The bfloat16 whose bits are b.
  static constexpr bf16 from_bits(std::uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
  friend constexpr bool operator==(bf16, bf16) = default;  ///< bitwise
};

static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2);

}  // namespace gradus
