#pragma once
// Ranks for the communicator tests, as threads of this process (on_threads) or as forked
// processes (fork_ranks, reap), and a scratch directory; every wait is bounded.
#include <gradus/core/error.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace gradus_test {

namespace fs = std::filesystem;
using steady = std::chrono::steady_clock;

// A fresh directory (for ipc:// paths, result files), removed at the end of the test.
struct temp_dir {
  fs::path path;
  temp_dir() {
    std::string tmpl = (fs::temp_directory_path() / "gradus-ring-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  std::string ipc(const std::string& name) const { return "ipc://" + (path / name).string(); }
};

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What ring transport "auto" resolves to between ranks of one host: shared memory, unless
// GRADUS_COMM_TRANSPORT picks another data path (CTest runs the ring tests over each).
inline std::string auto_transport_on_one_host() {
  const char* e = std::getenv("GRADUS_COMM_TRANSPORT");
  const std::string v = e && *e ? e : "shm";
  return v == "zmq" || v == "ipc" ? "zmq-ipc" : v;
}
// How ring_allreduce::addresses() begins under that transport, on one host.
inline std::string auto_address_prefix() {
  const std::string t = auto_transport_on_one_host();
  return t == "shm" ? "shm://@gradus-shm-" : t == "tcp" || t == "zmq-tcp" ? "tcp://" : "ipc://@gradus-ring-";
}

struct rank_result {
  std::optional<std::string> error;  // what() of the first exception
  bool comm_error = false;
  steady::time_point ended{};         // when fn returned or threw
};

// Runs fn(rank) on `world` threads and returns what each one threw.
inline std::vector<rank_result> on_threads(int world, const std::function<void(int)>& fn) {
  std::vector<rank_result> res(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const gradus::comm_error& e) {
        res[r].error = e.what();
        res[r].comm_error = true;
      } catch (const std::exception& e) {
        res[r].error = e.what();
      }
      res[r].ended = steady::now();
    });
  for (auto& t : threads) t.join();
  return res;
}

struct child {
  pid_t pid = -1;
  int rank = 0;
};

// Forks one process per rank running body(rank); a child exits with body's return value,
// 90 on an uncaught exception, never returning into the test framework. Fork before any
// ZeroMQ context or thread exists in this process.
inline std::vector<child> fork_ranks(int world, const std::function<int(int)>& body) {
  std::vector<child> kids;
  std::fflush(nullptr);  // or each child prints what the parent has buffered again
  for (int r = 0; r < world; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      int rc = 90;
      try {
        rc = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());  // the test's failure names the exit code only
      } catch (...) {
        std::fprintf(stderr, "rank %d: an exception that is not a std::exception\n", r);
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    kids.push_back({pid, r});
  }
  return kids;
}

// How a child ended: its exit status (-signal when killed; -1000 when reap had to kill it
// after its limit; -2000 when it was not waited for) and when.
struct ended {
  int status = -2000;
  steady::time_point at;
};

// Waits for the children at the positions `which` (at most `limit`); kills and reaps any
// still running after it. Indexed like `kids`.
inline std::vector<ended> reap(const std::vector<child>& kids, const std::vector<int>& which, std::chrono::seconds limit) {
  std::vector<ended> out(kids.size());
  std::vector<bool> done(kids.size(), true);
  for (int i : which) done[i] = false;
  const auto until = steady::now() + limit;
  std::size_t left = which.size();
  while (left > 0) {
    for (std::size_t i = 0; i < kids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      if (::waitpid(kids[i].pid, &st, WNOHANG) == kids[i].pid) {
        done[i] = true;
        --left;
        out[i] = {WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), steady::now()};
      }
    }
    if (left == 0) break;
    if (steady::now() > until) {
      for (std::size_t i = 0; i < kids.size(); ++i)
        if (!done[i]) {
          ::kill(kids[i].pid, SIGKILL);
          int st = 0;
          ::waitpid(kids[i].pid, &st, 0);
          out[i] = {-1000, steady::now()};  // timed out
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return out;
}

// Every child.
inline std::vector<ended> reap(const std::vector<child>& kids, std::chrono::seconds limit) {
  std::vector<int> all(kids.size());
  for (std::size_t i = 0; i < kids.size(); ++i) all[i] = static_cast<int>(i);
  return reap(kids, all, limit);
}

}  // namespace gradus_test
