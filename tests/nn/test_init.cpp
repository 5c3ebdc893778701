#define BOOST_TEST_MODULE nn_init
// Initializers: reproducible per (seed, name), independent of the order of calls and of
// other variables, with the moments and bounds their formulas give (checked on 10^5
// draws with ~5-sigma tolerances).
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace g = gradus;
namespace tt = boost::test_tools;

namespace {
g::variable<"w", float, 250, 400> w;  // fan_in 250, fan_out 400: 10^5 values
g::variable<"v", float, 250, 400> v;
g::variable<"k", double, 16, 8, 5, 5> k;  // conv kernel [out, in, kh, kw]

template <class T>
std::vector<double> copy(g::tensor_view<const T> x) {
  return {x.begin(), x.end()};
}
double mean(const std::vector<double>& x) { return std::accumulate(x.begin(), x.end(), 0.0) / double(x.size()); }
double stddev(const std::vector<double>& x) {
  const double m = mean(x);
  double s = 0;
  for (double e : x) s += (e - m) * (e - m);
  return std::sqrt(s / double(x.size()));
}
}  // namespace

BOOST_AUTO_TEST_CASE(same_seed_same_values_other_seed_other_values) {
  g::session<g::cpu_simd> a, b;
  g::initialize(a, w, g::init::he_normal{}, 42);
  g::initialize(b, v, g::init::uniform{-1, 1}, 42);  // another variable first: no effect on w
  g::initialize(b, w, g::init::he_normal{}, 42);
  const auto wa = copy(g::value(a, w)), wb = copy(g::value(b, w));
  BOOST_TEST(wa == wb, tt::per_element());
  g::initialize(b, w, g::init::he_normal{}, 43);
  BOOST_TEST(std::abs(mean(copy(g::value(b, w))) - mean(wa)) > 0);
  // same seed, different name: different stream
  g::initialize(a, v, g::init::he_normal{}, 42);
  BOOST_TEST(copy(g::value(a, v)) != wa);
}

BOOST_AUTO_TEST_CASE(moments_and_bounds) {
  g::session<g::cpu_simd> s;
  const double n = 1e5, fi = 250, fo = 400;
  auto near = [&](double got, double want, double sd_of_estimate) { BOOST_TEST(std::abs(got - want) < 5 * sd_of_estimate); };

  g::initialize(s, w, g::init::normal{0.5, 2}, 1);
  auto x = copy(g::value(s, w));
  near(mean(x), 0.5, 2 / std::sqrt(n));
  near(stddev(x), 2, 2 / std::sqrt(2 * n));

  g::initialize(s, w, g::init::uniform{-3, 1}, 1);
  x = copy(g::value(s, w));
  BOOST_TEST(*std::min_element(x.begin(), x.end()) >= -3);
  BOOST_TEST(*std::max_element(x.begin(), x.end()) < 1);
  near(mean(x), -1, 4 / std::sqrt(12 * n));

  g::initialize(s, w, g::init::truncated_normal{0, 1}, 1);
  x = copy(g::value(s, w));
  BOOST_TEST(*std::max_element(x.begin(), x.end()) <= 2);
  BOOST_TEST(*std::min_element(x.begin(), x.end()) >= -2);
  near(stddev(x), 0.87962566, 0.01);  // the stddev of a standard normal truncated to [-2, 2]

  g::initialize(s, w, g::init::glorot_uniform{}, 1);
  x = copy(g::value(s, w));
  const double gb = std::sqrt(6 / (fi + fo));
  BOOST_TEST(*std::max_element(x.begin(), x.end()) <= gb);
  BOOST_TEST(*std::max_element(x.begin(), x.end()) > 0.99 * gb);
  near(stddev(x), gb / std::sqrt(3.0), gb / std::sqrt(3 * n));

  g::initialize(s, w, g::init::glorot_normal{}, 1);
  near(stddev(copy(g::value(s, w))), std::sqrt(2 / (fi + fo)), std::sqrt(2 / (fi + fo)) / std::sqrt(2 * n));

  g::initialize(s, w, g::init::he_uniform{}, 1);
  x = copy(g::value(s, w));
  BOOST_TEST(*std::max_element(x.begin(), x.end()) <= std::sqrt(6 / fi));
  near(stddev(x), std::sqrt(2 / fi), std::sqrt(2 / fi) / std::sqrt(n));

  g::initialize(s, w, g::init::he_normal{}, 1);
  near(stddev(copy(g::value(s, w))), std::sqrt(2 / fi), std::sqrt(2 / fi) / std::sqrt(2 * n));

  // a conv kernel [16, 8, 5, 5]: fan_in = 8 * 25
  g::initialize(s, k, g::init::he_normal{}, 1);
  near(stddev(copy(g::value(s, k))), std::sqrt(2 / 200.0), std::sqrt(2 / 200.0) / std::sqrt(2 * 3200.0));

  g::initialize(s, w, g::init::constant{0.25}, 1);
  x = copy(g::value(s, w));
  BOOST_TEST(std::all_of(x.begin(), x.end(), [](double e) { return e == 0.25; }));
  g::initialize(s, w, g::init::zeros{}, 1);
  x = copy(g::value(s, w));
  BOOST_TEST(std::all_of(x.begin(), x.end(), [](double e) { return e == 0; }));
}

BOOST_AUTO_TEST_CASE(fans) {
  BOOST_TEST(g::init::fans_of(g::dims{784, 256}).in == 784);
  BOOST_TEST(g::init::fans_of(g::dims{784, 256}).out == 256);
  BOOST_TEST(g::init::fans_of(g::dims{10}).in == 10);
  BOOST_TEST(g::init::fans_of(g::dims{6, 1, 5, 5}).in == 25);
  BOOST_TEST(g::init::fans_of(g::dims{6, 1, 5, 5}).out == 150);
}
