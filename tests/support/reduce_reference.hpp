#pragma once
// Reference reductions (plain loops, wide accumulation) shared by the reduction tests.
#include "check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

enum class rk { sum, mean, max, min, argmax };
constexpr int all = -100;  // the reference's "every axis"

const char* rk_name(rk k) {
  switch (k) {
    case rk::sum: return "sum";
    case rk::mean: return "mean";
    case rk::max: return "max";
    case rk::min: return "min";
    case rk::argmax: return "argmax";
  }
  return "?";
}

struct reference {
  shape_v shape;                // of the result
  std::vector<double> value;    // per result element
  std::vector<double> scale;    // sum of |x| over the reduced run (a sum's condition)
};

// Reference reduction of x (row-major, shape s) over `axis` (normalised, or `all`).
template <class T>
reference reduce_ref(rk k, const std::vector<T>& x, const shape_v& s, int axis, bool keep) {
  std::size_t outer = 1, n = 1, inner = 1;
  reference r;
  if (axis == all) {
    n = numel(s);
    if (keep) r.shape.assign(s.size(), 1);
  } else {
    const auto a = static_cast<std::size_t>(axis);
    for (std::size_t i = 0; i < a; ++i) outer *= s[i];
    n = s[a];
    for (std::size_t i = a + 1; i < s.size(); ++i) inner *= s[i];
    for (std::size_t i = 0; i < s.size(); ++i)
      if (i != a) r.shape.push_back(s[i]);
      else if (keep) r.shape.push_back(1);
  }
  r.value.resize(outer * inner);
  r.scale.resize(outer * inner);
  for (std::size_t o = 0; o < outer; ++o)
    for (std::size_t i = 0; i < inner; ++i) {
      long double acc = 0, abs_acc = 0;
      double best = 0;
      std::size_t best_k = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const double v = static_cast<double>(x[(o * n + j) * inner + i]);
        acc += v;
        abs_acc += std::abs(v);
        if (j == 0 || (k == rk::max || k == rk::argmax ? v > best : v < best)) {
          best = v;
          best_k = j;
        }
      }
      double out = 0;
      switch (k) {
        case rk::sum: out = static_cast<double>(acc); break;
        case rk::mean: out = n ? static_cast<double>(acc / n) : std::numeric_limits<double>::quiet_NaN(); break;
        case rk::max:
        case rk::min: out = best; break;
        case rk::argmax: out = static_cast<double>(best_k); break;
      }
      r.value[o * inner + i] = out;
      r.scale[o * inner + i] = static_cast<double>(k == rk::mean && n ? abs_acc / n : abs_acc);
    }
  return r;
}


// One result against its reference: sums and means within rtol * sum |x|, the rest exact.
template <class T, class V>
void check(const V& got, rk k, int axis, bool keep, const std::vector<T>& x, const shape_v& s) {
  const auto want = reduce_ref(k, x, s, axis, keep);
  std::ostringstream label;
  label << rk_name(k) << "<" << (axis == all ? std::string("all") : std::to_string(axis)) << (keep ? ", keep" : "")
        << "> of (";
  for (std::size_t i = 0; i < s.size(); ++i) label << (i ? ", " : "") << s[i];
  label << ")";
  BOOST_TEST(shape_is(got, want.shape), label.str());
  if (k == rk::sum || k == rk::mean)
    BOOST_TEST(close(got, want.value, rtol<T>(), want.scale), label.str());
  else
    BOOST_TEST(equal(got, want.value), label.str());
}

}  // namespace
