#pragma once
// The element-type vocabulary, once: what the planner, the backends, the checkpoint readers
// and writers, the wire formats and the communicators say about a buffer's elements.
//
//   dtype / real_dtype       the C++ types tensors compute with (float, double; int32 labels)
//   element_type             every element type a buffer, file or message may hold, as a
//                            value (an enum: it travels in headers and fingerprints)
//   element_type_of<T>       T's element_type, at compile time
//   size_of, name_of         its bytes and numpy's name ("float32", "bfloat16", ...)
//   element_type_named       the inverse of name_of (a file's or a peer's word for it)
// File formats' own spellings ("<f4", "F32") map to element_type in the format's reader
// (io/npy_format.hpp, io/safetensors.hpp) and nowhere else.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include "gradus/core/half.hpp"

namespace gradus {

/// The element types gradus computes with: float and double for values, int32 for
/// labels and indices.
template <class T>
concept dtype = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t>;

/// float or double: what variables, losses and most ops need.
template <class T>
concept real_dtype = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// Every element type a buffer, a file or a message may hold. The values are stable (they
/// travel in wire headers and run fingerprints): new ones go at the end.
enum class element_type : std::uint8_t {
  none = 0,  ///< not an element type (bytes, or unknown)
  f32 = 1,
  f64 = 2,
  f16 = 3,   ///< IEEE binary16 (core/half.hpp)
  bf16 = 4,  ///< bfloat16 (core/half.hpp)
  i32 = 5,
  i64 = 6,
  u8 = 7,
};

/// Bytes per element (0 for none).
constexpr std::size_t size_of(element_type t) {
  switch (t) {
    case element_type::f64:
    case element_type::i64: return 8;
    case element_type::f32:
    case element_type::i32: return 4;
    case element_type::f16:
    case element_type::bf16: return 2;
    case element_type::u8: return 1;
    case element_type::none: return 0;
  }
  return 0;
}

/// numpy's name: "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8";
/// "none" for none.
constexpr std::string_view name_of(element_type t) {
  switch (t) {
    case element_type::f32: return "float32";
    case element_type::f64: return "float64";
    case element_type::f16: return "float16";
    case element_type::bf16: return "bfloat16";
    case element_type::i32: return "int32";
    case element_type::i64: return "int64";
    case element_type::u8: return "uint8";
    case element_type::none: return "none";
  }
  return "none";
}

/// The element_type name_of names, or nullopt for any other word.
constexpr std::optional<element_type> element_type_named(std::string_view name) {
  for (const element_type t : {element_type::f32, element_type::f64, element_type::f16, element_type::bf16,
                               element_type::i32, element_type::i64, element_type::u8})
    if (name_of(t) == name) return t;
  return std::nullopt;
}

/// Floating point (f64, f32, f16, bf16)?
constexpr bool is_floating(element_type t) {
  return t == element_type::f64 || t == element_type::f32 || t == element_type::f16 || t == element_type::bf16;
}

/// T's element_type; none for a type that is not one.
template <class T>
inline constexpr element_type element_type_of = [] {
  if constexpr (std::is_same_v<T, float>) return element_type::f32;
  else if constexpr (std::is_same_v<T, double>) return element_type::f64;
  else if constexpr (std::is_same_v<T, f16>) return element_type::f16;
  else if constexpr (std::is_same_v<T, bf16>) return element_type::bf16;
  else if constexpr (std::is_same_v<T, std::int32_t>) return element_type::i32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return element_type::i64;
  else if constexpr (std::is_same_v<T, std::uint8_t>) return element_type::u8;
  else return element_type::none;
}();

/// T's name as sessions, checkpoints and error messages write it (name_of); "unknown" for a
/// type that is not an element type.
template <class T>
constexpr std::string_view dtype_name() {
  return element_type_of<T> == element_type::none ? std::string_view("unknown") : name_of(element_type_of<T>);
}

}  // namespace gradus
