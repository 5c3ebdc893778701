// The communicators over gradus::cuda sessions, built against Thrust's OpenMP system (label
// cuda-omp): the ring all-reduce and the ZeroMQ parameter server train `cuda` sessions
// through data_parallel's host buckets, and end where the same run on cpu_simd ends; and a
// model split across devices of one process (pipeline_in_process: a cpu_simd stage and a
// cuda stage) trains as the unsplit cpu_simd model does.
#define BOOST_TEST_MODULE cuda_omp_dist
#include "../support/check.hpp"

#include <gradus/backends/cuda.hpp>
#include <gradus/comm/ring.hpp>
#include <gradus/comm/ps.hpp>
#include <gradus/parallel/data_parallel.hpp>
#include <gradus/parallel/pipeline/in_process.hpp>

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
        auto step = g::parallel::minimize(*comm, s, loss, g::sgd{.lr = 0.1});
        const g::index_t part = 8;
        for (int k = 0; k < steps; ++k) {
          const g::index_t lo = (k * world + r) * part;
          step.run(x = g::view(xs.data() + lo * 12, {part, 12}), y = g::view(ys.data() + lo, {part}));
        }
        auto& o = out[static_cast<std::size_t>(r)];
        for (const auto& v : {host(g::value(s, fc1.w)), host(g::value(s, fc1.b)), host(g::value(s, fc2.w)), host(g::value(s, fc2.b))})
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

// A communicator of a world of two whose collectives change nothing and refuse device
// memory: what gradus hands a communicator must be host memory (the ring and the parameter
// server read and write it on the host; a device pointer there faults on a GPU).
struct host_memory_only {
  int calls = 0;
  int r = 0;
  int rank() const { return r; }
  int world_size() const { return 2; }
  template <class T>
  void check(std::span<T> s, const char* op) {
    ++calls;
    if (g::cuda_detail::device_pool::device_memory(s.data(), s.size_bytes()))
      throw std::runtime_error(std::string(op) + " was handed device memory (" + std::to_string(s.size_bytes()) + " bytes)");
  }
  void allreduce_sum(std::span<float> x) { check(x, "allreduce_sum"); }
  void allreduce_sum(std::span<double> x) { check(x, "allreduce_sum"); }
  void allreduce_average(std::span<float> x) { check(x, "allreduce_average"); }
  void allreduce_average(std::span<double> x) { check(x, "allreduce_average"); }
  void broadcast(std::span<float> x, int) { check(x, "broadcast"); }
  void broadcast(std::span<double> x, int) { check(x, "broadcast"); }
  void broadcast(std::span<std::byte> x, int) { check(x, "broadcast"); }
  void barrier() {}
};
static_assert(g::parallel::communicator<host_memory_only>);

// broadcast_variables and reduce_gradients (a hand-written loop's average, through the
// data-parallel step's buckets) over a cuda session: each tensor reaches the communicator as
// a host copy and comes back unchanged.
BOOST_AUTO_TEST_CASE(communicators_are_handed_host_copies_of_device_tensors) {
  g::placeholder<"x", float, g::dyn, 12> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"fc1", 12, 16> fc1;
  g::nn::dense<"fc2", 16, 3> fc2;
  const auto loss = g::nn::softmax_cross_entropy_loss(fc2(g::relu(fc1(x))), y);
  g::session<g::cuda> s;
  fc1.initialize(s, 5);
  fc2.initialize(s, 6);
  auto step = g::minimize(s, loss, g::adam{.lr = 0.01});
  const auto xs = uniform<float>(8 * 12, -1, 1);
  const auto ys = uniform_int(8, 0, 2);
  step.run(x = g::view(xs.data(), {8, 12}), y = g::view(ys.data(), {8}));
  const auto before = host(g::value(s, fc1.w));
  host_memory_only comm;
  g::parallel::broadcast_variables(comm, s);  // 4 variables, 8 Adam slots, the step
  BOOST_TEST(comm.calls == 13);
  BOOST_TEST(host(g::value(s, fc1.w)) == before);  // rank 0 sends: its tensors are left as they were
  comm.r = 1;  // a receiver: each tensor is copied back from what the communicator left in the host copy
  g::parallel::broadcast_variables(comm, s);
  BOOST_TEST(comm.calls == 26);
  BOOST_TEST(host(g::value(s, fc1.w)) == before);
  step.compute_gradients(x = g::view(xs.data(), {8, 12}), y = g::view(ys.data(), {8}));
  std::vector<std::vector<double>> grads;
  for (auto& gb : step.gradients()) {
    std::vector<float> h(static_cast<std::size_t>(gb.size));
    g::cuda::copy_to_host(h.data(), gb.data, h.size() * sizeof(float));
    grads.emplace_back(h.begin(), h.end());
  }
  g::parallel::reduce_gradients(comm, step);  // the average over a world of copies of itself: unchanged
  BOOST_TEST(comm.calls == 26 + 1);  // the 4 gradients in one bucket
  std::size_t i = 0;
  for (auto& gb : step.gradients()) {
    std::vector<float> h(static_cast<std::size_t>(gb.size));
    g::cuda::copy_to_host(h.data(), gb.data, h.size() * sizeof(float));
    BOOST_TEST(std::vector<double>(h.begin(), h.end()) == grads[i++]);
  }
}

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
    g::ps::server<g::cpu_simd> server(ctx, so);
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

#if GRADUS_CUDA_GPU  // the GPU build of this file (GRADUS_CUDA_DEVICE_SUITE): skipped without a device
#include "../support/device_main.hpp"
#endif

// Model parallelism across the devices of one process (parallel/pipeline/in_process.hpp):
// stage 0 on the CPU (a cpu_simd session), stage 1 on CUDA device 0 (a cuda session); the
// activations and their gradients cross as host copies. The losses and the weights after 3
// steps are the unsplit cpu_simd model's, to float rounding (the CUDA kernels sum in other
// orders), under both schedules.
BOOST_AUTO_TEST_CASE(a_pipeline_across_the_cpu_and_a_cuda_device) {
  g::placeholder<"x", float, g::dyn, 12> x;
  g::placeholder<"y", std::int32_t, g::dyn> y;
  g::nn::dense<"fc1", 12, 16> fc1;
  g::nn::dense<"fc2", 16, 3> fc2;
  const auto h = g::on<g::device::cpu>(g::relu(fc1(x)));
  const auto loss = g::on<g::device::cuda<0>>(g::nn::softmax_cross_entropy_loss(fc2(h), y));
  static_assert(std::is_same_v<g::stage_device_t<1, decltype(loss)>, g::device::cuda<0>>);
  const g::sgd opt{.lr = 0.1, .momentum = 0.9};
  const auto xs = uniform<float>(3 * 12 * 12, -1, 1);
  const auto ys = uniform_int(3 * 12, 0, 2);
  std::vector<double> ref_losses;
  std::vector<double> ref_w;
  {
    g::session<g::cpu_simd> r;
    fc1.initialize(r, 5);
    fc2.initialize(r, 6);
    auto step = g::minimize(r, g::nn::softmax_cross_entropy_loss(fc2(g::relu(fc1(x))), y), opt);
    for (int k = 0; k < 3; ++k)
      ref_losses.push_back(step.run(x = g::view(xs.data() + k * 144, {12, 12}), y = g::view(ys.data() + k * 12, {12})));
    for (const auto& v : {host(g::value(r, fc1.w)), host(g::value(r, fc1.b)), host(g::value(r, fc2.w)), host(g::value(r, fc2.b))})
      ref_w.insert(ref_w.end(), v.begin(), v.end());
  }
  for (const auto sched : {g::parallel::schedule_kind::gpipe, g::parallel::schedule_kind::one_f_one_b}) {
    BOOST_TEST_CONTEXT(g::parallel::schedule_name(sched)) {
      g::session<g::cpu_simd> cpu;
      g::session<g::cuda> gpu;
      fc1.initialize(cpu, 5);
      fc2.initialize(cpu, 6);  // (gathered into the CPU's session at the end)
      fc2.initialize(gpu, 6);
      auto step = g::parallel::pipeline_in_process<2>({.micro_batches = 3, .schedule = sched}, loss, opt, cpu, gpu);
      for (int k = 0; k < 3; ++k) {
        const double l = step.run(x = g::view(xs.data() + k * 144, {12, 12}), y = g::view(ys.data() + k * 12, {12}));
        BOOST_TEST(std::abs(l - ref_losses[static_cast<std::size_t>(k)]) <= 1e-5 * (1 + std::abs(ref_losses[static_cast<std::size_t>(k)])));
      }
      BOOST_TEST(step.stats(0).bytes_sent == 12u * 16 * 4);  // the [12, 16] activations to the device
      BOOST_TEST(step.stats(1).bytes_sent == 12u * 16 * 4);  // their gradient back
      step.gather_variables();
      std::vector<double> got;
      const std::vector<double>& want = ref_w;
      for (const auto& v : {host(g::value(cpu, fc1.w)), host(g::value(cpu, fc1.b)), host(g::value(cpu, fc2.w)), host(g::value(cpu, fc2.b))})
        got.insert(got.end(), v.begin(), v.end());
      BOOST_TEST(largest_difference(got, want) <= 1e-5);
      BOOST_TEST(host(g::value(gpu, fc2.w)) == host(g::value(cpu, fc2.w)));  // the device's own copy, gathered bit for bit
    }
  }
}
