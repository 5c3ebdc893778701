#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace gradus {

/// The element types gradus computes with: float and double for values, int32 for
/// labels and indices.
template <class T>
concept dtype = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t>;

/// float or double: what variables, losses and most ops need.
template <class T>
concept real_dtype = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// T's name as sessions, checkpoints and error messages write it: "float32", "float64",
/// "int32", or "unknown" for a type that is not a dtype.
template <class T>
constexpr std::string_view dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else return "unknown";
}

/// Bytes per element of a dtype named as dtype_name() names it (0 for an unknown name).
constexpr std::size_t dtype_size(std::string_view name) {
  if (name == "float64") return 8;
  if (name == "float32" || name == "int32") return 4;
  return 0;
}

}  // namespace gradus
