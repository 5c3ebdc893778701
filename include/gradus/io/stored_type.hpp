#pragma once
// The element types other programs store (NumPy descrs in .npy/.npz, safetensors dtypes) and
// their conversion on load into the five element types gradus keeps (io/npz_array.hpp), every
// value exact:
//   float16, bfloat16 -> float32      float32 -> float32       float64 -> float64
//   int8, int16, uint16 -> int32      int32 -> int32           int64, uint32 -> int64
//   uint64 -> int64 where every value is at most 2^63 - 1, else refused naming the first
//   bool (bytes 0 or 1) -> uint8      uint8 -> uint8
// in either byte order. Apart from npy_format.hpp and safetensors.hpp because both formats
// name the same types differently and convert them the same way.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "gradus/core/dtype.hpp"

namespace gradus::io::detail {

enum class stored_kind { ieee_float, bfloat, signed_int, unsigned_int, boolean };

/// One element type as a file stores it. size: 1, 2, 4 or 8 bytes (float: 2, 4 or 8; bfloat: 2;
/// bool: 1).
struct stored_type {
  stored_kind kind = stored_kind::ieee_float;
  std::size_t size = 4;
  bool big_endian = false;
};

/// "float16", "bfloat16", "int8", ..., "uint64", "bool": numpy's names.
inline std::string stored_type_name(const stored_type& t) {
  switch (t.kind) {
    case stored_kind::ieee_float: return "float" + std::to_string(8 * t.size);
    case stored_kind::bfloat: return std::string(name_of(element_type::bf16));
    case stored_kind::signed_int: return "int" + std::to_string(8 * t.size);
    case stored_kind::unsigned_int: return "uint" + std::to_string(8 * t.size);
    case stored_kind::boolean: return "bool";
  }
  return "?";
}

/// The element type a stored type loads as (the table above).
inline element_type loads_as(const stored_type& t) {
  switch (t.kind) {
    case stored_kind::ieee_float: return t.size == 8 ? element_type::f64 : element_type::f32;
    case stored_kind::bfloat: return element_type::f32;
    case stored_kind::signed_int: return t.size == 8 ? element_type::i64 : element_type::i32;
    case stored_kind::unsigned_int:
      return t.size == 1 ? element_type::u8 : t.size == 2 ? element_type::i32 : element_type::i64;
    case stored_kind::boolean: return element_type::u8;
  }
  return element_type::none;
}

/// Bytes per element of loads_as(t).
inline std::size_t loaded_size(const stored_type& t) { return size_of(loads_as(t)); }

/// Are the stored bytes already those of loads_as(t) (no conversion, no byte swap)?
inline bool loads_unchanged(const stored_type& t) {
  if (t.kind == stored_kind::bfloat || t.kind == stored_kind::boolean) return false;
  return (t.size == 1 || !t.big_endian) && t.size == loaded_size(t) &&
         !(t.kind == stored_kind::unsigned_int && t.size > 1);
}

/// Converts n elements of `t` at src into loads_as(t) at dst (n * loaded_size(t) bytes).
/// Returns an empty string, or what stops the conversion: the first value that does not fit
/// (a uint64 above 2^63 - 1, a bool byte other than 0 and 1) and its index in src.
inline std::string convert_elements(const stored_type& t, const std::byte* src, std::size_t n, std::byte* dst) {
  const std::size_t out = loaded_size(t);
  if (loads_unchanged(t)) {
    if (n) std::memcpy(dst, src, n * out);
    return {};
  }
  for (std::size_t i = 0; i < n; ++i, src += t.size, dst += out) {
    std::uint64_t u = 0;
    for (std::size_t k = 0; k < t.size; ++k)
      u = u << 8 | std::to_integer<std::uint64_t>(src[t.big_endian ? k : t.size - 1 - k]);
    const auto put = [&](auto v) { std::memcpy(dst, &v, sizeof v); };
    switch (t.kind) {
      case stored_kind::ieee_float:
        if (t.size == 2) put(half_bits::f16_to_float(static_cast<std::uint16_t>(u)));  // NaN payloads kept
        else if (t.size == 4) put(static_cast<std::uint32_t>(u));
        else put(u);
        break;
      case stored_kind::bfloat: put(static_cast<std::uint32_t>(u << 16)); break;
      case stored_kind::signed_int: {
        const unsigned shift = static_cast<unsigned>(64 - 8 * t.size);
        const auto v = static_cast<std::int64_t>(u << shift) >> shift;  // sign-extended
        if (out == 4) put(static_cast<std::int32_t>(v));
        else put(v);
        break;
      }
      case stored_kind::unsigned_int:
        if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
          return "uint64 value " + std::to_string(u) + " at index " + std::to_string(i) +
                 " does not fit int64 (gradus has no uint64)";
        if (out == 1) put(static_cast<std::uint8_t>(u));
        else if (out == 4) put(static_cast<std::int32_t>(u));
        else put(static_cast<std::int64_t>(u));
        break;
      case stored_kind::boolean:
        if (u > 1)
          return "bool byte " + std::to_string(u) + " at index " + std::to_string(i) +
                 " is neither 0 nor 1 (numpy and PyTorch write only those)";
        put(static_cast<std::uint8_t>(u));
        break;
    }
  }
  return {};
}

}  // namespace gradus::io::detail
