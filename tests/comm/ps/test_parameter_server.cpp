#define BOOST_TEST_MODULE dist_parameter_server
// The ZeroMQ parameter server (backends/comm/ps): servers on threads listening on loopback
// tcp, workers on threads, each with its own parameter_server communicator, as separate
// processes would have. Checked against independent references: the partition covers
// every element once and balances bytes; the wire decoder refuses malformed headers;
// pushes and pulls move exact values over 1, 2 and 3 servers with variables that are
// split (sizes 1, odd, large; chunks smaller than a shard); BSP applies the mean gradient
// once per step and with one worker trains bit for bit as a single process (SGD with
// momentum, Adam); N workers on 1/N of each batch match one process on the whole batch;
// SSP never lets a worker read parameters missing an update older than S steps (counted
// in the values themselves); async converges; the collectives through server 0; errors
// name the server, the variable and the operation; junk sent to a server while it trains
// is counted and dropped.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/comm/ps.hpp>
#include <gradus/parallel/data_parallel.hpp>
#include <gradus/gradus.hpp>

#include "../../support/free_port.hpp"
#include "../../support/ps_test_cluster.hpp"
#include "../../support/silent_listener.hpp"
#include "../../support/tiny_mlp.hpp"

namespace g = gradus;
namespace wire = gradus::ps::wire;
using namespace std::chrono_literals;
using ps_test::on_workers;
using ps_test::server_pool;
using ps_test::vanishing_worker;

namespace {

std::vector<double> ramp(std::size_t n, double scale) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * (static_cast<double>(i % 97) - 48.0);
  return v;
}

}  // namespace

// ---- the partition --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_partition_covers_every_element_once_and_balances_bytes) {
  const std::vector<g::ps::variable_info> vars{
      {"empty", 0, 4}, {"one", 1, 4}, {"odd", 7, 8}, {"large", 1000003, 4}, {"small", 10, 4}, {"mid", 4096, 8}};
  std::size_t total = 0, largest_small = 0;
  for (const auto& v : vars) total += v.elements * v.element_bytes;
  for (const int servers : {1, 2, 3, 5}) {
    const auto shards = g::ps::balanced_by_bytes(vars, servers);
    BOOST_CHECK_NO_THROW(g::ps::check_partition(vars, servers, shards));
    std::vector<std::size_t> load(static_cast<std::size_t>(servers), 0);
    for (const auto& s : shards) load[static_cast<std::size_t>(s.server)] += s.count * vars[s.var].element_bytes;
    // the large variable is cut so that no server holds much more than its share
    const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    largest_small = 4096 * 8;
    BOOST_TEST(*hi - *lo <= total / static_cast<std::size_t>(servers) / 2 + largest_small, "servers " << servers);
    if (servers > 1) {
      int pieces = 0;
      for (const auto& s : shards) pieces += s.var == 3;
      BOOST_TEST(pieces >= servers - 1, "the large variable spans the servers");
    }
  }
  // a partitioner that loses elements is refused, naming the variable
  auto bad = g::ps::balanced_by_bytes(vars, 2);
  bad.pop_back();
  try {
    g::ps::check_partition(vars, 2, bad);
    BOOST_FAIL("a partition that loses a shard was accepted");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("parameter server partition: '") != std::string::npos, e.what());
  }
}

// ---- the wire format ------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_decoder_refuses_malformed_messages_with_the_reason) {
  auto h = wire::make(wire::type::push, 3, 0, 4, g::element_type::f32);
  h.payload_bytes = 16;
  std::vector<std::byte> head(64), body(16), short_body(12);
  std::memcpy(head.data(), &h, 64);
  const auto dec = [](std::vector<std::span<const std::byte>> f) { return wire::decode(f).error; };
  BOOST_TEST(dec({head, body}).empty());
  BOOST_TEST(dec({head, short_body}).find("announces 16 payload bytes but carries 12") != std::string::npos);
  BOOST_TEST(dec({std::span<const std::byte>(head).first(63), body}).find("header of 63 bytes") != std::string::npos);
  auto bad = head;
  bad[0] = std::byte{0};
  BOOST_TEST(dec({bad, body}).find("bad magic") != std::string::npos);
  bad = head;
  bad[4] = std::byte{9};  // version 9
  BOOST_TEST(dec({bad, body}).find("protocol version 9") != std::string::npos);
  bad = head;
  bad[6] = std::byte{200};  // type
  BOOST_TEST(dec({bad, body}).find("unknown message type 200") != std::string::npos);
  auto h2 = h;
  h2.count = 5;  // 5 floats in 16 bytes
  std::memcpy(bad.data(), &h2, 64);
  BOOST_TEST(dec({bad, body}).find("push of 5 float32 elements carries 16 bytes") != std::string::npos);
  wire::limits small;
  small.max_payload = 8;
  BOOST_TEST(wire::decode(std::vector<std::span<const std::byte>>{head, body}, small).error.find("exceeds the limit of 8") != std::string::npos);
  BOOST_TEST(dec({head, body, body}).find("3 frames") != std::string::npos);
}

// ---- push and pull --------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(push_and_pull_move_exact_values_over_1_2_and_3_servers) {
  for (const int servers : {1, 2, 3}) {
    server_pool pool(servers);
    // one worker, async, sgd lr 0.5: w <- w - 0.5 g, exactly representable
    g::parameter_server<g::ps_async> ps(pool.options(0, 1));
    ps.set_optimizer("sgd", {});
    ps.set_learning_rate(0.5);
    const std::vector<std::size_t> sizes{1, 7, 300001, 2};
    std::vector<std::vector<double>> w, grad;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      w.push_back(ramp(sizes[i], 0.25));
      grad.push_back(ramp(sizes[i], 1.0));
      ps.initialize("v" + std::to_string(i), std::span<const double>(w.back()));
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) ps.push("v" + std::to_string(i), std::span<const double>(grad[i]));
    ps.step_done();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::vector<double> got(sizes[i], -1);
      ps.pull("v" + std::to_string(i), std::span<double>(got));
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < sizes[i]; ++k) wrong += got[k] != w[i][k] - 0.5 * grad[i][k];
      BOOST_TEST(wrong == 0u, "servers " << servers << " variable " << i << " size " << sizes[i]);
    }
    // non-blocking handles: two pulls in flight at once
    std::vector<double> a(sizes[2]), b(sizes[0]);
    const auto ha = ps.pull_async("v2", std::span<double>(a));
    const auto hb = ps.pull_async("v0", std::span<double>(b));
    ps.wait(hb);
    ps.wait(ha);
    BOOST_TEST(a[12345] == w[2][12345] - 0.5 * grad[2][12345]);
    BOOST_TEST(ps.stats().bytes_pushed == (1 + 7 + 300001 + 2) * 8u);
  }
}

// A scheduler reads a job's outcome from every process's exit status: the servers of a job
// whose worker or chief failed must fail too (ps::serve throws job_failure()).
BOOST_AUTO_TEST_CASE(a_failed_job_fails_its_servers_and_a_finished_one_does_not) {
  const auto train = [](const g::ps_options& o, bool fail) {
    g::parameter_server<g::ps_async> ps(o);
    ps.set_optimizer("sgd", {});
    std::vector<double> w(100, 1.0);
    ps.initialize("w", std::span<const double>(w));
    ps.push("w", std::span<const double>(w));
    ps.step_done();
    if (fail) throw std::runtime_error("this worker's own error");  // its goodbye says so
  };
  const auto verdict = [](server_pool& pool) {
    pool.join();
    std::vector<std::string> v;
    for (auto& s : pool.servers) v.push_back(s->job_failure().value_or("ok"));
    return v;
  };
  {
    server_pool pool(2);
    on_workers(2, [&](int r) { train(pool.options(r, 2, "async"), false); });
    for (const auto& v : verdict(pool)) BOOST_TEST(v == "ok");
  }
  {
    server_pool pool(2);
    BOOST_CHECK_THROW(on_workers(2, [&](int r) { train(pool.options(r, 2, "async"), r == 1); }), std::runtime_error);
    for (const auto& v : verdict(pool)) BOOST_TEST(v.find("worker 1 left after a failure") != std::string::npos, v);
  }
  {
    server_pool pool(1);
    BOOST_CHECK_THROW(train(pool.options(0, 1, "async"), true), std::runtime_error);
    const auto v = verdict(pool);
    BOOST_TEST(v[0].find("parameter server 0: the chief (worker 0) ended the job after a failure") != std::string::npos, v[0]);
  }
  {  // nobody ever came: the idle bound ends it, and that is no success either
    zmq::context_t ctx{1};
    g::ps::server_options o;
    o.address = "127.0.0.1:0";
    o.idle_exit = 300ms;
    o.log = [](const std::string&) {};
    g::ps::server<g::cpu_simd> s(ctx, o);
    s.run();
    const auto v = s.job_failure().value_or("ok");
    BOOST_TEST(v.find("the job ended without the chief's shutdown (nothing heard for 300 ms)") != std::string::npos, v);
  }
}

BOOST_AUTO_TEST_CASE(a_small_chunk_size_splits_messages_inside_shards) {
  server_pool pool(2);
  auto o = pool.options(0, 1, "bsp");
  o.chunk_bytes = 1000;  // 125 doubles: shards of ~5000 elements go in ~40 messages
  g::parameter_server<> ps(o);
  ps.set_optimizer("sgd", {});
  ps.set_learning_rate(1.0);
  const auto w = ramp(10001, 0.5), grad = ramp(10001, 0.125);
  ps.initialize("w", std::span<const double>(w));
  ps.push("w", std::span<const double>(grad));
  ps.step_done();
  std::vector<double> got(w.size());
  ps.pull("w", std::span<double>(got));
  std::size_t wrong = 0;
  for (std::size_t k = 0; k < w.size(); ++k) wrong += got[k] != w[k] - grad[k];
  BOOST_TEST(wrong == 0u);
  BOOST_TEST((ps.consistency() == g::ps::mode::bsp));
}

// The chief's first values with its optimizer state (a resumed job) go in init_values
// chunks, and a snapshot comes back in chunks: every element of the values and of both
// Adam moments where it belongs, with the step.
BOOST_AUTO_TEST_CASE(init_and_snapshot_go_in_chunks_with_the_optimizer_state) {
  server_pool pool(2);
  auto o = pool.options(0, 1, "bsp");
  o.chunk_bytes = 800;  // 100 doubles: ~50 chunks per shard, the last one short
  g::parameter_server<> ps(o);
  ps.set_optimizer("adam", {});
  ps.set_learning_rate(0.0);  // the update leaves the values; the moments still move
  const auto w = ramp(10001, 0.5), m = ramp(10001, 0.25), v = ramp(10001, 0.0);
  std::vector<double> v_pos(v.size());
  for (std::size_t k = 0; k < v.size(); ++k) v_pos[k] = 1.0 + static_cast<double>(k % 13);
  ps.initialize("w", std::span<const double>(w), {std::span<const double>(m), std::span<const double>(v_pos)}, 7);
  std::vector<double> got_w(w.size()), got_m(w.size()), got_v(w.size());
  const auto step = ps.snapshot("w", std::span<double>(got_w), std::vector<std::span<double>>{std::span<double>(got_m), std::span<double>(got_v)});
  BOOST_TEST(step == 7);
  BOOST_TEST(got_w == w);
  BOOST_TEST(got_m == m);
  BOOST_TEST(got_v == v_pos);
}

// ---- consistency modes ----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(bsp_applies_the_mean_of_every_workers_gradient_once_per_step) {
  constexpr int world = 3;
  server_pool pool(2);
  const auto w0 = ramp(1001, 0.1);
  std::vector<std::vector<double>> seen(world);
  on_workers(world, [&](int r) {
    g::parameter_server<g::ps_bsp> ps(pool.options(r, world));
    ps.set_optimizer("sgd", {{"momentum", "0"}});
    ps.set_learning_rate(0.25);
    std::vector<double> mine(w0.size(), 123.0);  // only the chief's first value counts
    ps.initialize("w", std::span<const double>(r == 0 ? w0 : mine));
    for (int step = 0; step < 3; ++step) {
      std::vector<double> grad(w0.size(), static_cast<double>(r + 1) * (step + 1));
      ps.push("w", std::span<const double>(grad));
      ps.step_done();
      ps.pull("w", std::span<double>(mine));
    }
    seen[static_cast<std::size_t>(r)] = mine;
  });
  // mean gradient of step s: (1+2+3)/3 (s+1) = 2(s+1); three steps: 2+4+6 = 12; lr 0.25 -> 3
  for (int r = 0; r < world; ++r)
    for (std::size_t k = 0; k < w0.size(); k += 97) BOOST_TEST(std::abs(seen[static_cast<std::size_t>(r)][k] - (w0[k] - 3.0)) < 1e-12);
}

// Every worker adds exactly 1 to its own element of a counter per step (sgd, lr = N,
// gradient -1, applied as 1/N of a step per push). A pull at clock c therefore shows how
// many steps of each worker the values include: SSP promises all but the last S.
void ssp_bound(int world, int staleness) {
  server_pool pool(2);
  std::vector<std::uint64_t> violations(static_cast<std::size_t>(world), 0), reads(static_cast<std::size_t>(world), 0);
  std::vector<std::uint64_t> max_lag(static_cast<std::size_t>(world), 0), reported(static_cast<std::size_t>(world), 0);
  constexpr int steps = 40;
  on_workers(world, [&](int r) {
    g::parameter_server<> ps(pool.options(r, world, "ssp:" + std::to_string(staleness)));
    ps.set_optimizer("sgd", {});
    ps.set_learning_rate(static_cast<double>(world));
    std::vector<double> counts(static_cast<std::size_t>(world), 0.0), grad(static_cast<std::size_t>(world), 0.0);
    grad[static_cast<std::size_t>(r)] = -1.0;
    ps.initialize("counts", std::span<const double>(counts));
    std::mt19937 rng(static_cast<unsigned>(r) + 1);
    for (int c = 0; c < steps; ++c) {
      ps.pull("counts", std::span<double>(counts));
      ++reads[static_cast<std::size_t>(r)];
      for (int w = 0; w < world; ++w) {
        const auto have = static_cast<long>(std::lround(counts[static_cast<std::size_t>(w)]));
        const long lag = c - have;
        if (lag > staleness) ++violations[static_cast<std::size_t>(r)];
        if (lag > 0) max_lag[static_cast<std::size_t>(r)] = std::max<std::uint64_t>(max_lag[static_cast<std::size_t>(r)], static_cast<std::uint64_t>(lag));
      }
      // rank 0 is a straggler; the others jitter
      std::this_thread::sleep_for(std::chrono::microseconds(r == 0 ? 3000 : rng() % 1500));
      ps.push("counts", std::span<const double>(grad));
      ps.step_done();
    }
    reported[static_cast<std::size_t>(r)] = ps.stats().max_staleness;
  });
  for (int r = 0; r < world; ++r) {
    BOOST_TEST(violations[static_cast<std::size_t>(r)] == 0u, "worker " << r << " read parameters staler than " << staleness);
    BOOST_TEST(reads[static_cast<std::size_t>(r)] == static_cast<std::uint64_t>(steps));
    BOOST_TEST(reported[static_cast<std::size_t>(r)] <= static_cast<std::uint64_t>(staleness));
  }
  // the fast workers did run ahead of the straggler (the bound is used, not just kept)
  if (staleness > 0) BOOST_TEST(*std::max_element(max_lag.begin(), max_lag.end()) >= 1u);
}

BOOST_AUTO_TEST_CASE(ssp_never_reads_parameters_staler_than_its_bound) { ssp_bound(3, 3); }
BOOST_AUTO_TEST_CASE(ssp_with_bound_zero_reads_as_bsp) { ssp_bound(3, 0); }

// ---- through the data-parallel step: the same model source as the ring ----------------

namespace {
using gradus_test::batch, gradus_test::n_in, gradus_test::x, gradus_test::y, gradus_test::mlp, gradus_test::dataset;
dataset make_data(int steps) { return gradus_test::make_data(steps, /*learnable=*/true); }
using gradus_test::single_process;
template <class Mode, class Opt>
std::vector<std::vector<double>> with_servers(int world, int servers, const dataset& d, int steps, const Opt& opt,
                                              std::vector<double>* losses = nullptr) {
  server_pool pool(servers);
  std::vector<std::vector<double>> out(static_cast<std::size_t>(world));
  on_workers(world, [&](int r) {
    auto o = pool.options(r, world);
    if constexpr (std::is_same_v<Mode, g::ps_async>) o.consistency = g::ps::mode::async;
    g::parameter_server<Mode> comm(o);
    mlp m;
    g::session<g::cpu_simd> s;
    m.init(s, r == 0 ? 11 : 500 + static_cast<std::uint64_t>(r));  // the servers keep the chief's
    auto step = g::parallel::minimize(comm, s, m.loss(), opt);
    const g::index_t part = batch / world, lo = r * part;
    for (int k = 0; k < steps; ++k) {
      const double l = step.run(x = g::view(d.xs.data() + (k * batch + lo) * n_in, {part, n_in}),
                                y = g::view(d.ys.data() + k * batch + lo, {part}));
      if (losses && r == 0) losses->push_back(l);
    }
    if (s.global_step() != steps) throw g::error("global step " + std::to_string(s.global_step()));
    out[static_cast<std::size_t>(r)] = m.weights(s);
  });
  return out;
}
}  // namespace

BOOST_AUTO_TEST_CASE(bsp_with_one_worker_trains_bit_for_bit_as_one_process) {
  const auto d = make_data(8);
  {
    const g::sgd opt{.lr = 0.1, .momentum = 0.9, .nesterov = true, .weight_decay = 1e-3};
    const auto ref = single_process(d, 8, opt);
    const auto got = with_servers<g::ps_bsp>(1, 2, d, 8, opt)[0];
    BOOST_TEST(got == ref, "sgd with nesterov momentum and weight decay");
  }
  {
    const g::adam opt{.lr = g::lr_schedule::cosine(0.01, 8)};
    const auto ref = single_process(d, 8, opt);
    const auto got = with_servers<g::ps_bsp>(1, 3, d, 8, opt)[0];
    BOOST_TEST(got == ref, "adam with a cosine schedule");
  }
}

BOOST_AUTO_TEST_CASE(bsp_with_n_workers_matches_one_process_on_the_whole_batch) {
  const auto d = make_data(6);
  const g::sgd opt{.lr = 0.1, .momentum = 0.9};
  const auto ref = single_process(d, 6, opt);
  for (const int world : {2, 3}) {
    const auto out = with_servers<g::ps_bsp>(world, 2, d, 6, opt);
    for (int r = 0; r < world; ++r) {
      double worst = 0;
      for (std::size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, std::abs(out[static_cast<std::size_t>(r)][k] - ref[k]));
      BOOST_TEST(worst < 1e-12, "world " << world << " rank " << r << ": " << worst);
    }
  }
}

BOOST_AUTO_TEST_CASE(async_training_converges) {
  const auto d = make_data(240);
  std::vector<double> losses;
  (void)with_servers<g::ps_async>(2, 2, d, 240, g::sgd{.lr = 0.3, .momentum = 0.5}, &losses);
  double first = 0, last = 0;
  for (int k = 0; k < 20; ++k) {
    first += losses[static_cast<std::size_t>(k)] / 20;
    last += losses[losses.size() - 1 - static_cast<std::size_t>(k)] / 20;
  }
  BOOST_TEST(last < 0.6 * first, "first 20 steps " << first << ", last 20 " << last);
}

// ---- collectives through server 0 -----------------------------------------------------

BOOST_AUTO_TEST_CASE(collectives_run_through_server_0) {
  constexpr int world = 3;
  server_pool pool(2);
  on_workers(world, [&](int r) {
    g::parameter_server<g::ps_bsp> ps(pool.options(r, world));
    std::vector<double> v{1.0 * r, 2.0, -1.0 * r};
    ps.allreduce_sum(std::span<double>(v));
    if (v != std::vector<double>{3, 6, -3}) throw g::error("allreduce_sum");
    std::vector<float> f{static_cast<float>(r)};
    ps.allreduce_average(std::span<float>(f));
    if (f[0] != 1.0f) throw g::error("allreduce_average");
    std::vector<std::byte> b(5, std::byte(r));
    ps.broadcast(std::span<std::byte>(b), 2);
    if (b[4] != std::byte{2}) throw g::error("broadcast");
    ps.barrier();
    // a mismatch names both calls
    std::vector<double> z(r == 1 ? 4 : 3, 0.0);
    try {
      ps.allreduce_sum(std::span<double>(z));
      throw g::error("a mismatched collective passed");
    } catch (const g::comm_error& e) {
      const std::string w = e.what();
      if (w.find("every worker must call the same collectives") == std::string::npos || w.find("allreduce_sum of 4 float64") == std::string::npos)
        throw g::error("unexpected message: " + w);
    }
  });
}

// Collectives larger than a chunk go as pieces (64-byte chunks: 100 doubles in 13), with the
// exact results; a request over the servers' message limit is refused before it is sent.
BOOST_AUTO_TEST_CASE(collectives_larger_than_a_chunk_go_in_pieces_and_a_request_over_the_limit_is_refused) {
  constexpr int world = 2;
  server_pool pool(1);
  std::string refusal;
  on_workers(world, [&](int r) {
    auto o = pool.options(r, world);
    o.chunk_bytes = 64;
    g::parameter_server<g::ps_bsp> ps(o);
    std::vector<double> v(100), want(100);
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<double>(i) * (r + 1);
      want[i] = static_cast<double>(i) * 3;
    }
    ps.allreduce_sum(std::span<double>(v));
    if (v != want) throw g::error("a chunked allreduce_sum");
    std::vector<std::byte> b(100, std::byte(r + 7));
    ps.broadcast(std::span<std::byte>(b), 1);
    for (const auto x : b)
      if (x != std::byte{8}) throw g::error("a chunked broadcast");
  });
  server_pool pool2(1);  // the first job's server stopped when its workers left
  on_workers(1, [&](int) {
    auto o = pool2.options(0, 1);
    o.chunk_bytes = 4096;
    o.max_payload = 1024;  // what the servers would accept
    g::parameter_server<g::ps_bsp> ps(o);
    std::vector<double> w(512, 1.0);
    ps.initialize("w", std::span<const double>(w));
    try {
      ps.push("w", std::span<const double>(w));
    } catch (const g::error& e) {
      refusal = e.what();
    }
  });
  BOOST_TEST((refusal.find("'w'") != std::string::npos && refusal.find("over the servers' limit of 1024 per message") != std::string::npos &&
              refusal.find("chunk_bytes") != std::string::npos),
             refusal);
}

// ---- errors ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(errors_name_the_server_the_variable_and_the_operation) {
  {
    server_pool pool(1);
    g::parameter_server<g::ps_bsp> ps(pool.options(0, 1));
    std::vector<double> w(5, 1.0);
    ps.initialize("layer/w", std::span<const double>(w));
    std::vector<double> wrong(4);
    BOOST_CHECK_EXCEPTION(ps.push("layer/w", std::span<const double>(wrong)), g::error, [](const g::error& e) {
      return std::string(e.what()).find("push of 'layer/w' with 4 float64 elements; it has 5 float64") != std::string::npos;
    });
    BOOST_CHECK_EXCEPTION(ps.pull("nope", std::span<double>(w)), g::error, [](const g::error& e) {
      return std::string(e.what()).find("pull of 'nope', which was never declared") != std::string::npos;
    });
  }
  {
    // nobody listens: the wait ends at its deadline naming the server and its address
    const std::string addr = "127.0.0.1:" + std::to_string(gradus_test::free_port());
    g::ps_options o;
    o.servers = {addr};
    o.timeout = 700ms;
    const auto t0 = std::chrono::steady_clock::now();
    BOOST_CHECK_EXCEPTION(g::parameter_server<g::ps_bsp>{o}, g::comm_error, [&](const g::comm_error& e) {
      const std::string m = e.what();
      BOOST_TEST_MESSAGE(m);
      return m.find("no answer from server 0 (" + addr) != std::string::npos && m.find("hello") != std::string::npos;
    });
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < 5s));
  }
  {
    // options no wait could live with are refused before anything connects
    const auto refused = [](auto change, const std::string& want) {
      g::ps_options o;
      o.servers = {"127.0.0.1:1"};
      o.consistency = g::ps::mode::ssp;
      change(o);
      try {
        g::parameter_server<g::ps_dynamic> ps(o);
        BOOST_ERROR("no error for: " << want);
      } catch (const g::error& e) {
        BOOST_TEST(std::string(e.what()) == want);
      }
    };
    refused([](g::ps_options& o) { o.timeout = 0ms; },
            "gradus: parameter_server: timeout must be positive, got 0 ms (ps_options::timeout; the examples' --comm-timeout)");
    refused([](g::ps_options& o) { o.timeout = -5ms; },
            "gradus: parameter_server: timeout must be positive, got -5 ms (ps_options::timeout; the examples' --comm-timeout)");
    refused([](g::ps_options& o) { o.reconnect_timeout = -1ms; },
            "gradus: parameter_server: reconnect_timeout and rejoin_timeout must be >= 0, got -1 and 900000 ms");
    refused([](g::ps_options& o) { o.staleness = -1; }, "gradus: parameter_server: staleness -1 is outside [0, 1000000]");
  }
}

BOOST_AUTO_TEST_CASE(junk_sent_to_a_server_is_counted_and_dropped_while_training_goes_on) {
  const auto d = make_data(6);
  const g::sgd opt{.lr = 0.1, .momentum = 0.9};
  const auto ref = single_process(d, 6, opt);
  server_pool pool(1);
  std::atomic<bool> stop{false};
  std::thread vandal([&] {
    zmq::socket_t s(pool.ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.connect(pool.addresses[0]);
    std::mt19937 rng(5);
    for (int i = 0; i < 400 && !stop; ++i) {
      std::vector<std::uint8_t> junk(rng() % 200);
      for (auto& b : junk) b = static_cast<std::uint8_t>(rng());
      if (i % 3 == 0 && junk.size() >= 64) {  // a valid-looking header with a lying size
        auto h = wire::make(wire::type::push, 0, 0, 1000, g::element_type::f64);
        h.payload_bytes = 8;
        std::memcpy(junk.data(), &h, 64);
        junk.resize(64);
      }
      s.send(zmq::buffer(junk), zmq::send_flags::none);
      std::this_thread::sleep_for(1ms);
    }
  });
  std::vector<double> got;
  on_workers(1, [&](int) {
    g::parameter_server<g::ps_bsp> comm(pool.options(0, 1));
    mlp m;
    g::session<g::cpu_simd> s;
    m.init(s, 11);
    auto step = g::parallel::minimize(comm, s, m.loss(), opt);
    for (int k = 0; k < 6; ++k) {
      step.run(x = g::view(d.xs.data() + k * batch * n_in, {batch, n_in}), y = g::view(d.ys.data() + k * batch, {batch}));
      std::this_thread::sleep_for(20ms);
    }
    got = m.weights(s);
  });
  stop = true;
  vandal.join();
  BOOST_TEST(got == ref);
  BOOST_TEST(pool.servers[0]->stats().malformed + pool.servers[0]->stats().rejected > 10u);
}

// ---- a worker lost mid-training -------------------------------------------------------


BOOST_AUTO_TEST_CASE(a_lost_worker_fails_a_bsp_job_at_once_naming_it) {
  server_pool pool(1);
  {
    g::parameter_server<g::ps_bsp> ps(pool.options(0, 2));
    std::jthread ghost([&] { vanishing_worker(pool.addresses, 1, 2, "bsp", 0); });
    std::vector<double> w(10, 1.0);
    ps.initialize("w", std::span<const double>(w));
    ps.push("w", std::span<const double>(w));
    ps.step_done();
    const auto t0 = std::chrono::steady_clock::now();
    BOOST_CHECK_EXCEPTION(ps.pull("w", std::span<double>(w)), g::error, [](const g::error& e) {
      const std::string m = e.what();
      BOOST_TEST_MESSAGE(m);
      return m.find("worker 1") != std::string::npos && m.find("was lost at clock 0") != std::string::npos &&
             m.find("bsp cannot finish a step without it") != std::string::npos;
    });
    BOOST_TEST((std::chrono::steady_clock::now() - t0 < 5s));  // not the 20 s deadline
  }
  pool.join();  // the server fails the job too, with the same reason (ps::serve throws it)
  const auto v = pool.servers[0]->job_failure().value_or("ok");
  BOOST_TEST((v.find("worker 1") != std::string::npos && v.find("was lost at clock 0") != std::string::npos), v);
}

BOOST_AUTO_TEST_CASE(async_and_ssp_go_on_without_a_lost_worker) {
  for (const std::string mode : {"async", "ssp:1"}) {
    server_pool pool(2);
    constexpr int world = 3;
    std::vector<std::vector<double>> last(2);
    std::jthread ghost([&] { vanishing_worker(pool.addresses, 2, world, mode == "async" ? "async" : "ssp", mode == "async" ? 0 : 1); });
    on_workers(2, [&](int r) {
      g::parameter_server<> ps(pool.options(r, world, mode));
      ps.set_optimizer("sgd", {});
      ps.set_learning_rate(1.0);
      std::vector<double> counts(world, 0.0), grad(world, 0.0);
      grad[static_cast<std::size_t>(r)] = -1.0;
      ps.initialize("counts", std::span<const double>(counts));
      for (int c = 0; c < 30; ++c) {
        ps.pull("counts", std::span<double>(counts));
        ps.push("counts", std::span<const double>(grad));
        ps.step_done();
        std::this_thread::sleep_for(10ms);  // the ghost vanishes meanwhile
      }
      std::vector<double> sum{1.0};
      ps.allreduce_sum(std::span<double>(sum));  // counts only the live workers
      if (sum[0] != 2.0) throw g::error("allreduce_sum over the survivors: " + std::to_string(sum[0]));
      ps.barrier();
      ps.pull("counts", std::span<double>(counts));
      last[static_cast<std::size_t>(r)] = counts;
    });
    // both survivors' 30 pushes arrived (each 1/live of a step: 1/3 while the ghost lived, then 1/2)
    for (int r = 0; r < 2; ++r) BOOST_TEST(last[static_cast<std::size_t>(r)][static_cast<std::size_t>(r)] > 10.0, mode);
    BOOST_TEST(pool.servers[0]->stats().workers_lost == 1u, mode);
    pool.join();  // a worker lost in async and ssp is no failure of the job
    for (auto& sv : pool.servers) BOOST_TEST(sv->job_failure().value_or("ok") == "ok", mode);
  }
}

// ---- checkpoints: the servers' state pulled as one step, and a resumed job ------------

BOOST_AUTO_TEST_CASE(a_job_resumed_from_the_servers_state_trains_as_one_that_never_stopped) {
  const auto d = make_data(8);
  for (const bool adam : {false, true}) {
    // the reference: 8 steps in one process
    const g::sgd sgd_opt{.lr = 0.1, .momentum = 0.9};
    const g::adam adam_opt{.lr = 0.01};
    const auto ref = adam ? single_process(d, 8, adam_opt) : single_process(d, 8, sgd_opt);
    // 4 steps on 2 servers; the servers' state (variables, momentum or Adam's moments, the
    // step) into the session; a new session takes it (as restore_checkpoint would)
    std::vector<std::pair<std::string, std::vector<std::byte>>> saved;
    std::int64_t saved_step = 0;
    const auto run = [&](int first, int steps, bool restore) {
      server_pool pool(2);
      std::vector<double> out;
      on_workers(1, [&](int) {
        g::parameter_server<g::ps_bsp> comm(pool.options(0, 1));
        mlp m;
        g::session<g::cpu_simd> s;
        m.init(s, 11);
        const auto body = [&](auto& step) {
          if (restore) {
            for (const auto& e : s.entries())
              for (const auto& [name, bytes] : saved)
                if (e.name == name) std::memcpy(e.data, bytes.data(), bytes.size());
            s.set_global_step(saved_step);
          }
          for (int k = first; k < first + steps; ++k)
            step.run(x = g::view(d.xs.data() + k * batch * n_in, {batch, n_in}), y = g::view(d.ys.data() + k * batch, {batch}));
          step.pull_state();
          saved.clear();
          for (const auto& e : s.entries()) {
            const auto n = static_cast<std::size_t>(e.shape.numel()) * g::size_of(e.dtype);
            saved.emplace_back(std::string(e.name), std::vector<std::byte>(static_cast<const std::byte*>(e.data),
                                                                           static_cast<const std::byte*>(e.data) + n));
          }
          saved_step = s.global_step();
          out = m.weights(s);
        };
        if (adam) {
          auto step = g::parallel::minimize(comm, s, m.loss(), adam_opt);
          body(step);
        } else {
          auto step = g::parallel::minimize(comm, s, m.loss(), sgd_opt);
          body(step);
        }
      });
      return out;
    };
    (void)run(0, 4, false);
    BOOST_TEST(saved_step == 4);
    bool has_state = false;
    for (const auto& [name, bytes] : saved) has_state = has_state || name.find(adam ? "/adam_v" : "/momentum") != std::string::npos;
    BOOST_TEST(has_state, "the optimizer state is in the session");
    const auto resumed = run(4, 4, true);
    BOOST_TEST(resumed == ref, (adam ? "adam" : "sgd with momentum") << ": 4 steps, the servers' state, 4 more = 8 steps");
  }
}

// ---- sparse rows ----------------------------------------------------------------------

// A table of 301 rows of 5 cut over 3 servers at row boundaries; one push of 4 rows with
// Adam: those rows move as one Adam step from their first values (computed here), every
// other row and its optimizer state stay as they were (lazy); pull_rows moves exactly the
// changed rows, then none.
BOOST_AUTO_TEST_CASE(sparse_rows_move_only_the_named_rows_with_lazy_optimizer_state) {
  constexpr std::size_t rows = 301, L = 5;
  {  // the partitioner cuts tables between rows
    const std::vector<g::ps::variable_info> vars{{"t", rows * L, 8, L}, {"d", 700, 8, 0}};
    const auto shards = g::ps::balanced_by_bytes(vars, 3);
    BOOST_CHECK_NO_THROW(g::ps::check_partition(vars, 3, shards));
    int pieces = 0;
    for (const auto& sh : shards)
      if (sh.var == 0) {
        ++pieces;
        BOOST_TEST(sh.offset % L == 0u);
        BOOST_TEST(sh.count % L == 0u);
      }
    BOOST_TEST(pieces >= 2, "the table spans servers");
    auto cut = shards;
    for (auto& sh : cut)
      if (sh.var == 0 && sh.offset == 0) sh.count -= 1;
    for (auto& sh : cut)
      if (sh.var == 0 && sh.offset != 0 && sh.offset == shards[0].count) sh.offset -= 1, sh.count += 1;
    BOOST_CHECK_THROW(g::ps::check_partition(vars, 3, cut), std::invalid_argument);
  }
  server_pool pool(3);
  on_workers(1, [&](int) {
    auto o = pool.options(0, 1, "async");
    g::parameter_server<> ps(o);
    const double lr = 0.05, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    ps.set_optimizer("adam", {{"beta1", "0.9"}, {"beta2", "0.999"}, {"eps", "1e-08"}});
    ps.set_learning_rate(lr);
    const auto w0 = ramp(rows * L, 0.01);
    ps.initialize("t", std::span<const double>(w0));
    ps.set_rows("t", L);
    std::vector<double> other(700, 1.0);
    ps.initialize("d", std::span<const double>(other));
    const std::vector<std::int64_t> named{0, 150, 7, 300};  // both ends, unsorted, over the servers
    std::vector<double> grad(named.size() * L);
    for (std::size_t k = 0; k < grad.size(); ++k) grad[k] = 0.3 * (static_cast<double>(k % 7) - 3.0) + 0.1;
    std::vector<double> table(w0);
    ps.pull("t", std::span<double>(table));
    ps.wait(ps.push_rows("t", std::span<const std::int64_t>(named), std::span<const double>(grad)));
    const auto before = ps.stats().bytes_pulled;
    ps.pull_rows("t", std::span<double>(table));
    BOOST_TEST(ps.stats().bytes_pulled - before == named.size() * (8 + L * 8), "only the 4 changed rows moved");
    const auto again = ps.stats().bytes_pulled;
    ps.pull_rows("t", std::span<double>(table));
    BOOST_TEST(ps.stats().bytes_pulled == again, "nothing changed: nothing moved");
    std::vector<double> vals(rows * L), m(rows * L), v(rows * L);
    (void)ps.snapshot("t", std::span<double>(vals), std::vector<std::span<double>>{std::span<double>(m), std::span<double>(v)});
    BOOST_TEST(table == vals, "pull_rows left the copy equal to the servers' values");
    for (std::size_t r = 0; r < rows; ++r) {
      const auto it = std::find(named.begin(), named.end(), static_cast<std::int64_t>(r));
      for (std::size_t e = 0; e < L; ++e) {
        const std::size_t i = r * L + e;
        if (it == named.end()) {
          BOOST_REQUIRE_MESSAGE(vals[i] == w0[i] && m[i] == 0 && v[i] == 0, "row " << r << " moved though not named");
        } else {
          const double gi = grad[static_cast<std::size_t>(it - named.begin()) * L + e];
          const double mi = (1 - b1) * gi, vi = (1 - b2) * gi * gi;
          const double want = w0[i] - lr * (mi / (1 - b1)) / (std::sqrt(vi / (1 - b2)) + eps);
          BOOST_REQUIRE_MESSAGE(std::abs(vals[i] - want) < 1e-12 && std::abs(m[i] - mi) < 1e-15 && std::abs(v[i] - vi) < 1e-15,
                                "row " << r << " element " << e << ": " << vals[i] << " vs " << want);
        }
      }
    }
    // errors name the row, the table and what is wrong
    const std::vector<std::int64_t> bad{301};
    try {
      ps.push_rows("t", std::span<const std::int64_t>(bad), std::span<const double>(grad.data(), L));
      BOOST_FAIL("a row past the table was pushed");
    } catch (const g::error& e) {
      BOOST_TEST(std::string(e.what()).find("row 301 of a table of 301") != std::string::npos, e.what());
    }
    try {
      ps.pull_rows("d", std::span<double>(other));
      BOOST_FAIL("pull_rows of a dense variable");
    } catch (const g::error& e) {
      BOOST_TEST(std::string(e.what()).find("'d', which is not a table of rows") != std::string::npos, e.what());
    }
  });
}

namespace {
constexpr g::index_t vocab = 40, dim = 6, classes = 3, ebatch = 16;
g::placeholder<"ids", std::int32_t, g::dyn> ids;
g::placeholder<"labels", std::int32_t, g::dyn> labels;
struct embed_model {
  g::nn::embedding<"emb", vocab, dim, double, true> emb;  // sparse-row gradient
  g::nn::dense<"out", dim, classes, double> out;
  auto loss() const { return g::nn::softmax_cross_entropy_loss(out(emb(ids)), labels); }
  void init(g::session<g::cpu_simd>& s, std::uint64_t seed) const {
    emb.initialize(s, seed);
    out.initialize(s, seed + 1);
  }
};
}  // namespace

// An embedding model whose table gradient is sparse rows: BSP with 2 workers on 2 servers
// (each pushing its rows and indices only, pulling the changed rows) equals one process on
// the whole batch with the same lazy momentum (up to summation order), and moves fewer
// bytes than the table each step.
BOOST_AUTO_TEST_CASE(bsp_with_a_sparse_embedding_matches_one_process_and_moves_rows) {
  constexpr int steps = 6, world = 2;
  std::mt19937 rng(5);
  std::vector<std::int32_t> all_ids(steps * ebatch), all_labels(steps * ebatch);
  for (std::size_t k = 0; k < all_ids.size(); ++k) {
    all_ids[k] = static_cast<std::int32_t>(rng() % 12);  // 12 of 40 rows ever used
    all_labels[k] = all_ids[k] % classes;
  }
  const g::sgd opt{.lr = 0.2, .momentum = 0.9};
  const auto table_of = [](g::session<g::cpu_simd>& s, const embed_model& m) {
    auto [t, w] = s.run(m.emb.table, m.out.w);
    std::vector<double> r(t.begin(), t.end());
    r.insert(r.end(), w.begin(), w.end());
    return r;
  };
  std::vector<double> ref;
  {
    embed_model m;
    g::session<g::cpu_simd> s;
    m.init(s, 3);
    auto step = g::minimize(s, m.loss(), opt);
    for (int k = 0; k < steps; ++k)
      step.run(ids = g::view(all_ids.data() + k * ebatch, {ebatch}), labels = g::view(all_labels.data() + k * ebatch, {ebatch}));
    ref = table_of(s, m);
  }
  server_pool pool(2);
  std::vector<std::vector<double>> got(world);
  std::vector<std::uint64_t> pulled(world);
  on_workers(world, [&](int r) {
    g::parameter_server<g::ps_bsp> comm(pool.options(r, world));
    embed_model m;
    g::session<g::cpu_simd> s;
    m.init(s, r == 0 ? 3 : 77);
    auto step = g::parallel::minimize(comm, s, m.loss(), opt);
    const g::index_t part = ebatch / world, lo = r * part;
    for (int k = 0; k < steps; ++k)
      step.run(ids = g::view(all_ids.data() + k * ebatch + lo, {part}), labels = g::view(all_labels.data() + k * ebatch + lo, {part}));
    got[static_cast<std::size_t>(r)] = table_of(s, m);
    pulled[static_cast<std::size_t>(r)] = comm.stats().bytes_pulled;
  });
  for (int r = 0; r < world; ++r) {
    double worst = 0;
    for (std::size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, std::abs(got[static_cast<std::size_t>(r)][k] - ref[k]));
    BOOST_TEST(worst < 1e-12, "rank " << r << ": " << worst);
    // dense pulls would move (steps + 1) whole tables; rows: one table, then the rows changed
    const std::uint64_t table_bytes = vocab * dim * 8, dense_w = dim * classes * 8 + classes * 8;
    BOOST_TEST(pulled[static_cast<std::size_t>(r)] < (steps + 1) * dense_w + table_bytes + steps * 12 * (8 + dim * 8) + 1,
               "rank " << r << " pulled " << pulled[static_cast<std::size_t>(r)] << " bytes");
    BOOST_TEST(pulled[static_cast<std::size_t>(r)] < (steps + 1) * (table_bytes + dense_w));
  }
}

// ---- server recovery -------------------------------------------------------------------

// Server 1 of 2 is stopped after step 4 and a new one started on its address, reloading its
// shards from a checkpoint (the servers' state after step 4: values and momentum); the two
// BSP workers rejoin it and train 4 more steps. Every element is checked against an
// independent simulation of SGD with momentum: server 0's shard took all 8 steps; server
// 1's took steps 0-3, the checkpoint, then those after the workers rejoined (a step in
// flight when it died, if any, is dropped: counted by the server).
BOOST_AUTO_TEST_CASE(a_restarted_server_reloads_its_shards_and_the_workers_rejoin_it) {
  constexpr int world = 2;
  constexpr double lr = 0.1, mu = 0.5;
  zmq::context_t ctx{1};
  const auto quiet = [](const std::string&) {};
  const auto make = [&](const std::string& address, int index, g::ps::restore_source restore) {
    g::ps::server_options o;
    o.address = address;
    o.index = index;
    o.idle_exit = 60s;
    o.restore = std::move(restore);
    if (!std::getenv("PS_TEST_LOG")) o.log = quiet;
    for (int attempt = 0;; ++attempt) {  // the old listener's port is released by ZeroMQ's reaper
      try {
        return std::make_unique<g::ps::server<g::cpu_simd>>(ctx, o);
      } catch (const g::comm_error&) {
        if (attempt == 100) throw;
        std::this_thread::sleep_for(20ms);
      }
    }
  };
  std::vector<std::unique_ptr<g::ps::server<g::cpu_simd>>> servers;
  servers.push_back(make("127.0.0.1:0", 0, {}));
  servers.push_back(make("127.0.0.1:0", 1, {}));
  const std::vector<std::string> addresses{servers[0]->endpoint(), servers[1]->endpoint()};
  std::thread t0([&] { servers[0]->run(); }), t1([&] { servers[1]->run(); });
  std::unique_ptr<g::ps::server<g::cpu_simd>> restarted;
  std::thread t2;

  const auto w0 = ramp(1001, 0.01);
  std::vector<double> ck_w(w0.size()), ck_m(w0.size());
  std::int64_t ck_step = -1;
  std::vector<std::vector<double>> seen(world);
  std::vector<std::uint64_t> rejoins(world, 0);
  std::string failure;
  try {
  on_workers(world, [&](int r) {
    g::ps_options o;
    o.servers = addresses;
    o.rank = r;
    o.world_size = world;
    o.timeout = 20s;
    o.reconnect_timeout = 20s;
    g::parse_consistency("bsp", o);
    g::parameter_server<g::ps_bsp> ps(o);
    ps.set_optimizer("sgd", {{"momentum", "0.5"}});
    ps.set_learning_rate(lr);
    std::vector<double> mine(w0.size(), 0.0), grad(w0.size(), static_cast<double>(2 * r + 1));  // mean gradient 2
    ps.initialize("w", std::span<const double>(w0));
    const auto step = [&] {
      ps.push("w", std::span<const double>(grad));
      ps.step_done();
      ps.pull("w", std::span<double>(mine));
    };
    for (int k = 0; k < 4; ++k) step();
    ps.barrier();
    if (r == 0) ck_step = ps.snapshot("w", std::span<double>(ck_w), std::vector<std::span<double>>{std::span<double>(ck_m)});
    ps.barrier();
    if (r == 0) {  // "kill" server 1; it comes back 300 ms later from the checkpoint
      servers[1]->stop();
      t1.join();
      servers[1].reset();
      t2 = std::thread([&] {
        std::this_thread::sleep_for(300ms);
        g::ps::restore_source restore = [&](const std::string& name, const std::vector<std::string>& slots) -> std::optional<g::ps::restored_variable> {
          if (name != "w" || slots != std::vector<std::string>{"momentum"}) return std::nullopt;
          g::ps::restored_variable v;
          v.dt = g::element_type::f64;
          const auto b = std::as_bytes(std::span<const double>(ck_w)), m = std::as_bytes(std::span<const double>(ck_m));
          v.values.assign(b.begin(), b.end());
          v.slots.emplace_back(m.begin(), m.end());
          v.step = ck_step;
          return v;
        };
        restarted = make(addresses[1], 1, restore);
        restarted->run();
      });
    }
    ps.barrier();
    for (int k = 0; k < 4; ++k) step();
    ps.barrier();
    seen[static_cast<std::size_t>(r)] = mine;
    rejoins[static_cast<std::size_t>(r)] = ps.stats().rejoins;
  });
  } catch (const std::exception& e) {
    failure = e.what();
  }
  for (auto* t : {&t0, &t1, &t2})  // bounded: every server stops after 60 s of silence
    if (t->joinable()) t->join();
  BOOST_REQUIRE_MESSAGE(failure.empty(), failure);
  BOOST_TEST(ck_step == 4);
  BOOST_TEST(restarted->stats().restored.load() == 1u, "the restarted server reloaded its shard of w");
  BOOST_TEST(rejoins[0] == 1u);
  BOOST_TEST(rejoins[1] == 1u);
  // SGD with momentum (PyTorch's form: v = mu v + g; w -= lr v) on a constant mean gradient 2
  const auto run = [&](double w, double v, int steps) {
    for (int k = 0; k < steps; ++k) {
      v = mu * v + 2.0;
      w -= lr * v;
    }
    return std::pair(w, v);
  };
  const int after = restarted->stats().stale_dropped.load() > 0 ? 3 : 4;  // a step in flight at the kill is dropped
  // which elements server 1 holds: the partition the workers used
  const auto shards = g::ps::balanced_by_bytes({{"w", w0.size(), 8}}, 2);
  int checked0 = 0, checked1 = 0;
  for (const auto& sh : shards)
    for (std::size_t i = sh.offset; i < sh.offset + sh.count; ++i) {
      const double want = sh.server == 0 ? run(w0[i], 0, 8).first : run(ck_w[i], ck_m[i], after).first;
      for (int r = 0; r < world; ++r)
        if (std::abs(seen[static_cast<std::size_t>(r)][i] - want) > 1e-12) {
          BOOST_TEST(seen[static_cast<std::size_t>(r)][i] == want, "worker " << r << " element " << i << " (server " << sh.server << ")");
          return;
        }
      (sh.server == 0 ? checked0 : checked1)++;
    }
  BOOST_TEST(checked0 > 0);
  BOOST_TEST(checked1 > 0);
  // the checkpoint itself is the 4-step state
  BOOST_TEST(std::abs(ck_w[5] - run(w0[5], 0, 4).first) < 1e-12);
  BOOST_TEST(std::abs(ck_m[5] - run(w0[5], 0, 4).second) < 1e-12);
}

// Push, step and pull "w" until the communicator fails (at most 100 steps: a lost server
// is noticed within a few); returns the error, or nothing when it never failed.
template <class Ps>
std::string steps_until_it_fails(Ps& ps, std::vector<double>& w) {
  try {
    for (int k = 0; k < 100; ++k) {
      ps.push("w", std::span<const double>(w));
      ps.step_done();
      ps.pull("w", std::span<double>(w));
      std::this_thread::sleep_for(20ms);
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// A server that comes back without a checkpoint refuses its rejoining workers (saying
// why); one that does not come back fails them after reconnect_timeout, naming it.
BOOST_AUTO_TEST_CASE(a_server_back_without_a_checkpoint_or_not_back_fails_its_workers_naming_it) {
  zmq::context_t ctx{1};
  for (const bool comes_back : {true, false}) {
    g::ps::server_options so;
    so.address = "127.0.0.1:0";
    so.idle_exit = 60s;
    if (!std::getenv("PS_TEST_LOG")) so.log = [](const std::string&) {};
    auto srv = std::make_unique<g::ps::server<g::cpu_simd>>(ctx, so);
    const std::string address = srv->endpoint();
    std::thread t([&] { srv->run(); });
    std::atomic<g::ps::server<g::cpu_simd>*> again{nullptr};  // the server that came back, while it runs
    std::thread t2;
    std::string error;
    const auto t_start = std::chrono::steady_clock::now();
    double failed_after = 0;
    {
      g::ps_options o;
      o.servers = {address};
      o.timeout = 20s;
      o.reconnect_timeout = 1500ms;
      g::parameter_server<g::ps_async> ps(o);
      ps.set_shutdown_on_exit(false);
      std::vector<double> w(10, 1.0);
      ps.initialize("w", std::span<const double>(w));
      ps.pull("w", std::span<double>(w));
      srv->stop();
      t.join();
      srv.reset();
      if (comes_back)
        t2 = std::thread([&] {
          so.address = address;
          std::unique_ptr<g::ps::server<g::cpu_simd>> back;
          for (int attempt = 0; attempt < 100 && !back; ++attempt) {
            try {
              back = std::make_unique<g::ps::server<g::cpu_simd>>(ctx, so);
            } catch (const g::comm_error&) {
              std::this_thread::sleep_for(20ms);
            }
          }
          if (!back) return;
          again = back.get();
          back->run();
          again = nullptr;
        });
      error = steps_until_it_fails(ps, w);
      failed_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    }
    if (t2.joinable()) {
      for (int k = 0; k < 200 && !again.load(); ++k) std::this_thread::sleep_for(10ms);
      if (auto* p = again.load()) p->stop();
      t2.join();
    }
    BOOST_TEST_MESSAGE(error);
    BOOST_TEST(error.find("server 0 (" + address + ") is gone") != std::string::npos, error);
    if (comes_back) {
      BOOST_TEST(error.find("no checkpoint to restore its shards from") != std::string::npos, error);
    } else {
      BOOST_TEST(error.find("did not come back within 1500 ms") != std::string::npos, error);
      BOOST_TEST(error.find("its port refuses connections: the ps process died") != std::string::npos, error);
      BOOST_TEST(failed_after < 10.0);
    }
  }
}

// A server that goes silent (stopped, hung) rather than away: its heartbeats stop, the
// worker's connection is dropped, and the new one its kernel accepts is never greeted. The
// worker says so within about a second of reconnecting, naming the server and what to do,
// not after reconnect_timeout (the fault matrix's ps.bsp.stop.server took 10 s before).
BOOST_AUTO_TEST_CASE(a_server_that_accepts_and_never_greets_is_called_stopped_at_once) {
  zmq::context_t ctx{1};
  g::ps::server_options so;
  so.address = "127.0.0.1:0";
  so.idle_exit = 60s;
  if (!std::getenv("PS_TEST_LOG")) so.log = [](const std::string&) {};
  auto srv = std::make_unique<g::ps::server<g::cpu_simd>>(ctx, so);
  const std::string address = srv->endpoint();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  std::thread t([&] { srv->run(); });
  std::string error;
  double failed_after = 0;
  {
    g::ps_options o;
    o.servers = {address};
    o.timeout = 20s;
    o.reconnect_timeout = 20s;  // what the old rule waited
    g::parameter_server<g::ps_async> ps(o);
    ps.set_shutdown_on_exit(false);
    std::vector<double> w(10, 1.0);
    ps.initialize("w", std::span<const double>(w));
    ps.pull("w", std::span<double>(w));
    srv->stop();
    t.join();
    srv.reset();
    std::unique_ptr<gradus_test::silent_listener> silent;
    for (int attempt = 0; attempt < 100 && !silent; ++attempt) {  // the port, once the server let it go
      try {
        silent = std::make_unique<gradus_test::silent_listener>(port);
      } catch (const std::runtime_error&) {
        std::this_thread::sleep_for(20ms);
      }
    }
    BOOST_TEST_REQUIRE(silent != nullptr);
    const auto t_lost = std::chrono::steady_clock::now();
    error = steps_until_it_fails(ps, w);
    failed_after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_lost).count();
  }
  BOOST_TEST_MESSAGE(error);
  BOOST_TEST(error.find("server 0 (" + address + ") is gone") != std::string::npos, error);
  BOOST_TEST(error.find("accepted but not greeted within 1 s") != std::string::npos, error);
  BOOST_TEST(error.find("stopped (SIGSTOP, a debugger) or hung") != std::string::npos, error);
  BOOST_TEST(failed_after < 8.0, "failed after " << failed_after << " s");
}

// Workers that never start (or were given another server list): the servers fail the job
// join_timeout after the first hello, naming them, and answer the collective that waits with
// that reason; once the joined worker has left, they stop (the fault grid's
// ps.kill.chief.start: both servers served on for ever, the worker blamed server 0).
BOOST_AUTO_TEST_CASE(workers_that_never_join_fail_the_job_naming_them_and_the_servers_stop) {
  server_pool pool(2, 1500ms);
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  {
    g::parameter_server<> ps(pool.options(0, 3));
    try {
      ps.barrier();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  pool.join();  // bounded: idle_exit 60 s if they did not stop by themselves
  const double stopped = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST(error.find("workers 1, 2 of 3 did not join within 1500 ms of the first worker's hello") != std::string::npos, error);
  BOOST_TEST(after < 8.0, "failed after " << after << " s");
  BOOST_TEST(stopped < 12.0, "the servers stopped after " << stopped << " s");
  for (auto& s : pool.servers) {
    const auto f = s->job_failure();
    BOOST_TEST_REQUIRE(f.has_value());
    BOOST_TEST(f->find("did not join") != std::string::npos, *f);
  }
}

// ---- hostile input the fuzzer's reading found (tests/fuzz covers the decoder) ----------

BOOST_AUTO_TEST_CASE(out_of_range_numbers_in_hello_and_init_are_refused_with_the_reason) {
  server_pool pool(1);
  zmq::context_t ctx(1);
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::rcvtimeo, 5000);
  s.connect(pool.addresses[0]);
  const auto ask = [&](wire::header h, const std::string& payload) {
    h.payload_bytes = payload.size();
    s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore);
    s.send(zmq::buffer(payload), zmq::send_flags::none);
    zmq::message_t head, body;
    if (!s.recv(head)) throw g::error("no answer");
    if (head.more()) (void)s.recv(body);
    wire::header r;
    std::memcpy(&r, head.data(), sizeof r);
    return std::make_pair(static_cast<wire::type>(r.type), body.to_string());
  };
  auto hello = wire::make(wire::type::hello);
  hello.rank = 0;
  auto [t1, why1] = ask(hello, R"({"rank":1e300,"world_size":1,"mode":"async","staleness":0})");
  BOOST_TEST((t1 == wire::type::fail));
  BOOST_TEST(why1.find("rank is not an integer") != std::string::npos, why1);
  auto [t2, why2] = ask(hello, R"({"rank":0,"world_size":100000000,"mode":"async"})");
  BOOST_TEST(why2.find("world_size = 100000000 is outside") != std::string::npos, why2);
  auto [t3, why3] = ask(hello, R"({"rank":0,"world_size":1,"mode":"async","staleness":0})");
  BOOST_TEST((t3 == wire::type::reply));
  auto config = wire::make(wire::type::config);
  config.rank = 0;
  (void)ask(config, R"({"optimizer":"sgd","settings":{}})");
  auto init = wire::make(wire::type::init, 0, 0, 1, g::element_type::f32);
  init.rank = 0;
  init.scalar = -1;
  const std::string name = std::string("\x01\0\0\0", 4) + "w";
  auto [t4, why4] = ask(init, name);
  BOOST_TEST(why4.find("not a whole number of elements") != std::string::npos, why4);
  // the server still serves: a proper init is answered
  init.scalar = 1;
  auto [t5, why5] = ask(init, name + std::string(4, '\0'));
  BOOST_TEST((t5 == wire::type::reply), why5);
  BOOST_TEST(pool.servers[0]->stats().rejected == 3u);
  auto bye = wire::make(wire::type::bye);
  bye.rank = 0;
  (void)ask(bye, "");
}

// What a worker's config names is rebuilt exactly (train/optimizer_description.hpp); what a
// server cannot apply is refused, naming why.
BOOST_AUTO_TEST_CASE(the_servers_optimizer_is_the_workers_or_a_refusal_naming_why) {
  const auto refusal = [](const std::string& name, const g::optimizer_settings& settings) -> std::string {
    try {
      (void)g::ps::server_optimizer(name, settings);
    } catch (const g::error& e) {
      return e.what();
    }
    return "(applied)";
  };
  BOOST_TEST(refusal("adam", {{"clip_global_norm", "1"}}) ==
             "gradus: parameter server: clip_global_norm needs every gradient of a step at once; the servers each hold a part");
  BOOST_TEST(refusal("rmsprop", {{"clip_global_norm", "0"}}) ==
             "gradus: parameter server: optimizer 'rmsprop' is not one the servers apply (sgd, adam, adamw)");
  BOOST_TEST(refusal("sgd", {{"momentum", "0.9x"}}) == "gradus: parameter server: optimizer setting momentum = '0.9x' is not a number");
  BOOST_TEST(refusal("sgd", {{"clip_global_norm", "none"}}) ==
             "gradus: parameter server: optimizer setting clip_global_norm = 'none' is not a number");
  BOOST_TEST(refusal("adamw", {}) == "(applied)");
  const auto d = g::describe_optimizer(g::adamw{.lr = g::cosine_lr(0.01, 100), .beta1 = 0.8, .weight_decay = 0.02});
  BOOST_TEST((g::describe_optimizer(g::ps::server_optimizer(d.name, d.settings)) == d));
}

// ---- CurveZMQ: encryption, the allow-list, identity from the key (security.hpp) --------

namespace {
struct curve_keys {
  g::ps::key_pair server = g::ps::generate_key_pair(), w0 = g::ps::generate_key_pair(), w1 = g::ps::generate_key_pair(),
                  stranger = g::ps::generate_key_pair();
};
struct curve_pool {
  const curve_keys& k;
  zmq::context_t ctx{1};
  std::vector<std::unique_ptr<g::ps::server<g::cpu_simd>>> servers;
  std::vector<std::thread> threads;
  std::vector<std::string> addresses, logs;
  std::mutex mu;
  curve_pool(int n, const curve_keys& keys) : k(keys) {
    g::ps::allow_list a;
    a.allow(k.w0.public_key, 0);
    a.allow(k.w1.public_key, 1);
    for (int i = 0; i < n; ++i) {
      g::ps::server_options o;
      o.address = "127.0.0.1:0";
      o.index = i;
      o.idle_exit = 3s;  // the refused clients never say goodbye
      o.curve = g::ps::curve_server_config{k.server, a};
      o.log = [this](const std::string& s) {
        std::lock_guard l(mu);
        logs.push_back(s);
      };
      servers.push_back(std::make_unique<g::ps::server<g::cpu_simd>>(ctx, o));
      addresses.push_back(servers.back()->endpoint());
    }
    for (auto& s : servers) threads.emplace_back([p = s.get()] { p->run(); });
  }
  ~curve_pool() {
    for (auto& t : threads) t.join();
  }
  g::ps_options options(int rank, int world, const g::ps::key_pair* kp, const std::string* server_pub = nullptr) const {
    g::ps_options o;
    o.servers = addresses;
    o.rank = rank;
    o.world_size = world;
    o.timeout = 20s;
    if (kp) o.curve = g::ps::curve_client_config{*kp, {server_pub ? *server_pub : k.server.public_key}};
    return o;
  }
};
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_curve_job_with_allowed_keys_trains) {
  const curve_keys k;
  curve_pool pool(2, k);
  std::vector<std::vector<double>> seen(2);
  on_workers(2, [&](int r) {
    g::parameter_server<g::ps_bsp> c(pool.options(r, 2, r == 0 ? &k.w0 : &k.w1));
    c.set_optimizer("sgd", {});
    c.set_learning_rate(1.0);
    std::vector<double> w(1001, 1.0), grad(1001, 0.5 * (r + 1));
    c.initialize("w", std::span<const double>(w));
    c.push("w", std::span<const double>(grad));
    c.step_done();
    c.pull("w", std::span<double>(w));
    seen[static_cast<std::size_t>(r)] = w;
  });
  BOOST_TEST(seen[0][7] == 0.25);  // 1 - mean(0.5, 1.0)
  BOOST_TEST(seen[1][1000] == 0.25);
}

BOOST_AUTO_TEST_CASE(curve_refuses_unknown_keys_plaintext_a_wrong_server_key_and_a_borrowed_rank) {
  const curve_keys k;
  curve_pool pool(2, k);
  const auto t0 = std::chrono::steady_clock::now();
  const auto stranger = error_of([&] { g::parameter_server<g::ps_bsp> c(pool.options(0, 2, &k.stranger)); });
  BOOST_TEST(stranger.find("allow-list") != std::string::npos, stranger);
  const auto plain = error_of([&] { g::parameter_server<g::ps_bsp> c(pool.options(0, 2, nullptr)); });
  BOOST_TEST(plain.find("one uses CURVE") != std::string::npos, plain);
  const auto wrong = error_of([&] { g::parameter_server<g::ps_bsp> c(pool.options(0, 2, &k.w0, &k.stranger.public_key)); });
  BOOST_TEST(wrong.find("GRADUS_PS_CURVE_SERVER_PUB") != std::string::npos, wrong);
  // worker 1's key may act only as worker 1: its hello as worker 0 is refused
  const auto borrowed = error_of([&] { g::parameter_server<g::ps_bsp> c(pool.options(0, 2, &k.w1)); });
  BOOST_TEST(borrowed.find("claims to be worker 0") != std::string::npos, borrowed);
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < 10s));  // each fails at once, not at its 20 s deadline
  std::lock_guard l(pool.mu);
  bool logged = false;
  for (const auto& s : pool.logs) logged = logged || s.find(k.stranger.public_key) != std::string::npos;
  BOOST_TEST(logged, "the server's log names the refused key");
}
