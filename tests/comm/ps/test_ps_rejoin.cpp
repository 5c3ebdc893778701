#define BOOST_TEST_MODULE ps_rejoin
// A lost parameter-server worker's restart taken back (backends/comm/ps/server_rejoin.hpp),
// with servers and workers on threads over loopback tcp, the first process of a rank
// played by a worker that says hello and vanishes (what a server sees of a SIGKILL). The
// workers train as the examples do — K steps an epoch, then an all-reduce, a barrier and a
// join point (data_parallel_step::pull_state's) — and the restart comes back at the join
// point after its join: at the others' clock (an epoch's end), with the next collective's
// number (it runs the others' next collective with them), counted in every collective and
// staleness clock from there, its pushes applied. A restart that comes after the job ended
// is told so (nothing to train, no failure); one without the restart flag, and any in bsp,
// is refused naming why. The data-parallel step and the examples on top of this:
// examples/check_ps.sh (a worker SIGKILLed under gradus-run --max-restarts).
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../../support/ps_test_cluster.hpp"

namespace g = gradus;
using namespace std::chrono_literals;
using ps_test::on_workers;
using ps_test::server_pool;
using ps_test::vanishing_worker;

namespace {

constexpr int steps_per_epoch = 6, epochs = 4;

// What one worker saw at each epoch's end: how many workers the all-reduce counted, and
// the ranks the join point took back.
struct epoch_ends {
  std::vector<double> counted;
  std::vector<std::vector<int>> back;
};

// Epochs [first, epochs) of `steps_per_epoch` steps: pull, a gradient of -1 into this rank's
// slot of "counts", step_done (20 ms a step: a restart has time to arrive mid-job). Each
// epoch ends as the examples' do: an all-reduce (every worker adds 1: the count of workers
// it included), a barrier, a join point; where a restart came back, every worker runs one
// collective more (the run fingerprint's, in data_parallel_step) — as the restart does first.
void train(g::parameter_server<>& p, int rank, int first, epoch_ends& seen, std::atomic<std::uint64_t>* clock) {
  std::vector<double> counts(3, 0.0), grad(3, 0.0);
  grad[static_cast<std::size_t>(rank)] = -1.0;
  for (int e = first; e < epochs; ++e) {
    for (int k = 0; k < steps_per_epoch; ++k) {
      p.pull("counts", std::span<double>(counts));
      p.push("counts", std::span<const double>(grad));
      p.step_done();
      if (clock) clock->store(p.clock());
      std::this_thread::sleep_for(20ms);
    }
    std::vector<double> one{1.0};
    p.allreduce_sum(std::span<double>(one));
    seen.counted.push_back(one[0]);
    p.barrier();
    seen.back.push_back(p.join_point());
    if (!seen.back.back().empty()) {
      std::vector<double> x{1.0};
      p.allreduce_sum(std::span<double>(x));
    }
  }
}

void start(g::parameter_server<>& p) {
  p.set_optimizer("sgd", {});
  p.set_learning_rate(1.0);
  const std::vector<double> counts(3, 0.0);
  p.initialize("counts", std::span<const double>(counts));
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_restarted_worker_comes_back_at_the_next_join_point_and_trains_with_the_others) {
  for (const std::string mode : {"async", "ssp:1"}) {
    server_pool pool(2);
    constexpr int world = 3;
    // rank 2's first process: says hello and dies
    vanishing_worker(pool.addresses, 2, world, mode == "async" ? "async" : "ssp", mode == "async" ? 0 : 1);
    std::vector<epoch_ends> seen(world);
    std::atomic<std::uint64_t> chief_clock{0};
    std::int64_t at = -1;
    bool restarted = false;
    std::vector<double> final_counts;
    on_workers(world, [&](int r) {
      if (r < 2) {
        g::parameter_server<> p(pool.options(r, world, mode));
        start(p);
        train(p, r, 0, seen[static_cast<std::size_t>(r)], r == 0 ? &chief_clock : nullptr);
        p.barrier();
        if (r == 0) {
          final_counts.assign(3, 0.0);
          p.pull("counts", std::span<double>(final_counts));
        }
        return;
      }
      // its restart, once the chief is into its second epoch (bounded: 20 s)
      for (int i = 0; i < 2000 && chief_clock.load() <= steps_per_epoch; ++i) std::this_thread::sleep_for(10ms);
      auto o = pool.options(2, world, mode);
      o.restarted = true;
      g::parameter_server<> p(o);
      restarted = p.restarted();
      const auto a = p.rejoin_job();
      if (!a) throw g::error("the restart was told the job had ended");
      at = *a;
      if (static_cast<std::int64_t>(p.clock()) != at) throw g::error("the restart's clock is not the step it came back at");
      std::vector<double> x{1.0};
      p.allreduce_sum(std::span<double>(x));  // with the others, right after their join point
      start(p);
      train(p, 2, static_cast<int>(at / steps_per_epoch), seen[2], nullptr);
      p.barrier();
    });
    BOOST_TEST_INFO(mode);
    BOOST_TEST(restarted);
    // it came back at an epoch's end after the chief's first: the step it goes on from
    BOOST_TEST(at % steps_per_epoch == 0);
    BOOST_TEST(at >= 2 * steps_per_epoch);
    BOOST_TEST(at <= epochs * steps_per_epoch);
    const int back_at = static_cast<int>(at / steps_per_epoch) - 1;  // the epoch whose end took it back
    for (int r = 0; r < 2; ++r) {
      const auto& s = seen[static_cast<std::size_t>(r)];
      BOOST_TEST_REQUIRE(s.counted.size() == std::size_t(epochs));
      for (int e = 0; e < epochs; ++e) {
        BOOST_TEST(s.counted[static_cast<std::size_t>(e)] == (e <= back_at ? 2.0 : 3.0), "rank " << r << " epoch " << e);
        BOOST_TEST((s.back[static_cast<std::size_t>(e)] == (e == back_at ? std::vector<int>{2} : std::vector<int>{})),
                   "rank " << r << " epoch " << e);
      }
    }
    // the restart trained the epochs left, counted by every collective
    BOOST_TEST(seen[2].counted.size() == std::size_t(epochs - back_at - 1));
    for (const double c : seen[2].counted) BOOST_TEST(c == 3.0);
    for (const auto& b : seen[2].back) BOOST_TEST(b.empty());
    // its pushes were applied (each 1/3 of a step in async and ssp); the first process pushed none
    BOOST_TEST_REQUIRE(final_counts.size() == 3u);
    if (back_at + 1 < epochs) BOOST_TEST(final_counts[2] > 0.0);
    else BOOST_TEST(final_counts[2] == 0.0);
    for (auto& sv : pool.servers) BOOST_TEST(sv->stats().workers_rejoined == 1u);
    pool.join();  // a lost worker that came back is no failure of the job
    for (auto& sv : pool.servers) BOOST_TEST(sv->job_failure().value_or("ok") == "ok");
  }
}

BOOST_AUTO_TEST_CASE(a_restart_the_job_no_longer_needs_is_told_so_and_one_without_the_flag_is_refused) {
  server_pool pool(1);
  constexpr int world = 2;
  std::atomic<int> phase{0};  // 1: the chief trains; 2: the restart said hello
  bool refused_named_why = false, restarted = false;
  std::optional<std::int64_t> at{-1};
  on_workers(world, [&](int r) {
    if (r == 0) {
      g::parameter_server<> p(pool.options(0, world, "async"));
      start(p);
      std::vector<double> counts(3, 0.0), grad{-1.0, 0.0, 0.0};
      for (int k = 0; k < 3; ++k) {
        p.pull("counts", std::span<double>(counts));
        p.push("counts", std::span<const double>(grad));
        p.step_done();
      }
      phase = 1;
      for (int i = 0; i < 2000 && phase.load() < 2; ++i) std::this_thread::sleep_for(10ms);
      return;  // the chief ends the job (shutdown) with the restart still waiting to rejoin
    }
    vanishing_worker(pool.addresses, 1, world, "async", 0);
    for (int i = 0; i < 2000 && phase.load() < 1; ++i) std::this_thread::sleep_for(10ms);
    try {  // a second process for rank 1 that does not say it is a restart
      g::parameter_server<> q(pool.options(1, world, "async"));
    } catch (const g::error& e) {
      const std::string m = e.what();
      refused_named_why = m.find("worker 1 was declared dead") != std::string::npos && m.find("GRADUS_RESTART_COUNT") != std::string::npos;
      if (!refused_named_why) throw;
    }
    auto o = pool.options(1, world, "async");
    o.restarted = true;
    g::parameter_server<> p(o);
    restarted = p.restarted();
    phase = 2;
    at = p.rejoin_job();  // no join point comes: the chief ends the job
  });
  BOOST_TEST(refused_named_why);
  BOOST_TEST(restarted);
  BOOST_TEST(!at.has_value());
  BOOST_TEST(pool.servers[0]->stats().workers_rejoined == 0u);
  pool.join();  // the chief ended the job: no failure, though its lost worker never came back
  BOOST_TEST(pool.servers[0]->job_failure().value_or("ok") == "ok");
}

BOOST_AUTO_TEST_CASE(bsp_takes_no_restart_back_and_says_why) {
  server_pool pool(1);
  constexpr int world = 2;
  std::string why;
  {
    g::parameter_server<> chief(pool.options(0, world, "bsp"));
    vanishing_worker(pool.addresses, 1, world, "bsp", 0);  // lost: the bsp job fails
    auto o = pool.options(1, world, "bsp");
    o.restarted = true;
    try {
      g::parameter_server<> p(o);
    } catch (const g::error& e) {
      why = e.what();
    }
  }
  BOOST_TEST_MESSAGE(why);
  BOOST_TEST((why.find("worker 1") != std::string::npos && why.find("was lost") != std::string::npos &&
              why.find("bsp cannot finish a step without it") != std::string::npos),
             why);
  pool.join();
  BOOST_TEST(pool.servers[0]->job_failure().has_value());
}
