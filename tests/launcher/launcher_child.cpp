// The program gradus-run starts in tests/launcher: it does what its arguments say, in order.
//   env                 print "RANK=... WORLD_SIZE=... ..." (unset variables as '-')
//   spec                print gradus::cluster::from_env() in one line
//   args                print its arguments after the program name
//   stderr TEXT         write TEXT and a newline to stderr
//   partial TEXT        write TEXT to stdout without a newline
//   lines N             print N numbered lines
//   pidfile DIR         write its pid to DIR/<label>.pid (label: "ps" GRADUS_PS_INDEX for ps, else RANK)
//   fault-file          print "GRADUS_FAULT_FILE=<its value, or ->"
//   blame-if R PEER KIND  when RANK is R, append "rank R blames rank PEER (KIND): test" to
//                       $GRADUS_FAULT_FILE, one write(2) on an O_APPEND fd, as communicators do
//   exit-if R CODE      exit with CODE when RANK (a sweep: GRADUS_SWEEP_INDEX) is R
//   abort-if R          abort() when RANK is R
//   ignore-term         ignore SIGTERM (gradus-run must SIGKILL it)
//   restart-count       print "GRADUS_RESTART_COUNT=<its value, or ->"
//   starts DIR          append "<pid> <GRADUS_RESTART_COUNT or ->" to DIR/<label>.starts: one line a start
//   exit-first L CODE   exit with CODE when its label is L and it is not a restart (no
//                       GRADUS_RESTART_COUNT, or 0)
//   kill-first L SIG    send itself signal SIG when its label is L and it is not a restart
//   await L DIR M N MS  when its label is L, wait until DIR/M.starts has N lines (M started
//                       N times); exit 95 after MS milliseconds without
//   sleep MS            sleep MS milliseconds
//   sleep-first MS      sleep MS milliseconds when it is not a restart
//   --NAME VALUE        ignored (what gradus-run --sweep appends)
// Exit status 0 at the end.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <gradus/parallel/cluster.hpp>

namespace {

std::string var(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "-";
}

// "ps1" for a parameter server, else RANK.
std::string label() {
  const char* ps = std::getenv("GRADUS_PS_INDEX");
  return ps ? "ps" + std::string(ps) : var("RANK");
}

bool restarted() {
  const char* n = std::getenv("GRADUS_RESTART_COUNT");
  return n && std::atoi(n) > 0;
}

int count_lines(const std::string& file) {
  std::ifstream in(file);
  int n = 0;
  for (std::string l; std::getline(in, l);) ++n;
  return n;
}

int index_of_this_run() {
  const char* sweep = std::getenv("GRADUS_SWEEP_INDEX");
  const char* rank = std::getenv("RANK");
  return std::atoi(sweep ? sweep : rank ? rank : "-1");
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string cmd = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launcher_child: %s needs an argument\n", cmd.c_str());
        std::exit(90);
      }
      return argv[++i];
    };
    if (cmd == "env") {
      std::printf("RANK=%s WORLD_SIZE=%s LOCAL_RANK=%s LOCAL_WORLD_SIZE=%s MASTER_ADDR=%s MASTER_PORT=%s GRADUS_ROLE=%s "
                  "GRADUS_PS=%s GRADUS_PS_INDEX=%s GRADUS_SWEEP_INDEX=%s TF_CONFIG=%s\n",
                  var("RANK").c_str(), var("WORLD_SIZE").c_str(), var("LOCAL_RANK").c_str(),
                  var("LOCAL_WORLD_SIZE").c_str(), var("MASTER_ADDR").c_str(), var("MASTER_PORT").c_str(),
                  var("GRADUS_ROLE").c_str(), var("GRADUS_PS").c_str(), var("GRADUS_PS_INDEX").c_str(),
                  var("GRADUS_SWEEP_INDEX").c_str(), var("TF_CONFIG").c_str());
    } else if (cmd == "spec") {
      try {
        const auto s = gradus::cluster::from_env();
        std::printf("spec source=%s rank=%d world=%d local=%d/%d task=%s/%d ps=%zu rendezvous=%s\n", s.source.c_str(), s.rank,
                    s.world_size, s.local_rank, s.local_world_size, s.task_type.c_str(), s.task_index, s.ps.size(),
                    s.rendezvous().c_str());
      } catch (const gradus::error& e) {
        std::fprintf(stderr, "spec error: %s\n", e.what());
        return 91;
      }
    } else if (cmd == "args") {
      std::string all;
      for (int k = 1; k < argc; ++k) all += std::string(k > 1 ? " " : "") + argv[k];
      std::printf("args %s\n", all.c_str());
    } else if (cmd == "stderr") {
      std::fprintf(stderr, "%s\n", next().c_str());
    } else if (cmd == "partial") {
      std::printf("%s", next().c_str());
    } else if (cmd == "lines") {
      const int n = std::atoi(next().c_str());
      for (int k = 0; k < n; ++k) std::printf("line %d of %d\n", k, n);
    } else if (cmd == "pidfile") {
      const std::string dir = next();
      std::ofstream(dir + "/" + label() + ".pid") << ::getpid() << "\n";
    } else if (cmd == "fault-file") {
      std::printf("GRADUS_FAULT_FILE=%s\n", var("GRADUS_FAULT_FILE").c_str());
    } else if (cmd == "blame-if") {
      const int r = std::atoi(next().c_str());
      const std::string peer = next(), kind = next();
      if (index_of_this_run() == r && !std::getenv("GRADUS_PS_INDEX")) {
        const char* file = std::getenv("GRADUS_FAULT_FILE");
        if (!file) {
          std::fprintf(stderr, "launcher_child: GRADUS_FAULT_FILE is not set\n");
          return 93;
        }
        const std::string line = "rank " + std::to_string(r) + " blames rank " + peer + " (" + kind + "): test\n";
        const int fd = ::open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
          std::perror("launcher_child: blame-if");
          return 94;
        }
        ::close(fd);
      }
    } else if (cmd == "say-first" || cmd == "verdict-first") {
      // a line on stderr (say-first), or a verdict in the fault file (verdict-first), from the
      // process labelled so, at its first start
      const std::string l = next(), text = next();
      if (label() == l && !restarted()) {
        if (cmd == "say-first") {
          std::fprintf(stderr, "%s\n", text.c_str());
          std::fflush(stderr);
        } else {
          const char* file = std::getenv("GRADUS_FAULT_FILE");
          const std::string line = text + "\n";
          const int fd = file ? ::open(file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600) : -1;
          if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
            std::fprintf(stderr, "launcher_child: verdict-first: no fault file to write\n");
            return 94;
          }
          ::close(fd);
        }
      }
    } else if (cmd == "exit-if") {
      const int r = std::atoi(next().c_str());
      const int code = std::atoi(next().c_str());
      if (index_of_this_run() == r && !std::getenv("GRADUS_PS_INDEX")) {
        std::fflush(stdout);
        return code;
      }
    } else if (cmd == "abort-if") {
      const int r = std::atoi(next().c_str());
      if (index_of_this_run() == r && !std::getenv("GRADUS_PS_INDEX")) {
        std::fflush(stdout);
        std::abort();
      }
    } else if (cmd == "restart-count") {
      std::printf("GRADUS_RESTART_COUNT=%s\n", var("GRADUS_RESTART_COUNT").c_str());
    } else if (cmd == "restart-scope") {
      std::printf("GRADUS_RESTART_SCOPE=%s\n", var("GRADUS_RESTART_SCOPE").c_str());
    } else if (cmd == "starts") {
      const std::string file = next() + "/" + label() + ".starts";
      const std::string line = std::to_string(::getpid()) + " " + var("GRADUS_RESTART_COUNT") + "\n";
      const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
      if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
        std::perror("launcher_child: starts");
        return 94;
      }
      ::close(fd);
    } else if (cmd == "exit-first") {
      const std::string l = next();
      const int code = std::atoi(next().c_str());
      if (label() == l && !restarted()) {
        std::fflush(stdout);
        return code;
      }
    } else if (cmd == "kill-first") {
      const std::string l = next();
      const int sig = std::atoi(next().c_str());
      if (label() == l && !restarted()) {
        std::fflush(stdout);
        ::kill(::getpid(), sig);
        std::this_thread::sleep_for(std::chrono::seconds(10));  // a signal it handles or ignores
        return 96;
      }
    } else if (cmd == "await") {
      const std::string l = next(), dir = next(), other = next();
      const int n = std::atoi(next().c_str()), ms = std::atoi(next().c_str());
      if (label() == l) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
        while (count_lines(dir + "/" + other + ".starts") < n) {
          if (std::chrono::steady_clock::now() >= until) {
            std::fprintf(stderr, "launcher_child: %s was not started %d times within %d ms\n", other.c_str(), n, ms);
            return 95;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    } else if (cmd == "ignore-term") {
      ::signal(SIGTERM, SIG_IGN);
    } else if (cmd == "sleep" || cmd == "sleep-first") {
      std::fflush(stdout);
      const int ms = std::atoi(next().c_str());
      if (cmd == "sleep" || !restarted()) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    } else if (cmd.rfind("--", 0) == 0) {
      next();  // a swept option (--lr 0.1): printed by "args", otherwise ignored
    } else {
      std::fprintf(stderr, "launcher_child: unknown command '%s'\n", cmd.c_str());
      return 92;
    }
    std::fflush(stdout);
  }
  return 0;
}
