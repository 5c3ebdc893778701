// gradus-run: start a data-parallel job's processes on this host, or a hyper-parameter
// sweep of independent single-process runs. See tools/gradus-run/README.md and --help.
//
//   gradus-run -np N [--ps M] [--hosts h1,h2 [--node-rank R]] [--port P] [--timeout S] [--max-restarts K]
//              program args...
//   gradus-run --sweep 'lr=0.01,0.05,0.1' [--sweep 'batch=32,64'] [--parallel K] program args...
//
// Each child gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), which gradus::cluster::from_env() reads. Each child runs in
// its own process group with its stdout and stderr on pipes; a poll loop copies every line
// to gradus-run's own stdout/stderr behind a "[rank] " prefix, one write() per line so that
// lines of different ranks never mix. A rank that fails (non-zero exit, signal) stops the
// others: SIGTERM to their process groups, SIGKILL after --grace seconds.
//
// Children die with gradus-run: each is started (fork, from the main thread: gradus-run has
// no other) with PR_SET_PDEATHSIG = SIGTERM, so that a SIGKILLed launcher leaves no ranks
// training on. A job's workers get GRADUS_FAULT_FILE, a file in a private directory made for
// the job (removed on exit), where a ring communicator writes "rank A blames rank B (gone|
// silent): ..." when a peer dies or stops answering; when the job fails, the final line names
// the blamed rank rather than the neighbour that noticed first.
//
// With --max-restarts K, a job with parameter servers starts a process (worker or server)
// that fails by itself again, alone, up to K times: same argv, same environment, plus
// GRADUS_RESTART_COUNT (1, 2, ...) so that it knows to resume from its checkpoint; the others
// run on. A collective job (no --ps: a ring, MPI-style or pipeline job, whose ranks cannot
// take one restarted rank back into a collective) restarts as a group, torchrun's rule: every
// rank stopped, then all started again with GRADUS_RESTART_COUNT, up to K times in all. A
// process gradus-run stopped is never restarted, and nothing is restarted once the job is
// stopping.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

extern char** environ;

namespace {

using steady = std::chrono::steady_clock;
using seconds = std::chrono::duration<double>;

// ---- signals: handlers only write the signal number to a self-pipe ------------------------
int signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  [[maybe_unused]] const auto n = ::write(signal_pipe[1], &c, 1);
  errno = saved;
}

void install_signal_handlers() {
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe2 failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

// ---- output ---------------------------------------------------------------------------------
void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  for (int tries = 0; off < s.size() && tries < 1000000; ++tries) {
    const auto n = ::write(fd, s.data() + off, s.size() - off);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
      return;  // our own stdout is gone: nothing to do about it
    }
  }
}

void say(const std::string& s) { write_all(2, "gradus-run: " + s + "\n"); }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

// 1, 0.5, 2.25: seconds as an option takes them.
std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+=./:,@%") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// ---- one child process ------------------------------------------------------------------------
constexpr std::size_t max_line = 64 * 1024;  // a longer line is passed on in pieces

struct stream {
  int fd = -1;   // read end of the child's pipe; -1 once closed
  int to = 1;    // our fd the lines go to
  std::string pending;
};

struct child {
  std::string label;  // "0", "ps1", "lr=0.1 batch=32"
  std::vector<std::string> argv;
  std::map<std::string, std::string> env_set;  // on top of the inherited environment
  bool is_ps = false;
  bool is_launcher = false;  // mpirun, srun...: it starts the job's ranks itself
  pid_t pid = -1;
  bool started = false, running = false, done = false;
  int status = 0;
  bool stopped_by_us = false;        // we sent it SIGTERM/SIGKILL
  bool timed_out = false;
  std::optional<steady::time_point> kill_at;  // SIGKILL then, unless it has exited
  int restarts = 0;                           // how often it was started again (--max-restarts)
  std::optional<steady::time_point> restart_at;  // failed, to be started again then
  steady::time_point start_time, end_time;
  stream out, err;

  bool failed() const { return done && !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }
  bool has_open_streams() const { return out.fd >= 0 || err.fd >= 0; }
};

// Variables gradus-run owns: removed from the inherited environment before its own are set.
// TF_CONFIG goes too: cluster::from_env() would read it before RANK and friends.
const std::set<std::string> managed_vars = {"RANK",        "WORLD_SIZE", "LOCAL_RANK",      "LOCAL_WORLD_SIZE",
                                            "MASTER_ADDR", "MASTER_PORT", "GRADUS_ROLE",    "GRADUS_PS",
                                            "GRADUS_PS_INDEX", "GRADUS_SWEEP_INDEX", "GRADUS_SWEEP", "TF_CONFIG",
                                            "GRADUS_FAULT_FILE", "GRADUS_RESTART_COUNT"};

std::vector<std::string> child_environment(const child& c) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto name = kv.substr(0, kv.find('='));
    if (!managed_vars.count(name) && !c.env_set.count(name)) env.push_back(kv);
  }
  for (const auto& [k, v] : c.env_set) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (auto& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// Starts c: stdin from /dev/null, stdout and stderr on pipes, its own process group, default
// signal dispositions, SIGTERM when gradus-run dies (Linux). Returns 0 or the errno of the
// failure. fork, not posix_spawn: PR_SET_PDEATHSIG must be set between fork and exec.
// The signal that PR_SET_PDEATHSIG names is sent when the thread that forked exits, so every
// child is started from the main thread (gradus-run has no other thread).
int spawn(child& c) {
  int out[2], err[2], exec_err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return errno;
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(out[0]);
    ::close(out[1]);
    return e;
  }
  if (::pipe2(exec_err, O_CLOEXEC) != 0) {
    const int e = errno;
    for (const int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return e;
  }
  const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Everything the child needs is made before fork: between fork and exec it only makes
  // system calls.
  auto argv = c.argv;
  auto envv = child_environment(c);
  auto argp = c_strings(argv);
  auto envp = c_strings(envv);
  const pid_t launcher = ::getpid();
  sigset_t all, old;
  sigfillset(&all);
  ::sigprocmask(SIG_SETMASK, &all, &old);  // no handler of ours runs in the child
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (const int sig : {SIGINT, SIGTERM, SIGCHLD, SIGHUP, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
#if defined(__linux__)
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(128 + SIGTERM);  // gradus-run died before prctl
#endif
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    const auto place = [](int from, int to) {
      if (from == to) return ::fcntl(to, F_SETFD, 0) == 0;  // dup2 would keep O_CLOEXEC
      return ::dup2(from, to) == to;
    };
    int e = 0;
    if (devnull < 0 || !place(devnull, 0) || !place(out[1], 1) || !place(err[1], 2)) e = errno ? errno : EBADF;
    if (e == 0) {
      ::execvpe(argp[0], argp.data(), envp.data());
      e = errno;
    }
    [[maybe_unused]] const auto n = ::write(exec_err[1], &e, sizeof e);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::sigprocmask(SIG_SETMASK, &old, nullptr);
  for (const int fd : {out[1], err[1], exec_err[1]}) ::close(fd);
  if (devnull >= 0) ::close(devnull);
  int e = 0;
  if (pid < 0) {
    e = fork_errno;
  } else {
    ::setpgid(pid, pid);  // as the child does: whichever runs first, kill(-pid) finds the group
    // The exec's outcome: EOF (exec closed the pipe) or the child's errno.
    ssize_t n = -1;
    for (int tries = 0; tries < 1000 && n < 0; ++tries) {
      n = ::read(exec_err[0], &e, sizeof e);
      if (n < 0 && errno != EINTR) break;
    }
    if (n != static_cast<ssize_t>(sizeof e)) e = 0;
    if (e != 0) {
      int status = 0;
      for (int tries = 0; tries < 1000 && ::waitpid(pid, &status, 0) < 0 && errno == EINTR; ++tries) {
      }
    }
  }
  ::close(exec_err[0]);
  if (e != 0) {
    ::close(out[0]);
    ::close(err[0]);
    return e;
  }
  c.pid = pid;
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  c.out = {out[0], 1, {}};
  c.err = {err[0], 2, {}};
  c.started = c.running = true;
  c.start_time = steady::now();
  return 0;
}

void signal_child(child& c, int sig, double grace_s) {
  if (!c.running) return;
  ::kill(-c.pid, sig);  // its process group: the program and whatever it started
  c.stopped_by_us = true;
  if (sig != SIGKILL && !c.kill_at)
    c.kill_at = steady::now() + std::chrono::duration_cast<steady::duration>(seconds(grace_s));
}

void emit(const std::string& label, stream& s, bool at_eof) {
  std::size_t start = 0;
  std::string out;
  for (;;) {
    const auto nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    out += "[" + label + "] ";
    out.append(s.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (s.pending.size() >= max_line || (at_eof && !s.pending.empty())) {
    out += "[" + label + "] " + s.pending + "\n";
    s.pending.clear();
  }
  if (!out.empty()) write_all(s.to, out);
}

void read_stream(const std::string& label, stream& s) {
  char buf[65536];
  for (int i = 0; i < 16; ++i) {  // bounded: other children get their turn
    const auto n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.pending.append(buf, static_cast<std::size_t>(n));
      emit(label, s, false);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    ::close(s.fd);  // EOF or error
    s.fd = -1;
    emit(label, s, true);
    return;
  }
}

void close_stream(const std::string& label, stream& s) {
  if (s.fd < 0) return;
  ::close(s.fd);
  s.fd = -1;
  emit(label, s, true);
}

// Before a restarted child's new pipes replace the old ones: what its last run wrote and we
// have not read yet is passed on first (bounded: a grandchild may hold the pipe and write on).
void drain_stream(const std::string& label, stream& s) {
  for (int i = 0; i < 64 && s.fd >= 0; ++i) {
    pollfd p{s.fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    read_stream(label, s);
  }
  close_stream(label, s);
}

// Waits up to timeout for output or a signal, copies output, reaps exited children.
// Returns the signals received (SIGINT/SIGTERM/SIGHUP), and appends newly finished children.
std::vector<int> pump(std::vector<child>& cs, steady::duration timeout, std::vector<child*>& finished) {
  std::vector<pollfd> fds{{signal_pipe[0], POLLIN, 0}};
  std::vector<std::pair<child*, stream*>> owners{{nullptr, nullptr}};
  for (auto& c : cs)
    for (stream* s : {&c.out, &c.err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&c, s);
      }
  const auto ms = std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count());
  const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long long>(ms, 1000)));
  std::vector<int> signals;
  if (n > 0) {
    for (std::size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents) read_stream(owners[i].first->label, *owners[i].second);
    if (fds[0].revents) {
      char sigs[64];
      const auto k = ::read(signal_pipe[0], sigs, sizeof sigs);
      for (ssize_t i = 0; i < k; ++i)
        if (sigs[i] != SIGCHLD) signals.push_back(sigs[i]);
    }
  }
  for (auto& c : cs) {
    if (!c.running) continue;
    int status = 0;
    const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
    if (r == c.pid) {
      c.running = false;
      c.done = true;
      c.status = status;
      c.end_time = steady::now();
      finished.push_back(&c);
    }
  }
  return signals;
}

// SIGKILL those whose grace period is over.
void enforce_kill_deadlines(std::vector<child>& cs) {
  const auto now = steady::now();
  for (auto& c : cs)
    if (c.running && c.kill_at && now >= *c.kill_at) {
      ::kill(-c.pid, SIGKILL);
      c.kill_at.reset();
    }
}

// After a child's exit its pipes may still be held by a process it started outside its
// group; stop waiting for them after the grace period.
void close_orphaned_streams(std::vector<child>& cs, double grace_s) {
  const auto now = steady::now();
  for (auto& c : cs)
    if (c.done && c.has_open_streams() && seconds(now - c.end_time).count() > grace_s) {
      close_stream(c.label, c.out);
      close_stream(c.label, c.err);
    }
}

// ---- ports --------------------------------------------------------------------------------
// n distinct free TCP ports on 127.0.0.1 (bind to port 0, read it back; all sockets stay
// open until every port is known, so the n are distinct).
std::vector<int> free_ports(int n) {
  std::vector<int> socks, ports;
  for (int i = 0; i < n; ++i) {
    const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) break;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ::close(s);
      break;
    }
    socks.push_back(s);
    ports.push_back(ntohs(a.sin_port));
  }
  for (const int s : socks) ::close(s);
  if (static_cast<int>(ports.size()) != n) throw std::runtime_error("cannot find a free TCP port on 127.0.0.1");
  return ports;
}

bool is_local_host(const std::string& h) {
  if (h == "localhost" || h == "::1" || h.rfind("127.", 0) == 0) return true;
  char name[256] = {};
  return ::gethostname(name, sizeof name - 1) == 0 && h == name;
}

// ---- faults: who stopped responding --------------------------------------------------------
// A private directory for the job (mkdtemp, mode 0700) holding the file that the workers'
// communicators append their verdicts to; removed with everything in it when gradus-run
// returns or throws (a SIGKILLed gradus-run leaves it behind: it is small).
struct job_directory {
  std::filesystem::path dir, fault_file;
  job_directory() {
    const char* t = std::getenv("TMPDIR");
    std::string templ = (t && *t ? std::string(t) : std::string("/tmp")) + "/gradus-run.XXXXXX";
    if (!::mkdtemp(templ.data()))
      throw std::runtime_error("cannot create a private directory " + templ + ": " + std::strerror(errno) +
                               " (set TMPDIR to a writable directory)");
    dir = templ;
    fault_file = dir / "faults";
    const int fd = ::open(fault_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
  }
  job_directory(const job_directory&) = delete;
  job_directory& operator=(const job_directory&) = delete;
  ~job_directory() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

// What dry runs show for GRADUS_FAULT_FILE: where it would be.
std::string fault_file_pattern() {
  const char* t = std::getenv("TMPDIR");
  return (t && *t ? std::string(t) : std::string("/tmp")) + "/gradus-run.XXXXXX/faults";
}

// One line of the fault file: "rank <observer> blames rank <peer> (<gone|silent>): <message>".
struct blame {
  std::string observer, peer, kind;
};

std::optional<blame> parse_blame(const std::string& line) {
  const auto digits = [&](std::size_t& p, std::string& out) {
    const auto b = p;
    while (p < line.size() && p - b < 9 && line[p] >= '0' && line[p] <= '9') ++p;
    out = line.substr(b, p - b);
    return !out.empty();
  };
  const auto literal = [&](std::size_t& p, const std::string& text) {
    if (line.compare(p, text.size(), text) != 0) return false;
    p += text.size();
    return true;
  };
  blame b;
  std::size_t p = 0;
  if (!literal(p, "rank ") || !digits(p, b.observer) || !literal(p, " blames rank ") || !digits(p, b.peer) ||
      !literal(p, " ("))
    return std::nullopt;
  if (literal(p, "gone): ")) {
    b.kind = "gone";
  } else if (literal(p, "silent): ")) {
    b.kind = "silent";
  } else {
    return std::nullopt;
  }
  return b;
}

// The first verdict in the fault file (in the order they were appended) from byte `from` on,
// if any.
std::optional<blame> first_blame(const std::filesystem::path& file, std::uintmax_t from) {
  std::ifstream in(file);
  in.seekg(static_cast<std::streamoff>(from));
  std::string line;
  for (int n = 0; n < 100000 && std::getline(in, line); ++n)
    if (auto b = parse_blame(line)) return b;
  return std::nullopt;
}

// ---- options --------------------------------------------------------------------------------
struct options {
  int np = 1;
  int ps = 0;
  std::vector<std::string> hosts;
  int node_rank = -1;
  std::string master_addr;
  int port = 0;
  double timeout = 0;
  double grace = 5;
  std::vector<std::string> sweeps;
  int parallel = 0;
  bool dry_run = false;
  int max_restarts = 0;
  double restart_delay = 1;
  std::vector<std::string> command;
};

// A program that starts a job's ranks itself (Open MPI's mpirun, MPICH's mpiexec, Slurm's
// srun): gradus-run supervises it as the job's one process, without torchrun's variables
// (its ranks take theirs from it), so that --max-restarts restarts the whole job.
bool starts_its_own_ranks(const std::string& program) {
  const auto name = std::filesystem::path(program).filename().string();
  return name == "mpirun" || name == "mpiexec" || name == "orterun" || name == "srun";
}

// The job's processes on this host.
std::vector<child> plan_job(const options& o) {
  if (starts_its_own_ranks(o.command.front())) {
    child c;
    c.label = std::filesystem::path(o.command.front()).filename().string();
    c.is_launcher = true;
    c.argv = o.command;
    return {c};
  }
  int first_rank = 0, local_n = o.np, nodes = 1;
  std::string master = "127.0.0.1";
  int port = o.port;
  if (o.node_rank >= 0) {
    nodes = static_cast<int>(o.hosts.size());
    const int base = o.np / nodes, extra = o.np % nodes;
    local_n = base + (o.node_rank < extra ? 1 : 0);
    first_rank = o.node_rank * base + std::min(o.node_rank, extra);
    master = o.master_addr.empty() ? o.hosts.front() : o.master_addr;
    if (port == 0) port = 29500;
  } else if (!o.master_addr.empty()) {
    master = o.master_addr;
  }
  const bool ps_here = o.node_rank <= 0;
  std::vector<int> probed;
  if (port == 0) {
    probed = free_ports(1 + o.ps);
    port = probed[0];
  }
  std::string ps_list;
  for (int i = 0; i < o.ps; ++i) {
    const int p = probed.empty() ? port + 1 + i : probed[static_cast<std::size_t>(1 + i)];
    ps_list += (i ? "," : "") + (o.node_rank >= 0 ? o.hosts.front() : std::string("127.0.0.1")) + ":" + std::to_string(p);
  }
  std::vector<child> cs;
  for (int i = 0; i < local_n; ++i) {
    child c;
    c.label = std::to_string(first_rank + i);
    c.argv = o.command;
    c.env_set = {{"RANK", std::to_string(first_rank + i)},
                 {"WORLD_SIZE", std::to_string(o.np)},
                 {"LOCAL_RANK", std::to_string(i)},
                 {"LOCAL_WORLD_SIZE", std::to_string(local_n)},
                 {"MASTER_ADDR", master},
                 {"MASTER_PORT", std::to_string(port)},
                 {"GRADUS_ROLE", "worker"}};
    if (o.ps > 0) c.env_set["GRADUS_PS"] = ps_list;
    cs.push_back(std::move(c));
  }
  for (int i = 0; ps_here && i < o.ps; ++i) {
    child c;
    c.label = "ps" + std::to_string(i);
    c.is_ps = true;
    c.argv = o.command;
    c.env_set = {{"WORLD_SIZE", std::to_string(o.np)},     {"MASTER_ADDR", master},
                 {"MASTER_PORT", std::to_string(port)},    {"GRADUS_ROLE", "ps"},
                 {"GRADUS_PS_INDEX", std::to_string(i)},   {"GRADUS_PS", ps_list}};
    cs.push_back(std::move(c));
  }
  return cs;
}

void print_dry_run(const std::vector<child>& cs) {
  std::string out;
  for (const auto& c : cs) {
    out.append("[").append(c.label).append("]");
    for (const auto& [k, v] : c.env_set) out.append(" ").append(k).append("=").append(shell_quote(v));
    for (const auto& a : c.argv) out.append(" ").append(shell_quote(a));
    out.append("\n");
  }
  write_all(1, out);
}

// "rank 1" or "ps0": how the lines about one process name it.
std::string process_name(const child& c) { return c.is_ps || c.is_launcher ? c.label : "rank " + c.label; }

// "rank 1: 2 of 2, ps0: 1 of 2": the processes that were restarted; "" when none was.
std::string restarts_used(const std::vector<child>& cs, int max_restarts) {
  std::string used;
  for (const auto& c : cs)
    if (c.restarts > 0)
      used += (used.empty() ? "" : ", ") + process_name(c) + ": " + std::to_string(c.restarts) + " of " +
              std::to_string(max_restarts);
  return used;
}

// A job: every process at once; the first failure stops the rest, unless --max-restarts lets
// the failed process start again by itself. fault_file: where the workers' communicators
// write whom they blame (empty: not read).
int run_job(std::vector<child>& cs, const options& o, const std::filesystem::path& fault_file) {
  const auto job_start = steady::now();
  std::optional<steady::time_point> deadline;
  if (o.timeout > 0) deadline = job_start + std::chrono::duration_cast<steady::duration>(seconds(o.timeout));
  const auto restart_delay = std::chrono::duration_cast<steady::duration>(seconds(o.restart_delay));
  child* failure = nullptr;
  std::optional<blame> blamed;  // the fault file's first verdict when the failure was seen
  std::uintmax_t verdicts_from = 0;  // the fault file's length at the latest restart: older verdicts are dealt with
  int spawn_error = 0;
  int interrupted = 0;
  bool timed_out = false, ps_stopping = false;

  const auto stop_all = [&](int sig) {
    for (auto& c : cs) signal_child(c, sig, o.grace);
  };
  const auto stopping = [&] { return failure || interrupted || timed_out || spawn_error; };
  // Whether a process that failed by itself may start again: restarts left, the job not
  // stopping, and (a parameter server) the workers still there to serve.
  // A collective job (no parameter servers) restarts every rank together: group_restarts
  // counts those restarts, group_causes says what set off each.
  const bool group = o.ps == 0;
  int group_restarts = 0;
  std::string group_causes;
  bool regrouping = false;     // the ranks are being stopped for a group restart
  bool regroup_due = false;    // every rank has exited: all start again at regroup_at
  steady::time_point regroup_at{};
  const auto restartable = [&](const child& c) {
    if (group) return group_restarts < o.max_restarts && !stopping();
    return c.restarts < o.max_restarts && !stopping() && !(c.is_ps && ps_stopping);
  };
  for (auto& c : cs) {
    if (const int e = spawn(c)) {
      spawn_error = e;
      say("cannot start '" + c.argv[0] + "' for rank " + c.label + ": " + std::strerror(e));
      stop_all(SIGTERM);
      break;
    }
  }
  const auto busy = [&] {
    return std::any_of(cs.begin(), cs.end(),
                       [](const child& c) { return c.running || c.has_open_streams() || c.restart_at; }) ||
           regrouping;
  };
  while (busy()) {
    auto wait = steady::duration(std::chrono::milliseconds(200));
    for (const auto& c : cs)
      if (c.restart_at) wait = std::min(wait, *c.restart_at - steady::now());
    if (regroup_due) wait = std::min(wait, regroup_at - steady::now());
    std::vector<child*> finished;
    const auto signals = pump(cs, wait, finished);
    for (const int sig : signals) {
      if (!interrupted) {
        interrupted = sig;
        say(std::string("received ") + ::strsignal(sig) + "; passing it on to the ranks");
        for (auto& c : cs) signal_child(c, sig == SIGHUP ? SIGTERM : sig, o.grace);
      } else {
        say("second signal: killing the ranks");
        stop_all(SIGKILL);
      }
    }
    // A process that failed by itself starts again while it has restarts left; otherwise it is
    // the job's failure. Of several failures reaped together, one killed by a signal of its
    // own first: the others are more likely its neighbours, failing because of it. While a
    // group restart stops the ranks, their failures are its consequences, not new causes.
    if (!failure && !interrupted && !timed_out && !regrouping) {
      std::vector<child*> failed, to_restart;
      for (child* c : finished)
        if (c->failed() && !c->stopped_by_us) (restartable(*c) ? to_restart : failed).push_back(c);
      for (child* c : failed)
        if (!failure || (WIFSIGNALED(c->status) && !WIFSIGNALED(failure->status))) failure = c;
      if (failure) {
        // Read now: verdicts written after the others are stopped would blame their victims.
        if (!fault_file.empty()) blamed = first_blame(fault_file, verdicts_from);
        say(process_name(*failure) + " " + describe_status(failure->status) + "; stopping the other ranks");
        stop_all(SIGTERM);
        to_restart.clear();  // the job is stopping
      }
      if (group && !to_restart.empty()) {
        child* cause = to_restart.front();
        for (child* c : to_restart)
          if (WIFSIGNALED(c->status) && !WIFSIGNALED(cause->status)) cause = c;
        std::string why = process_name(*cause) + " " + describe_status(cause->status);
        // A rank that exited because its neighbour died or went silent: the neighbour is the cause.
        if (const auto b = fault_file.empty() ? std::nullopt : first_blame(fault_file, verdicts_from);
            b && !WIFSIGNALED(cause->status) && b->peer != cause->label)
          why = "rank " + b->peer + (b->kind == "silent" ? " stopped responding" : " died") + " (noticed by rank " +
                b->observer + ")";
        ++group_restarts;
        group_causes += (group_causes.empty() ? "" : "; ") + why;
        regrouping = true;
        for (child* c : to_restart) ::kill(-c->pid, SIGKILL);  // helpers it left would hold its ports
        if (!fault_file.empty()) {
          std::error_code ec;
          const auto length = std::filesystem::file_size(fault_file, ec);
          if (!ec) verdicts_from = length;
        }
        say(why + (cs.size() == 1 ? "; restarting it in " : "; stopping the other ranks and restarting all " +
                                                                std::to_string(cs.size()) + " in ") +
            format_seconds(o.restart_delay) + " s (restart " + std::to_string(group_restarts) + " of " +
            std::to_string(o.max_restarts) + ")");
        stop_all(SIGTERM);
        to_restart.clear();
      }
      for (child* c : to_restart) {
        ++c->restarts;
        c->restart_at = steady::now() + restart_delay;
        // What is left of its process group (a helper it started) would hold its ports.
        ::kill(-c->pid, SIGKILL);
        if (!fault_file.empty()) {
          std::error_code ec;
          const auto length = std::filesystem::file_size(fault_file, ec);
          if (!ec) verdicts_from = length;
        }
        say(process_name(*c) + " " + describe_status(c->status) + "; restarting it in " +
            format_seconds(o.restart_delay) + " s (restart " +
            std::to_string(c->restarts) + " of " + std::to_string(o.max_restarts) + ")");
      }
    }
    // Workers all done and fine: the parameter servers have served their purpose.
    if (!ps_stopping &&
        std::none_of(cs.begin(), cs.end(), [](const child& c) { return !c.is_ps && (!c.done || c.restart_at); }) &&
        std::any_of(cs.begin(), cs.end(), [](const child& c) { return c.is_ps && (c.running || c.restart_at); })) {
      ps_stopping = true;
      for (auto& c : cs)
        if (c.is_ps) signal_child(c, SIGTERM, o.grace);
    }
    if (deadline && !timed_out && steady::now() >= *deadline) {
      timed_out = true;
      say("timeout: the job ran past " + std::to_string(static_cast<long>(o.timeout)) + " s; stopping the ranks");
      stop_all(SIGTERM);
    }
    // A group restart: once every rank has exited, and the delay has passed, all start again
    // (same argv and environment plus GRADUS_RESTART_COUNT); called off when the job stops.
    if (regrouping) {
      if (stopping()) {
        regrouping = regroup_due = false;
      } else if (std::none_of(cs.begin(), cs.end(), [](const child& c) { return c.running; })) {
        if (!regroup_due) {
          regroup_due = true;
          regroup_at = steady::now() + restart_delay;
        }
        if (steady::now() >= regroup_at) {
          regrouping = regroup_due = false;
          for (auto& c : cs) {
            drain_stream(c.label, c.out);
            drain_stream(c.label, c.err);
            c.env_set["GRADUS_RESTART_COUNT"] = std::to_string(group_restarts);
            c.stopped_by_us = c.timed_out = false;
            c.kill_at.reset();
            if (const int e = spawn(c)) {
              spawn_error = e;
              say("cannot restart '" + c.argv[0] + "' for " + process_name(c) + ": " + std::strerror(e) +
                  "; stopping the other ranks");
              stop_all(SIGTERM);
              break;
            }
            c.done = false;
            c.status = 0;
          }
        }
      }
    }
    // Restarts that are due, with the same argv and environment plus GRADUS_RESTART_COUNT;
    // called off when the job has begun to stop since they were planned.
    for (auto& c : cs) {
      if (!c.restart_at) continue;
      if (stopping() || (c.is_ps && ps_stopping)) {
        c.restart_at.reset();
        continue;
      }
      if (steady::now() < *c.restart_at) continue;
      c.restart_at.reset();
      drain_stream(c.label, c.out);
      drain_stream(c.label, c.err);
      c.env_set["GRADUS_RESTART_COUNT"] = std::to_string(c.restarts);
      c.stopped_by_us = c.timed_out = false;
      c.kill_at.reset();
      if (const int e = spawn(c)) {
        spawn_error = e;
        say("cannot restart '" + c.argv[0] + "' for " + process_name(c) + ": " + std::strerror(e) +
            "; stopping the other ranks");
        stop_all(SIGTERM);
        continue;
      }
      c.done = false;
      c.status = 0;
    }
    enforce_kill_deadlines(cs);
    close_orphaned_streams(cs, o.grace);
  }
  const auto used = group ? (group_restarts ? std::to_string(group_restarts) + " of " + std::to_string(o.max_restarts) +
                                                   ", after: " + group_causes
                                             : std::string())
                         : restarts_used(cs, o.max_restarts);
  const auto restarts_note = used.empty() ? std::string() : " (restarts used: " + used + ")";
  if (spawn_error) {
    if (!used.empty()) say("failed" + restarts_note);
    return 127;
  }
  if (failure) {
    // A rank that was killed by a signal is its own explanation; otherwise the rank blamed by
    // the first verdict, if it is not the failed rank itself.
    std::string culprit;
    if (blamed && !WIFSIGNALED(failure->status) && blamed->peer != failure->label) {
      culprit = "rank " + blamed->peer + (blamed->kind == "silent" ? " stopped responding" : " died") + " (" +
                blamed->kind + "; noticed by rank " + blamed->observer + ")";
      for (const auto& c : cs)
        if (!c.is_ps && c.label == blamed->peer && c.failed() && !c.stopped_by_us && WIFSIGNALED(c.status))
          culprit += ", it " + describe_status(c.status);
      culprit += " \u2014 ";
    }
    say("failed: " + culprit + process_name(*failure) + " " + describe_status(failure->status) + restarts_note);
    if (WIFEXITED(failure->status)) return WEXITSTATUS(failure->status);
    return 128 + WTERMSIG(failure->status);
  }
  if (timed_out) {
    if (!used.empty()) say("timed out" + restarts_note);
    return 124;
  }
  if (interrupted) {
    if (!used.empty()) say("interrupted" + restarts_note);
    return 128 + interrupted;
  }
  // A parameter server that failed by itself (not stopped by us, not restarted) is a failure
  // too; handled above. Everything exited 0.
  if (!used.empty()) say("finished: the workers exited 0" + restarts_note);
  return 0;
}

// ---- sweeps ---------------------------------------------------------------------------------
struct sweep_axis {
  std::string name;
  std::vector<std::string> values;
};

sweep_axis parse_sweep(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0)
    throw CLI::ValidationError("--sweep", "'" + text + "' is not name=v1,v2,... (e.g. lr=0.01,0.1)");
  sweep_axis a{text.substr(0, eq), {}};
  if (a.name.front() == '-' || a.name.find_first_of(" \t,") != std::string::npos)
    throw CLI::ValidationError("--sweep", "'" + a.name + "' is not an option name (write lr=..., not --lr=...)");
  const auto list = text.substr(eq + 1);
  std::size_t b = 0;
  while (b <= list.size()) {
    auto comma = list.find(',', b);
    if (comma == std::string::npos) comma = list.size();
    const auto v = list.substr(b, comma - b);
    if (v.empty()) throw CLI::ValidationError("--sweep", "'" + text + "' has an empty value");
    a.values.push_back(v);
    b = comma + 1;
  }
  return a;
}

int run_sweep(const options& o) {
  std::vector<sweep_axis> axes;
  std::set<std::string> names;
  std::size_t total = 1;
  for (const auto& s : o.sweeps) {
    axes.push_back(parse_sweep(s));
    if (!names.insert(axes.back().name).second)
      throw CLI::ValidationError("--sweep", "'" + axes.back().name + "' is swept twice");
    total *= axes.back().values.size();
    if (total > 100000) throw CLI::ValidationError("--sweep", "more than 100000 combinations");
  }
  // The cartesian product, the first --sweep varying slowest.
  std::vector<child> cs;
  std::vector<std::vector<std::string>> chosen;
  for (std::size_t i = 0; i < total; ++i) {
    std::size_t rest = i;
    std::vector<std::string> pick(axes.size());
    for (std::size_t k = axes.size(); k-- > 0;) {
      pick[k] = axes[k].values[rest % axes[k].values.size()];
      rest /= axes[k].values.size();
    }
    child c;
    c.argv = o.command;
    std::string label;
    for (std::size_t k = 0; k < axes.size(); ++k) {
      label += (k ? " " : "") + axes[k].name + "=" + pick[k];
      c.argv.push_back("--" + axes[k].name);
      c.argv.push_back(pick[k]);
    }
    c.label = label;
    c.env_set = {{"RANK", "0"},          {"WORLD_SIZE", "1"},           {"LOCAL_RANK", "0"},
                 {"LOCAL_WORLD_SIZE", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"GRADUS_ROLE", "worker"},
                 {"GRADUS_SWEEP_INDEX", std::to_string(i)}, {"GRADUS_SWEEP", label}};
    cs.push_back(std::move(c));
    chosen.push_back(std::move(pick));
  }
  if (o.dry_run) {
    for (auto& c : cs) c.env_set["MASTER_PORT"] = "(free port)";
    print_dry_run(cs);
    return 0;
  }
  const int parallel = o.parallel > 0 ? o.parallel : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int interrupted = 0;
  std::size_t next = 0;
  std::map<const child*, std::string> start_errors;
  const auto busy = [&] {
    return std::any_of(cs.begin(), cs.end(), [](const child& c) { return c.running || c.has_open_streams(); });
  };
  while (next < cs.size() || busy()) {
    const auto running = std::count_if(cs.begin(), cs.end(), [](const child& c) { return c.running; });
    for (auto r = running; !interrupted && r < parallel && next < cs.size(); ++next) {
      child& c = cs[next];
      c.env_set["MASTER_PORT"] = std::to_string(free_ports(1)[0]);
      if (const int e = spawn(c)) {
        start_errors[&c] = std::strerror(e);
        say("cannot start '" + c.argv[0] + "' for " + c.label + ": " + std::strerror(e));
        c.done = true;
        c.status = 127 << 8;
      } else {
        ++r;
      }
    }
    if (interrupted && next < cs.size()) next = cs.size();  // start nothing more
    std::vector<child*> finished;
    for (const int sig : pump(cs, std::chrono::milliseconds(200), finished)) {
      if (!interrupted) {
        interrupted = sig;
        say(std::string("received ") + ::strsignal(sig) + "; passing it on to the runs");
        for (auto& c : cs) signal_child(c, sig == SIGHUP ? SIGTERM : sig, o.grace);
      } else {
        for (auto& c : cs) signal_child(c, SIGKILL, o.grace);
      }
    }
    for (child* c : finished)
      if (c->failed() && !c->stopped_by_us) say("[" + c->label + "] " + describe_status(c->status));
    if (o.timeout > 0)
      for (auto& c : cs)
        if (c.running && !c.timed_out && seconds(steady::now() - c.start_time).count() >= o.timeout) {
          c.timed_out = true;
          say("[" + c.label + "] timeout after " + std::to_string(static_cast<long>(o.timeout)) + " s; stopping it");
          signal_child(c, SIGTERM, o.grace);
        }
    enforce_kill_deadlines(cs);
    close_orphaned_streams(cs, o.grace);
  }
  // Summary table.
  std::vector<std::string> head{"#"};
  for (const auto& a : axes) head.push_back(a.name);
  head.insert(head.end(), {"status", "seconds"});
  std::vector<std::vector<std::string>> rows{head};
  int failures = 0;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const child& c = cs[i];
    std::vector<std::string> row{std::to_string(i)};
    row.insert(row.end(), chosen[i].begin(), chosen[i].end());
    std::string status;
    if (!c.started && !start_errors.count(&c)) {
      status = "not started";
    } else if (start_errors.count(&c)) {
      status = "cannot start: " + start_errors[&c];
    } else if (c.timed_out) {
      status = "timeout";
    } else if (!c.failed()) {
      status = "ok";
    } else if (WIFEXITED(c.status)) {
      status = "exit " + std::to_string(WEXITSTATUS(c.status));
    } else {
      status = std::string("signal ") + std::to_string(WTERMSIG(c.status)) + " (" + ::strsignal(WTERMSIG(c.status)) + ")";
    }
    if (status != "ok") ++failures;
    char secs[32] = "-";
    if (c.started) std::snprintf(secs, sizeof secs, "%.2f", seconds(c.end_time - c.start_time).count());
    row.insert(row.end(), {status, secs});
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> width(head.size(), 0);
  for (const auto& r : rows)
    for (std::size_t k = 0; k < r.size(); ++k) width[k] = std::max(width[k], r[k].size());
  std::string table = "gradus-run: sweep of " + std::to_string(cs.size()) + " runs, " + std::to_string(failures) + " failed\n";
  for (const auto& r : rows) {
    for (std::size_t k = 0; k < r.size(); ++k) table += r[k] + std::string(width[k] - r[k].size() + 2, ' ');
    while (!table.empty() && table.back() == ' ') table.pop_back();
    table += "\n";
  }
  write_all(1, table);
  if (interrupted) return 128 + interrupted;
  return failures ? 1 : 0;
}

// CLI11 names short options with one letter; mpirun's "-np" becomes "--np" here, before
// the program (whose own arguments are never touched).
std::vector<std::string> normalise_args(int argc, char** argv) {
  static const std::set<std::string> with_value = {"-n",          "--np",     "-np",    "--ps",          "--hosts",
                                                   "--node-rank", "--port",   "--timeout", "--grace",    "--sweep",
                                                   "--parallel",  "--master-addr", "--max-restarts", "--restart-delay"};
  std::vector<std::string> args(argv, argv + argc);
  for (std::size_t i = 1; i < args.size();) {
    const auto& a = args[i];
    if (a == "--" || a.empty() || a[0] != '-') break;
    if (a == "-np") args[i] = "--np";
    i += with_value.count(args[i]) ? 2 : 1;
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gradus-run: start a data-parallel job's processes on this host (torchrun's environment: RANK, WORLD_SIZE,\n"
      "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; GRADUS_ROLE=worker|ps), prefix each line of their\n"
      "output with [rank], and stop them all when one fails; or run a hyper-parameter sweep.\n\n"
      "  gradus-run -np 4 ./mnist_mlp --comm ring\n"
      "  gradus-run -np 2 --ps 1 ./train\n"
      "  gradus-run -np 2 --ps 1 --max-restarts 3 ./train --resume ckpt\n"
      "  gradus-run -np 4 --max-restarts 2 ./mnist_mlp --comm ring --checkpoint run/ckpt.npz --resume\n"
      "  gradus-run --sweep lr=0.01,0.05,0.1 --sweep batch=32,64 --parallel 2 ./mnist_mlp --epochs 1\n\n"
      "Several hosts: --hosts h1,h2 without --node-rank prints the command to run on each host (gradus-run does\n"
      "not ssh: start them with your scheduler, pdsh or ssh); with --node-rank R it starts host R's share of the\n"
      "ranks (block distribution), meeting at the first host (--master-addr to change) on --port (default 29500).\n"
      "Under Slurm, mpirun or Kubernetes, start the program directly: gradus::cluster::from_env() reads their\n"
      "variables (tools/gradus-run/README.md).\n\n"
      "With --max-restarts K, a job with --ps starts a process that fails by itself (worker or parameter server)\n"
      "again alone, up to K times, after --restart-delay seconds, with its same arguments and environment plus\n"
      "GRADUS_RESTART_COUNT=n (n = 1, 2, ...: resume from your checkpoint); the others run on. A job without --ps\n"
      "(ring, pipeline) restarts as a group, as torchrun does: every rank is stopped and all start again, up to K\n"
      "times in all, resuming from the checkpoint (e.g. ./mnist_mlp --checkpoint F --resume). A failure with no\n"
      "restart left stops the job as usual.\n\n"
      "Exit status: 0 when every process exited 0; else the failed rank's exit status (128+signal when killed),\n"
      "124 after --timeout, 127 when the program cannot be started, 128+signal when interrupted; a sweep: 1 when\n"
      "any run failed.",
      "gradus-run"};
  options o;
  app.add_option("-n,--np", o.np, "number of worker processes (also -np)")->check(CLI::Range(1, 4096));
  app.add_option("--ps", o.ps, "number of parameter-server processes (GRADUS_ROLE=ps, GRADUS_PS_INDEX; every process "
                               "gets GRADUS_PS, their host:port list)")
      ->check(CLI::Range(0, 1024));
  std::string hosts;
  app.add_option("--hosts", hosts, "comma-separated hosts sharing the job (see above)");
  app.add_option("--node-rank", o.node_rank, "this host's index in --hosts: start its share of the ranks")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr", o.master_addr, "MASTER_ADDR (default 127.0.0.1, or the first of --hosts)");
  app.add_option("--port", o.port, "MASTER_PORT (default: a free port of 127.0.0.1; with --hosts, 29500); "
                                   "parameter servers take the next ports")
      ->check(CLI::Range(1, 65535));
  app.add_option("--timeout", o.timeout, "stop the job (a sweep: each run) after this many seconds; 0: no limit")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace", o.grace, "seconds between SIGTERM and SIGKILL when stopping processes")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--sweep", o.sweeps, "name=v1,v2,...: one run per combination of the --sweep lists, each with "
                                      "--name value appended (GRADUS_SWEEP_INDEX in its environment)")
      ->allow_extra_args(false);
  app.add_option("--parallel", o.parallel, "sweep: runs at a time (default: the number of cores)")
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-restarts", o.max_restarts,
                 "after a failure (non-zero exit, a signal not sent by gradus-run), start again up to this many "
                 "times, with GRADUS_RESTART_COUNT=1, 2, ...: the failed process alone with --ps, every rank "
                 "without; 0 (default): the first failure stops the job")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--restart-delay", o.restart_delay, "seconds between a process's failure and its restart (default 1)")
      ->check(CLI::Range(0.0, 3600.0));
  app.add_flag("--dry-run", o.dry_run, "print each process's environment and command instead of starting it");
  app.prefix_command();
  const auto args = normalise_args(argc, argv);
  std::vector<const char*> cargv;
  for (const auto& a : args) cargv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(cargv.size()), cargv.data());
    for (std::size_t b = 0; !hosts.empty() && b <= hosts.size();) {
      auto comma = hosts.find(',', b);
      if (comma == std::string::npos) comma = hosts.size();
      if (comma == b) throw CLI::ValidationError("--hosts", "'" + hosts + "' has an empty host name");
      o.hosts.push_back(hosts.substr(b, comma - b));
      b = comma + 1;
    }
    o.command = app.remaining();
    if (!o.command.empty() && o.command.front() == "--") o.command.erase(o.command.begin());
    if (o.command.empty()) throw CLI::ValidationError("program", "no program to run (gradus-run -np N program args...)");
    if (!o.sweeps.empty() && (o.np != 1 || o.ps != 0 || !o.hosts.empty()))
      throw CLI::ValidationError("--sweep", "a sweep runs single-process trainings: no -np, --ps or --hosts with it");
    if (!o.sweeps.empty() && o.max_restarts > 0)
      throw CLI::ValidationError("--max-restarts", "restarts a job's processes; a sweep's runs are not restarted");
    if (o.node_rank >= 0 && o.hosts.empty()) throw CLI::ValidationError("--node-rank", "needs --hosts");
    if (o.node_rank >= static_cast<int>(o.hosts.size()) && o.node_rank >= 0)
      throw CLI::ValidationError("--node-rank", std::to_string(o.node_rank) + " but --hosts lists " +
                                                    std::to_string(o.hosts.size()) + " hosts");
    if (starts_its_own_ranks(o.command.front()) && (o.np != 1 || o.ps != 0 || !o.hosts.empty() || !o.sweeps.empty()))
      throw CLI::ValidationError("program", std::filesystem::path(o.command.front()).filename().string() +
                                                " starts the job's ranks itself: give -np to it, not to gradus-run "
                                                "(gradus-run supervises it as one process: no -np, --ps, --hosts or "
                                                "--sweep)");
    if (!o.hosts.empty() && o.np < static_cast<int>(o.hosts.size()))
      throw CLI::ValidationError("--hosts", std::to_string(o.hosts.size()) + " hosts for -np " + std::to_string(o.np) +
                                                " ranks: every host needs one");
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (!o.sweeps.empty()) {
      if (!o.dry_run) install_signal_handlers();
      return run_sweep(o);
    }
    // Several hosts, none chosen: print what each host runs.
    if (!o.hosts.empty() && o.node_rank < 0 &&
        !std::all_of(o.hosts.begin(), o.hosts.end(), [](const std::string& h) { return is_local_host(h); })) {
      std::string hosts;
      for (const auto& h : o.hosts) hosts += (hosts.empty() ? "" : ",") + h;
      std::string out = "# gradus-run starts processes on this host only (no ssh); run on each host:\n";
      for (std::size_t r = 0; r < o.hosts.size(); ++r) {
        out += "# on " + o.hosts[r] + ":\ngradus-run -np " + std::to_string(o.np);
        if (o.ps) out += " --ps " + std::to_string(o.ps);
        out += " --hosts " + hosts + " --node-rank " + std::to_string(r) + " --port " +
               std::to_string(o.port ? o.port : 29500);
        if (!o.master_addr.empty()) out += " --master-addr " + shell_quote(o.master_addr);
        if (o.timeout > 0) out += " --timeout " + std::to_string(static_cast<long>(o.timeout));
        if (o.max_restarts > 0) out += " --max-restarts " + std::to_string(o.max_restarts);
        if (o.restart_delay != options{}.restart_delay) out += " --restart-delay " + format_seconds(o.restart_delay);
        out += " --";
        for (const auto& a : o.command) out += " " + shell_quote(a);
        out += "\n";
      }
      write_all(1, out);
      return 0;
    }
    auto cs = plan_job(o);
    if (o.dry_run) {
      for (auto& c : cs)
        if (!c.is_ps) c.env_set["GRADUS_FAULT_FILE"] = fault_file_pattern();
      print_dry_run(cs);
      return 0;
    }
    const job_directory job;
    for (auto& c : cs)
      if (!c.is_ps) c.env_set["GRADUS_FAULT_FILE"] = job.fault_file.string();
    install_signal_handlers();
    return run_job(cs, o, job.fault_file);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
