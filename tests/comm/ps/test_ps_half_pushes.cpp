#define BOOST_TEST_MODULE dist_ps_half_pushes
// The parameter server's half-width pushes (parameter_server::set_push_type: a precision
// policy's comm type): the wire carries bfloat16 and float16 in pushes only, and a shard of
// float32 takes them widened. Checked against an independent reference: three BSP workers
// push float gradients as bf16 or fp16; the servers apply the mean of the rounded gradients
// (the same values as float32 pushes of the rounded gradients, and not those of the
// unrounded ones), with half the bytes on the wire; other types are refused by name.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/comm/ps.hpp>
#include <gradus/gradus.hpp>

#include "../../support/ps_test_cluster.hpp"

namespace g = gradus;
namespace wire = gradus::ps::wire;
using ps_test::on_workers;
using ps_test::server_pool;

BOOST_AUTO_TEST_CASE(the_decoder_takes_half_width_values_in_pushes_only) {
  const auto dec = [](wire::type t, g::element_type dt, std::uint64_t count, std::size_t bytes) {
    auto h = wire::make(t, 1, 0, count, dt);
    h.payload_bytes = bytes;
    std::vector<std::byte> head(64), body(bytes);
    std::memcpy(head.data(), &h, 64);
    std::vector<std::span<const std::byte>> frames{head};
    if (bytes) frames.emplace_back(body);
    return wire::decode(frames).error;
  };
  BOOST_TEST(dec(wire::type::push, g::element_type::bf16, 5, 10).empty());
  BOOST_TEST(dec(wire::type::push, g::element_type::f16, 5, 10).empty());
  BOOST_TEST(dec(wire::type::push, g::element_type::bf16, 5, 20).find("push of 5 bfloat16 elements carries 20 bytes") !=
             std::string::npos);
  BOOST_TEST(dec(wire::type::pull, g::element_type::bf16, 5, 0).find("pull of bfloat16 elements (only a push carries") !=
             std::string::npos);
  BOOST_TEST(dec(wire::type::init_values, g::element_type::f16, 5, 10).find("init_values of float16 elements") !=
             std::string::npos);
}

namespace {

/// Three BSP workers over two servers push float gradients g_r (worker r, step s) of a
/// 10,001-element variable as `push_type` for two steps; returns worker 0's values and its
/// bytes pushed.
std::pair<std::vector<float>, std::uint64_t> train(g::element_type push_type, const std::vector<float>& w0,
                                                  const std::vector<std::vector<float>>& grads) {
  constexpr int world = 3;
  server_pool pool(2);
  std::vector<float> out;
  std::uint64_t bytes = 0;
  on_workers(world, [&](int r) {
    g::parameter_server<g::ps_bsp> ps(pool.options(r, world));
    ps.set_optimizer("sgd", {{"momentum", "0"}});
    ps.set_learning_rate(0.5);
    BOOST_TEST(ps.set_push_type(push_type));
    std::vector<float> mine(w0);
    ps.initialize("w", std::span<const float>(mine));
    for (int step = 0; step < 2; ++step) {
      ps.push("w", std::span<const float>(grads[static_cast<std::size_t>(step * world + r)]));
      ps.step_done();
      ps.pull("w", std::span<float>(mine));
    }
    if (r == 0) out = mine, bytes = ps.stats().bytes_pushed;
  });
  return {out, bytes};
}

template <class H>
std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = static_cast<float>(H(x));
  return v;
}

template <class H>
void half_pushes_apply_the_rounded_gradients(g::element_type push_type) {
  constexpr std::size_t n = 10001;
  std::vector<float> w0(n);
  std::vector<std::vector<float>> grads(6, std::vector<float>(n)), rounded_grads;
  for (std::size_t i = 0; i < n; ++i) w0[i] = 0.001f * static_cast<float>(i % 113) - 0.05f;
  for (std::size_t k = 0; k < grads.size(); ++k)
    for (std::size_t i = 0; i < n; ++i) grads[k][i] = std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k)) / 3.0f;
  for (const auto& gr : grads) rounded_grads.push_back(rounded<H>(gr));
  const auto [half, half_bytes] = train(push_type, w0, grads);
  const auto [ref, ref_bytes] = train(g::element_type::f32, w0, rounded_grads);  // the same values, as float32
  const auto [full, full_bytes] = train(g::element_type::f32, w0, grads);
  BOOST_TEST(std::memcmp(half.data(), ref.data(), n * sizeof(float)) == 0,
             g::name_of(push_type) << " pushes: not the float32 pushes of the rounded gradients");
  BOOST_TEST(std::memcmp(half.data(), full.data(), n * sizeof(float)) != 0, "the gradients were not rounded");
  // and against the update computed here: w0 - 0.5 * (mean of step 0 + mean of step 1)
  std::size_t off = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double want = w0[i];
    for (int s = 0; s < 2; ++s) {
      double mean = 0;
      for (int r = 0; r < 3; ++r) mean += rounded_grads[static_cast<std::size_t>(s * 3 + r)][i] / 3.0;
      want -= 0.5 * mean;
    }
    off += !(std::abs(half[i] - want) <= 1e-6);
  }
  BOOST_TEST(off == 0u, off << " elements off the rounded gradients' update");
  BOOST_TEST(half_bytes == 2 * n * 2, "two pushes of n two-byte values");
  BOOST_TEST(full_bytes == 2 * n * 4);
}

}  // namespace

BOOST_AUTO_TEST_CASE(bf16_pushes_apply_the_mean_of_the_rounded_gradients) {
  half_pushes_apply_the_rounded_gradients<g::bf16>(g::element_type::bf16);
}
BOOST_AUTO_TEST_CASE(fp16_pushes_apply_the_mean_of_the_rounded_gradients) {
  half_pushes_apply_the_rounded_gradients<g::f16>(g::element_type::f16);
}

BOOST_AUTO_TEST_CASE(a_push_type_that_is_not_a_float_is_refused_by_name) {
  server_pool pool(1);
  g::parameter_server<g::ps_bsp> ps(pool.options(0, 1));
  BOOST_CHECK_EXCEPTION(ps.set_push_type(g::element_type::f64), g::error, [](const g::error& e) {
    return std::string(e.what()).find("pushes travel as float32, bfloat16 or float16, not float64") != std::string::npos;
  });
  // double variables push float64 whatever the push type
  BOOST_TEST(ps.set_push_type(g::element_type::bf16));
  ps.set_optimizer("sgd", {{"momentum", "0"}});
  ps.set_learning_rate(1.0);
  std::vector<double> w{1.0, 2.0}, grad{1.0 / 3, 0.25};
  ps.initialize("d", std::span<const double>(w));
  ps.push("d", std::span<const double>(grad));
  ps.step_done();
  ps.pull("d", std::span<double>(w));
  BOOST_TEST(w[0] == 1.0 - 1.0 / 3);
  BOOST_TEST(ps.stats().bytes_pushed == 16u);
}
