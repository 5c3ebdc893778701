#pragma once
// The check behind every generated differential case (tests/differential/gen_cases.py):
// a random expression's gradients against central finite differences in double, and the
// same expression in float against the double one. A failure prints the case's seed and
// expression, so it can be rebuilt alone.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gradus/autodiff/autodiff.hpp>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace gradus_test {

namespace g = gradus;

template <class X>
auto as_tuple(const X& x) {
  if constexpr (requires { std::tuple_size<X>::value; }) return x;
  else return std::tuple<X>{x};
}

// Values of one variable: uniform in [-1, 1), each exactly representable in float, so the
// float and the double runs see the same inputs.
inline std::vector<double> case_values(std::mt19937_64& rng, std::size_t n) {
  std::uniform_real_distribution<double> d(-1, 1);
  std::vector<double> v(n);
  for (auto& e : v) e = static_cast<double>(static_cast<float>(d(rng)));
  return v;
}

template <class T, g::fixed_string N, g::index_t... E>
void assign_values(g::session<g::cpu_simd>& s, const g::variable<N, T, E...>& v, const std::vector<double>& vals) {
  std::vector<T> t(vals.begin(), vals.end());
  g::assign(s, v, g::view(t.data(), std::array<g::index_t, sizeof...(E)>{E...}));
}

// loss and its gradients for the given variable values, in T; returns them as doubles
template <class T, class Loss, class Vars>
std::vector<std::vector<double>> run_case(g::session<g::cpu_simd>& s, const Loss& loss, const Vars& vars,
                                          const std::vector<std::vector<double>>& vals) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (assign_values<T>(s, std::get<I>(vars), vals[I]), ...);
  }(std::make_index_sequence<std::tuple_size_v<Vars>>{});
  const auto grads = as_tuple(std::apply([&](const auto&... v) { return g::grad(loss, v...); }, vars));
  const auto r = std::apply([&](const auto&... gr) { return s.run(loss, gr...); }, grads);
  std::vector<std::vector<double>> out;
  std::apply([&](const auto&... x) { (out.emplace_back(x.begin(), x.end()), ...); }, r);
  return out;
}

// Build(T{}) returns (loss, tuple of variables) of the case in dtype T.
template <class Build>
void differential_check(unsigned long long seed, int index, const char* text, Build build) {
  const std::string id = "seed " + std::to_string(seed) + " case " + std::to_string(index) + ": " + text;
  std::mt19937_64 rng(seed * 1000003ull + static_cast<unsigned long long>(index));
  const auto [loss_d, vars_d] = build(double{});
  std::vector<std::vector<double>> vals;
  std::apply([&](const auto&... v) { (vals.push_back(case_values(rng, static_cast<std::size_t>(g::static_dims<g::shape_t<decltype(v)>>().numel()))), ...); }, vars_d);

  g::session<g::cpu_simd> sd;
  const auto an = run_case<double>(sd, loss_d, vars_d, vals);
  const double l0 = an[0][0];
  BOOST_TEST_REQUIRE(std::isfinite(l0), id << ": the loss is " << l0);

  // central differences, variable by variable
  for (std::size_t k = 0; k < vals.size(); ++k) {
    double gmax = 0;
    for (double v : an[k + 1]) gmax = std::max(gmax, std::abs(v));
    std::size_t bad = 0, first = 0;
    double worst_fd = 0, worst_an = 0;
    for (std::size_t i = 0; i < vals[k].size(); ++i) {
      auto vx = vals;
      const double h = 1e-6 * std::max(1.0, std::abs(vals[k][i]));
      vx[k][i] = vals[k][i] + h;
      const double up = run_case<double>(sd, loss_d, vars_d, vx)[0][0];
      vx[k][i] = vals[k][i] - h;
      const double down = run_case<double>(sd, loss_d, vars_d, vx)[0][0];
      const double fd = (up - down) / (2 * h), a = an[k + 1][i];
      // rounding in the difference is ~eps |loss| / h; truncation ~h^2
      const double tol = 1e-6 * std::max(std::abs(fd), std::abs(a)) + 1e-8 * std::max({1.0, std::abs(l0), gmax});
      if (!(std::abs(fd - a) <= tol) && bad++ == 0) first = i, worst_fd = fd, worst_an = a;
    }
    BOOST_TEST(bad == 0u, id << ": d loss / d v" << k << ": " << bad << " of " << vals[k].size()
                             << " entries differ from finite differences, first [" << first << "]: grad "
                             << worst_an << ", central difference " << worst_fd);
  }

  // the same expression in float, against double
  const auto [loss_f, vars_f] = build(float{});
  g::session<g::cpu_simd> sf;
  const auto fl = run_case<float>(sf, loss_f, vars_f, vals);
  BOOST_TEST(std::abs(fl[0][0] - l0) <= 1e-4 * std::max(1.0, std::abs(l0)),
             id << ": float loss " << fl[0][0] << ", double " << l0);
  for (std::size_t k = 1; k < an.size(); ++k) {
    double scale = 1e-3, diff = 0;
    for (std::size_t i = 0; i < an[k].size(); ++i) {
      scale = std::max(scale, std::abs(an[k][i]));
      diff = std::max(diff, std::abs(fl[k][i] - an[k][i]));
    }
    BOOST_TEST(diff <= 2e-3 * scale, id << ": d loss / d v" << k - 1 << " in float differs from double by " << diff
                                        << " (largest entry " << scale << ")");
  }
}

}  // namespace gradus_test
