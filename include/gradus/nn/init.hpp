#pragma once
// Initializers, seeded and reproducible: the same (seed, variable name) gives the same
// values on every run, compiler and thread count, and adding a variable does not change
// the others' values (each variable's stream is seeded from the seed and its name).
//
//   g::initialize(s, w1, g::init::he_normal{}, 42);
//
// zeros, constant{v}, uniform{lo, hi}, normal{mean, stddev}, truncated_normal{mean,
// stddev} (redrawn beyond 2 stddev), glorot_uniform / glorot_normal (Xavier), he_uniform /
// he_normal (Kaiming, for ReLU), with PyTorch's formulas. Fans: a [in, out] matrix (as
// x @ W uses it) has fan_in = in, fan_out = out; a rank-1 tensor has both = its length;
// rank >= 3 is a convolution kernel [out, in, k...]: fan_in = in * prod(k), fan_out =
// out * prod(k).
//
// They live in nn/ beside the layers that call them to give their variables a first value
// (gradus/train/init.hpp forwards here for one release).
//
// The generator is std::mt19937_64 (its sequence is fixed by the standard) with our own
// transforms to floating point: the standard distributions' algorithms differ between
// standard libraries, which would make values depend on the toolchain.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/exec/session.hpp"

namespace gradus {

namespace init {
/// Every element 0.
struct zeros {};
/// Every element `value`.
struct constant {
  double value = 0;  ///< the value of every element (default 0)
};
/// Uniform in `[lo, hi)` (default `[-0.05, 0.05)`); lo > hi is a gradus::error.
struct uniform {
  /// the least value (default -0.05)
  double lo = -0.05, hi = 0.05;  ///< the bound above every value (default 0.05)
};
/// Normal with mean `mean` (default 0) and standard deviation `stddev` (default 0.05); a
/// negative stddev is a gradus::error.
struct normal {
  /// the mean (default 0)
  double mean = 0, stddev = 0.05;  ///< the standard deviation, >= 0 (default 0.05)
};
/// `mean + stddev * z`, z standard normal redrawn while `|z| > 2`, so that every value lies
/// within 2 stddev of the mean (TensorFlow's truncated_normal); defaults mean 0, stddev
/// 0.05; a negative stddev is a gradus::error.
struct truncated_normal {
  /// the mean (default 0)
  double mean = 0, stddev = 0.05;  ///< the standard deviation before truncation, >= 0 (default 0.05)
};
/// Glorot (Xavier) uniform: uniform in `[-b, b)`, `b = sqrt(6 / (fan_in + fan_out))` (see fans_of).
struct glorot_uniform {};
/// Glorot (Xavier) normal: normal with mean 0 and stddev `sqrt(2 / (fan_in + fan_out))`.
struct glorot_normal {};
/// He (Kaiming) uniform, for ReLU layers: uniform in `[-b, b)`, `b = sqrt(6 / fan_in)`.
struct he_uniform {};
/// He (Kaiming) normal, for ReLU layers: normal with mean 0 and stddev `sqrt(2 / fan_in)`.
struct he_normal {};

/// A tensor's fan-in and fan-out, as the Glorot and He initializers read them.
struct fans {
  /// fan-in
  double in, out;  ///< fan-out
};
/// The fans of a variable of dims `d`, by PyTorch's rules: a scalar has 1 and 1; a rank-1
/// tensor its length for both; a matrix `[in, out]` (as `x @ W` uses it) in and out; a
/// rank >= 3 convolution kernel `[out, in, k...]` has `in * prod(k)` and `out * prod(k)`.
inline fans fans_of(const dims& d) {
  if (d.rank == 0) return {1, 1};
  if (d.rank == 1) return {static_cast<double>(d.d[0]), static_cast<double>(d.d[0])};
  if (d.rank == 2) return {static_cast<double>(d.d[0]), static_cast<double>(d.d[1])};
  double rf = 1;
  for (std::size_t i = 2; i < d.rank; ++i) rf *= static_cast<double>(d.d[i]);
  return {static_cast<double>(d.d[1]) * rf, static_cast<double>(d.d[0]) * rf};
}

/// A variable's own stream: splitmix64 of the seed mixed with the name's FNV-1a hash.
inline std::uint64_t stream_seed(std::uint64_t seed, std::string_view name) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (h | 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The initializers' random numbers: std::mt19937_64, whose sequence the standard fixes, with
/// transforms to floating point of its own, so that the values do not depend on the standard
/// library. Not thread-safe; one per variable.
class generator {
 public:
  /// A generator seeded with `seed` (the initializers pass stream_seed(seed, name)).
  explicit generator(std::uint64_t seed) : e_(seed) {}
  /// uniform in [0, 1), 53 random bits
  double unit() { return static_cast<double>(e_() >> 11) * 0x1.0p-53; }
  /// Uniform in `[lo, hi)`: `lo + (hi - lo) * unit()`.
  double uniform(double lo, double hi) { return lo + (hi - lo) * unit(); }
  /// standard normal, Box-Muller (both values of a pair are used)
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = unit();
    while (u1 <= 0) u1 = unit();
    const double u2 = unit(), r = std::sqrt(-2 * std::log(u1)), t = 2 * std::numbers::pi * u2;
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }

 private:
  std::mt19937_64 e_;
  double spare_ = 0;
  bool has_spare_ = false;
};

/// The `d.numel()` values, row-major, of dtype `T` that initializer `how` gives the variable
/// named `name` of dims `d` with `seed` (what gradus::initialize assigns). Throws gradus::error
/// naming the variable for invalid parameters (uniform with lo > hi, a negative stddev); an
/// unknown initializer type is a compile error.
template <class T, class I>
std::vector<T> values(const I& how, const dims& d, std::uint64_t seed, std::string_view name) {
  std::vector<T> v(static_cast<std::size_t>(d.numel()));
  generator g(stream_seed(seed, name));
  const fans f = fans_of(d);
  auto fill_uniform = [&](double lo, double hi) {
    for (auto& x : v) x = static_cast<T>(g.uniform(lo, hi));
  };
  auto fill_normal = [&](double mean, double sd) {
    for (auto& x : v) x = static_cast<T>(mean + sd * g.normal());
  };
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw error("gradus: initialize '" + std::string(name) + "': " + what);
  };
  if constexpr (std::is_same_v<I, zeros>) {
  } else if constexpr (std::is_same_v<I, constant>) {
    for (auto& x : v) x = static_cast<T>(how.value);
  } else if constexpr (std::is_same_v<I, uniform>) {
    need(how.lo <= how.hi, "uniform needs lo <= hi");
    fill_uniform(how.lo, how.hi);
  } else if constexpr (std::is_same_v<I, normal>) {
    need(how.stddev >= 0, "normal needs stddev >= 0");
    fill_normal(how.mean, how.stddev);
  } else if constexpr (std::is_same_v<I, truncated_normal>) {
    need(how.stddev >= 0, "truncated_normal needs stddev >= 0");
    for (auto& x : v) {
      double z = g.normal();
      // P(redraw) = 4.6%: 64 redraws in a row (p = 1e-86) never happen; the bound keeps
      // the loop finite anyway
      for (int k = 0; k < 64 && std::abs(z) > 2; ++k) z = g.normal();
      z = std::clamp(z, -2.0, 2.0);
      x = static_cast<T>(how.mean + how.stddev * z);
    }
  } else if constexpr (std::is_same_v<I, glorot_uniform>) {
    const double b = std::sqrt(6 / (f.in + f.out));
    fill_uniform(-b, b);
  } else if constexpr (std::is_same_v<I, glorot_normal>) {
    fill_normal(0, std::sqrt(2 / (f.in + f.out)));
  } else if constexpr (std::is_same_v<I, he_uniform>) {
    const double b = std::sqrt(6 / f.in);
    fill_uniform(-b, b);
  } else if constexpr (std::is_same_v<I, he_normal>) {
    fill_normal(0, std::sqrt(2 / f.in));
  } else {
    static_assert(sizeof(I) == 0, "gradus: initialize: unknown initializer");
  }
  return v;
}
}  // namespace init

/// initialize(session, v, initializer, seed): give v its initial value, computed on the host
/// by init::values and assigned to v in `s` (replacing any value it had). The values depend
/// only on the initializer, the seed and v's name and shape. Throws gradus::error naming v
/// for invalid initializer parameters.
template <class Backend, fixed_string Name, class T, index_t... E, class I>
void initialize(session<Backend>& s, const variable<Name, T, E...>& v, const I& how, std::uint64_t seed) {
  const dims d = static_dims<shape<E...>>();
  const std::vector<T> vals = init::values<T>(how, d, seed, Name.view());
  assign(s, v, tensor_view<const T>{vals.data(), d});
}

}  // namespace gradus
