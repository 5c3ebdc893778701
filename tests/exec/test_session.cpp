#define BOOST_TEST_MODULE exec_session
#include <boost/test/unit_test.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace g = gradus;

BOOST_AUTO_TEST_CASE(bias_add_exp_matches_loop) {
  g::placeholder<"x", float, g::dyn, 4> x;
  g::variable<"b", float, 4> b;
  g::session<g::cpu_simd> s;
  xt::xtensor<float, 1> bv = {1, 2, 3, 4};
  s.assign(b, bv);
  xt::xtensor<float, 2> xv = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  auto r = s.run(g::exp(x * 0.5f) + b, x = xv);
  BOOST_TEST(r.shape.rank == 2u);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 4; ++j)
      BOOST_TEST(r[static_cast<g::index_t>(i * 4 + j)] == std::exp(xv(i, j) * 0.5f) + bv(j),
                 boost::test_tools::tolerance(1e-6f));
}

// ---- threads (backends/cpu_simd/.../threads.hpp): the team follows the free cores ----------
// The readers of /proc/stat and /proc/self/stat, on text whose answer is worked by hand.
BOOST_AUTO_TEST_CASE(proc_stat_counts_the_cpus_of_the_mask) {
  const std::string stat =
      "cpu  900 10 300 5000 40 0 5 7 0 0\n"
      "cpu0 100 0 50 1000 10 0 1 2 0 0\n"
      "cpu1 200 10 60 2000 20 0 2 3 0 0\n"
      "cpu2 600 0 190 2000 10 0 2 2 0 0\n"
      "intr 12345 1 2 3\n"
      "cpu9 1 1 1 1 1 1 1 1 0 0\n";  // after the cpu lines: not read
  // cpu0 + cpu2: busy (user nice system irq softirq steal) 153 + 794, total +1010 +2010
  const auto t = g::cpu_threads::parse_proc_stat(stat, {0, 2});
  BOOST_TEST(t.ok);
  BOOST_TEST(t.busy == 153u + 794u);
  BOOST_TEST(t.total == 1163u + 2804u);
  const auto all = g::cpu_threads::parse_proc_stat(stat, {});
  BOOST_TEST(all.busy == 153u + 275u + 794u);
  BOOST_TEST(!g::cpu_threads::parse_proc_stat("intr 1 2\n", {0}).ok);
  // fields 14 and 15 after the name, which may hold spaces and parentheses
  BOOST_TEST(g::cpu_threads::parse_self_stat("4242 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 117 25 0 0 20") == 142);
  BOOST_TEST(g::cpu_threads::parse_self_stat("4242 (x) R 1 2") == -1);
}

// A core counts as taken from 60% of it until below 40%; the team is threads() less the taken
// cores, at least 1, and all of threads() on idle cores even beyond the cores (oversubscribed
// on purpose).
BOOST_AUTO_TEST_CASE(governor_counts_taken_cores_with_hysteresis) {
  g::cpu_threads::governor_state s;
  const double others[] = {0.1, 0.5, 0.65, 0.5, 0.41, 0.35, 1.7, 1.5, 1.39, 0.2};
  const int taken[] = {0, 0, 1, 1, 1, 0, 2, 2, 1, 0};
  for (std::size_t i = 0; i < std::size(others); ++i) BOOST_TEST(s.observe(others[i]) == taken[i], "window " << i);
  using gs = g::cpu_threads::governor_state;
  BOOST_TEST(gs::team(2, 2, 0) == 2);
  BOOST_TEST(gs::team(2, 2, 1) == 1);
  BOOST_TEST(gs::team(2, 2, 3) == 1);
  BOOST_TEST(gs::team(8, 16, 9) == 7);
  BOOST_TEST(gs::team(8, 16, 4) == 8);
  BOOST_TEST(gs::team(4, 2, 0) == 4);
  BOOST_TEST(gs::team(4, 2, 1) == 1);
}

// The bits are threads()'s, not the team's: a long-k GEMM (cpu_simd::split_k's slices) and a
// training step give the same bits on a team of 1 as on 2, and before_run hands the team
// to OpenMP.
BOOST_AUTO_TEST_CASE(results_depend_on_threads_not_on_the_team) {
  g::cpu_simd::set_threads(2);
  const g::index_t m = 6, n = 25, k = 5003;  // a conv weight gradient's shape; k reaches a tail
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i));
  std::vector<float> c1(static_cast<std::size_t>(m * n)), c2(c1.size());
  g::cpu_simd::pin_team(1);
  g::cpu_simd::before_run();
  BOOST_TEST(g::cpu_simd::team() == 1);
  BOOST_TEST(omp_get_max_threads() == 1);
  BOOST_TEST(g::cpu_simd::threads() == 2);
  g::cpu_simd::gemm(false, false, m, n, k, 1.0f, a.data(), k, 0, b.data(), n, 0, 0.0f, c1.data(), n, 0, 1);
  g::cpu_simd::pin_team(2);
  g::cpu_simd::before_run();
  BOOST_TEST(omp_get_max_threads() == 2);
  g::cpu_simd::gemm(false, false, m, n, k, 1.0f, a.data(), k, 0, b.data(), n, 0, 0.0f, c2.data(), n, 0, 1);
  for (g::index_t i = 0; i < m; ++i)
    for (g::index_t j = 0; j < n; ++j) {
      double ref = 0;
      for (g::index_t q = 0; q < k; ++q) ref += double(a[static_cast<std::size_t>(i * k + q)]) * b[static_cast<std::size_t>(q * n + j)];
      const auto at = static_cast<std::size_t>(i * n + j);
      BOOST_TEST(std::bit_cast<std::uint32_t>(c1[at]) == std::bit_cast<std::uint32_t>(c2[at]), "c(" << i << "," << j << ")");
      BOOST_TEST(std::abs(c1[at] - ref) <= 1e-3 * (1 + std::abs(ref)), "c(" << i << "," << j << ") against double");
    }

  // a few SGD steps of a small MLP, on a team of 1 and of 2
  auto train = [](int team) {
    g::cpu_simd::pin_team(team);
    g::placeholder<"x", float, g::dyn, 40> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::dense<"l1", 40, 33> l1;
    g::nn::dense<"l2", 33, 10> l2;
    const auto loss = g::nn::softmax_cross_entropy_loss(l2(g::relu(l1(x))), y);
    g::session<g::cpu_simd> s;
    l1.initialize(s, 7);
    l2.initialize(s, 7);
    auto step = g::minimize(s, loss, g::sgd{.lr = 0.1, .momentum = 0.9});
    xt::xtensor<float, 2> xv = xt::zeros<float>({std::size_t{3000}, std::size_t{40}});
    xt::xtensor<std::int32_t, 1> yv = xt::zeros<std::int32_t>({std::size_t{3000}});
    for (std::size_t i = 0; i < 3000; ++i) {
      for (std::size_t j = 0; j < 40; ++j) xv(i, j) = std::sin(0.013f * static_cast<float>(i * 40 + j));
      yv(i) = static_cast<std::int32_t>((i * 7) % 10);
    }
    for (int it = 0; it < 3; ++it) step.run(x = xv, y = yv);
    BOOST_TEST(omp_get_max_threads() == team);
    const auto w = s.value(l1.w);
    return std::vector<float>(w.begin(), w.end());
  };
  const auto w1 = train(1), w2 = train(2);
  BOOST_TEST(std::memcmp(w1.data(), w2.data(), w1.size() * sizeof(float)) == 0);
  g::cpu_simd::pin_team(0);
}

// Live: with a spinning child process on every core this process may use, the team drops to
// 1 within a few samples, on each of two threads that run sessions (OpenMP's thread count is
// per thread; more load elsewhere only takes more cores; the children are ended by PID
// whatever the outcome).
BOOST_AUTO_TEST_CASE(team_shrinks_while_other_processes_hold_the_cores) {
  g::cpu_simd::set_adaptive_threads(true);
  const int cpus = g::cpu_threads::governor::instance().cpus();
  BOOST_TEST_REQUIRE(cpus >= 1);
  std::vector<pid_t> kids;
  for (int i = 0; i < cpus; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (std::chrono::steady_clock::now() < end) {}
      _exit(0);
    }
    if (pid > 0) kids.push_back(pid);
  }
  struct seen {
    int team = 0, omp = 0, threads = 0;
  };
  seen r[2];
  auto poll = [](seen& out) {
    g::cpu_simd::set_threads(2);
    int team = 2;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
    while (team != 1 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      g::cpu_simd::before_run();
      team = g::cpu_simd::team();
    }
    out = {team, omp_get_max_threads(), g::cpu_simd::threads()};
  };
  {
    std::jthread a(poll, std::ref(r[0])), b(poll, std::ref(r[1]));
  }
  for (const pid_t p : kids) kill(p, SIGKILL);
  for (const pid_t p : kids) waitpid(p, nullptr, 0);
  BOOST_TEST(kids.size() == static_cast<std::size_t>(cpus));
  for (const seen& s : r) {
    BOOST_TEST(s.team == 1);
    BOOST_TEST(s.omp == 1);
    BOOST_TEST(s.threads == 2);
  }
  g::cpu_simd::set_adaptive_threads(false);
  BOOST_TEST(g::cpu_simd::team() == 2);  // off: threads() whatever the load
}
