#pragma once
// gradus-run's child processes: the child (one process of a job, or one run of a sweep), how
// it is started (spawn) and stopped (signal_child), gradus-run's own signal handling, and the
// pump loop that copies the children's output and reaps them.
//
// Each child runs in its own process group with its stdout and stderr on pipes; a poll loop
// copies every line to gradus-run's own stdout/stderr behind a "[rank] " prefix, one write()
// per line so that lines of different ranks never mix.
//
// Children die with gradus-run: each is started (fork, from the main thread: gradus-run has
// no other) with PR_SET_PDEATHSIG = SIGTERM, so that a SIGKILLed launcher leaves no ranks
// training on.
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "output.hpp"

extern char** environ;

namespace gradus_run {

using steady = std::chrono::steady_clock;
using seconds = std::chrono::duration<double>;

// ---- signals: handlers only write the signal number to a self-pipe ------------------------
inline int signal_pipe[2] = {-1, -1};

inline void on_signal(int sig) {
  const int saved = errno;
  const char c = static_cast<char>(sig);
  [[maybe_unused]] const auto n = ::write(signal_pipe[1], &c, 1);
  errno = saved;
}

inline void install_signal_handlers() {
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw std::runtime_error("pipe2 failed");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (const int sig : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

// ---- one child process ------------------------------------------------------------------------
inline constexpr std::size_t max_line = 64 * 1024;  // a longer line is passed on in pieces

struct stream {
  int fd = -1;   // read end of the child's pipe; -1 once closed
  int to = 1;    // our fd the lines go to
  std::string pending;
  // what the child said last (stderr): its last line, and its last "gradus: ..." line (the
  // library's and the examples' errors begin so): the reason a failure's final line quotes
  std::string last_line, last_error;
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
  // Its own account of its failure: its last error line on stderr, else its last line ("").
  std::string reason() const { return err.last_error.empty() ? err.last_line : err.last_error; }
  bool has_open_streams() const { return out.fd >= 0 || err.fd >= 0; }
};

// Variables gradus-run owns: removed from the inherited environment before its own are set.
// TF_CONFIG goes too: cluster::from_env() would read it before RANK and friends.
inline const std::set<std::string> managed_vars = {"RANK",        "WORLD_SIZE", "LOCAL_RANK",      "LOCAL_WORLD_SIZE",
                                                   "MASTER_ADDR", "MASTER_PORT", "GRADUS_ROLE",    "GRADUS_PS",
                                                   "GRADUS_PS_INDEX", "GRADUS_SWEEP_INDEX", "GRADUS_SWEEP", "TF_CONFIG",
                                                   "GRADUS_FAULT_FILE", "GRADUS_RESTART_COUNT", "GRADUS_RESTART_SCOPE",
                                                   "GRADUS_TRACE"};

inline std::vector<std::string> child_environment(const child& c) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const auto name = kv.substr(0, kv.find('='));
    if (!managed_vars.count(name) && !c.env_set.count(name)) env.push_back(kv);
  }
  for (const auto& [k, v] : c.env_set) env.push_back(k + "=" + v);
  return env;
}

inline std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (auto& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

// What --dry-run prints instead of starting the children (a job's or a sweep's): one line
// each, "[label]", the variables gradus-run sets and the command, shell-quoted.
inline void print_dry_run(const std::vector<child>& cs) {
  std::string out;
  for (const auto& c : cs) {
    out.append("[").append(c.label).append("]");
    for (const auto& [k, v] : c.env_set) out.append(" ").append(k).append("=").append(shell_quote(v));
    for (const auto& a : c.argv) out.append(" ").append(shell_quote(a));
    out.append("\n");
  }
  write_all(1, out);
}

// Starts c: stdin from /dev/null, stdout and stderr on pipes, its own process group, default
// signal dispositions, SIGTERM when gradus-run dies (Linux). Returns 0 or the errno of the
// failure. fork, not posix_spawn: PR_SET_PDEATHSIG must be set between fork and exec.
// The signal that PR_SET_PDEATHSIG names is sent when the thread that forked exits, so every
// child is started from the main thread (gradus-run has no other thread).
inline int spawn(child& c) {
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
  c.out = {out[0], 1, {}, {}, {}};
  c.err = {err[0], 2, {}, {}, {}};
  c.started = c.running = true;
  c.start_time = steady::now();
  return 0;
}

inline void signal_child(child& c, int sig, double grace_s) {
  if (!c.running) return;
  ::kill(-c.pid, sig);  // its process group: the program and whatever it started
  c.stopped_by_us = true;
  if (sig != SIGKILL && !c.kill_at)
    c.kill_at = steady::now() + std::chrono::duration_cast<steady::duration>(seconds(grace_s));
}

inline void remember(stream& s, std::string_view line) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  if (const auto cr = line.rfind('\r'); cr != std::string_view::npos) line.remove_prefix(cr + 1);  // a progress bar's last state
  if (line.empty()) return;
  constexpr std::size_t keep = 600;
  const std::string kept(line.substr(0, keep));
  if (line.starts_with("gradus: ")) s.last_error = kept;
  // a line that says something: a rule of dashes (mpirun's boxes) or a lone word is no reason
  if (std::count_if(line.begin(), line.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; }) >= 8)
    s.last_line = kept;
}

inline void emit(const std::string& label, stream& s, bool at_eof) {
  std::size_t start = 0;
  std::string out;
  for (;;) {
    const auto nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    out += "[" + label + "] ";
    out.append(s.pending, start, nl + 1 - start);
    if (s.to == 2) remember(s, std::string_view(s.pending).substr(start, nl - start));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (s.pending.size() >= max_line || (at_eof && !s.pending.empty())) {
    out += "[" + label + "] " + s.pending + "\n";
    if (s.to == 2) remember(s, s.pending);
    s.pending.clear();
  }
  if (!out.empty()) write_all(s.to, out);
}

inline void read_stream(const std::string& label, stream& s) {
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

inline void close_stream(const std::string& label, stream& s) {
  if (s.fd < 0) return;
  ::close(s.fd);
  s.fd = -1;
  emit(label, s, true);
}

// Before a restarted child's new pipes replace the old ones: what its last run wrote and we
// have not read yet is passed on first (bounded: a grandchild may hold the pipe and write on).
inline void drain_stream(const std::string& label, stream& s) {
  for (int i = 0; i < 64 && s.fd >= 0; ++i) {
    pollfd p{s.fd, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    read_stream(label, s);
  }
  close_stream(label, s);
}

// Waits up to timeout for output or a signal, copies output, reaps exited children.
// Returns the signals received (SIGINT/SIGTERM/SIGHUP), and appends newly finished children.
inline std::vector<int> pump(std::vector<child>& cs, steady::duration timeout, std::vector<child*>& finished) {
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
inline void enforce_kill_deadlines(std::vector<child>& cs) {
  const auto now = steady::now();
  for (auto& c : cs)
    if (c.running && c.kill_at && now >= *c.kill_at) {
      ::kill(-c.pid, SIGKILL);
      c.kill_at.reset();
    }
}

// After a child's exit its pipes may still be held by a process it started outside its
// group; stop waiting for them after the grace period.
inline void close_orphaned_streams(std::vector<child>& cs, double grace_s) {
  const auto now = steady::now();
  for (auto& c : cs)
    if (c.done && c.has_open_streams() && seconds(now - c.end_time).count() > grace_s) {
      close_stream(c.label, c.out);
      close_stream(c.label, c.err);
    }
}

}  // namespace gradus_run
