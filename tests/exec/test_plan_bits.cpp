// One value, one bit pattern: an elementwise op gives element i the same bits whether i
// lands in a full SIMD batch or in a row's tail, in a forward pass or recomputed inside a
// backward pass, in a fused pass or in an in-place update (for_each, the optimizers' and
// RNN cells' path), and softmax's exponentials likewise. A rule that compares a
// recomputed value with a stored one (max, relu's mask) relies on it (issue 11: std::tanh
// in the tail and xsimd::tanh in the body differed by one ulp).
#define BOOST_TEST_MODULE exec_plan_bits
#include "../support/check.hpp"

#include <bit>
#include <cstring>

using namespace gradus_test;

namespace {

// The bits of v (float or double) as an unsigned integer, for exact comparison (NaN too).
template <class T>
auto bits(T v) {
  if constexpr (sizeof(T) == 4) return std::bit_cast<std::uint32_t>(v);
  else return std::bit_cast<std::uint64_t>(v);
}

// Row widths: all tail (< W for every SIMD width), around W, and rows of several batches.
constexpr std::size_t widths[] = {1, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33};
constexpr std::size_t total = 99;  // the flat reference: 6 batches of 16 (or 12 of 8), then a tail

struct ops_of {
  template <class X, class P>
  static auto apply(const X& x, const P& p) {
    return std::tuple{g::neg(x), g::exp(x), g::log(p), g::log1p(p), g::sqrt(p), g::rsqrt(p), g::abs(x),
                      g::square(x), g::tanh(x), g::sigmoid(x), g::relu(x), g::softplus(x), g::leaky_relu(x, 0.2),
                      g::elu(x), g::clamp(x, -0.25, 0.5), g::pow(p, x), x / p};
  }
  static constexpr const char* names[] = {"neg",     "exp",  "log",      "log1p",      "sqrt", "rsqrt",
                                          "abs",     "square", "tanh",   "sigmoid",    "relu", "softplus",
                                          "leaky_relu", "elu", "clamp",  "pow",        "div"};
};
constexpr std::size_t op_count = std::size(ops_of::names);

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(unary_ops_body_tail_forward_backward, T, real_types) {
  g::placeholder<"x", T, g::dyn, g::dyn> x;   // [rows, width]: any value
  g::placeholder<"p", T, g::dyn, g::dyn> p;   // positive
  g::placeholder<"c", T, g::dyn, g::dyn> c;   // the backward pass's probe
  g::placeholder<"one", T, g::dyn> one;       // [width] ones: keeps rows apart (no loop collapse)
  g::session<g::cpu_simd> s;

  // forward: op(x) * one, a pass over rows of `width` elements; backward: d/dc of
  // sum(op(x) * one * c) is op(x) * one again, recomputed inside the gradient's pass
  const auto fwd = std::apply([&](const auto&... e) { return std::tuple{(e * one)...}; }, ops_of::apply(x, p));
  const auto bwd = std::apply([&](const auto&... e) { return std::tuple{g::grad(g::sum(e * c), c)...}; }, fwd);

  const auto xs = uniform<T>(total, -6, 6), ps = uniform<T>(total, 0.01, 4);
  auto run = [&](std::size_t width, const auto& outs) {
    const std::size_t rows = total / width, n = rows * width;
    const std::vector<T> xv(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(n)),
        pv(ps.begin(), ps.begin() + static_cast<std::ptrdiff_t>(n)), ones(width, T(1)), cv(n, T(1));
    const auto xt = tensor<T, 2>({rows, width}, xv), pt = tensor<T, 2>({rows, width}, pv),
               ct = tensor<T, 2>({rows, width}, cv);
    const auto ot = tensor<T, 1>({width}, ones);
    std::array<std::vector<T>, op_count> out;
    const auto results = std::apply([&](const auto&... o) {
      if constexpr (std::is_same_v<std::remove_cvref_t<decltype(outs)>, std::remove_cvref_t<decltype(bwd)>>)
        return s.run(o..., x = xt, p = pt, one = ot, c = ct);
      else
        return s.run(o..., x = xt, p = pt, one = ot);
    }, outs);
    std::apply([&](const auto&... r) {
      std::size_t i = 0;
      ((out[i++] = std::vector<T>(r.begin(), r.end())), ...);
    }, results);
    return out;
  };
  // the reference: one flat row of `total` elements, forward
  const auto ref = run(total, fwd);
  for (std::size_t width : widths)
    for (bool backward : {false, true}) {
      const auto got = backward ? run(width, bwd) : run(width, fwd);
      for (std::size_t k = 0; k < op_count; ++k) {
        std::size_t differ = 0, first = 0;
        for (std::size_t i = 0; i < got[k].size(); ++i)
          if (bits(got[k][i]) != bits(ref[k][i]) && differ++ == 0) first = i;
        BOOST_TEST(differ == 0u, ops_of::names[k] << " (" << g::dtype_name<T>() << "), rows of " << width
                                                  << (backward ? ", backward" : ", forward") << ": " << differ
                                                  << " elements differ from the flat pass, first at " << first);
      }
    }
}

// The in-place path (optimizer updates, RNN cells): an array's last partial batch is
// padded, so element i has the bits it has in a longer array's full batch.
BOOST_AUTO_TEST_CASE_TEMPLATE(for_each_tail_has_the_body_bits, T, real_types) {
  const auto xs = uniform<T>(total, -6, 6);
  auto check = [&](auto f, const char* name) {
    auto apply = [&](std::size_t n) {
      std::vector<T> v(xs.begin(), xs.begin() + static_cast<std::ptrdiff_t>(n)), w(n, T(0.5));
      const T* wc = w.data();
      g::cpu_simd::for_each(static_cast<g::index_t>(n), [&](auto& y, const auto& z) { y = f(y) * z; }, v.data(), wc);
      return v;
    };
    const auto ref = apply(total);
    for (std::size_t n : widths) {
      const auto got = apply(n);
      std::size_t differ = 0;
      for (std::size_t i = 0; i < n; ++i) differ += bits(got[i]) != bits(ref[i]);
      BOOST_TEST(differ == 0u, name << " (" << g::dtype_name<T>() << "), " << n << " elements: " << differ << " differ");
    }
  };
  check(g::fn::tanh_fn{}, "tanh");
  check(g::fn::exp_fn{}, "exp");
  check(g::fn::sigmoid_fn{}, "sigmoid");
  check(g::fn::softplus_fn{}, "softplus");
}

// softmax and log_softmax: a row that repeats a block of W values (then its first 3)
// gives the repeated entries the same bits, in full batches and in the tail.
BOOST_AUTO_TEST_CASE_TEMPLATE(softmax_tail_has_the_body_bits, T, real_types) {
  constexpr std::size_t W = xsimd::batch<T>::size;
  const std::size_t cols = 2 * W + 3;
  const auto block = uniform<T>(W, -3, 3);
  std::vector<T> row(cols);
  for (std::size_t j = 0; j < cols; ++j) row[j] = block[j % W];
  g::placeholder<"z", T, g::dyn, g::dyn> z;
  g::session<g::cpu_simd> s;
  const auto [sm, lsm] = s.run(g::softmax(z), g::log_softmax(z), z = tensor<T, 2>({1, cols}, row));
  for (std::size_t j = W; j < cols; ++j) {
    const auto i = static_cast<g::index_t>(j), i0 = static_cast<g::index_t>(j % W);
    BOOST_TEST(bits(sm[i]) == bits(sm[i0]), "softmax entry " << j << " vs " << j % W);
    BOOST_TEST(bits(lsm[i]) == bits(lsm[i0]), "log_softmax entry " << j << " vs " << j % W);
  }
}
