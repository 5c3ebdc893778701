// Every unary elementwise op against a plain loop in double, at sizes around the SIMD
// width. Also: _binary (binary ops), _scalar, _broadcast, _fused (chains and leaves),
// _limits (extremes, zero size, threads).
#define BOOST_TEST_MODULE graph_elementwise
#include "../support/check.hpp"

namespace g = gradus;
using namespace gradus_test;

namespace {

// Sizes around the SIMD width (16 floats / 8 doubles with AVX-512) and beyond.
constexpr std::size_t sizes[] = {1, 7, 8, 15, 16, 17, 33, 64, 1023};

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(unary_ops_match_loops, T, real_types) {
  // One graph computes every unary op (several outputs, one plan), fed inputs in each
  // op's domain: x in [-10, 10], w in [-30, 30], p in [1e-3, 100], u in [-0.9, 10].
  g::placeholder<"x", T, g::dyn> x;
  g::placeholder<"w", T, g::dyn> w;
  g::placeholder<"p", T, g::dyn> p;
  g::placeholder<"u", T, g::dyn> u;
  g::session<g::cpu_simd> s;
  for (std::size_t n : sizes) {
    const auto xv = uniform<T>(n, -10, 10), wv = uniform<T>(n, -30, 30), pv = uniform<T>(n, 1e-3, 100),
               uv = uniform<T>(n, -0.9, 10);
    const auto xt = tensor<T, 1>({n}, xv), wt = tensor<T, 1>({n}, wv), pt = tensor<T, 1>({n}, pv),
               ut = tensor<T, 1>({n}, uv);
    const auto rs = s.run(-x, g::neg(x), g::exp(x), g::log(p), g::log1p(u), g::sqrt(p), g::rsqrt(p), g::abs(x),
                          g::square(x), g::tanh(x), g::sigmoid(w), g::relu(x), g::softplus(w), g::leaky_relu(x),
                          g::leaky_relu(x, 0.2), g::elu(x), g::elu(x, 0.5), g::clamp(x, -0.25, 0.5), x = xt, w = wt,
                          p = pt, u = ut);
    const double a02 = static_cast<double>(T(0.2));
    check_map<T>("neg", std::get<0>(rs), xv, [](double v) { return -v; });
    check_map<T>("neg()", std::get<1>(rs), xv, [](double v) { return -v; });
    check_map<T>("exp", std::get<2>(rs), xv, [](double v) { return std::exp(v); });
    check_map<T>("log", std::get<3>(rs), pv, [](double v) { return std::log(v); });
    check_map<T>("log1p", std::get<4>(rs), uv, [](double v) { return std::log1p(v); });
    check_map<T>("sqrt", std::get<5>(rs), pv, [](double v) { return std::sqrt(v); });
    check_map<T>("rsqrt", std::get<6>(rs), pv, [](double v) { return 1.0 / std::sqrt(v); });
    check_map<T>("abs", std::get<7>(rs), xv, [](double v) { return std::abs(v); });
    check_map<T>("square", std::get<8>(rs), xv, [](double v) { return v * v; });
    check_map<T>("tanh", std::get<9>(rs), xv, [](double v) { return std::tanh(v); });
    check_map<T>("sigmoid", std::get<10>(rs), wv, sigmoid_ref);
    check_map<T>("relu", std::get<11>(rs), xv, [](double v) { return v > 0 ? v : 0.0; });
    check_map<T>("softplus", std::get<12>(rs), wv, softplus_ref);
    check_map<T>("leaky_relu", std::get<13>(rs), xv, [](double v) { return v > 0 ? v : 0.01 * v; });
    check_map<T>("leaky_relu(0.2)", std::get<14>(rs), xv, [a02](double v) { return v > 0 ? v : a02 * v; });
    check_map<T>("elu", std::get<15>(rs), xv, [](double v) { return elu_ref(v, 1.0); });
    check_map<T>("elu(0.5)", std::get<16>(rs), xv, [](double v) { return elu_ref(v, 0.5); });
    check_map<T>("clamp", std::get<17>(rs), xv, [](double v) { return std::min(std::max(v, -0.25), 0.5); });
  }
}

