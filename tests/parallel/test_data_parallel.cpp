#define BOOST_TEST_MODULE dist_data_parallel
// The data-parallel step (parallel/data_parallel.hpp) over a communicator of threads that
// share memory (defined here: each rank sums every rank's buffer in rank order, so all
// ranks get the same bits). Checked: N ranks on 1/N of a batch each train the same
// weights as one process on the whole batch (the mean of the per-rank mean gradients is
// the whole batch's mean gradient); rank 0's initial variables reach every rank; replicas
// stay bit-identical; buckets (one, several, no overlap) give the same result; gradients
// arrive during the backward pass, last layer first; a collective's error reaches run()
// with its message and nothing hangs; a parameter-server policy (a fake in-memory BSP
// server with SGD) trains through the same step and matches the single process too.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/comm/ring.hpp>
#include <gradus/parallel/cluster.hpp>
#include <gradus/parallel/data_parallel.hpp>
#include <gradus/parallel/trainer.hpp>
#include <gradus/gradus.hpp>

#include "../support/free_port.hpp"
#include "../support/tiny_mlp.hpp"
#include "thread_comm.hpp"

namespace g = gradus;

namespace {

using gradus_test::board, gradus_test::thread_comm;

using gradus_test::batch, gradus_test::n_in, gradus_test::n_out, gradus_test::x, gradus_test::y, gradus_test::mlp;
using data = gradus_test::dataset;
data make_data(int steps) { return gradus_test::make_data(steps, /*learnable=*/false); }
std::vector<double> weights(g::session<g::cpu_simd>& s, const mlp& m) { return m.weights(s); }

constexpr int steps = 6;
const g::sgd optimizer{.lr = 0.1, .momentum = 0.9};

// One process, the whole batch each step.
std::vector<double> single_process(const data& d) { return gradus_test::single_process(d, steps, optimizer); }

struct rank_result {
  std::vector<double> w;
  std::size_t buckets = 0;
  g::parallel::comm_stats stats;
  std::string error;
};

// Runs body(r, result of rank r) on `world` threads; an exception becomes the rank's error.
template <class Body>
std::vector<rank_result> on_ranks(int world, Body body) {
  std::vector<rank_result> out(static_cast<std::size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      auto& res = out[static_cast<std::size_t>(r)];
      try {
        body(r, res);
      } catch (const std::exception& e) {
        res.error = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return out;
}

// `world` threads, rank r on rows [r*batch/world, (r+1)*batch/world) of each batch. Only
// rank 0 initialises like the single process; the others start elsewhere on purpose.
std::vector<rank_result> data_parallel(const data& d, int world, g::parallel::data_parallel_options opts, int fail_at = -1) {
  board b(world, std::chrono::milliseconds(fail_at >= 0 ? 1000 : 20000));
  return on_ranks(world, [&](int r, rank_result& res) {
    thread_comm comm{&b, r};
    if (r == 1) comm.fail_at = fail_at;
    mlp m;
    g::session<g::cpu_simd> s;
    m.init(s, r == 0 ? 11 : 500 + static_cast<std::uint64_t>(r));
    auto step = g::parallel::minimize(comm, opts, s, m.loss(), optimizer);
    res.buckets = step.bucket_count();
    const g::index_t part = batch / world, lo = r * part;
    for (int k = 0; k < steps; ++k)
      step.run(x = g::view(d.xs.data() + (k * batch + lo) * n_in, {part, n_in}),
               y = g::view(d.ys.data() + k * batch + lo, {part}));
    res.w = weights(s, m);
    res.stats = step.stats();
  });
}

void check_against_single(const std::vector<rank_result>& rs, const std::vector<double>& ref) {
  for (const auto& r : rs) BOOST_REQUIRE_MESSAGE(r.error.empty(), r.error);
  for (std::size_t i = 0; i < ref.size(); ++i) BOOST_TEST(rs[0].w[i] == ref[i], boost::test_tools::tolerance(1e-10));
  for (std::size_t k = 1; k < rs.size(); ++k)
    BOOST_TEST(std::memcmp(rs[k].w.data(), rs[0].w.data(), ref.size() * sizeof(double)) == 0,
               "rank " << k << " differs from rank 0");
}

}  // namespace

BOOST_AUTO_TEST_CASE(ranks_train_like_one_process_on_the_whole_batch) {
  const auto d = make_data(steps);
  const auto ref = single_process(d);
  for (int world : {2, 3, 4}) {
    BOOST_TEST_CONTEXT("world " << world) {
      const auto rs = data_parallel(d, world, {});
      check_against_single(rs, ref);
      BOOST_TEST(rs[0].buckets == 1u);  // 25 MiB holds every gradient
      BOOST_TEST(rs[0].stats.steps == steps);
      BOOST_TEST(rs[0].stats.collectives == steps);
    }
  }
}

BOOST_AUTO_TEST_CASE(buckets_and_overlap_do_not_change_the_result) {
  const auto d = make_data(steps);
  const auto ref = single_process(d);
  // 200 bytes: every gradient its own bucket (the biggest, fc1/w, alone exceeds it)
  const auto many = data_parallel(d, 2, {.bucket_bytes = 200});
  check_against_single(many, ref);
  BOOST_TEST(many[0].buckets == 4u);
  BOOST_TEST(many[0].stats.collectives == 4 * steps);
  const auto serial = data_parallel(d, 2, {.bucket_bytes = 200, .overlap = false});
  check_against_single(serial, ref);
  BOOST_TEST(std::memcmp(serial[0].w.data(), many[0].w.data(), ref.size() * sizeof(double)) == 0);
}

BOOST_AUTO_TEST_CASE(gradients_arrive_during_the_backward_pass_last_layer_first) {
  mlp m;
  g::session<g::cpu_simd> s;
  m.init(s, 1);
  auto step = g::minimize(s, m.loss(), optimizer);
  const auto d = make_data(1);
  std::vector<std::size_t> order;
  std::vector<double> seen_sum;
  step.compute_gradients_hooked(
      [&](std::size_t i, const g::gradient_buffer& gb) {
        order.push_back(i);
        double sum = 0;  // the value must be final when the hook runs: compare below
        for (g::index_t k = 0; k < gb.size; ++k) sum += static_cast<const double*>(gb.data)[k];
        seen_sum.push_back(sum);
      },
      x = g::view(d.xs.data(), {batch, n_in}), y = g::view(d.ys.data(), {batch}));
  BOOST_REQUIRE_EQUAL(order.size(), 4u);  // each of fc1/w, fc1/b, fc2/w, fc2/b once
  std::vector<std::size_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  BOOST_TEST(sorted == (std::vector<std::size_t>{0, 1, 2, 3}), boost::test_tools::per_element());
  // fc2's gradients (variables 2, 3) are final before fc1's (0, 1)
  const auto pos = [&](std::size_t v) { return std::find(order.begin(), order.end(), v) - order.begin(); };
  BOOST_TEST(std::max(pos(2), pos(3)) < std::min(pos(0), pos(1)));
  auto grads = step.gradients();
  for (std::size_t k = 0; k < order.size(); ++k) {
    double sum = 0;
    for (g::index_t j = 0; j < grads[order[k]].size; ++j) sum += static_cast<const double*>(grads[order[k]].data)[j];
    BOOST_TEST(seen_sum[k] == sum);
  }
}

BOOST_AUTO_TEST_CASE(a_failed_collective_reaches_run_with_its_message) {
  const auto d = make_data(steps);
  // rank 1 fails its 3rd all-reduce; rank 0 then waits at the barrier and times out: both
  // report, neither hangs (the board's wait is bounded)
  const auto t0 = std::chrono::steady_clock::now();
  const auto rs = data_parallel(d, 2, {}, 2);
  BOOST_TEST(rs[1].error.find("peer rank 1 at inproc://test is gone") != std::string::npos, rs[1].error);
  BOOST_TEST(rs[0].error.find("did not arrive in time") != std::string::npos, rs[0].error);
  BOOST_TEST((std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)));
}

BOOST_AUTO_TEST_CASE(a_world_of_one_is_the_plain_step) {
  const auto d = make_data(steps);
  const auto ref = single_process(d);
  mlp m;
  g::trainer<g::cpu_simd, g::parallel::local> t;
  m.init(t.session(), 11);
  auto step = t.minimize(m.loss(), optimizer);
  for (int k = 0; k < steps; ++k)
    step.run(x = g::view(d.xs.data() + k * batch * n_in, {batch, n_in}), y = g::view(d.ys.data() + k * batch, {batch}));
  const auto w = weights(t.session(), m);
  BOOST_TEST(std::memcmp(w.data(), ref.data(), ref.size() * sizeof(double)) == 0);
}

// ---- ranks that disagree on the run, or whose replicas drift ---------------------------------

namespace {

// `world` threads; rank r builds its step with make(r, comm, session, model), calls
// before(r, step, session), runs `run_steps` steps on its share, then after(r, step, session).
template <class Make, class Before, class After>
std::vector<rank_result> ranks_with(int world, int run_steps, Make make, Before before, After after) {
  const auto d = make_data(run_steps);
  board b(world, std::chrono::milliseconds(20000));
  return on_ranks(world, [&](int r, rank_result& res) {
    thread_comm comm{&b, r};
    mlp m;
    g::session<g::cpu_simd> s;
    m.init(s, 11);
    auto step = make(r, comm, s, m);
    before(r, step, s);
    const g::index_t part = batch / world, lo = r * part;
    for (int k = 0; k < run_steps; ++k)
      step.run(x = g::view(d.xs.data() + (k * batch + lo) * n_in, {part, n_in}),
               y = g::view(d.ys.data() + k * batch + lo, {part}));
    after(r, step, s);
    res.w = weights(s, m);
  });
}
const auto nothing = [](int, auto&, auto&) {};

// Adds `delta` to element 0 of the session tensor `name` (host memory: cpu_simd).
void nudge(g::session<g::cpu_simd>& s, std::string_view name, double delta) {
  for (const auto& e : s.entries())
    if (e.name == name) static_cast<double*>(e.data)[0] += delta;
}

}  // namespace

BOOST_AUTO_TEST_CASE(ranks_given_another_learning_rate_fail_naming_it_and_both_values) {
  const auto rs = ranks_with(
      2, 1,
      [](int r, thread_comm& comm, g::session<g::cpu_simd>& s, const mlp& m) {
        return g::parallel::minimize(comm, {}, s, m.loss(), g::sgd{.lr = r == 0 ? 0.05 : 0.1, .momentum = 0.9});
      },
      nothing, nothing);
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(rs[static_cast<std::size_t>(r)].error ==
                   "gradus: run fingerprint differs between ranks: rank 1 has optimizer.lr = 0.1, rank 0 has "
                   "optimizer.lr = 0.05; noticed on rank " + std::to_string(r),
               rs[static_cast<std::size_t>(r)].error);
}

BOOST_AUTO_TEST_CASE(ranks_of_another_precision_policy_fail_naming_both) {
  // the policy is part of the session's type (core/precision.hpp): rank 1's is mixed_bf16
  const auto d = make_data(1);
  board b(2, std::chrono::milliseconds(20000));
  const auto rs = on_ranks(2, [&](int r, rank_result&) {
    thread_comm comm{&b, r};
    mlp m;
    auto train = [&](auto& s) {
      m.init(s, 11);
      auto step = g::parallel::minimize(comm, {}, s, m.loss(), optimizer);
      step.run(x = g::view(d.xs.data(), {batch / 2, n_in}), y = g::view(d.ys.data(), {batch / 2}));
    };
    if (r == 0) {
      g::session<g::cpu_simd> s;
      train(s);
    } else {
      g::session<g::cpu_simd, g::mixed_bf16> s;
      train(s);
    }
  });
  for (int r = 0; r < 2; ++r)
    BOOST_TEST(rs[static_cast<std::size_t>(r)].error ==
                   "gradus: run fingerprint differs between ranks: rank 1 has precision = bf16, rank 0 has "
                   "precision = fp32; noticed on rank " + std::to_string(r),
               rs[static_cast<std::size_t>(r)].error);
}

BOOST_AUTO_TEST_CASE(ranks_given_another_batch_or_optimizer_fail_naming_the_first_field) {
  // the program's own fields: rank 1 and 2 were given another batch size
  const auto rs = ranks_with(
      3, 1,
      [](int, thread_comm& comm, g::session<g::cpu_simd>& s, const mlp& m) {
        return g::parallel::minimize(comm, {}, s, m.loss(), optimizer);
      },
      [](int r, auto& step, auto&) { step.set_run_fingerprint({{"batch_size", r == 0 ? "64" : "32"}, {"epochs", "3"}}); },
      nothing);
  for (const auto& res : rs)
    BOOST_TEST(res.error.find("rank 1 has batch_size = 32, rank 0 has batch_size = 64 (rank 2 differs from rank 0 too)") !=
                   std::string::npos,
               res.error);
  // another optimizer: named before the tensors its slots add
  const auto ro = ranks_with(
      2, 1,
      [](int, thread_comm& comm, g::session<g::cpu_simd>& s, const mlp& m) {
        return g::parallel::minimize(comm, {}, s, m.loss(), g::adam{.lr = 0.1});
      },
      [](int r, auto& step, auto&) {
        if (r == 0) step.set_run_fingerprint({{"seed", "1"}});
      },
      nothing);
  for (const auto& res : ro)
    BOOST_TEST(res.error.find("rank 1 has tensor fc1/b = float64 (13,), rank 0 has seed = 1") != std::string::npos, res.error);
}

BOOST_AUTO_TEST_CASE(agreeing_ranks_pass_and_a_drifted_replica_is_named) {
  // agreeing replicas pass check_replicas, at the end and every 2 steps
  const auto ok = ranks_with(
      2, 4,
      [](int, thread_comm& comm, g::session<g::cpu_simd>& s, const mlp& m) {
        return g::parallel::minimize(comm, {.check_replicas_every = 2}, s, m.loss(), optimizer);
      },
      [](int, auto& step, auto&) { step.set_run_fingerprint({{"batch_size", "12"}}); },
      [](int, auto& step, auto&) { step.check_replicas(); });
  for (const auto& res : ok) BOOST_TEST(res.error.empty(), res.error);
  // rank 1's fc2/b drifts by one ulp-sized nudge after training: named with both checksums
  const auto bad = ranks_with(
      2, 2,
      [](int, thread_comm& comm, g::session<g::cpu_simd>& s, const mlp& m) {
        return g::parallel::minimize(comm, {}, s, m.loss(), optimizer);
      },
      nothing,
      [](int r, auto& step, auto& s) {
        if (r == 1) nudge(s, "fc2/b", 1e-15);
        step.check_replicas();
      });
  for (const auto& res : bad) {
    BOOST_TEST(res.error.find("gradus: replica check differs between ranks: rank 1 has checksum of fc2/b = ") !=
                   std::string::npos,
               res.error);
    BOOST_TEST(res.error.find(", rank 0 has checksum of fc2/b = ") != std::string::npos, res.error);
  }
  // with check_replicas_every = 2, a drift after step 2 is caught inside run() at step 4
  const auto during = ranks_with(
      2, 2,
      [](int, thread_comm& comm, g::session<g::cpu_simd>& s, const mlp& m) {
        return g::parallel::minimize(comm, {.check_replicas_every = 2}, s, m.loss(), optimizer);
      },
      nothing,
      [](int r, auto& step, auto& s) {
        if (r == 1) nudge(s, "fc1/w", 0.5);
        const auto d = make_data(2);
        const g::index_t part = batch / 2, lo = r * part;
        for (int k = 0; k < 2; ++k)
          step.run(x = g::view(d.xs.data() + (k * batch + lo) * n_in, {part, n_in}),
                   y = g::view(d.ys.data() + k * batch + lo, {part}));
      });
  for (const auto& res : during)
    BOOST_TEST(res.error.find("replica check differs between ranks: rank 1 has checksum of fc1/w = ") != std::string::npos,
               res.error);
}

BOOST_AUTO_TEST_CASE(the_global_step_comes_from_rank_0) {
  // rank 0 restored a checkpoint of step 7 that rank 1 could not read: both go on from 7
  const auto rs = ranks_with(
      2, 1,
      [](int, thread_comm& comm, g::session<g::cpu_simd>& s, const mlp& m) {
        return g::parallel::minimize(comm, {}, s, m.loss(), optimizer);
      },
      [](int r, auto&, auto& s) {
        if (r == 0) s.set_global_step(7);
      },
      [](int, auto&, auto& s) {
        if (s.global_step() != 8) throw g::error("global step " + std::to_string(s.global_step()));
      });
  for (const auto& res : rs) BOOST_TEST(res.error.empty(), res.error);
}

// ---- a parameter server behind the same step ---------------------------------------------
namespace {

// BSP with plain SGD at the server, in memory: rank 0's offered values are kept;
// a step's pushes are summed; when every worker has ended the step the server applies
// w -= lr * sum / workers; pull waits (bounded) until the server has applied this worker's
// last step.
struct fake_server {
  explicit fake_server(int n, double lr) : n(n), lr(lr), b(n, std::chrono::milliseconds(20000)) {}
  int n;
  double lr;
  board b;  // the workers' own collectives (the run fingerprint)
  std::mutex m;
  std::condition_variable cv;
  std::map<std::string, std::vector<double>, std::less<>> w, sum;
  int done = 0;
  long applied = 0;  // steps applied
};

struct ps_comm {
  fake_server* srv;
  int r;
  long steps = 0;
  int rank() const { return r; }
  int world_size() const { return srv->n; }
  template <class T>
  void allreduce_sum(std::span<T> v) {
    thread_comm{&srv->b, r}.allreduce_sum(v);
  }
  template <class T>
  void allreduce_average(std::span<T> v) {
    thread_comm{&srv->b, r}.allreduce_average(v);
  }
  template <class T>
  void broadcast(std::span<T> v, int root) {
    thread_comm{&srv->b, r}.broadcast(v, root);
  }
  void barrier() { srv->b.sync(); }
  void initialize(std::string_view key, std::span<const double> v) {
    if (r != 0) return;  // rank 0's values (a real server: the first offer)
    std::lock_guard lk(srv->m);
    srv->w.try_emplace(std::string(key), v.begin(), v.end());
    srv->cv.notify_all();
  }
  void initialize(std::string_view, std::span<const float>) { throw g::error("fake_server: double only"); }
  void push(std::string_view key, std::span<const double> gr) {
    std::lock_guard lk(srv->m);
    auto& acc = srv->sum[std::string(key)];
    acc.resize(gr.size(), 0.0);
    for (std::size_t i = 0; i < gr.size(); ++i) acc[i] += gr[i];
  }
  void push(std::string_view, std::span<const float>) { throw g::error("fake_server: double only"); }
  void step_done() {
    std::lock_guard lk(srv->m);
    ++steps;
    if (++srv->done == srv->n) {
      for (auto& [key, acc] : srv->sum) {
        auto& wv = srv->w.at(key);
        for (std::size_t i = 0; i < wv.size(); ++i) wv[i] -= srv->lr * (acc[i] / srv->n);
        std::fill(acc.begin(), acc.end(), 0.0);
      }
      srv->done = 0;
      ++srv->applied;
      srv->cv.notify_all();
    }
  }
  void pull(std::string_view key, std::span<double> out) {
    std::unique_lock lk(srv->m);
    if (!srv->cv.wait_for(lk, std::chrono::seconds(20),
                          [&] { return srv->applied >= steps && srv->w.find(key) != srv->w.end(); }))
      throw g::error("fake_server: pull timed out");
    const auto& wv = srv->w.at(std::string(key));
    std::copy(wv.begin(), wv.end(), out.begin());
  }
  void pull(std::string_view, std::span<float>) { throw g::error("fake_server: double only"); }
};
static_assert(g::parallel::parameter_server_policy<ps_comm>);
static_assert(!g::parallel::parameter_server_policy<thread_comm>);

}  // namespace

BOOST_AUTO_TEST_CASE(a_parameter_server_policy_trains_through_the_same_step) {
  const auto d = make_data(steps);
  // the reference: one process, whole batches, plain SGD (what the fake server applies)
  std::vector<double> ref;
  {
    mlp m;
    g::session<g::cpu_simd> s;
    m.init(s, 11);
    auto step = g::minimize(s, m.loss(), g::sgd{.lr = 0.1});
    for (int k = 0; k < steps; ++k)
      step.run(x = g::view(d.xs.data() + k * batch * n_in, {batch, n_in}), y = g::view(d.ys.data() + k * batch, {batch}));
    ref = weights(s, m);
  }
  constexpr int world = 2;
  fake_server srv(world, 0.1);
  const auto out = on_ranks(world, [&](int r, rank_result& res) {
    ps_comm comm{&srv, r};
    mlp m;
    g::session<g::cpu_simd> s;
    m.init(s, r == 0 ? 11 : 77);  // the server keeps rank 0's
    auto step = g::parallel::minimize(comm, s, m.loss(), g::sgd{.lr = 0.1});
    const g::index_t part = batch / world, lo = r * part;
    for (int k = 0; k < steps; ++k)
      step.run(x = g::view(d.xs.data() + (k * batch + lo) * n_in, {part, n_in}),
               y = g::view(d.ys.data() + k * batch + lo, {part}));
    res.w = weights(s, m);
    res.stats = step.stats();
    if (s.global_step() != steps) throw g::error("global step " + std::to_string(s.global_step()));
  });
  check_against_single(out, ref);
  BOOST_TEST(out[0].stats.steps == steps);
}

// ---- the design's program: trainer<cpu_simd, ring_allreduce> from a cluster spec ----------

BOOST_AUTO_TEST_CASE(trainer_over_the_ring_from_torchrun_variables) {
  const auto d = make_data(steps);
  const auto ref = single_process(d);
  constexpr int world = 2;
  const std::string port = std::to_string(gradus_test::free_port());
  const auto out = on_ranks(world, [&](int r, rank_result& res) {
    const auto spec = g::cluster::from_env(std::map<std::string, std::string>{
        {"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", port}});
    g::ring_options base;
    base.timeout = std::chrono::seconds(20);
    g::trainer<g::cpu_simd, g::ring_allreduce> t(spec, base);
    if (t.rank() != r || t.world_size() != world) throw g::error("trainer: wrong rank or world");
    mlp m;
    m.init(t.session(), r == 0 ? 11 : 900);
    auto step = t.minimize(m.loss(), optimizer);
    const g::index_t part = batch / world, lo = r * part;
    for (int k = 0; k < steps; ++k)
      step.run(x = g::view(d.xs.data() + (k * batch + lo) * n_in, {part, n_in}),
               y = g::view(d.ys.data() + k * batch + lo, {part}));
    res.w = weights(t.session(), m);
    res.stats = step.stats();
  });
  check_against_single(out, ref);
  BOOST_TEST(out[0].stats.collectives == steps);
}
