// Mixed precision (core/precision.hpp, exec/compute_kernels.hpp): the 16-bit conversions
// against hand-worked bit patterns; the policy's op rule (matmul, convolution in the compute
// type, everything else in fp32 with fp32's very bits); a bf16 / fp16 matmul against a wide
// reference of the rounded operands and against the fp32 product within the bound the compute
// type's unit roundoff gives; the default policy taking today's code path.
#define BOOST_TEST_MODULE exec_precision
#include <bit>
#include <cstring>

#include "../support/matmul_reference.hpp"

namespace {

template <class H>
std::vector<float> rounded(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(H(v[i]));
  return r;
}

std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

}  // namespace

BOOST_AUTO_TEST_CASE(sixteen_bit_conversions_round_to_nearest_even) {
  // bf16: the top 16 bits of a float, rounded to nearest, ties to even
  BOOST_TEST(g::bf16(1.0f).bits == 0x3f80u);
  BOOST_TEST(g::bf16(1.0f / 3).bits == 0x3eabu);                        // 0x3eaaaaab: rounds up
  BOOST_TEST(g::bf16(std::bit_cast<float>(0x3f808000u)).bits == 0x3f80u);  // a tie: to even (down)
  BOOST_TEST(g::bf16(std::bit_cast<float>(0x3f818000u)).bits == 0x3f82u);  // a tie: to even (up)
  BOOST_TEST(g::bf16(std::bit_cast<float>(0x7f7fffffu)).bits == 0x7f80u);  // FLT_MAX rounds to +inf
  BOOST_TEST((g::bf16(std::numeric_limits<float>::quiet_NaN()).bits & 0x7fc0u) == 0x7fc0u);
  BOOST_TEST(bits(static_cast<float>(g::bf16::from_bits(0xc0a0u))) == 0xc0a00000u);  // -5
  // f16: IEEE binary16
  BOOST_TEST(g::f16(1.0f).bits == 0x3c00u);
  BOOST_TEST(g::f16(1.0f / 3).bits == 0x3555u);
  BOOST_TEST(g::f16(65504.0f).bits == 0x7bffu);   // the largest half
  BOOST_TEST(g::f16(65520.0f).bits == 0x7c00u);   // halfway to 65536: rounds to even, i.e. +inf
  BOOST_TEST(g::f16(std::ldexp(1.0f, -24)).bits == 0x0001u);  // the smallest subnormal
  BOOST_TEST(g::f16(std::ldexp(1.0f, -26)).bits == 0x0000u);  // below half of it: zero
  BOOST_TEST(static_cast<float>(g::f16::from_bits(0x0001u)) == std::ldexp(1.0f, -24));
  BOOST_TEST(static_cast<float>(g::f16::from_bits(0xfbffu)) == -65504.0f);
  // the vocabulary
  BOOST_TEST(g::size_of(g::element_type::bf16) == 2u);
  BOOST_TEST(g::name_of(g::element_type_of<g::f16>) == "float16");
  BOOST_TEST((g::element_type_named("bfloat16") == g::element_type::bf16));
  BOOST_TEST(!g::element_type_named("float8").has_value());
}

// The rule, at compile time: GEMM-like ops run in the compute type, the rest in fp32; under
// the default policy no op changes backend, so an fp32 session runs today's code.
using mm_t = decltype(g::matmul(std::declval<g::placeholder<"a", float, 2, 3>>(), std::declval<g::placeholder<"b", float, 3, 2>>()));
using sm_t = decltype(g::softmax(std::declval<g::placeholder<"a", float, 2, 3>>()));
static_assert(g::op_precision_of<mm_t> == g::op_precision::compute);
static_assert(g::op_precision_of<sm_t> == g::op_precision::fp32);
static_assert(std::is_same_v<g::kernel_backend_t<g::cpu_simd, mm_t>, g::cpu_simd>);
static_assert(std::is_same_v<g::kernel_backend_t<g::with_precision<g::cpu_simd, g::mixed_bf16>, sm_t>,
                             g::with_precision<g::cpu_simd, g::mixed_bf16>>);
static_assert(std::is_same_v<g::kernel_backend_t<g::with_precision<g::cpu_simd, g::mixed_bf16>, mm_t>,
                             g::compute_kernels<g::with_precision<g::cpu_simd, g::mixed_bf16>, g::bf16>>);
static_assert(std::is_base_of_v<g::session<g::with_precision<g::cpu_simd, g::mixed_bf16>>,
                                g::session<g::cpu_simd, g::mixed_bf16>>);

template <class Policy, class H>
void low_precision_matmul_within_its_bound() {
  g::placeholder<"a", float, g::dyn, g::dyn> a;
  g::placeholder<"b", float, g::dyn, g::dyn> b;
  g::placeholder<"bt", float, g::dyn, g::dyn> bt;
  g::session<g::cpu_simd, Policy> s;
  // unit roundoff of the compute type: 2^-8 (bf16), 2^-11 (fp16)
  const double u = std::is_same_v<H, g::bf16> ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  for (const auto [m, k, n] : {std::array<std::size_t, 3>{1, 1, 1}, {5, 7, 3}, {64, 784, 256}, {33, 129, 65}, {300, 64, 200}}) {
    const auto av = uniform<float>(m * k, -1, 1), bv = uniform<float>(k * n, -1, 1);
    const auto btv = transposed(bv, 1, k, n);
    const auto rs = s.run(g::matmul(a, b), g::matmul(a, g::transpose(bt)), a = tensor<float, 2>({m, k}, av),
                          b = tensor<float, 2>({k, n}, bv), bt = tensor<float, 2>({n, k}, btv));
    const std::string label = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
    // against the product of the rounded operands, summed wide: only fp32 accumulation differs
    const auto low = matmul_ref(rounded<H>(av), rounded<H>(bv), 1, m, k, n, 0, 0);
    BOOST_TEST(close(std::get<0>(rs), low.value, rtol<float>(), low.scale), "rounded operands " << label);
    BOOST_TEST(close(std::get<1>(rs), low.value, rtol<float>(), low.scale), "transposed b " << label);
    // against the fp32 product: each operand off by at most u, so |error| <= (2u + u^2) sum|a||b|
    const auto full = matmul_ref(av, bv, 1, m, k, n, 0, 0);
    const auto got = host(std::get<0>(rs));
    std::size_t differ = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double bound = (2 * u + u * u) * full.scale[i] + 4 * rtol<float>() * full.scale[i];
      if (std::abs(got[i] - full.value[i]) > bound) ++differ;
    }
    BOOST_TEST(differ == 0u, label << ": " << differ << " elements outside the compute type's bound");
  }
}

BOOST_AUTO_TEST_CASE(bf16_matmul_is_the_product_of_rounded_operands) {
  low_precision_matmul_within_its_bound<g::mixed_bf16, g::bf16>();
}
BOOST_AUTO_TEST_CASE(fp16_matmul_is_the_product_of_rounded_operands) {
  low_precision_matmul_within_its_bound<g::mixed_fp16, g::f16>();
}

BOOST_AUTO_TEST_CASE(ops_kept_in_fp32_give_fp32_bits_under_a_mixed_policy) {
  // softmax, log-softmax, sums, means, exp/log/pow, the cross-entropy loss: the same bits in a
  // bf16 session as in an fp32 one; the matmul beside them does differ (the rule is applied).
  g::placeholder<"x", float, g::dyn, 10> x;
  g::placeholder<"w", float, 10, 10> w;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  const auto xv = uniform<float>(37 * 10, -3, 3), wv = uniform<float>(100, -1, 1);
  const auto yv = uniform_int(37, 0, 9);
  auto run = [&](auto& s) {
    const auto r = s.run(g::softmax(x), g::log_softmax(x), g::sum(g::exp(x)), g::mean(g::log(g::abs(x) + 1.f)),
                         g::pow(g::abs(x), 1.5f), g::nn::softmax_cross_entropy_loss(x, y), g::matmul(x, w),
                         x = tensor<float, 2>({37, 10}, xv), w = tensor<float, 2>({10, 10}, wv), y = tensor<std::int32_t, 1>({37}, yv));
    std::vector<std::vector<float>> out;
    std::apply([&](const auto&... v) { (out.emplace_back(v.data(), v.data() + v.size()), ...); }, r);
    return out;
  };
  g::session<g::cpu_simd> full;
  g::session<g::cpu_simd, g::mixed_bf16> mixed;
  const auto a = run(full), b = run(mixed);
  for (std::size_t i = 0; i + 1 < a.size(); ++i)
    BOOST_TEST(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) == 0, "output " << i << " is fp32's");
  BOOST_TEST(std::memcmp(a.back().data(), b.back().data(), a.back().size() * sizeof(float)) != 0,
             "the matmul ran in bf16");
}

BOOST_AUTO_TEST_CASE(a_bf16_gemm_gives_the_same_bits_on_a_team_of_one_and_of_two) {
  // cpu_simd's bf16 GEMM cuts each product into threads() slices (rows of A where A is the
  // larger operand, else columns of B) run on the team: a busy core (a team of 1) changes
  // nothing; each slice's result is still the product of the rounded operands
  g::cpu_simd::set_threads(2);
  struct product {
    bool ta, tb;
    g::index_t m, n, k, batch, stride_c;
  };
  const product cases[] = {
      {false, false, 64, 256, 784, 1, 1},   // B larger: cut by columns
      {true, false, 784, 256, 64, 1, 1},    // A larger, transposed: cut by rows
      {false, true, 300, 200, 64, 1, 1},    // A larger, B transposed
      {false, false, 40, 24, 8, 1, 1},      // too small to cut in blocks of 16 both ways
      {false, false, 50, 70, 30, 3, 1},     // a batch of three
      {true, true, 33, 65, 129, 2, 0},      // two items adding into one output
  };
  for (const product& p : cases) {
    const g::index_t am = p.ta ? p.k : p.m, ak = p.ta ? p.m : p.k, bk = p.tb ? p.n : p.k, bn = p.tb ? p.k : p.n;
    const auto a = uniform<float>(static_cast<std::size_t>(p.batch * am * ak), -1, 1);
    const auto b = uniform<float>(static_cast<std::size_t>(p.batch * bk * bn), -1, 1);
    const g::index_t stride_c = p.stride_c ? p.m * p.n : 0;
    std::vector<float> c[2];
    for (int team = 1; team <= 2; ++team) {
      g::cpu_simd::pin_team(team);
      auto& out = c[team - 1];
      out.assign(static_cast<std::size_t>((p.stride_c ? p.batch : 1) * p.m * p.n), 0.25f);  // beta = 1 adds to it
      g::cpu_simd::gemm_low(g::element_type::bf16, p.ta, p.tb, p.m, p.n, p.k, 1.0f, a.data(), ak, am * ak, b.data(), bn,
                            bk * bn, 1.0f, out.data(), p.n, stride_c, p.batch);
    }
    const std::string label = std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) + " x" +
                              std::to_string(p.batch);
    BOOST_TEST(std::memcmp(c[0].data(), c[1].data(), c[0].size() * sizeof(float)) == 0, label << ": bits differ between teams");
    // against the product of the rounded operands summed in double (fp32 accumulation aside)
    std::size_t wrong = 0;
    for (g::index_t t = 0; t < p.batch; ++t)
      for (g::index_t i = 0; i < p.m; ++i)
        for (g::index_t j = 0; j < p.n; ++j) {
          double ref = 0, scale = 0;
          for (g::index_t q = 0; q < p.k; ++q) {
            const double av = static_cast<float>(g::bf16(a[static_cast<std::size_t>(t * am * ak + (p.ta ? q * ak + i : i * ak + q))]));
            const double bv = static_cast<float>(g::bf16(b[static_cast<std::size_t>(t * bk * bn + (p.tb ? j * bn + q : q * bn + j))]));
            ref += av * bv;
            scale += std::abs(av * bv);
          }
          if (p.stride_c == 0) continue;  // the shared output: checked for its bits only
          const auto at = static_cast<std::size_t>((t * p.m + i) * p.n + j);
          wrong += !(std::abs(c[1][at] - 0.25 - ref) <= 1e-5 * (scale + 1));
        }
    BOOST_TEST(wrong == 0u, label << ": " << wrong << " elements off the rounded operands' product");
  }
  g::cpu_simd::pin_team(0);
}

namespace {

/// The element count of a convolution pass's result: y, dx or dw.
std::size_t conv_output_size(g::conv_pass_kind pass, const g::conv_geometry& g) {
  return pass == g::conv_pass_kind::forward ? static_cast<std::size_t>(g.n * g.o * g.oh() * g.ow())
         : pass == g::conv_pass_kind::data  ? static_cast<std::size_t>(g.n * g.c * g.h * g.w)
                                            : static_cast<std::size_t>(g.o * g.patch());
}

/// The three convolution passes of (a, b) in double, with the sums of |products| for a
/// tolerance: forward a = x, b = w -> y; data a = dy, b = w -> dx; weights a = x, b = dy -> dw.
std::pair<std::vector<double>, std::vector<double>> conv_reference(g::conv_pass_kind pass, const std::vector<float>& a,
                                                                   const std::vector<float>& b, const g::conv_geometry& g) {
  const auto [kh, kw, s, pad] = g.window;
  const g::index_t oh = g.oh(), ow = g.ow();
  const std::size_t out_size = conv_output_size(pass, g);
  std::vector<double> out(out_size, 0.0), scale(out_size, 0.0);
  for (g::index_t n = 0; n < g.n; ++n)
    for (g::index_t o = 0; o < g.o; ++o)
      for (g::index_t i = 0; i < oh; ++i)
        for (g::index_t j = 0; j < ow; ++j)
          for (g::index_t c = 0; c < g.c; ++c)
            for (g::index_t p = 0; p < kh; ++p)
              for (g::index_t q = 0; q < kw; ++q) {
                const g::index_t xi = i * s - pad + p, xj = j * s - pad + q;
                if (xi < 0 || xj < 0 || xi >= g.h || xj >= g.w) continue;
                const auto x_at = static_cast<std::size_t>(((n * g.c + c) * g.h + xi) * g.w + xj);
                const auto y_at = static_cast<std::size_t>(((n * g.o + o) * oh + i) * ow + j);
                const auto w_at = static_cast<std::size_t>(((o * g.c + c) * kh + p) * kw + q);
                const auto [at, u, v] = pass == g::conv_pass_kind::forward ? std::tuple{y_at, a[x_at], b[w_at]}
                                        : pass == g::conv_pass_kind::data  ? std::tuple{x_at, a[y_at], b[w_at]}
                                                                           : std::tuple{w_at, a[x_at], b[y_at]};
                out[at] += double(u) * double(v);
                scale[at] += std::abs(double(u) * double(v));
              }
  return {out, scale};
}

template <class H>
void low_precision_convolutions_within_their_bound(g::element_type compute) {
  g::cpu_simd::set_threads(2);
  const double u = std::is_same_v<H, g::bf16> ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const std::pair<const char*, g::conv_pass_kind> passes[] = {
      {"forward", g::conv_pass_kind::forward}, {"data", g::conv_pass_kind::data}, {"weights", g::conv_pass_kind::weights}};
  // LeNet's two layers as mnist_cnn trains them (a one-channel input: oneDNN's data pass is
  // not taken, see dnnl.hpp), padded and on odd batches (slices of unequal size), and a
  // strided, padded one
  const g::conv_geometry shapes[] = {{32, 1, 28, 28, 6, {5, 5, 1, 0}}, {32, 6, 12, 12, 16, {5, 5, 1, 0}},
                                     {37, 1, 28, 28, 6, {5, 5, 1, 2}}, {37, 6, 14, 14, 16, {5, 5, 1, 0}},
                                     {9, 3, 11, 11, 8, {3, 3, 2, 1}}};
  for (const auto& geo : shapes)
    for (const auto& [pass_name, pass] : passes) {
      const auto [a_size, b_size] = g::conv_operand_sizes(pass, geo);
      const auto av = uniform<float>(static_cast<std::size_t>(a_size), -1, 1);
      const auto bv = uniform<float>(static_cast<std::size_t>(b_size), -1, 1);
      const std::string label = std::string(pass_name) + " c=" + std::to_string(geo.c) + " h=" + std::to_string(geo.h);
      std::vector<float> out[2], full;
      for (int team = 1; team <= 2; ++team) {
        g::cpu_simd::pin_team(team);
        out[team - 1].assign(conv_output_size(pass, geo), -7.f);
        g::cpu_simd::conv2d_low(compute, pass, av.data(), bv.data(), geo, out[team - 1].data());
      }
      g::cpu_simd::pin_team(0);
      BOOST_TEST(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0,
                 label << ": bits differ between teams");
      // against the rounded operands' convolution summed in double: only fp32 accumulation differs
      const auto [low, low_scale] = conv_reference(pass, rounded<H>(av), rounded<H>(bv), geo);
      const auto [ref, ref_scale] = conv_reference(pass, av, bv, geo);
      std::size_t off_rounded = 0, off_bound = 0;
      for (std::size_t i = 0; i < low.size(); ++i) {
        off_rounded += !(std::abs(out[1][i] - low[i]) <= 4 * rtol<float>() * (low_scale[i] + 1e-30));
        off_bound += !(std::abs(out[1][i] - ref[i]) <= (2 * u + u * u + 4 * rtol<float>()) * ref_scale[i]);
      }
      BOOST_TEST(off_rounded == 0u, label << ": " << off_rounded << " elements off the rounded operands' convolution");
      BOOST_TEST(off_bound == 0u, label << ": " << off_bound << " elements outside the compute type's bound");
      // and not fp32's own result: the operands were rounded
      full.assign(low.size(), 0.f);
      if (pass == g::conv_pass_kind::forward) g::cpu_simd::conv2d(av.data(), bv.data(), geo, full.data());
      else if (pass == g::conv_pass_kind::data) g::cpu_simd::conv2d_backward_data(av.data(), bv.data(), geo, full.data());
      else g::cpu_simd::conv2d_backward_weights(av.data(), bv.data(), geo, full.data());
      BOOST_TEST(std::memcmp(full.data(), out[1].data(), full.size() * sizeof(float)) != 0,
                 label << ": fp32's very bits (the operands were not rounded)");
    }
}

}  // namespace

BOOST_AUTO_TEST_CASE(bf16_convolutions_are_the_convolutions_of_rounded_operands) {
  // oneDNN's bf16 convolutions where the CPU has AVX512_BF16 (fp32 after a warning where not:
  // then the rounded-operand check cannot hold, and the test says why)
  if (!g::cpu_dnnl::bf16_native()) {
    BOOST_TEST_MESSAGE("no AVX512_BF16 on this CPU: cpu_simd's bf16 convolutions are fp32 ones here");
    return;
  }
  low_precision_convolutions_within_their_bound<g::bf16>(g::element_type::bf16);
}
BOOST_AUTO_TEST_CASE(fp16_convolutions_are_the_convolutions_of_rounded_operands) {
  low_precision_convolutions_within_their_bound<g::f16>(g::element_type::f16);
}

BOOST_AUTO_TEST_CASE(a_held_operand_is_converted_once_and_read_from_its_copy) {
  // core/held_operand.hpp: while a hold on W lives, cpu_simd's bf16 GEMM reads W's bf16 bits
  // converted at the first GEMM that read them: the same bits as converting at each call, and (the
  // proof that the copy is read) unchanged by a write to W inside the scope, which the
  // contract forbids and this test makes on purpose. Parts of W (the RNN cells' W_h_k) too.
  if (!g::cpu_dnnl::bf16_native()) {
    BOOST_TEST_MESSAGE("no AVX512_BF16 on this CPU: nothing is held");
    return;
  }
  g::cpu_simd::set_threads(2);
  const g::index_t m = 48, k = 64, n = 4 * 64;
  const auto a = uniform<float>(static_cast<std::size_t>(m * k), -1, 1);
  auto w = uniform<float>(static_cast<std::size_t>(k * n), -1, 1);
  using kernels = g::compute_kernels<g::with_precision<g::cpu_simd, g::mixed_bf16>, g::bf16>;
  auto product = [&](const float* b, g::index_t cols) {
    std::vector<float> c(static_cast<std::size_t>(m * cols));
    kernels::gemm(false, false, m, cols, k, 1.0f, a.data(), k, 0, b, n, 0, 0.0f, c.data(), cols, 0, g::index_t(1));
    return c;
  };
  const auto plain = product(w.data(), n), part = product(w.data() + 64, 64);
  {
    const auto held = g::hold_operand<kernels>(w.data(), w.size());
    static_assert(!std::is_same_v<std::remove_cvref_t<decltype(held)>, g::nothing_held>);
    const auto whole = product(w.data(), n), second = product(w.data() + 64, 64);
    BOOST_TEST(std::memcmp(whole.data(), plain.data(), plain.size() * sizeof(float)) == 0);
    BOOST_TEST(std::memcmp(second.data(), part.data(), part.size() * sizeof(float)) == 0);
    for (auto& v : w) v = -v;  // read from the copy: no effect while held
    const auto after = product(w.data(), n);
    BOOST_TEST(std::memcmp(after.data(), plain.data(), plain.size() * sizeof(float)) == 0);
  }
  // the hold ended: W is converted again, its new values read
  const auto negated = product(w.data(), n);
  std::size_t flipped = 0;
  for (std::size_t i = 0; i < negated.size(); ++i) flipped += negated[i] == -plain[i];
  BOOST_TEST(flipped == negated.size());
  // an fp32 session's backend holds nothing
  static_assert(std::is_same_v<decltype(g::hold_operand<g::cpu_simd>(w.data(), w.size())), g::nothing_held>);
}

BOOST_AUTO_TEST_CASE(holds_nest_and_release_only_what_they_added) {
  // Several regions in one hold; an inner hold adds only what no outer hold covers and, when it
  // ends, releases only that. Writes made on purpose show which regions are read from a copy.
  if (!g::cpu_dnnl::bf16_native()) {
    BOOST_TEST_MESSAGE("no AVX512_BF16 on this CPU: nothing is held");
    return;
  }
  const g::index_t m = 16, k = 32, n = 32;
  const auto a = uniform<float>(static_cast<std::size_t>(m * k), -1, 1);
  auto w1 = uniform<float>(static_cast<std::size_t>(k * n), -1, 1), w2 = w1, w3 = w1;
  using kernels = g::compute_kernels<g::with_precision<g::cpu_simd, g::mixed_bf16>, g::bf16>;
  auto product = [&](const std::vector<float>& b) {
    std::vector<float> c(static_cast<std::size_t>(m * n));
    kernels::gemm(false, false, m, n, k, 1.0f, a.data(), k, 0, b.data(), n, 0, 0.0f, c.data(), n, 0, g::index_t(1));
    return c;
  };
  const auto plain = product(w1);
  const auto negate = [](std::vector<float>& v) {
    for (auto& x : v) x = -x;
  };
  const std::size_t before = g::cpu_simd::held_conversions();
  {
    auto outer = kernels::hold_operands();
    outer.add(w1.data(), w1.size());
    outer.add(w2.data(), w2.size());
    BOOST_TEST(product(w1) == plain);
    BOOST_TEST(product(w2) == plain);
    {
      auto inner = kernels::hold_operands();
      inner.add(w1.data(), w1.size());  // covered: not held again
      inner.add(w3.data(), w3.size());
      BOOST_TEST(product(w3) == plain);
      negate(w1), negate(w3);
      BOOST_TEST(product(w1) == plain, "w1 read from the outer hold's copy");
      BOOST_TEST(product(w3) == plain, "w3 read from the inner hold's copy");
    }
    BOOST_TEST(product(w1) == plain, "w1 still held by the outer hold");
    BOOST_TEST(product(w3) != plain, "w3 released with the inner hold");
    negate(w2);
    BOOST_TEST(product(w2) == plain, "w2 still held");
  }
  BOOST_TEST(product(w2) != plain, "every hold ended");
  BOOST_TEST(g::cpu_simd::held_conversions() - before == 3u, "w1, w2 and w3 each converted once");
}

BOOST_AUTO_TEST_CASE(a_run_converts_each_weight_once_and_reads_its_new_values_next_run) {
  // exec/graph_engine.hpp: a run under a bf16 policy holds its variables. w2 is read by two
  // GEMMs (h w2, and G w2^T for dW1), w1 by one: two conversions a run, the same bits as the
  // same products of unheld operands (placeholders), and after an assign the next run reads
  // the new values.
  if (!g::cpu_dnnl::bf16_native()) {
    BOOST_TEST_MESSAGE("no AVX512_BF16 on this CPU: nothing is held");
    return;
  }
  g::placeholder<"x", float, g::dyn, 64> x;
  g::variable<"w1", float, 64, 48> w1;
  g::variable<"w2", float, 48, 24> w2;
  g::placeholder<"p1", float, 64, 48> p1;
  g::placeholder<"p2", float, 48, 24> p2;
  const auto xv = uniform<float>(37 * 64, -1, 1), w1v = uniform<float>(64 * 48, -1, 1);
  auto w2v = uniform<float>(48 * 24, -1, 1);
  const auto X = tensor<float, 2>({37, 64}, xv);
  const auto vec = [](const auto& t) { return std::vector<float>(t.data(), t.data() + t.size()); };
  g::session<g::cpu_simd, g::mixed_bf16> s;
  g::assign(s, w1, tensor<float, 2>({64, 48}, w1v));
  const auto y = g::matmul(g::matmul(x, w1), w2);
  const auto dw1 = g::grad(g::sum(y), w1);
  const auto yp = g::matmul(g::matmul(x, p1), p2);
  const auto dp1 = g::grad(g::sum(yp), p1);
  for (int round = 0; round < 2; ++round) {
    g::assign(s, w2, tensor<float, 2>({48, 24}, w2v));
    const std::size_t before = g::cpu_simd::held_conversions();
    const auto [yv, d1] = s.run(y, dw1, x = X);
    BOOST_TEST(g::cpu_simd::held_conversions() - before == 2u, "w1 and w2 converted once each");
    const auto want_y = vec(yv), want_d1 = vec(d1);
    const auto [yr, dr] = s.run(yp, dp1, x = X, p1 = tensor<float, 2>({64, 48}, w1v), p2 = tensor<float, 2>({48, 24}, w2v));
    BOOST_TEST(want_y == vec(yr), "round " << round << ": y");
    BOOST_TEST(want_d1 == vec(dr), "round " << round << ": dW1");
    for (auto& v : w2v) v *= -0.5f;
  }
}

BOOST_AUTO_TEST_CASE(in_precision_runs_its_subexpression_in_its_own_type) {
  // graph/ops/precision_scope.hpp: the same matmul in an fp32 session and a bf16 one, with and
  // without a scope; a node planned under two precisions is two steps
  g::placeholder<"x", float, g::dyn, 64> x;
  g::placeholder<"w", float, 64, 48> w;
  g::placeholder<"w2", float, 48, 24> w2;
  const auto xv = uniform<float>(37 * 64, -1, 1), wv = uniform<float>(64 * 48, -1, 1), w2v = uniform<float>(48 * 24, -1, 1);
  const auto X = tensor<float, 2>({37, 64}, xv), W = tensor<float, 2>({64, 48}, wv), W2 = tensor<float, 2>({48, 24}, w2v);
  const auto bits_of = [](const auto& t) { return std::vector<float>(t.data(), t.data() + t.size()); };
  g::session<g::cpu_simd> full;
  g::session<g::cpu_simd, g::mixed_bf16> mixed;
  const auto mm = g::matmul(x, w);
  const auto [f_plain, f_bf16] = full.run(mm, g::in_precision<g::bf16>(mm), x = X, w = W);
  const auto [m_plain, m_fp32] = mixed.run(mm, g::in_precision<float>(mm), x = X, w = W);
  const auto fp32 = bits_of(f_plain), bf16 = bits_of(m_plain);
  BOOST_TEST(fp32 != bf16, "the policies differ");
  BOOST_TEST(bits_of(f_bf16) == bf16, "in_precision<bf16> in an fp32 session: the bf16 session's bits");
  BOOST_TEST(bits_of(m_fp32) == fp32, "in_precision<float> in a bf16 session: the fp32 session's bits");
  // nested: the outer matmul in fp32, the inner one back in bf16
  const auto nested = g::in_precision<float>(g::matmul(g::in_precision<g::bf16>(mm), w2));
  const auto got = full.run(nested, x = X, w = W, w2 = W2);
  g::placeholder<"h", float, g::dyn, 48> h;
  const auto nested_bits = bits_of(got);
  const auto want = full.run(g::matmul(h, w2), h = tensor<float, 2>({37, 48}, bf16), w2 = W2);
  BOOST_TEST(nested_bits == bits_of(want), "nested scopes");
}

BOOST_AUTO_TEST_CASE(the_gradients_of_a_scope_run_in_its_type_and_the_adjoint_from_above_in_its_own) {
  // loss = sum(in_precision<float>(x w1) w2) in a bf16 session: h = x w1 and the gradient
  // GEMM below it, dW1 = x^T (G w2^T), run in fp32; the GEMMs outside it (G w2^T, dW2 = h^T G,
  // G = ones) in bf16. Checked against double references of exactly those roundings.
  g::placeholder<"x", float, g::dyn, 64> x;
  g::variable<"w1", float, 64, 48> w1;
  g::variable<"w2", float, 48, 24> w2;
  const auto xv = uniform<float>(37 * 64, -1, 1), w1v = uniform<float>(64 * 48, -1, 1), w2v = uniform<float>(48 * 24, -1, 1);
  g::session<g::cpu_simd, g::mixed_bf16> s;
  g::assign(s, w1, tensor<float, 2>({64, 48}, w1v));
  g::assign(s, w2, tensor<float, 2>({48, 24}, w2v));
  const auto h = g::in_precision<float>(g::matmul(x, w1));
  const auto loss = g::sum(g::matmul(h, w2));
  const auto [dw1, dw2] = g::grad(loss, w1, w2);
  const auto [hv, d1, d2] = s.run(h, dw1, dw2, x = tensor<float, 2>({37, 64}, xv));
  const std::vector<float> hf(hv.data(), hv.data() + hv.size());
  // h: the fp32 product (an fp32 session's bits)
  g::session<g::cpu_simd> full;
  g::placeholder<"w1p", float, 64, 48> w1p;
  const auto h32 = full.run(g::matmul(x, w1p), x = tensor<float, 2>({37, 64}, xv), w1p = tensor<float, 2>({64, 48}, w1v));
  BOOST_TEST(hf == std::vector<float>(h32.data(), h32.data() + h32.size()));
  // dW2[k][j] = sum_i bf16(h[i][k]) (G = ones): bf16 operands, fp32 sums
  std::size_t off2 = 0, rounded_only = 0;
  for (int k = 0; k < 48; ++k)
    for (int j = 0; j < 24; ++j) {
      double ref = 0, unrounded = 0, scale = 0;
      for (int i = 0; i < 37; ++i) {
        ref += static_cast<float>(g::bf16(hf[static_cast<std::size_t>(i * 48 + k)]));
        unrounded += hf[static_cast<std::size_t>(i * 48 + k)];
        scale += std::abs(hf[static_cast<std::size_t>(i * 48 + k)]);
      }
      const double got = d2.data()[k * 24 + j];
      off2 += !(std::abs(got - ref) <= 4 * rtol<float>() * scale);
      rounded_only += std::abs(got - unrounded) > 8 * rtol<float>() * scale;
    }
  BOOST_TEST(off2 == 0u, off2 << " elements of dW2 off bf16(h)^T G");
  BOOST_TEST(rounded_only > 0u, "dW2 is not fp32's h^T G");
  // dW1[p][k] = sum_i x[i][p] A[i][k], A[i][k] = sum_j bf16(w2[k][j]) (G w2^T in bf16), in fp32
  std::size_t off1 = 0;
  for (int p = 0; p < 64; ++p)
    for (int k = 0; k < 48; ++k) {
      double a = 0;
      for (int j = 0; j < 24; ++j) a += static_cast<float>(g::bf16(w2v[static_cast<std::size_t>(k * 24 + j)]));
      double ref = 0, scale = 0;
      for (int i = 0; i < 37; ++i) {
        ref += double(xv[static_cast<std::size_t>(i * 64 + p)]) * a;
        scale += std::abs(double(xv[static_cast<std::size_t>(i * 64 + p)]) * a);
      }
      off1 += !(std::abs(d1.data()[p * 48 + k] - ref) <= 4 * rtol<float>() * scale + 1e-30);
    }
  BOOST_TEST(off1 == 0u, off1 << " elements of dW1 off x^T (G bf16(w2)^T) summed in fp32");
}
