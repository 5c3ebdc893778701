#pragma once
// Finite-difference gradient checks: central differences in double precision against
// the expressions grad() derives. Every leaf a check perturbs is a variable of the
// session, so perturbing is `assign`, and the loss is re-run through the same plan.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gradus/autodiff/autodiff.hpp>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace gradus_test {

namespace g = gradus;
using session = g::session<g::cpu_simd>;

inline std::mt19937& fd_rng() {
  static std::mt19937 r(7u);
  return r;
}

// Fill a variable with uniform values in [lo, hi), each at least `gap` away from the
// points in `avoid` (kinks of relu, abs, clamp, ...).
template <g::fixed_string N, g::index_t... E>
std::vector<double> set_random(session& s, const g::variable<N, double, E...>& v, double lo, double hi,
                               std::vector<double> avoid = {}, double gap = 0.05) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> vals(static_cast<std::size_t>((E * ... * 1)));
  for (auto& x : vals) {
    do x = d(fd_rng());
    while (std::any_of(avoid.begin(), avoid.end(), [&](double a) { return std::abs(x - a) < gap; }));
  }
  g::assign(s, v, g::view(vals.data(), std::array<g::index_t, sizeof...(E)>{E...}));
  return vals;
}

// max over elements of |fd - analytic| / max(|fd|, |analytic|, 1e-3): a relative error
// that does not blow up where the true gradient is zero.
template <class Loss, class Grad, g::fixed_string N, g::index_t... E, class... Feeds>
double fd_error(session& s, const Loss& loss, const Grad& gexpr, const g::variable<N, double, E...>& v,
                const Feeds&... feeds) {
  const auto an_view = s.run(gexpr, feeds...);
  BOOST_TEST_REQUIRE(an_view.shape().numel() == (E * ... * 1));
  std::vector<double> analytic(an_view.begin(), an_view.end());
  const auto cur = g::value(s, v);
  std::vector<double> x(cur.begin(), cur.end());
  const std::array<g::index_t, sizeof...(E)> shape{E...};
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double h = 1e-6 * std::max(1.0, std::abs(x[i]));
    const double keep = x[i];
    x[i] = keep + h;
    g::assign(s, v, g::view(x.data(), shape));
    const double up = s.run(loss, feeds...)[0];
    x[i] = keep - h;
    g::assign(s, v, g::view(x.data(), shape));
    const double down = s.run(loss, feeds...)[0];
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(fd - analytic[i]) / std::max({std::abs(fd), std::abs(analytic[i]), 1e-3}));
  }
  g::assign(s, v, g::view(x.data(), shape));
  return worst;
}

// Checks d loss / d v for every v given, each within 1e-6 relative error.
template <class Loss, class... Vs>
void check_gradients(session& s, const Loss& loss, const Vs&... vs) {
  auto check_one = [&](const auto& v) {
    const double err = fd_error(s, loss, g::grad(loss, v), v);
    BOOST_TEST(err < 1e-6, "d loss / d " << std::string(std::remove_cvref_t<decltype(v)>::name.view())
                                         << ": max relative error " << err);
  };
  (check_one(vs), ...);
}

}  // namespace gradus_test
