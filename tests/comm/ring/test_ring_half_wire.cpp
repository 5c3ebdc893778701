// The ring's two-byte wires (parallel/half_wire.hpp): fp16 and bf16 conversions against
// core/half.hpp's scalar bits (every half survives a round trip; the vector path gives the
// scalar path's bits, tails included); all-reduces compressed by ring_options::compress and
// by allreduce_average(x, wire) bound their error by the wire's epsilon and keep every
// replica's bits identical; an fp16 average divides before the sum (no overflow where the
// sum would pass 65504); ranks that disagree on the wire are named; and the data-parallel
// step of a mixed_bf16 session moves bf16 gradients (its precision policy's Comm type),
// training to the fp32-wire result within bf16's tolerance.
#define BOOST_TEST_MODULE ring_half_wire
#include <boost/test/unit_test.hpp>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/comm/ring.hpp>
#include <gradus/gradus.hpp>
#include <gradus/parallel/data_parallel.hpp>

#include "../../support/rank_harness.hpp"
#include "ring_inputs.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace g = gradus;
using namespace std::chrono_literals;

namespace {

using gradus_test::contains;
using gradus_test::on_threads;
using gradus_test::temp_dir;
using ring_test::checksum, ring_test::inputs, ring_test::max_error, ring_test::options, ring_test::require_no_errors;
namespace hw = g::parallel::half_wire;

// How many of the 65,536 two-byte patterns do not survive a round trip through float (a NaN
// must come back a NaN).
int round_trip_failures(std::uint16_t (*from_float)(float), float (*to_float)(std::uint16_t)) {
  int bad = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto x = static_cast<std::uint16_t>(b);
    const float f = to_float(x);
    if (std::isnan(f) ? !std::isnan(to_float(from_float(f))) : from_float(f) != x) ++bad;
  }
  return bad;
}

// The vector path of compress/decompress gives the scalar conversions' bits, tail included.
void check_vector_path_matches_scalar(g::element_type wire, std::uint16_t (*from_float)(float), float (*to_float)(std::uint16_t)) {
  std::vector<float> v(1003);
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = ring_test::input<float>(7, i) * std::ldexp(1.f, static_cast<int>(i % 40) - 24);
  v[5] = std::numeric_limits<float>::infinity();
  v[6] = std::nanf("");
  std::vector<std::byte> bytes(2 * v.size());
  hw::compress(wire, v.data(), bytes.data(), v.size());
  std::vector<float> back(v.size(), 1.f), added(v.size(), 1.f);
  hw::decompress<false>(wire, back.data(), bytes.data(), v.size());
  hw::decompress<true>(wire, added.data(), bytes.data(), v.size());
  int differ = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint16_t w;
    std::memcpy(&w, bytes.data() + 2 * i, 2);
    const float f = to_float(w);
    const bool same = std::isnan(f) ? std::isnan(back[i]) && std::isnan(added[i]) : back[i] == f && added[i] == 1.f + f;
    if (w != from_float(v[i]) || !same) ++differ;
  }
  BOOST_TEST(differ == 0);
}

}  // namespace

// ---- conversions ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(fp16_conversions_round_to_nearest_even) {
  constexpr auto from_float = g::half_bits::f16_from_float;  // the scalar path compress() takes
  constexpr auto to_float = g::half_bits::f16_to_float;
  BOOST_TEST(from_float(1.f) == 0x3c00);
  BOOST_TEST(from_float(-2.f) == 0xc000);
  BOOST_TEST(from_float(65504.f) == 0x7bff);             // the largest half
  BOOST_TEST(from_float(65519.f) == 0x7bff);             // rounds down to it
  BOOST_TEST(from_float(65520.f) == 0x7c00);             // halfway: to even, which is infinity
  BOOST_TEST(from_float(std::ldexp(1.f, -24)) == 0x0001);  // the smallest subnormal
  BOOST_TEST(from_float(std::ldexp(1.f, -26)) == 0x0000);  // a quarter of it: zero
  BOOST_TEST(from_float(1.f + std::ldexp(1.f, -11)) == 0x3c00);      // halfway between 1 and its successor: even
  BOOST_TEST(from_float(1.f + 3 * std::ldexp(1.f, -11)) == 0x3c02);  // halfway above an odd one: up
  BOOST_TEST(std::isnan(to_float(from_float(std::nanf("")))));
  BOOST_TEST(to_float(0x7c00) == std::numeric_limits<float>::infinity());
  BOOST_TEST(round_trip_failures(from_float, to_float) == 0);  // every half survives float (NaNs stay NaN)
  check_vector_path_matches_scalar(g::element_type::f16, from_float, to_float);
}

BOOST_AUTO_TEST_CASE(bf16_conversions_round_to_nearest_even_and_keep_floats_range) {
  constexpr auto from_float = g::half_bits::bf16_from_float;
  constexpr auto to_float = g::half_bits::bf16_to_float;
  BOOST_TEST(from_float(1.f) == 0x3f80);
  BOOST_TEST(from_float(-2.f) == 0xc000);
  BOOST_TEST(from_float(1.f + std::ldexp(1.f, -8)) == 0x3f80);      // halfway between 1 and its successor: even
  BOOST_TEST(from_float(1.f + 3 * std::ldexp(1.f, -8)) == 0x3f82);  // halfway above an odd one: up
  BOOST_TEST(std::abs(to_float(from_float(1e30f)) - 1e30f) <= 1e30f * std::ldexp(1.f, -9));  // float's range
  BOOST_TEST(std::isfinite(to_float(from_float(3e38f))));  // fp16 is infinity past 65504
  BOOST_TEST(to_float(from_float(std::ldexp(1.f, -130))) == std::ldexp(1.f, -130));  // a subnormal kept, not flushed
  BOOST_TEST(std::isnan(to_float(from_float(std::nanf("")))));
  BOOST_TEST(round_trip_failures(from_float, to_float) == 0);  // every bfloat16 survives float
  check_vector_path_matches_scalar(g::element_type::bf16, from_float, to_float);
}

// ---- compressed all-reduces ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(compression_bounds_the_error_and_keeps_replicas_identical) {
  temp_dir dir;
  int job = 0;
  // significant bits after rounding: fp16 11, bf16 8
  for (const auto& wire : {std::pair<std::string, int>{"fp16", 11}, {"bf16", 8}})
    for (const bool average : {false, true})
      for (int world : {2, 3})
        for (const std::size_t n : {std::size_t{100003}, std::size_t{1001}}) {
          // 100003: a SIMD tail, chunks of several segments (the ring); 1001: the all-gather path
          const std::string& compress = wire.first;
          const int bits = wire.second;
          const std::string rdv = dir.ipc("wire-" + std::to_string(job++));
          std::vector<std::vector<float>> got(world);
          auto res = on_threads(world, [&](int r) {
            auto o = options(r, world, rdv);
            o.compress = compress;
            o.segment_bytes = 16 << 10;
            g::ring_allreduce comm(o);
            got[r] = inputs<float>(r, n);
            if (average) comm.allreduce_average(std::span<float>(got[r]));
            else comm.allreduce_sum(std::span<float>(got[r]));
            std::vector<double> w(5, 0.1 * (r + 1));  // broadcasts are never compressed
            comm.broadcast(std::span<double>(w), world - 1);
            if (w[4] != 0.1 * world) throw std::runtime_error("a broadcast lost bits");
          });
          BOOST_TEST_CONTEXT(compress << ", world " << world << ", n " << n << (average ? ", average" : ", sum")) {
            require_no_errors(res);
            for (int r = 1; r < world; ++r) BOOST_TEST(checksum(got[r]) == checksum(got[0]), "rank " << r << "'s bits differ from rank 0's");
            // Every hop rounds a partial sum of at most `world` inputs in [-1, 1] to `bits` bits.
            const double err = max_error(got[0], world, average);
            const double bound = std::ldexp(1.0, -bits) * world * world / (average ? world : 1);
            BOOST_TEST(err <= bound);
            BOOST_TEST(err > std::ldexp(1.0, -bits - 6), "no rounding seen: was the data compressed?");
          }
        }
  // ranks that disagree on compression are named, with what each sends
  zmq::context_t ctx;
  auto res = on_threads(2, [&](int r) {
    auto o = options(r, 2, "inproc://wire-mismatch", &ctx);
    o.timeout = 5s;
    if (r == 1) o.compress = "fp16";
    g::ring_allreduce comm(o);
    std::vector<float> x(1000, 1.f);
    comm.allreduce_sum(std::span<float>(x));
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r << " did not fail");
    BOOST_TEST(contains(*res[r].error, "float32 as float16 on the wire, 1000 elements"), *res[r].error);
  }
  auto bad = options(0, 1, "inproc://wire-bad");
  bad.compress = "int8";
  BOOST_CHECK_EXCEPTION(g::ring_allreduce{bad}, g::error, [](const g::error& e) {
    return contains(e.what(), "compress 'int8' must be none, fp16 or bf16");
  });
}

BOOST_AUTO_TEST_CASE(an_average_names_its_wire_per_call_and_fp16_divides_before_the_sum) {
  zmq::context_t ctx;
  // bf16 per call, no compress option: rounded to 8 bits, the same bits everywhere
  for (const std::size_t n : {std::size_t{50001}, std::size_t{77}}) {
    std::vector<std::vector<float>> got(3);
    auto res = on_threads(3, [&](int r) {
      g::ring_allreduce comm(options(r, 3, "inproc://wire-call-" + std::to_string(n), &ctx));
      got[r] = inputs<float>(r, n);
      comm.allreduce_average(std::span<float>(got[r]), g::element_type::bf16);
    });
    BOOST_TEST_CONTEXT("n " << n) {
      require_no_errors(res);
      for (int r = 1; r < 3; ++r) BOOST_TEST(checksum(got[r]) == checksum(got[0]));
      const double err = max_error(got[0], 3, true);
      BOOST_TEST(err <= std::ldexp(1.0, -8) * 3);
      BOOST_TEST(err > std::ldexp(1.0, -14), "no rounding seen: did the values travel as bf16?");
    }
  }
  // fp16: three ranks' 40000s sum to 120000, past fp16's 65504; divided first they average exactly
  for (const std::size_t n : {std::size_t{20000}, std::size_t{7}}) {
    std::vector<std::vector<float>> got(3);
    auto res = on_threads(3, [&](int r) {
      g::ring_allreduce comm(options(r, 3, "inproc://wire-pre-" + std::to_string(n), &ctx));
      got[r].assign(n, 40000.f);
      comm.allreduce_average(std::span<float>(got[r]), g::element_type::f16);
    });
    require_no_errors(res);
    for (int r = 0; r < 3; ++r)
      for (float v : got[r]) BOOST_REQUIRE_MESSAGE(std::abs(v - 40000.f) <= 40000.f * std::ldexp(1.f, -10), "rank " << r << " got " << v);
  }
  // ranks that pass different wires are named, with what each sends
  auto res = on_threads(2, [&](int r) {
    auto o = options(r, 2, "inproc://wire-call-mismatch", &ctx);
    o.timeout = 5s;
    g::ring_allreduce comm(o);
    std::vector<float> x(1000, 1.f);
    comm.allreduce_average(std::span<float>(x), r == 0 ? g::element_type::bf16 : g::element_type::f16);
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r << " did not fail");
    BOOST_TEST(contains(*res[r].error, "as bfloat16 on the wire"), *res[r].error);
    BOOST_TEST(contains(*res[r].error, "as float16 on the wire"), *res[r].error);
  }
  g::ring_allreduce one(options(0, 1, "inproc://wire-one", &ctx));
  std::vector<float> x(4, 1.f);
  BOOST_CHECK_EXCEPTION(one.allreduce_average(std::span<float>(x), g::element_type::f64), g::error, [](const g::error& e) {
    return contains(e.what(), "allreduce_average: gradients cannot travel as float64 (float32, bfloat16 or float16)");
  });
}

// ---- the data-parallel step under a precision policy ---------------------------------------

namespace {

constexpr g::index_t d_in = 12, d_h = 16, d_out = 3, rows = 32;
g::placeholder<"x", float, g::dyn, d_in> xs;
g::placeholder<"y", std::int32_t, g::dyn> ys;

struct model {
  g::nn::dense<"fc1", d_in, d_h, float> fc1;
  g::nn::dense<"fc2", d_h, d_out, float> fc2;
  auto loss() const { return g::nn::softmax_cross_entropy_loss(fc2(g::relu(fc1(xs))), ys); }
};

// Two ranks over a ring of threads train `steps` steps of the same data under Policy; rank
// r's weights (fc1.w, fc1.b, fc2.w, fc2.b in a row) and the bytes each step averaged.
template <class Policy>
std::vector<std::vector<float>> train_two_ranks(zmq::context_t& ctx, const std::string& name) {
  constexpr int steps = 8;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> x(static_cast<std::size_t>(steps * rows * d_in));
  std::vector<std::int32_t> y(static_cast<std::size_t>(steps * rows));
  for (auto& v : x) v = nd(rng);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = (x[i * d_in] > 0 ? 1 : 0) + (x[i * d_in + 1] > 0.5f ? 1 : 0);
  std::vector<std::vector<float>> w(2);
  auto res = on_threads(2, [&](int r) {
    g::ring_allreduce comm(options(r, 2, "inproc://dp-" + name, &ctx));
    model m;
    g::session<g::cpu_simd, Policy> s;
    m.fc1.initialize(s, 3);
    m.fc2.initialize(s, 4);
    auto step = g::parallel::minimize(comm, {}, s, m.loss(), g::sgd{.lr = 0.2, .momentum = 0.9});
    constexpr g::index_t half = rows / 2;
    for (int k = 0; k < steps; ++k)
      step.run(xs = g::view(x.data() + (k * rows + r * half) * d_in, {half, d_in}),
               ys = g::view(y.data() + k * rows + r * half, {half}));
    auto [w1, b1, w2, b2] = s.run(m.fc1.w, m.fc1.b, m.fc2.w, m.fc2.b);
    for (const auto* t : {&w1, &b1, &w2, &b2}) w[r].insert(w[r].end(), t->begin(), t->end());
  });
  require_no_errors(res);
  return w;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_mixed_bf16_sessions_gradients_travel_as_bf16_and_train_within_its_tolerance) {
  zmq::context_t ctx;
  const auto bf16_wire = train_two_ranks<g::mixed_bf16>(ctx, "bf16");                          // comm = bf16
  const auto f32_wire = train_two_ranks<g::precision<g::bf16, float, float>>(ctx, "f32");     // comm = float
  const auto fp32 = train_two_ranks<g::full_precision>(ctx, "fp32");
  BOOST_TEST(checksum(bf16_wire[1]) == checksum(bf16_wire[0]), "the replicas' weights differ");
  BOOST_TEST(checksum(f32_wire[1]) == checksum(f32_wire[0]), "the replicas' weights differ");
  double wire_diff = 0, from_fp32 = 0, scale = 0;
  for (std::size_t i = 0; i < fp32[0].size(); ++i) {
    wire_diff = std::max(wire_diff, static_cast<double>(std::abs(bf16_wire[0][i] - f32_wire[0][i])));
    from_fp32 = std::max(from_fp32, static_cast<double>(std::abs(bf16_wire[0][i] - fp32[0][i])));
    scale = std::max(scale, static_cast<double>(std::abs(fp32[0][i])));
  }
  BOOST_TEST_MESSAGE("bf16 wire vs float32 wire: " << wire_diff << ", mixed_bf16 vs fp32: " << from_fp32 << ", weight scale " << scale);
  BOOST_TEST(wire_diff > 0, "a bf16 wire left the weights bit-identical to a float32 wire's: did it travel as bf16?");
  // 8 steps of lr 0.2 on gradients rounded to 8 bits (and bf16 GEMMs): a few per cent of the weights' scale
  BOOST_TEST(wire_diff <= 0.02 * scale, "bf16 wire vs fp32 wire: " << wire_diff << " (scale " << scale << ")");
  BOOST_TEST(from_fp32 <= 0.05 * scale, "mixed_bf16 vs fp32: " << from_fp32 << " (scale " << scale << ")");
}
