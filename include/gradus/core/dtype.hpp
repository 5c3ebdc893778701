#pragma once
#include <cstdint>
#include <string_view>
#include <type_traits>

namespace gradus {

// The element types gradus computes with: float and double for values, int32 for
// labels and indices.
template <class T>
concept dtype = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t>;

template <class T>
concept real_dtype = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
constexpr std::string_view dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  else if constexpr (std::is_same_v<T, double>) return "float64";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  else return "unknown";
}

}  // namespace gradus
