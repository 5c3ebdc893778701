#define BOOST_TEST_MODULE exec_session
#include <boost/test/unit_test.hpp>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
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
  g::assign(s, b, bv);
  xt::xtensor<float, 2> xv = {{1, 2, 3, 4}, {5, 6, 7, 8}};
  auto r = s.run(g::exp(x * 0.5f) + b, x = xv);
  BOOST_TEST(r.shape().rank == 2u);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 4; ++j)
      BOOST_TEST(r[static_cast<g::index_t>(i * 4 + j)] == std::exp(xv(i, j) * 0.5f) + bv(j),
                 boost::test_tools::tolerance(1e-6f));
}

// A result read the way README shows it: by (i, j), its shape, printed, as xtensor; and the
// lifetime rule (valid until the next run of the same outputs, which reuses its buffer).
BOOST_AUTO_TEST_CASE(a_result_reads_by_row_and_column_prints_and_converts) {
  g::placeholder<"x", float, g::dyn, 3> x;
  g::variable<"w", float, 3, 2> w;
  g::variable<"b", float, 2> b;
  g::session<g::cpu_simd> s;
  g::assign(s, w, xt::xtensor<float, 2>{{1, -1}, {0.5f, 2}, {-2, 1}});
  g::assign(s, b, xt::xtensor<float, 1>{0.25f, -3});
  const auto out = g::relu(g::matmul(x, w) + b);
  auto y = s.run(out, x = xt::xtensor<float, 2>{{1, 2, 3}, {-1, 0, 4}});
  // by hand: row 0 = relu([1 + 1 - 6 + 0.25, -1 + 4 + 3 - 3]) = [0, 3]; row 1 = relu([-1 - 8 + 0.25, 1 + 4 - 3]) = [0, 2]
  BOOST_TEST((y.shape() == g::dims{2, 2}));
  BOOST_TEST(y(0, 1) == 3.f);
  BOOST_TEST(y(1, 1) == 2.f);
  BOOST_TEST(y(1, 0) == 0.f);
  std::ostringstream o;
  o << y;
  BOOST_TEST(o.str() == "[[0 3]\n [0 2]]");
  const auto copy = g::to_xtensor<2>(y);
  BOOST_TEST(copy(0, 1) == 3.f);
  const float* before = y.data();
  auto y2 = s.run(out, x = xt::xtensor<float, 2>{{0, 0, 1}, {0, 0, 2}});
  BOOST_TEST(y2.data() == before);  // the same buffer: y now shows the new values
  BOOST_TEST(y(0, 1) == 0.f);       // relu(1 - 3) = 0
  BOOST_TEST(y(1, 1) == 0.f);       // relu(2 - 3) = 0
  BOOST_TEST(copy(0, 1) == 3.f);    // the copy kept the old ones
}

// ---- threads (backends/compute/cpu_simd/.../threads.hpp): the team follows the free cores ----------
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

// The streaming-store threshold's cache size: the highest-level data or unified cache of
// the first CPU this process may use, from a sysfs-shaped tree (K and M suffixes; the
// instruction cache and a bigger L2 of another CPU are not it); 0 without one.
BOOST_AUTO_TEST_CASE(last_level_cache_is_read_from_sysfs) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("gradus-sysfs-" + std::to_string(getpid()));
  cpu_set_t set;
  CPU_ZERO(&set);
  BOOST_TEST_REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &set)) ++cpu;
  auto cache = [&](int c, int index, const char* level, const char* type, const char* size) {
    const fs::path d = root / ("cpu" + std::to_string(c)) / "cache" / ("index" + std::to_string(index));
    fs::create_directories(d);
    std::ofstream(d / "level") << level << "\n";
    std::ofstream(d / "type") << type << "\n";
    std::ofstream(d / "size") << size << "\n";
  };
  BOOST_TEST(g::cpu_threads::last_level_cache_bytes(root.string()) == 0u);
  cache(cpu, 0, "1", "Data", "32K");
  cache(cpu, 1, "1", "Instruction", "64K");
  BOOST_TEST(g::cpu_threads::last_level_cache_bytes(root.string()) == 32u << 10);
  cache(cpu, 2, "2", "Unified", "1024K");
  cache(cpu, 3, "3", "Unified", "32768K");
  cache(cpu + 1, 2, "2", "Unified", "2M");
  BOOST_TEST(g::cpu_threads::last_level_cache_bytes(root.string()) == 32u << 20);
  cache(cpu, 3, "3", "Unified", "96M");
  BOOST_TEST(g::cpu_threads::last_level_cache_bytes(root.string()) == 96u << 20);
  fs::remove_all(root);
}

// The bits are threads()'s, not the team's: GEMMs the backend cuts into blocks (an MLP
// layer's forward [64,784] x [784,256], its data gradient with B transposed, its weight
// gradient with A transposed, a batch of 3 items), one too narrow to cut (a single call,
// with OpenMP's count at 1 for it: OpenBLAS threads by that count), a long-k GEMM
// (cpu_simd::split_k's slices) and training steps give the same bits on a team of 1 as on 2
// (OpenBLAS's own threads gave 15,049 of the forward's 16,384 elements other bits), and
// before_run hands the team to OpenMP. Every product is also checked against a double-precision sum.
BOOST_AUTO_TEST_CASE(results_depend_on_threads_not_on_the_team) {
  g::cpu_simd::set_threads(2);
  struct product {
    bool ta, tb;
    g::index_t m, n, k, batch;
  };
  const product cases[] = {
      {false, false, 6, 25, 5003, 1},   // a conv weight gradient's shape; k reaches a tail
      {false, false, 64, 256, 784, 1},  // mnist_mlp's first layer
      {false, true, 64, 784, 256, 1},   // its data gradient (B = W, transposed)
      {true, false, 784, 256, 64, 1},   // its weight gradient (A = x, transposed)
      {false, false, 6, 36867, 25, 1},  // a convolution's forward: a long n with a tail
      {false, false, 20, 24, 1000, 1},  // too narrow to cut, too short for split_k: one call
      {false, false, 61, 133, 129, 3},  // a batch of three, odd extents
  };
  for (const product& p : cases) {
    const g::index_t am = p.ta ? p.k : p.m, ak = p.ta ? p.m : p.k;  // A as stored
    const g::index_t bk = p.tb ? p.n : p.k, bn = p.tb ? p.k : p.n;  // B as stored
    std::vector<float> a(static_cast<std::size_t>(p.batch * am * ak)), b(static_cast<std::size_t>(p.batch * bk * bn));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i));
    std::vector<float> c[2];
    for (int team = 1; team <= 2; ++team) {
      g::cpu_simd::pin_team(team);
      g::cpu_simd::before_run();
      BOOST_TEST(g::cpu_simd::team() == team);
      BOOST_TEST(omp_get_max_threads() == team);
      BOOST_TEST(g::cpu_simd::threads() == 2);
      auto& out = c[team - 1];
      out.assign(static_cast<std::size_t>(p.batch * p.m * p.n), 0.5f);  // beta = 1 adds to it
      g::cpu_simd::gemm(p.ta, p.tb, p.m, p.n, p.k, 1.0f, a.data(), ak, am * ak, b.data(), bn, bk * bn, 1.0f,
                        out.data(), p.n, p.m * p.n, p.batch);
    }
    int differ = 0, wrong = 0;
    for (g::index_t t = 0; t < p.batch; ++t)
      for (g::index_t i = 0; i < p.m; ++i)
        for (g::index_t j = 0; j < p.n; ++j) {
          double ref = 0.5;
          for (g::index_t q = 0; q < p.k; ++q) {
            const float av = a[static_cast<std::size_t>(t * am * ak + (p.ta ? q * ak + i : i * ak + q))];
            const float bv = b[static_cast<std::size_t>(t * bk * bn + (p.tb ? j * bn + q : q * bn + j))];
            ref += double(av) * bv;
          }
          const auto at = static_cast<std::size_t>((t * p.m + i) * p.n + j);
          differ += std::bit_cast<std::uint32_t>(c[0][at]) != std::bit_cast<std::uint32_t>(c[1][at]);
          wrong += !(std::abs(c[1][at] - ref) <= 1e-4 * (std::sqrt(double(p.k)) + std::abs(ref)));
        }
    BOOST_TEST(differ == 0, "[" << p.m << "," << p.n << "," << p.k << "] x" << p.batch << ": bits differ between teams");
    BOOST_TEST(wrong == 0, "[" << p.m << "," << p.n << "," << p.k << "] x" << p.batch << ": off the double sum");
  }

  // a few SGD steps of an MLP with a 784-wide input, on a team of 1 and of 2
  auto train = [](int team) {
    g::cpu_simd::pin_team(team);
    g::placeholder<"x", float, g::dyn, 784> x;
    g::placeholder<"y", std::int32_t, g::dyn> y;
    g::nn::dense<"l1", 784, 67> l1;
    g::nn::dense<"l2", 67, 10> l2;
    const auto loss = g::nn::softmax_cross_entropy_loss(l2(g::relu(l1(x))), y);
    g::session<g::cpu_simd> s;
    l1.initialize(s, 7);
    l2.initialize(s, 7);
    auto step = g::minimize(s, loss, g::sgd{.lr = 0.1, .momentum = 0.9});
    const std::size_t rows = 500;
    xt::xtensor<float, 2> xv = xt::zeros<float>({rows, std::size_t{784}});
    xt::xtensor<std::int32_t, 1> yv = xt::zeros<std::int32_t>({rows});
    for (std::size_t i = 0; i < rows; ++i) {
      for (std::size_t j = 0; j < 784; ++j) xv(i, j) = std::sin(0.013f * static_cast<float>(i * 784 + j));
      yv(i) = static_cast<std::int32_t>((i * 7) % 10);
    }
    for (int it = 0; it < 3; ++it) step.run(x = xv, y = yv);
    BOOST_TEST(omp_get_max_threads() == team);
    const auto w = g::value(s, l1.w);
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
  g::cpu_simd::set_adaptive_threads(true);  // the default
}
