// gradus-run, driven from outside: each case starts gradus-run (posix_spawn) on
// launcher_child and checks its output, exit status and time, and that the processes it
// started are gone afterwards. Every wait is bounded; only 127.0.0.1 is used.
#define BOOST_TEST_MODULE launcher_gradus_run
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace fs = std::filesystem;
using strings = std::vector<std::string>;
using steady = std::chrono::steady_clock;

namespace {

struct result {
  int status = -1;  // wait status
  std::string out, err;
  double seconds = 0;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// Runs gradus-run with args (and extra environment), at most limit_s seconds (then
// SIGKILL and a test failure). With signal_after_s > 0, sends `sig` to gradus-run then.
result run(const strings& args, double limit_s = 30, const std::map<std::string, std::string>& extra_env = {},
           double signal_after_s = 0, int sig = SIGINT) {
  strings argv{GRADUS_RUN_EXE};
  argv.insert(argv.end(), args.begin(), args.end());
  strings envs;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (!extra_env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
  }
  for (const auto& [k, v] : extra_env) envs.push_back(k + "=" + v);
  std::vector<char*> a, e;
  for (auto& s : argv) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : envs) e.push_back(s.data());
  e.push_back(nullptr);

  int out[2], err[2];
  BOOST_REQUIRE(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  pid_t pid = -1;
  const auto t0 = steady::now();
  const int rc = ::posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  ::close(err[1]);
  BOOST_REQUIRE_MESSAGE(rc == 0, "cannot start " << GRADUS_RUN_EXE);

  result r;
  int fds[2] = {out[0], err[0]};
  std::string* sinks[2] = {&r.out, &r.err};
  bool signalled = false, killed = false, reaped = false;
  for (int iter = 0; iter < 100000; ++iter) {
    const double elapsed = std::chrono::duration<double>(steady::now() - t0).count();
    if (signal_after_s > 0 && !signalled && elapsed >= signal_after_s) {
      ::kill(pid, sig);
      signalled = true;
    }
    if (elapsed > limit_s && !killed) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    if (!reaped && ::waitpid(pid, &r.status, WNOHANG) == pid) {
      reaped = true;
      r.seconds = std::chrono::duration<double>(steady::now() - t0).count();
    }
    if (fds[0] < 0 && fds[1] < 0 && reaped) break;
    if (elapsed > limit_s + 5) break;  // a grandchild holds the pipes: give up on them
    pollfd p[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    if (::poll(p, 2, 50) <= 0) continue;
    for (int k = 0; k < 2; ++k) {
      if (fds[k] < 0 || !p[k].revents) continue;
      char buf[65536];
      const auto n = ::read(fds[k], buf, sizeof buf);
      if (n > 0) {
        sinks[k]->append(buf, static_cast<std::size_t>(n));
      } else {
        ::close(fds[k]);
        fds[k] = -1;
      }
    }
  }
  for (const int fd : fds)
    if (fd >= 0) ::close(fd);
  if (!reaped) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &r.status, 0);
  }
  BOOST_CHECK_MESSAGE(!killed, "gradus-run ran past " << limit_s << " s; stdout:\n" << r.out << "\nstderr:\n" << r.err);
  return r;
}

strings lines(const std::string& text) {
  strings v;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

// One start of a process, as launcher_child's "starts" records it.
struct start {
  pid_t pid = 0;
  std::string restart_count;  // its GRADUS_RESTART_COUNT, "-" when unset
};

// A scratch directory for pid files, removed at the end of the case.
struct scratch {
  fs::path dir;
  scratch() {
    dir = fs::temp_directory_path() / ("gradus_run_test." + std::to_string(::getpid()) + "." +
                                       std::to_string(steady::now().time_since_epoch().count()));
    fs::create_directories(dir);
  }
  ~scratch() {
    // Processes this test started (through gradus-run) that are still alive: end them, by pid.
    for (const auto& [label, pid] : pids())
      if (alive(pid)) ::kill(pid, SIGKILL);
    for (const auto& [label, list] : starts())
      for (const auto& st : list)
        if (alive(st.pid)) ::kill(st.pid, SIGKILL);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::map<std::string, pid_t> pids() const {
    std::map<std::string, pid_t> m;
    for (const auto& f : fs::directory_iterator(dir))
      if (f.path().extension() == ".pid") {
        pid_t p = 0;
        std::ifstream(f.path()) >> p;
        if (p > 0) m[f.path().stem().string()] = p;
      }
    return m;
  }
  // Every start of every process (launcher_child's "starts"), by label, in order.
  std::map<std::string, std::vector<start>> starts() const {
    std::map<std::string, std::vector<start>> m;
    for (const auto& f : fs::directory_iterator(dir))
      if (f.path().extension() == ".starts") {
        std::ifstream in(f.path());
        for (start st; in >> st.pid >> st.restart_count;) m[f.path().stem().string()].push_back(st);
      }
    return m;
  }
  // Alive and still launcher_child (not a recycled pid).
  static bool alive(pid_t pid) {
    std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline");
    std::string s((std::istreambuf_iterator<char>(cmd)), std::istreambuf_iterator<char>());
    if (!contains(s, "launcher_child")) return false;
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string st((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const auto close = st.rfind(')');
    return close != std::string::npos && close + 2 < st.size() && st[close + 2] != 'Z';
  }
};

const std::string child = LAUNCHER_CHILD_EXE;

}  // namespace

BOOST_AUTO_TEST_CASE(environment_and_prefixes_per_rank) {
  const auto r = run({"-np", "3", child, "env", "spec", "stderr", "to-stderr", "partial", "no-newline"},
                     30, {{"TF_CONFIG", R"({"cluster": {"worker": ["x:1"]}})"}, {"RANK", "77"}});
  BOOST_TEST(r.exit_code() == 0);
  std::set<std::string> ports;
  const std::regex env_line(R"(\[(\d)\] RANK=(\d) WORLD_SIZE=3 LOCAL_RANK=(\d) LOCAL_WORLD_SIZE=3 )"
                            R"(MASTER_ADDR=127\.0\.0\.1 MASTER_PORT=(\d+) GRADUS_ROLE=worker GRADUS_PS=- )"
                            R"(GRADUS_PS_INDEX=- GRADUS_SWEEP_INDEX=- TF_CONFIG=-)");
  int env_lines = 0;
  std::map<std::string, int> per_prefix;
  for (const auto& l : lines(r.out)) {
    BOOST_TEST_CONTEXT(l) {
      BOOST_TEST(std::regex_search(l, std::regex(R"(^\[[0-2]\] )")));
      per_prefix[l.substr(0, 4)]++;
      std::smatch m;
      if (std::regex_match(l, m, env_line)) {
        ++env_lines;
        BOOST_TEST(m[1] == m[2]);
        BOOST_TEST(m[2] == m[3]);
        ports.insert(m[4]);
      }
    }
  }
  BOOST_TEST(env_lines == 3);
  BOOST_TEST(ports.size() == 1u);  // one MASTER_PORT for everyone
  // ... and one below the kernel's ephemeral range, where no bind(0) or outgoing connection of
  // another process can take it before rank 0 listens (tools/gradus-run/ports.hpp).
  int ephemeral_low = 32768;
  if (std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range"); f) f >> ephemeral_low;
  for (const auto& p : ports) BOOST_TEST((std::stoi(p) >= 20000 && std::stoi(p) < ephemeral_low), "MASTER_PORT " << p);
  for (const char* p : {"[0] ", "[1] ", "[2] "}) {
    BOOST_TEST(per_prefix[p] == 3);  // env, spec, the flushed partial line
    BOOST_TEST(contains(r.out, std::string(p) + "no-newline\n"));
    BOOST_TEST(contains(r.err, std::string(p) + "to-stderr\n"));
  }
  // The children's cluster::from_env() sees what gradus-run set (TF_CONFIG removed).
  for (const char* k : {"0", "1", "2"}) {
    std::ostringstream want;
    want << '[' << k << "] spec source=torchrun rank=" << k << " world=3 local=" << k << "/3 task=worker/" << k
         << " ps=0 rendezvous=tcp://127.0.0.1:" << (ports.empty() ? "?" : *ports.begin());
    BOOST_TEST(contains(r.out, want.str()));
  }
}

BOOST_AUTO_TEST_CASE(many_lines_arrive_whole) {
  const auto r = run({"-np", "2", child, "lines", "20000"});
  BOOST_TEST(r.exit_code() == 0);
  const auto ls = lines(r.out);
  BOOST_TEST(ls.size() == 40000u);
  std::map<std::string, int> next{{"0", 0}, {"1", 0}};
  bool ok = true;
  for (const auto& l : ls) {
    const std::string rank = l.substr(1, 1);
    if (l != "[" + rank + "] line " + std::to_string(next[rank]) + " of 20000") {
      ok = false;
      BOOST_ERROR("bad or out-of-order line: " << l);
      break;
    }
    next[rank]++;
  }
  BOOST_TEST(ok);
}

BOOST_AUTO_TEST_CASE(a_failing_rank_stops_the_others) {
  scratch s;
  const auto r = run({"-np", "3", "--grace", "2", child, "pidfile", s.dir.string(), "sleep", "300", "exit-if", "1", "3",
                      "sleep", "20000"},
                     15);
  BOOST_TEST(r.exit_code() == 3);
  BOOST_TEST(r.seconds < 8.0);
  BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3; stopping the other ranks"));
  BOOST_TEST(contains(r.err, "gradus-run: failed: rank 1 exited with status 3"));
  const auto pids = s.pids();
  BOOST_TEST(pids.size() == 3u);
  for (const auto& [label, pid] : pids) BOOST_TEST(!scratch::alive(pid), "rank " << label << " (pid " << pid << ") is alive");
}

BOOST_AUTO_TEST_CASE(a_crashing_rank_is_named_with_its_signal) {
  scratch s;
  const auto r = run({"-np", "2", child, "pidfile", s.dir.string(), "sleep", "200", "abort-if", "0", "sleep", "20000"}, 15);
  BOOST_TEST(WIFEXITED(r.status));
  BOOST_TEST(r.exit_code() == 128 + SIGABRT);
  BOOST_TEST(contains(r.err, "rank 0 was killed by signal " + std::to_string(SIGABRT)));
  for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), "rank " << label << " is alive");
}

BOOST_AUTO_TEST_CASE(a_rank_ignoring_sigterm_is_killed_after_the_grace_period) {
  scratch s;
  const auto r = run({"-np", "2", "--grace", "1", child, "ignore-term", "pidfile", s.dir.string(), "sleep", "200",
                      "exit-if", "0", "5", "sleep", "20000"},
                     15);
  BOOST_TEST(r.exit_code() == 5);
  BOOST_TEST(r.seconds >= 1.0);
  BOOST_TEST(r.seconds < 6.0);
  for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), "rank " << label << " is alive");
}

BOOST_AUTO_TEST_CASE(sigint_and_sigterm_are_passed_on) {
  for (const int sig : {SIGINT, SIGTERM}) {
    BOOST_TEST_CONTEXT("signal " << sig) {
      scratch s;
      const auto r = run({"-np", "2", child, "pidfile", s.dir.string(), "sleep", "20000"}, 15, {}, 1.0, sig);
      BOOST_TEST(r.exit_code() == 128 + sig);
      BOOST_TEST(r.seconds < 6.0);
      BOOST_TEST(contains(r.err, "passing it on to the ranks"));
      BOOST_TEST(s.pids().size() == 2u);
      for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), "rank " << label << " is alive");
    }
  }
}

BOOST_AUTO_TEST_CASE(timeout) {
  scratch s;
  const auto r = run({"-np", "2", "--timeout", "1", child, "pidfile", s.dir.string(), "sleep", "20000"}, 15);
  BOOST_TEST(r.exit_code() == 124);
  BOOST_TEST(r.seconds < 6.0);
  BOOST_TEST(contains(r.err, "timeout"));
  for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), "rank " << label << " is alive");
}

BOOST_AUTO_TEST_CASE(parameter_servers) {
  scratch s;
  // The workers finish; the parameter servers (sleeping) are then stopped, and that is success.
  const auto r = run({"-np", "2", "--ps", "2", child, "pidfile", s.dir.string(), "env", "spec", "fault-file", "sleep", "1000",
                      "exit-if", "0", "0", "exit-if", "1", "0", "sleep", "20000"},
                     15);
  BOOST_TEST(contains(r.out, "[ps0] GRADUS_FAULT_FILE=/"));  // servers say when the job as a whole failed
  BOOST_TEST(contains(r.out, "[1] GRADUS_FAULT_FILE=/"));
  BOOST_TEST(r.exit_code() == 0, r.err);
  const std::regex ps_env(R"(\[ps(\d)\] RANK=- WORLD_SIZE=2 LOCAL_RANK=- LOCAL_WORLD_SIZE=- MASTER_ADDR=127\.0\.0\.1 )"
                          R"(MASTER_PORT=\d+ GRADUS_ROLE=ps GRADUS_PS=127\.0\.0\.1:(\d+),127\.0\.0\.1:(\d+) GRADUS_PS_INDEX=(\d) )");
  int found = 0;
  for (const auto& l : lines(r.out)) {
    std::smatch m;
    if (std::regex_search(l, m, ps_env)) {
      ++found;
      BOOST_TEST(m[1] == m[4]);
      BOOST_TEST(m[2] != m[3]);
    }
  }
  BOOST_TEST(found == 2);
  BOOST_TEST(contains(r.out, "[ps1] spec source=torchrun rank=-1 world=2 local=0/1 task=ps/1 ps=2"));
  BOOST_TEST(contains(r.out, "[1] spec source=torchrun rank=1 world=2 local=1/2 task=worker/1 ps=2"));
  BOOST_TEST(s.pids().size() == 4u);
  for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), label << " is alive");
}

BOOST_AUTO_TEST_CASE(sweep_runs_every_combination) {
  const auto r = run({"--sweep", "lr=0.01,0.1,1", "--sweep", "batch=32,64", "--parallel", "2", child, "args", "env",
                      "exit-if", "4", "7"},
                     60);
  BOOST_TEST(r.exit_code() == 1);  // run 4 (lr=1 batch=32) fails
  int index = 0;
  for (const char* lr : {"0.01", "0.1", "1"})
    for (const char* batch : {"32", "64"}) {
      const std::string label = std::string("[lr=") + lr + " batch=" + batch + "] ";
      BOOST_TEST(contains(r.out, label + "args args env exit-if 4 7 --lr " + lr + " --batch " + batch + "\n"), label);
      BOOST_TEST(contains(r.out, label + "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1"));
      BOOST_TEST(contains(r.out, "GRADUS_SWEEP_INDEX=" + std::to_string(index) + " "));
      ++index;
    }
  BOOST_TEST(contains(r.out, "gradus-run: sweep of 6 runs, 1 failed"));
  BOOST_TEST(std::regex_search(r.out, std::regex(R"(\n#\s+lr\s+batch\s+status\s+seconds\n)")));
  BOOST_TEST(std::regex_search(r.out, std::regex(R"(\n0\s+0\.01\s+32\s+ok\s+\d+\.\d\d\n)")));
  BOOST_TEST(std::regex_search(r.out, std::regex(R"(\n4\s+1\s+32\s+exit 7\s+\d+\.\d\d\n)")));
  BOOST_TEST(contains(r.err, "[lr=1 batch=32] exited with status 7"));
}

BOOST_AUTO_TEST_CASE(sweep_runs_at_most_parallel_at_a_time) {
  // 4 runs of 0.5 s, 2 at a time: at least 1 s; all at once would take 0.5 s.
  const auto r = run({"--sweep", "x=1,2,3,4", "--parallel", "2", child, "sleep", "500"}, 30);
  BOOST_TEST(r.exit_code() == 0);
  BOOST_TEST(r.seconds >= 1.0);
  BOOST_TEST(contains(r.out, "sweep of 4 runs, 0 failed"));
}

BOOST_AUTO_TEST_CASE(hosts) {
  // Remote hosts: the per-host commands, nothing started.
  auto r = run({"-np", "4", "--hosts", "node-a,node-b", child, "env"});
  BOOST_TEST(r.exit_code() == 0);
  BOOST_TEST(contains(r.out, "gradus-run -np 4 --hosts node-a,node-b --node-rank 0 --port 29500 -- " + child + " env"));
  BOOST_TEST(contains(r.out, "gradus-run -np 4 --hosts node-a,node-b --node-rank 1 --port 29500 -- " + child + " env"));
  BOOST_TEST(!contains(r.out, "RANK="));
  // Restart options travel with the per-host commands.
  r = run({"-np", "2", "--hosts", "node-a,node-b", "--max-restarts", "2", "--restart-delay", "0.5", child, "env"});
  BOOST_TEST(r.exit_code() == 0);
  BOOST_TEST(contains(r.out, "--node-rank 1 --port 29500 --max-restarts 2 --restart-delay 0.5 -- " + child + " env"), r.out);
  // One host's share: ranks 2 and 3 of 4 here; the master is the first host (the children
  // only print it: nothing connects anywhere).
  r = run({"-np", "5", "--hosts", "node-a,node-b", "--node-rank", "1", "--port", "4321", child, "env"});
  BOOST_TEST(r.exit_code() == 0);
  BOOST_TEST(contains(r.out, "[3] RANK=3 WORLD_SIZE=5 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=node-a MASTER_PORT=4321 "));
  BOOST_TEST(contains(r.out, "[4] RANK=4 WORLD_SIZE=5 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=node-a MASTER_PORT=4321 "));
  BOOST_TEST(lines(r.out).size() == 2u);
  // Local hosts only: all ranks here.
  r = run({"-np", "2", "--hosts", "localhost,127.0.0.1", child, "env"});
  BOOST_TEST(r.exit_code() == 0);
  BOOST_TEST(lines(r.out).size() == 2u);
}

BOOST_AUTO_TEST_CASE(dry_run_and_mpirun_style_arguments) {
  // "-np" before the program is gradus-run's; the program's own "-np" is left alone.
  const auto r = run({"-np", "2", "--port", "4000", "--dry-run", child, "-np", "7"}, 30, {{"TMPDIR", "/tmp"}});
  BOOST_TEST(r.exit_code() == 0);
  // GRADUS_JOB_ID: gradus-run's PID and the port, one per job (the ring refuses ranks of another)
  BOOST_TEST(contains(r.out, "[0] GRADUS_FAULT_FILE=/tmp/gradus-run.XXXXXX/faults GRADUS_JOB_ID=gradus-run-"), r.out);
  BOOST_TEST(contains(r.out, "-4000 GRADUS_ROLE=worker LOCAL_RANK=0 "
                             "LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=4000 RANK=0 WORLD_SIZE=2 " +
                                 child + " -np 7\n"),
             r.out);
  BOOST_TEST(lines(r.out).size() == 2u);
}

BOOST_AUTO_TEST_CASE(usage_errors) {
  for (const strings& args : std::vector<strings>{{"-np", "2"},
                                                  {"-np", "0", child},
                                                  {"--sweep", "lr", child},
                                                  {"--sweep", "lr=1,,2", child},
                                                  {"--sweep", "lr=1", "-np", "2", child},
                                                  {"--node-rank", "1", child},
                                                  {"-np", "1", "--hosts", "a,b", child},
                                                  {"-np", "2", "--max-restarts", "-1", child},
                                                  {"-np", "2", "--max-restarts", "1", "--restart-delay", "-1", child},
                                                  {"--sweep", "lr=1", "--max-restarts", "1", child}}) {
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    BOOST_TEST_CONTEXT(joined) {
      const auto r = run(args);
      BOOST_TEST(r.exit_code() != 0);
      BOOST_TEST(!r.err.empty());
      BOOST_TEST(r.out.find("RANK=") == std::string::npos);
    }
  }
  // Seconds that are not finite or below 0 are refused by name, with the range (NaN passes
  // CLI11's own range checks, and its NonNegativeNumber's message wrote DBL_MAX in 309 digits).
  for (const strings& ovr : std::vector<strings>{{"--timeout", "nan", "[0, 1000000000]"},
                                                  {"--timeout", "-1", "[0, 1000000000]"},
                                                  {"--timeout", "inf", "[0, 1000000000]"},
                                                  {"--grace", "nan", "[0, 3600]"},
                                                  {"--grace", "-0.5", "[0, 3600]"},
                                                  {"--restart-delay", "nan", "[0, 3600]"},
                                                  {"--restart-delay", "-inf", "[0, 3600]"}}) {
    const std::string &option = ovr[0], &value = ovr[1], &range = ovr[2];
    BOOST_TEST_CONTEXT(option << " " << value) {
      const auto r = run({"-np", "2", "--max-restarts", "1", option, value, child});
      BOOST_TEST(r.exit_code() != 0);
      BOOST_TEST(contains(r.err, option + ": expected a finite number of seconds in " + range + ", got " + value),
                 r.err);
      BOOST_TEST(!contains(r.err, "179769313486231570"), r.err);  // DBL_MAX's digits
      BOOST_TEST(r.out.find("RANK=") == std::string::npos);
    }
  }
  const auto r = run({"-np", "2", "/nonexistent/program"});
  BOOST_TEST(r.exit_code() == 127);
  BOOST_TEST(contains(r.err, "cannot start '/nonexistent/program'"));
}

BOOST_AUTO_TEST_CASE(sweep_timeout_and_interrupt) {
  // --timeout limits each run: the sleeping one is stopped, the other succeeds.
  auto r = run({"--sweep", "x=1,2", "--timeout", "1", "--grace", "1", child, "exit-if", "0", "0", "sleep", "20000"}, 20);
  BOOST_TEST(r.exit_code() == 1);
  BOOST_TEST(r.seconds < 6.0);
  BOOST_TEST(std::regex_search(r.out, std::regex(R"(\n0\s+1\s+ok\s)")));
  BOOST_TEST(std::regex_search(r.out, std::regex(R"(\n1\s+2\s+timeout\s)")));
  // SIGINT reaches the running run; the queued ones never start.
  scratch s;
  r = run({"--sweep", "x=1,2,3", "--parallel", "1", child, "pidfile", s.dir.string(), "sleep", "20000"}, 20, {}, 1.0, SIGINT);
  BOOST_TEST(r.exit_code() == 128 + SIGINT);
  BOOST_TEST(r.seconds < 6.0);
  BOOST_TEST(contains(r.out, "sweep of 3 runs, 3 failed"));
  BOOST_TEST(std::regex_search(r.out, std::regex(R"(\n2\s+3\s+not started)")));
  BOOST_TEST(s.pids().size() == 1u);
  for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), label << " is alive");
}

namespace {

// "[label] GRADUS_FAULT_FILE=<path>" lines of a run's stdout: the paths.
strings fault_files(const std::string& out) {
  strings r;
  const std::regex line(R"(\] GRADUS_FAULT_FILE=(\S+))");
  for (const auto& l : lines(out)) {
    std::smatch m;
    if (std::regex_search(l, m, line)) r.push_back(m[1]);
  }
  return r;
}

std::string last_line(const std::string& text) {
  const auto ls = lines(text);
  return ls.empty() ? std::string() : ls.back();
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_killed_gradus_run_takes_its_ranks_along) {
  // SIGKILL cannot be passed on; PR_SET_PDEATHSIG gives each child SIGTERM when gradus-run dies.
  scratch s;
  const auto r = run({"-np", "2", child, "fault-file", "pidfile", s.dir.string(), "sleep", "20000"}, 15, {}, 1.5, SIGKILL);
  BOOST_TEST(WIFSIGNALED(r.status));
  const auto pids = s.pids();
  BOOST_TEST(pids.size() == 2u);
  bool all_gone = false;
  for (int i = 0; i < 100 && !all_gone; ++i) {  // at most 5 s
    all_gone = true;
    for (const auto& [label, pid] : pids) all_gone = all_gone && !scratch::alive(pid);
    if (!all_gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const auto& [label, pid] : pids) BOOST_TEST(!scratch::alive(pid), "rank " << label << " (pid " << pid << ") is alive");
  // The job's private directory outlives a SIGKILLed gradus-run: ours to remove.
  const auto files = fault_files(r.out);
  BOOST_TEST(files.size() == 2u);
  for (const auto& f : files) {
    const fs::path dir = fs::path(f).parent_path();
    if (dir.filename().string().rfind("gradus-run.", 0) == 0) {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  }
}

BOOST_AUTO_TEST_CASE(the_rank_blamed_by_its_neighbour_is_named) {
  // Rank 0 blames rank 1 and exits 1, as a ring communicator's owner would after a timeout.
  for (const std::string kind : {"silent", "gone"}) {
    BOOST_TEST_CONTEXT(kind) {
      scratch s;
      const auto r = run({"-np", "3", "--grace", "2", child, "fault-file", "pidfile", s.dir.string(), "sleep", "300",
                          "blame-if", "0", "1", kind, "exit-if", "0", "1", "sleep", "20000"},
                         15);
      BOOST_TEST(r.exit_code() == 1);  // the first failing rank's status, as before
      BOOST_TEST(r.seconds < 8.0);
      const std::string what = kind == "silent" ? "stopped responding" : "died";
      BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 1 " + what + " (" + kind +
                                         "; noticed by rank 0) \u2014 rank 0 exited with status 1",
                 r.err);
      for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), "rank " << label << " is alive");
      // one file for the job, in a private directory that is gone now
      const auto files = fault_files(r.out);
      BOOST_TEST(files.size() == 3u);
      BOOST_TEST(std::set<std::string>(files.begin(), files.end()).size() == 1u);
      for (const auto& f : files) BOOST_TEST(!fs::exists(fs::path(f).parent_path()), f);
    }
  }
  {  // a rank killed by a signal is named as it was: its neighbour's verdict would only repeat it
    const auto r = run({"-np", "2", child, "sleep", "200", "abort-if", "1", "sleep", "300", "blame-if", "0", "1", "gone",
                        "exit-if", "0", "1", "sleep", "20000"},
                       15);
    BOOST_TEST(r.exit_code() == 128 + SIGABRT);
    BOOST_TEST(contains(last_line(r.err), "gradus-run: failed: rank 1 was killed by signal " + std::to_string(SIGABRT)),
               r.err);
  }
  {  // the failing rank is the one blamed: the usual line
    const auto r = run({"-np", "2", child, "sleep", "200", "blame-if", "0", "1", "gone", "sleep", "300", "exit-if", "1",
                        "4", "sleep", "20000"},
                       15);
    BOOST_TEST(r.exit_code() == 4);
    BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 1 exited with status 4", r.err);
  }
  {  // no verdicts: the usual line; the fault file of a successful job is gone too
    const auto r = run({"-np", "2", child, "fault-file", "exit-if", "1", "2"}, 15);
    BOOST_TEST(r.exit_code() == 2);
    BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 1 exited with status 2", r.err);
    const auto ok = run({"-np", "2", child, "fault-file"}, 15);
    BOOST_TEST(ok.exit_code() == 0);
    for (const auto& f : fault_files(ok.out)) BOOST_TEST(!fs::exists(fs::path(f).parent_path()), f);
  }
  {  // an inherited GRADUS_FAULT_FILE is not passed on (a sweep's runs get none)
    const auto r = run({"--sweep", "x=1", child, "fault-file"}, 15, {{"GRADUS_FAULT_FILE", "/tmp/elsewhere"}});
    BOOST_TEST(contains(r.out, "] GRADUS_FAULT_FILE=-\n"), r.out);
  }
}

// The final line names the process whose failure set the job's off, in its own words, whoever
// exited first; and no process is stopped before it had a moment to say why it failed.
BOOST_AUTO_TEST_CASE(the_final_line_quotes_the_first_failure_in_its_own_words) {
  const std::string own = "gradus: restore_checkpoint 'run/ckpt.npz': the checkpoint holds NaN or Inf";
  // rank 0 fails with a reason; rank 1 blames it ("gone": its connection closed) and exits
  // first, or after it: either way rank 0 is named, quoting its error, not as "died"
  for (const bool blamer_first : {true, false}) {
    BOOST_TEST_CONTEXT((blamer_first ? "the blamer exits first" : "the blamed exits first")) {
      const auto r = run({"-np", "2", "--grace", "3", child, "sleep", blamer_first ? "300" : "0", "say-first", "0", own,
                          "exit-first", "0", "1", "sleep", blamer_first ? "0" : "300", "verdict-first", "1",
                          "rank 1 blames rank 0 (gone): lost the connection to rank 0", "exit-first", "1", "1"},
                         15);
      BOOST_TEST(r.exit_code() == 1);
      BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 0 exited with status 1: " + own, r.err);
    }
  }
  {  // a stage that reports another stage's failure ("failed"): the other is named, in its words
    const auto r = run({"-np", "2", child, "say-first", "1", "gradus: pipeline stage 1 (rank 1): its file is cut",
                        "sleep-first", "200", "verdict-first", "0", "rank 0 blames rank 1 (failed): stage 1 could not restore",
                        "say-first", "0", "gradus: pipeline stage 0 (rank 0): stage 1 could not restore its file",
                        "exit-first", "0", "1", "exit-first", "1", "1"},
                       15);
    BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 1 exited with status 1: gradus: pipeline stage 1 (rank 1): its "
                                   "file is cut",
               r.err);
  }
  {  // rank 0 fails at once; rank 1 says why it fails 400 ms later: its line is not lost to a SIGTERM
    const auto r = run({"-np", "2", child, "exit-first", "0", "1", "sleep-first", "400", "say-first", "1",
                        "gradus: rank 1's own last error", "exit-first", "1", "1", "sleep", "20000"},
                       15);
    BOOST_TEST(contains(r.err, "[1] gradus: rank 1's own last error\n"), r.err);
    BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 0 exited with status 1", r.err);
  }
  {  // a parameter server stopped for good, blamed by the chief: named first, not the chief
    scratch s;
    const auto r = run({"-np", "1", "--ps", "2", "--grace", "1", child, "pidfile", s.dir.string(), "say-first", "0",
                        "gradus: parameter_server: worker 0: server 1 (127.0.0.1:1) is gone: stopped or hung",
                        "verdict-first", "0", "rank 0 blames ps 1 (silent): server 1 is gone", "exit-first", "0", "1",
                        "sleep", "20000"},
                       15);
    BOOST_TEST(r.exit_code() == 1);
    BOOST_TEST(last_line(r.err) == "gradus-run: failed: ps1 stopped responding (silent; noticed by rank 0) \u2014 rank 0 "
                                   "exited with status 1: gradus: parameter_server: worker 0: server 1 (127.0.0.1:1) is "
                                   "gone: stopped or hung",
               r.err);
    for (const auto& [label, pid] : s.pids()) BOOST_TEST(!scratch::alive(pid), label << " is alive");
  }
}

// ---- --max-restarts ---------------------------------------------------------------------------
namespace {

// How many lines of text are exactly `line`.
int count_lines(const std::string& text, const std::string& line) {
  int n = 0;
  for (const auto& l : lines(text)) n += l == line;
  return n;
}

// The lines of text that begin with prefix.
strings lines_starting(const std::string& text, const std::string& prefix) {
  strings r;
  for (const auto& l : lines(text))
    if (l.rfind(prefix, 0) == 0) r.push_back(l);
  return r;
}

void check_all_gone(const scratch& s) {
  for (const auto& [label, list] : s.starts())
    for (const auto& st : list) BOOST_TEST(!scratch::alive(st.pid), label << " (pid " << st.pid << ") is alive");
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_failed_worker_of_a_parameter_server_job_is_restarted_alone) {
  // Rank 1 exits 3 at its first start; rank 0 waits (bounded) until rank 1 has started twice,
  // so it was running all along, and exits 0. (ps0 runs the same commands: it sleeps and exits 0.)
  scratch s;
  const auto dir = s.dir.string();
  const auto r = run({"-np", "2", "--ps", "1", "--max-restarts", "1", "--restart-delay", "0.2", child, "starts", dir,
                      "restart-count",
                      "fault-file", "env", "exit-first", "1", "3", "await", "0", dir, "1", "2", "20000", "sleep", "200"},
                     40);
  BOOST_TEST(r.exit_code() == 0, r.err);
  BOOST_TEST(r.seconds >= 0.2);
  auto st = s.starts();
  BOOST_TEST(st["0"].size() == 1u);
  BOOST_REQUIRE_EQUAL(st["1"].size(), 2u);
  BOOST_TEST(st["1"][0].restart_count == "-");
  BOOST_TEST(st["1"][1].restart_count == "1");
  BOOST_TEST(st["1"][0].pid != st["1"][1].pid);
  BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3; restarting it in 0.2 s (restart 1 of 1)\n"), r.err);
  BOOST_TEST(!contains(r.err, "stopping the other ranks"));
  BOOST_TEST(last_line(r.err) == "gradus-run: finished: the workers exited 0 (restarts used: rank 1: 1 of 1)", r.err);
  // Its output keeps its prefix; the restart sees GRADUS_RESTART_COUNT, the first start and rank 0 do not.
  BOOST_TEST(count_lines(r.out, "[0] GRADUS_RESTART_COUNT=-") == 1);
  BOOST_TEST(count_lines(r.out, "[1] GRADUS_RESTART_COUNT=-") == 1);
  BOOST_TEST(count_lines(r.out, "[1] GRADUS_RESTART_COUNT=1") == 1);
  // The same environment (rank, ports) both times, and the same fault file, gone now.
  const auto env = lines_starting(r.out, "[1] RANK=");
  BOOST_REQUIRE_EQUAL(env.size(), 2u);
  BOOST_TEST(env[0] == env[1]);
  strings files;  // the workers' (ps0 prints its own)
  for (const auto& l : lines(r.out))
    if (l.rfind("[ps0]", 0) != 0)
      for (const auto& f : fault_files(l)) files.push_back(f);
  BOOST_TEST(files.size() == 3u);
  BOOST_TEST(std::set<std::string>(files.begin(), files.end()).size() == 1u);
  for (const auto& f : files) BOOST_TEST(!fs::exists(fs::path(f).parent_path()), f);
  check_all_gone(s);
}

BOOST_AUTO_TEST_CASE(a_rank_that_keeps_failing_uses_up_its_restarts) {
  // A parameter-server job: rank 1 alone, three times.
  {
    scratch s;
    const auto dir = s.dir.string();
    const auto r = run({"-np", "2", "--ps", "1", "--max-restarts", "2", "--restart-delay", "0.1", "--grace", "2", child,
                        "starts", dir, "sleep", "100", "exit-if", "1", "3", "sleep", "20000"},
                       40);
    BOOST_TEST(r.exit_code() == 3);
    BOOST_TEST(r.seconds < 10.0);
    auto st = s.starts();
    BOOST_TEST(st["0"].size() == 1u);
    BOOST_TEST(st["ps0"].size() == 1u);
    BOOST_REQUIRE_EQUAL(st["1"].size(), 3u);
    BOOST_TEST(st["1"][0].restart_count == "-");
    BOOST_TEST(st["1"][1].restart_count == "1");
    BOOST_TEST(st["1"][2].restart_count == "2");
    BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3; restarting it in 0.1 s (restart 1 of 2)\n"), r.err);
    BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3; restarting it in 0.1 s (restart 2 of 2)\n"), r.err);
    BOOST_TEST(!contains(r.err, "(restart 3"));
    BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3; stopping the other ranks\n"), r.err);
    BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 1 exited with status 3 (restarts used: rank 1: 2 of 2)", r.err);
    check_all_gone(s);
  }
  // A collective job: the group, three times; rank 0 is stopped each time.
  {
    scratch s;
    const auto dir = s.dir.string();
    const auto r = run({"-np", "2", "--max-restarts", "2", "--restart-delay", "0.1", "--grace", "2", child, "starts",
                        dir, "sleep", "100", "exit-if", "1", "3", "sleep", "20000"},
                       40);
    BOOST_TEST(r.exit_code() == 3);
    BOOST_TEST(r.seconds < 10.0);
    auto st = s.starts();
    for (const char* rank : {"0", "1"}) {
      BOOST_REQUIRE_EQUAL(st[rank].size(), 3u);
      BOOST_TEST(st[rank][0].restart_count == "-");
      BOOST_TEST(st[rank][1].restart_count == "1");
      BOOST_TEST(st[rank][2].restart_count == "2");
    }
    for (const char* n : {"1", "2"})
      BOOST_TEST(contains(r.err, std::string("gradus-run: rank 1 exited with status 3; stopping the other ranks and "
                                             "restarting all 2 in 0.1 s (restart ") +
                                     n + " of 2)\n"),
                 r.err);
    BOOST_TEST(!contains(r.err, "(restart 3"));
    BOOST_TEST(last_line(r.err) == "gradus-run: failed: rank 1 exited with status 3 (restarts used: 2 of 2, after: rank "
                                   "1 exited with status 3; rank 1 exited with status 3)",
               r.err);
    check_all_gone(s);
  }
}

BOOST_AUTO_TEST_CASE(a_collective_job_restarts_every_rank) {
  // Rank 1 exits 3 at its first start (once rank 0 has started) while rank 0 sleeps:
  // gradus-run stops rank 0, then starts both again (GRADUS_RESTART_COUNT=1), and both exit 0.
  {
    scratch s;
    const auto dir = s.dir.string();
    // restart-count and env before starts: rank 1 exits once rank 0's start is recorded, and
    // gradus-run then stops rank 0, so its lines must already be in the pipe by then
    const auto r = run({"-np", "2", "--max-restarts", "1", "--restart-delay", "0.2", child, "restart-count", "env",
                        "starts", dir, "await", "1", dir, "0", "1", "20000", "exit-first", "1", "3", "sleep-first",
                        "20000"},
                       40);
    BOOST_TEST(r.exit_code() == 0, r.err);
    BOOST_TEST(r.seconds < 8.0);
    auto st = s.starts();
    for (const char* rank : {"0", "1"}) {
      BOOST_REQUIRE_EQUAL(st[rank].size(), 2u);
      BOOST_TEST(st[rank][0].restart_count == "-");
      BOOST_TEST(st[rank][1].restart_count == "1");
      BOOST_TEST(count_lines(r.out, std::string("[") + rank + "] GRADUS_RESTART_COUNT=1") == 1);
      const auto env = lines_starting(r.out, std::string("[") + rank + "] RANK=");  // the same ports both times
      BOOST_REQUIRE_EQUAL(env.size(), 2u);
      BOOST_TEST(env[0] == env[1]);
    }
    BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3; stopping the other ranks and restarting all 2 "
                               "in 0.2 s (restart 1 of 1)\n"),
               r.err);
    BOOST_TEST(last_line(r.err) ==
                   "gradus-run: finished: the workers exited 0 (restarts used: 1 of 1, after: rank 1 exited with status 3)",
               r.err);
    check_all_gone(s);
  }
  // Rank 0 exits 1 after blaming rank 1 in the fault file (as a ring rank does when its
  // neighbour dies): the restart names rank 1.
  {
    scratch s;
    const auto dir = s.dir.string();
    const auto r = run({"-np", "2", "--max-restarts", "1", "--restart-delay", "0.1", child, "starts", dir, "await", "0",
                        dir, "1", "1", "20000", "blame-if", "0", "1", "gone", "exit-first", "0", "1", "sleep-first",
                        "20000"},
                       40);
    BOOST_TEST(r.exit_code() == 0, r.err);
    BOOST_TEST(contains(r.err, "gradus-run: rank 1 died (gone; noticed by rank 0) \u2014 rank 0 exited with status 1; "
                               "stopping the other ranks and restarting all 2 in 0.1 s (restart 1 of 1)\n"),
               r.err);
    for (const char* rank : {"0", "1"}) BOOST_TEST(s.starts()[rank].size() == 2u, rank);
    check_all_gone(s);
  }
}

BOOST_AUTO_TEST_CASE(a_killed_parameter_server_is_restarted) {
  // ps0 SIGKILLs itself at its first start; the worker waits (bounded) for its second start,
  // then exits 0, and the restarted ps0 is stopped as parameter servers are (not restarted).
  scratch s;
  const auto dir = s.dir.string();
  // env before starts: the worker ends the job as soon as ps0's second start is recorded,
  // so the line must already be in the pipe (gradus-run drains it) by then
  const auto r = run({"-np", "1", "--ps", "1", "--max-restarts", "2", "--restart-delay", "0.2", child, "restart-count",
                      "env", "starts", dir, "kill-first", "ps0", std::to_string(SIGKILL), "await", "0", dir, "ps0", "2",
                      "20000", "exit-if", "0", "0", "sleep", "20000"},
                     40);
  BOOST_TEST(r.exit_code() == 0, r.err);
  auto st = s.starts();
  BOOST_TEST(st["0"].size() == 1u);
  BOOST_REQUIRE_EQUAL(st["ps0"].size(), 2u);
  BOOST_TEST(st["ps0"][0].restart_count == "-");
  BOOST_TEST(st["ps0"][1].restart_count == "1");
  BOOST_TEST(contains(r.err, "gradus-run: ps0 was killed by signal " + std::to_string(SIGKILL) + " (" +
                                 ::strsignal(SIGKILL) + "); restarting it in 0.2 s (restart 1 of 2)\n"),
             r.err);
  BOOST_TEST(count_lines(r.out, "[ps0] GRADUS_RESTART_COUNT=1") == 1);
  const auto env = lines_starting(r.out, "[ps0] RANK=");  // GRADUS_PS_INDEX, GRADUS_PS and ports
  BOOST_REQUIRE_EQUAL(env.size(), 2u);
  BOOST_TEST(env[0] == env[1]);
  BOOST_TEST(contains(env[0], " GRADUS_ROLE=ps "));
  BOOST_TEST(last_line(r.err) == "gradus-run: finished: the workers exited 0 (restarts used: ps0: 1 of 2)", r.err);
  check_all_gone(s);
}

// A failure of a job with parameter servers that a restart of the failed process alone
// cannot mend (a bsp worker lost: "ps 0 fails the job" in the fault file) restarts the whole
// job once, as a collective job restarts: every process twice in all, the second time with
// GRADUS_RESTART_SCOPE=job (a fresh start, not a worker rejoining), one restart counted.
BOOST_AUTO_TEST_CASE(a_failure_of_the_whole_job_restarts_every_process_once) {
  scratch s;
  const auto dir = s.dir.string();
  const auto r = run({"-np", "2", "--ps", "1", "--max-restarts", "1", "--restart-delay", "0.1", "--grace", "2", child,
                      "restart-count", "restart-scope", "starts", dir, "kill-first", "1", std::to_string(SIGKILL),
                      "sleep-first", "200", "verdict-first", "ps0", "ps 0 fails the job: worker 1 was lost at clock 3; bsp "
                      "cannot finish a step without it", "exit-first", "ps0", "1", "exit-first", "0", "1", "await", "0",
                      dir, "ps0", "2", "20000", "exit-if", "0", "0", "exit-if", "1", "0", "sleep", "20000"},
                     40);
  BOOST_TEST(r.exit_code() == 0, r.err);
  auto st = s.starts();
  // (the chief waits for ps0's second start: the servers are stopped once the workers are done)
  for (const char* p : {"0", "1", "ps0"}) {
    BOOST_TEST_REQUIRE(st[p].size() == 2u, p << ": " << r.err);
    BOOST_TEST(st[p][1].restart_count == "1", p);
    BOOST_TEST(count_lines(r.out, std::string("[") + p + "] GRADUS_RESTART_SCOPE=job") == 1, p);
  }
  BOOST_TEST(contains(r.err, "gradus-run: rank 1 was killed by signal " + std::to_string(SIGKILL) + " (" + ::strsignal(SIGKILL) +
                                 "); the job cannot go on without a restart of every process (ps0: worker 1 was lost at "
                                 "clock 3; bsp cannot finish a step without it); stopping the other processes and "
                                 "restarting all 3 in 0.1 s (restart 1 of 1)\n"),
             r.err);
  BOOST_TEST(!contains(r.err, "restarting it in"), r.err);  // no process alone
  BOOST_TEST(last_line(r.err) == "gradus-run: finished: the workers exited 0 (restarts used: 1 of 1, after: rank 1 was "
                                 "killed by signal " + std::to_string(SIGKILL) + " (" + ::strsignal(SIGKILL) + "))",
             r.err);
  check_all_gone(s);
}

BOOST_AUTO_TEST_CASE(processes_gradus_run_stops_are_not_restarted) {
  {  // --timeout, one rank ignoring SIGTERM: SIGTERM then SIGKILL, both from gradus-run
    scratch s;
    const auto r = run({"-np", "2", "--max-restarts", "3", "--restart-delay", "0.1", "--timeout", "1", "--grace", "1",
                        child, "starts", s.dir.string(), "ignore-term", "sleep", "20000"},
                       20);
    BOOST_TEST(r.exit_code() == 124);
    BOOST_TEST(r.seconds < 8.0);
    BOOST_TEST(!contains(r.err, "restart"), r.err);
    for (const char* rank : {"0", "1"}) BOOST_TEST(s.starts()[rank].size() == 1u, rank);
    check_all_gone(s);
  }
  {  // SIGINT passed on
    scratch s;
    const auto r = run({"-np", "2", "--max-restarts", "3", "--restart-delay", "0.1", child, "starts", s.dir.string(),
                        "sleep", "20000"},
                       20, {}, 1.0, SIGINT);
    BOOST_TEST(r.exit_code() == 128 + SIGINT);
    BOOST_TEST(!contains(r.err, "restart"), r.err);
    for (const char* rank : {"0", "1"}) BOOST_TEST(s.starts()[rank].size() == 1u, rank);
    check_all_gone(s);
  }
}

BOOST_AUTO_TEST_CASE(a_restart_due_after_the_job_began_to_stop_is_called_off) {
  // Rank 1 fails at once and would restart after 5 s; the job is stopped before that.
  {
    scratch s;
    const auto r = run({"-np", "2", "--max-restarts", "1", "--restart-delay", "5", child, "starts", s.dir.string(),
                        "exit-first", "1", "3", "sleep", "20000"},
                       20, {}, 1.5, SIGINT);
    BOOST_TEST(r.exit_code() == 128 + SIGINT);
    BOOST_TEST(r.seconds < 5.0);
    BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3; stopping the other ranks and restarting all 2 "
                               "in 5 s (restart 1 of 1)\n"),
               r.err);
    BOOST_TEST(last_line(r.err) == "gradus-run: interrupted (restarts used: 1 of 1, after: rank 1 exited with status 3)",
               r.err);
    BOOST_TEST(s.starts()["1"].size() == 1u);
    check_all_gone(s);
  }
  {
    scratch s;
    // (the restart is planned once the failure has settled, 1 s after it, before the timeout)
    const auto r = run({"-np", "2", "--max-restarts", "1", "--restart-delay", "5", "--timeout", "2", child, "starts",
                        s.dir.string(), "exit-first", "1", "3", "sleep", "20000"},
                       20);
    BOOST_TEST(r.exit_code() == 124);
    BOOST_TEST(r.seconds < 5.0);
    BOOST_TEST(last_line(r.err) == "gradus-run: timed out (restarts used: 1 of 1, after: rank 1 exited with status 3)",
               r.err);
    BOOST_TEST(s.starts()["1"].size() == 1u);
    check_all_gone(s);
  }
}

BOOST_AUTO_TEST_CASE(a_parameter_server_job_has_succeeded_once_its_chief_exits_0) {
  // Rank 1 fails at once and would restart after 5 s; the chief exits 0 before that: the
  // restart is called off and the job has succeeded (a TFJob's default success policy).
  {
    scratch s;
    const auto r = run({"-np", "2", "--ps", "1", "--max-restarts", "1", "--restart-delay", "5", child, "starts",
                        s.dir.string(), "exit-first", "1", "3", "sleep", "300", "exit-if", "0", "0", "sleep", "20000"},
                       20);
    BOOST_TEST(r.exit_code() == 0, r.err);
    BOOST_TEST(r.seconds < 5.0);
    BOOST_TEST(s.starts()["1"].size() == 1u);
    BOOST_TEST(last_line(r.err) == "gradus-run: finished: the chief exited 0 (after it: rank 1's restart is called off: "
                                   "the chief finished the job) (restarts used: rank 1: 1 of 1)",
               r.err);
    check_all_gone(s);
  }
  // Rank 1 fails after the chief exited 0: reported, not restarted, no failure of the job.
  {
    scratch s;
    const auto r = run({"-np", "2", "--ps", "1", "--max-restarts", "1", "--restart-delay", "0.1", child, "starts",
                        s.dir.string(), "exit-if", "0", "0", "sleep", "600", "exit-if", "1", "3", "sleep", "20000"},
                       20);
    BOOST_TEST(r.exit_code() == 0, r.err);
    BOOST_TEST(s.starts()["1"].size() == 1u);
    BOOST_TEST(contains(r.err, "gradus-run: rank 1 exited with status 3 after the chief finished the job; not restarted\n"), r.err);
    BOOST_TEST(last_line(r.err) == "gradus-run: finished: the chief exited 0 (after it: rank 1 exited with status 3 after "
                                   "the chief finished the job; not restarted)",
               r.err);
    check_all_gone(s);
  }
  // A worker still running 10 s after the chief exited 0 (a restart that never reached the
  // job) is stopped.
  {
    scratch s;
    const auto r = run({"-np", "2", "--ps", "1", "--grace", "1", child, "starts", s.dir.string(), "exit-if", "0", "0",
                        "sleep", "30000"},
                       40);
    BOOST_TEST(r.exit_code() == 0, r.err);
    BOOST_TEST(r.seconds >= 10.0);
    BOOST_TEST(r.seconds < 20.0);
    BOOST_TEST(last_line(r.err) == "gradus-run: finished: the chief exited 0 (after it: rank 1 still ran 10 s after the "
                                   "chief finished the job; stopping it)",
               r.err);
    check_all_gone(s);
  }
}

BOOST_AUTO_TEST_CASE(a_command_that_starts_its_own_ranks_is_supervised_as_one_process) {
  // mpirun, mpiexec and srun start the ranks themselves: gradus-run gives such a command none
  // of torchrun's variables and restarts it whole (here launcher_child under the name srun).
  scratch s;
  const auto dir = s.dir.string();
  fs::create_directories(s.dir / "launcher_child_as");
  const auto srun = (s.dir / "launcher_child_as" / "srun").string();
  fs::create_symlink(child, srun);
  const auto r = run({"--max-restarts", "2", "--restart-delay", "0.1", srun, "starts", dir, "restart-count", "env",
                      "exit-first", "-", "3"},
                     30);
  BOOST_TEST(r.exit_code() == 0, r.err);
  auto st = s.starts();
  BOOST_REQUIRE_EQUAL(st["-"].size(), 2u);
  BOOST_TEST(st["-"][0].restart_count == "-");
  BOOST_TEST(st["-"][1].restart_count == "1");
  BOOST_TEST(contains(r.err, "gradus-run: srun exited with status 3; restarting it in 0.1 s (restart 1 of 2)\n"), r.err);
  BOOST_TEST(last_line(r.err) ==
                 "gradus-run: finished: the workers exited 0 (restarts used: 1 of 2, after: srun exited with status 3)",
             r.err);
  const auto env = lines_starting(r.out, "[srun] RANK=");
  BOOST_TEST(env.size() == 2u, r.out);
  for (const auto& l : env)
    BOOST_TEST(contains(l, "RANK=- WORLD_SIZE=- LOCAL_RANK=- LOCAL_WORLD_SIZE=- MASTER_ADDR=- MASTER_PORT=- GRADUS_ROLE=-"),
               l);
  check_all_gone(s);
  // -np given to gradus-run instead of to it
  const auto bad = run({"-np", "2", srun, "env"});
  BOOST_TEST(bad.exit_code() != 0);
  BOOST_TEST(contains(bad.err, "srun starts the job's ranks itself: give -np to it, not to gradus-run"), bad.err);
  BOOST_TEST(!contains(bad.out, "RANK="));
}
