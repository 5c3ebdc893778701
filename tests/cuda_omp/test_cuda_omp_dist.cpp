// The communicators over gradus::cuda sessions, built against Thrust's OpenMP system (label
// cuda-omp): the ring all-reduce and the ZeroMQ parameter server train `cuda` sessions
// through data_parallel's host buckets, and end where the same run on cpu_simd ends.
#define BOOST_TEST_MODULE cuda_omp_dist
#include "../support/check.hpp"

#include <gradus/backends/cuda.hpp>
#include <gradus/backends/ring_allreduce.hpp>
#include <gradus/backends/zmq_ps.hpp>
#include <gradus/dist/data_parallel.hpp>

#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

namespace g = gradus;
using namespace gradus_test;

namespace {

// A 12-16-3 MLP on `world` ranks (threads), rank r on its part of every batch; returns
// every rank's variables after `steps` steps. Rank 0's initial values are the ones kept
// (broadcast by the ring, held by the servers), the other ranks start elsewhere.
template <class B, class MakeComm>
std::vector<std::vector<double>> train_ranks(int world, int steps, const std::vector<float>& xs,
                                             const std::vector<std::int32_t>& ys, MakeComm make_comm) {
  std::vector<std::vector<double>> out(static_cast<std::size_t>(world));
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        auto comm = make_comm(r);
        g::placeholder<"x", float, g::dyn, 12> x;
        g::placeholder<"y", std::int32_t, g::dyn> y;
        g::nn::dense<"fc1", 12, 16> fc1;
        g::nn::dense<"fc2", 16, 3> fc2;
        const auto loss = g::nn::softmax_cross_entropy_loss(fc2(g::relu(fc1(x))), y);
        g::session<B> s;
        fc1.initialize(s, r == 0 ? 5 : 50);
        fc2.initialize(s, r == 0 ? 6 : 60);
        auto step = g::dist::minimize(*comm, s, loss, g::sgd{.lr = 0.1});
        const g::index_t part = 8;
        for (int k = 0; k < steps; ++k) {
          const g::index_t lo = (k * world + r) * part;
          step.run(x = g::view(xs.data() + lo * 12, {part, 12}), y = g::view(ys.data() + lo, {part}));
        }
        auto& o = out[static_cast<std::size_t>(r)];
        for (const auto& v : {host(s.value(fc1.w)), host(s.value(fc1.b)), host(s.value(fc2.w)), host(s.value(fc2.b))})
          o.insert(o.end(), v.begin(), v.end());
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < world; ++r)
    BOOST_REQUIRE_MESSAGE(errors[static_cast<std::size_t>(r)].empty(), "rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
  return out;
}

double largest_difference(const std::vector<double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[i] - want[i]) / (std::abs(want[i]) + 1));
  return worst;
}

constexpr int world = 2, steps = 4;

}  // namespace

BOOST_AUTO_TEST_CASE(ring_allreduce_trains_cuda_sessions) {
  const auto xs = uniform<float>(static_cast<std::size_t>(steps * world * 8 * 12), -1, 1);
  const auto ys = uniform_int(static_cast<std::size_t>(steps * world * 8), 0, 2);
  auto run = [&]<class B>(B*) {
    zmq::context_t ctx;
    return train_ranks<B>(world, steps, xs, ys, [&](int r) {
      g::ring_options o;
      o.rank = r;
      o.world_size = world;
      o.rendezvous = "inproc://cuda-omp-ring";
      o.context = &ctx;
      o.timeout = std::chrono::seconds(20);
      return std::make_unique<g::ring_allreduce>(o);
    });
  };
  const auto cpu = run(static_cast<g::cpu_simd*>(nullptr));
  const auto gpu = run(static_cast<g::cuda*>(nullptr));
  BOOST_TEST(std::memcmp(gpu[0].data(), gpu[1].data(), gpu[0].size() * sizeof(double)) == 0, "the replicas differ");
  BOOST_TEST(largest_difference(gpu[0], cpu[0]) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(parameter_server_trains_cuda_sessions) {
  const auto xs = uniform<float>(static_cast<std::size_t>(steps * world * 8 * 12), -1, 1);
  const auto ys = uniform_int(static_cast<std::size_t>(steps * world * 8), 0, 2);
  auto run = [&]<class B>(B*) {
    zmq::context_t ctx{1};
    g::ps::server_options so;
    so.address = "127.0.0.1:0";
    so.idle_exit = std::chrono::seconds(60);
    so.log = [](const std::string&) {};
    g::ps::server server(ctx, so);
    std::thread serving([&] { server.run(); });  // ends when both workers said goodbye
    const std::string address = server.endpoint();
    auto out = train_ranks<B>(world, steps, xs, ys, [&](int r) {
      g::ps_options o;
      o.servers = {address};
      o.rank = r;
      o.world_size = world;
      o.timeout = std::chrono::seconds(20);
      return std::make_unique<g::parameter_server<g::ps_bsp>>(o);
    });
    serving.join();
    return out;
  };
  const auto cpu = run(static_cast<g::cpu_simd*>(nullptr));
  const auto gpu = run(static_cast<g::cuda*>(nullptr));
  BOOST_TEST(std::memcmp(gpu[0].data(), gpu[1].data(), gpu[0].size() * sizeof(double)) == 0, "the workers differ");
  BOOST_TEST(largest_difference(gpu[0], cpu[0]) <= 1e-5);
}
