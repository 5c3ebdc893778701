#pragma once
// A string literal usable as a template argument: the identity of a leaf
// (feed key, checkpoint key, parameter-server key, graph label).
//
// One type for every length (a fixed capacity and a length), not fixed_string<N>: nvcc's
// front end does not deduce a template argument whose type is a class template
// specialisation (variable<N, T, E...> against variable<"w", float, 3> fails there in
// partial specialisations and function calls alike), and one concrete type needs no
// deduction. Names are at most 63 characters; the unused characters are zero, so equal
// names are the same template argument.
#include <cstddef>
#include <string_view>

namespace gradus {

/// A name fixed at compile time, passed as a template argument: `variable<"w", float, 3>`
/// converts the literal "w" to one. At most 63 characters (a longer literal is a compile
/// error); the unused characters are zero, so equal names are the same template argument.
struct fixed_string {
  static constexpr std::size_t capacity = 64;  ///< bytes of storage: a name has at most capacity - 1 characters
  char chars[capacity]{};                      ///< the characters, zero from `length` on
  std::size_t length = 0;                      ///< the number of characters

  /// The empty name.
  constexpr fixed_string() = default;
  /// From a string literal (implicitly, so that a literal can stand for a name); a literal
  /// of more than 63 characters fails to compile.
  template <std::size_t N>
  constexpr fixed_string(const char (&s)[N]) : length(N - 1) {  // NOLINT: implicit, as a literal's stand-in
    static_assert(N < capacity, "gradus: a name (fixed_string) has at most 63 characters");
    for (std::size_t i = 0; i + 1 < N; ++i) chars[i] = s[i];
  }
  /// The form nvcc's front end writes such a template argument in, in the host code it
  /// hands on: fixed_string{{'f', 'c', '1', ...}, 3}.
  constexpr fixed_string(const char (&c)[capacity], std::size_t n) : length(n) {
    for (std::size_t i = 0; i < capacity; ++i) chars[i] = c[i];
  }
  /// The name's `length` characters.
  constexpr std::string_view view() const { return {chars, length}; }
  /// view(), implicitly: a name can be passed where a std::string_view is expected.
  constexpr operator std::string_view() const { return view(); }
  /// Equal names: the same characters and length.
  constexpr bool operator==(const fixed_string&) const = default;
};

/// a + b; a result over 63 characters is not a constant expression (a compile error where
/// it names a leaf)
constexpr fixed_string operator+(const fixed_string& a, const fixed_string& b) {
  if (a.length + b.length >= fixed_string::capacity) throw "gradus: a name (fixed_string) has at most 63 characters";
  fixed_string r = a;
  for (std::size_t i = 0; i < b.length; ++i) r.chars[a.length + i] = b.chars[i];
  r.length = a.length + b.length;
  return r;
}

}  // namespace gradus
