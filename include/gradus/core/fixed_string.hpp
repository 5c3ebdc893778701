#pragma once
// A string literal usable as a template argument: the identity of a leaf
// (feed key, checkpoint key, parameter-server key, graph label).
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace gradus {

template <std::size_t N>
struct fixed_string {
  char chars[N]{};
  constexpr fixed_string() = default;
  constexpr fixed_string(const char (&s)[N]) { std::copy_n(s, N, chars); }
  constexpr std::string_view view() const { return {chars, N - 1}; }
  constexpr operator std::string_view() const { return view(); }
  template <std::size_t M>
  constexpr bool operator==(const fixed_string<M>& o) const { return view() == o.view(); }
};

// Concatenation at compile time: a layer names its variables `Name + "/w"`.
template <std::size_t N, std::size_t M>
constexpr fixed_string<N + M - 1> operator+(const fixed_string<N>& a, const fixed_string<M>& b) {
  fixed_string<N + M - 1> r;
  std::copy_n(a.chars, N - 1, r.chars);
  std::copy_n(b.chars, M, r.chars + N - 1);
  return r;
}
template <std::size_t N, std::size_t M>
constexpr fixed_string<N + M - 1> operator+(const fixed_string<N>& a, const char (&b)[M]) {
  return a + fixed_string<M>(b);
}

}  // namespace gradus
