#pragma once
// Shared helpers of the op tests: seeded random data, tolerances per dtype, and a
// comparison of a gradus result with a reference computed by plain loops in the test.
// Nothing here calls gradus to compute a value: references must stay independent.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace gradus_test {

namespace g = gradus;

using real_types = std::tuple<float, double>;

// Relative tolerance of one result: ~1e-5 for float, ~1e-12 for double.
template <class T>
constexpr double rtol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

// placeholder<Name, T, dyn, ..., dyn> of rank R.
template <g::fixed_string N, class T, class Seq>
struct dyn_placeholder_impl;
template <g::fixed_string N, class T, std::size_t... I>
struct dyn_placeholder_impl<N, T, std::index_sequence<I...>> {
  using type = g::placeholder<N, T, (g::dyn + 0 * static_cast<g::index_t>(I))...>;
};
template <g::fixed_string N, class T, std::size_t R>
using dyn_placeholder = typename dyn_placeholder_impl<N, T, std::make_index_sequence<R>>::type;

// A run's result (a host view on every backend) as doubles.
template <class T>
std::vector<double> host(const g::tensor_view<const T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

inline std::mt19937& rng() {
  static std::mt19937 r(20240611u);
  return r;
}

template <class T>
std::vector<T> uniform(std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<T> v(n);
  for (auto& e : v) e = static_cast<T>(d(rng()));
  return v;
}

inline std::vector<std::int32_t> uniform_int(std::size_t n, std::int32_t lo, std::int32_t hi_inclusive) {
  std::uniform_int_distribution<std::int32_t> d(lo, hi_inclusive);
  std::vector<std::int32_t> v(n);
  for (auto& e : v) e = d(rng());
  return v;
}

// An xt::xtensor of the given shape filled from `values` (row-major).
template <class T, std::size_t R>
xt::xtensor<T, R> tensor(const std::array<std::size_t, R>& shape, const std::vector<T>& values) {
  xt::xtensor<T, R> t(shape);
  BOOST_REQUIRE_EQUAL(t.size(), values.size());
  std::copy(values.begin(), values.end(), t.begin());
  return t;
}

template <class T, std::size_t R>
xt::xtensor<T, R> random_tensor(const std::array<std::size_t, R>& shape, double lo = -1.0, double hi = 1.0) {
  std::size_t n = 1;
  for (auto e : shape) n *= e;
  return tensor<T, R>(shape, uniform<T>(n, lo, hi));
}

inline std::string dims_str(const g::dims& d) {
  std::ostringstream o;
  o << "(";
  for (std::size_t i = 0; i < d.rank; ++i) o << (i ? ", " : "") << d.d[i];
  return o.str() + ")";
}

// The result has exactly these dims.
template <class T>
boost::test_tools::predicate_result same_shape(const g::tensor_view<const T>& got, std::initializer_list<long> want) {
  g::dims w;
  w.rank = want.size();
  std::size_t i = 0;
  for (auto e : want) w.d[i++] = e;
  if (got.shape() == w) return true;
  boost::test_tools::predicate_result r(false);
  r.message() << "shape " << dims_str(got.shape()) << " != expected " << dims_str(w);
  return r;
}

// Elementwise closeness: |got - want| <= rtol * (|want| + scale[i]) where `scale` (if
// given) is the condition of the reference, e.g. sum |x_i| for a sum. Infinities must
// match exactly; a NaN is only accepted where the reference is NaN. Reports the first
// few mismatches.
template <class T>
boost::test_tools::predicate_result close(const g::tensor_view<const T>& got, const std::vector<double>& want,
                                          double tol, const std::vector<double>& scale = {}, double atol = 0.0) {
  boost::test_tools::predicate_result r(true);
  if (static_cast<std::size_t>(got.size()) != want.size()) {
    r = false;
    r.message() << "size " << got.size() << " != expected " << want.size();
    return r;
  }
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double gv = static_cast<double>(got[static_cast<g::index_t>(i)]), wv = want[i];
    bool ok;
    if (std::isnan(wv)) ok = std::isnan(gv);
    else if (std::isinf(wv)) ok = gv == wv;
    else {
      const double s = scale.empty() ? 0.0 : scale[i];
      ok = std::isfinite(gv) && std::abs(gv - wv) <= tol * (std::abs(wv) + s) + atol;
    }
    if (!ok) {
      if (bad == 0) r = false;
      if (bad < 5) r.message() << " [" << i << "]: got " << gv << ", want " << wv << ";";
      ++bad;
    }
  }
  if (bad) r.message() << " " << bad << " of " << want.size() << " elements differ (tol " << tol << ")";
  return r;
}

// Exact equality (integers, selections, copies).
template <class T, class U>
boost::test_tools::predicate_result equal(const g::tensor_view<const T>& got, const std::vector<U>& want) {
  boost::test_tools::predicate_result r(true);
  if (static_cast<std::size_t>(got.size()) != want.size()) {
    r = false;
    r.message() << "size " << got.size() << " != expected " << want.size();
    return r;
  }
  int bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!(static_cast<double>(got[static_cast<g::index_t>(i)]) == static_cast<double>(want[i]))) {
      if (bad == 0) r = false;
      if (bad < 5)
        r.message() << " [" << i << "]: got " << static_cast<double>(got[static_cast<g::index_t>(i)]) << ", want "
                    << static_cast<double>(want[i]) << ";";
      ++bad;
    }
  }
  if (bad) r.message() << " " << bad << " of " << want.size() << " elements differ";
  return r;
}

template <class T>
boost::test_tools::predicate_result no_nan(const g::tensor_view<const T>& got) {
  for (g::index_t i = 0; i < got.size(); ++i)
    if (std::isnan(static_cast<double>(got[i]))) {
      boost::test_tools::predicate_result r(false);
      r.message() << "NaN at [" << i << "]";
      return r;
    }
  return true;
}

// For output element `flat` of shape `out`, the flat index of the element read from an
// operand of shape `in` under NumPy broadcasting (trailing-aligned, extent 1 repeats).
inline std::size_t broadcast_source(std::size_t flat, const std::vector<std::size_t>& out,
                                    const std::vector<std::size_t>& in) {
  std::size_t src = 0, stride = 1;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const std::size_t ii = in.size() - 1 - i, oi = out.size() - 1 - i;
    std::size_t rem = flat;
    for (std::size_t k = out.size() - 1; k > oi; --k) rem /= out[k];
    const std::size_t coord = rem % out[oi];
    src += (in[ii] == 1 ? 0 : coord) * stride;
    stride *= in[ii];
  }
  return src;
}

inline std::size_t numel(const std::vector<std::size_t>& s) {
  std::size_t n = 1;
  for (auto e : s) n *= e;
  return n;
}

// ---- shapes as vectors, broadcasting references ----------------------------------------

using shape_v = std::vector<std::size_t>;

// An xt::xtensor<T, R> of shape s holding v.
template <class T, std::size_t R>
xt::xtensor<T, R> as_tensor(const shape_v& s, const std::vector<T>& v) {
  std::array<std::size_t, R> sh{};
  std::copy(s.begin(), s.end(), sh.begin());
  return tensor<T, R>(sh, v);
}

template <class V>
boost::test_tools::predicate_result shape_is(const V& got, const shape_v& want) {
  g::dims w;
  w.rank = want.size();
  for (std::size_t i = 0; i < want.size(); ++i) w.d[i] = static_cast<g::index_t>(want[i]);
  if (got.shape() == w) return true;
  boost::test_tools::predicate_result r(false);
  r.message() << "shape " << dims_str(got.shape()) << " != " << dims_str(w);
  return r;
}

// Values away from zero (divisors): uniform magnitude in [0.5, 2], random sign.
template <class T>
std::vector<T> nonzero(std::size_t n) {
  auto v = uniform<T>(n, 0.5, 2.0);
  const auto sign = uniform_int(n, 0, 1);
  for (std::size_t i = 0; i < n; ++i)
    if (sign[i]) v[i] = -v[i];
  return v;
}

// Integers in [lo, hi] as T: comparisons and max/min/argmax see ties.
template <class T>
std::vector<T> discrete(std::size_t n, std::int32_t lo, std::int32_t hi) {
  const auto k = uniform_int(n, lo, hi);
  return std::vector<T>(k.begin(), k.end());
}

inline double b2d(bool v) { return v ? 1.0 : 0.0; }

// Operand shapes of a binary op and the shape they broadcast to.
struct bcast_case {
  shape_v a, b, out;
};

// want[i] = f(a at its broadcast source, b at its)
template <class T, class F>
std::vector<double> ref2(const bcast_case& c, const std::vector<T>& a, const std::vector<T>& b, F f) {
  std::vector<double> want(numel(c.out));
  for (std::size_t i = 0; i < want.size(); ++i)
    want[i] = f(static_cast<double>(a[broadcast_source(i, c.out, c.a)]),
                static_cast<double>(b[broadcast_source(i, c.out, c.b)]));
  return want;
}

// References of the smooth activations, stable in double.
inline double sigmoid_ref(double v) { return v >= 0 ? 1.0 / (1.0 + std::exp(-v)) : std::exp(v) / (1.0 + std::exp(v)); }
inline double softplus_ref(double v) { return std::max(v, 0.0) + std::log1p(std::exp(-std::abs(v))); }
inline double elu_ref(double v, double a) { return v > 0 ? v : a * std::expm1(v); }

// got[i] == T(ref(in[i])) within the dtype's tolerance (and the smallest normal number,
// for results that underflow).
template <class T, class Ref>
void check_map(const char* name, const g::tensor_view<const T>& got, const std::vector<T>& in, Ref ref,
               bool math_has_nan = true) {
  std::vector<double> want(in.size());
  for (std::size_t i = 0; i < in.size(); ++i)
    want[i] = static_cast<double>(static_cast<T>(ref(static_cast<double>(in[i]))));
  BOOST_TEST(same_shape(got, {static_cast<long>(in.size())}), name);
  if (!math_has_nan) BOOST_TEST(no_nan(got), name);
  BOOST_TEST(close(got, want, rtol<T>(), {}, std::numeric_limits<T>::min()), name << " n=" << in.size());
}

}  // namespace gradus_test
