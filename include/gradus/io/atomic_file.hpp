#pragma once
// The pieces of an atomic, durable file replacement (what write_npz does, io/npz.hpp):
// the file is written to a temporary "<file>.tmp.<pid>.<n>.<host>" beside it, fsynced,
// renamed over the file, and the directory fsynced. Here: fsync of a file or a directory,
// and the temporaries' names, the registry of those this process is writing, and the
// clean-up of those a killed writer left behind. Apart from npz.hpp because none of it
// knows the archive's format.
//
// POSIX (open, fsync, getpid, kill, gethostname).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"

namespace gradus::io::detail {

// (appended, not "'" + s: g++ 12's -Wrestrict misfires on operator+(const char*, string&&))
inline std::string quoted(const std::filesystem::path& p) {
  std::string r(1, '\'');
  r += p.string();
  r += '\'';
  return r;
}

struct fd_handle {
  int fd = -1;
  fd_handle() = default;
  explicit fd_handle(int f) : fd(f) {}
  fd_handle(const fd_handle&) = delete;
  fd_handle& operator=(const fd_handle&) = delete;
  ~fd_handle() {
    if (fd >= 0) ::close(fd);
  }
};

inline std::string errno_text(int e) { return std::generic_category().message(e); }

// fsync the file or directory at `p`.
inline void fsync_path(const std::filesystem::path& p, bool directory, const std::string& ctx, const char* step) {
  fd_handle fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0)));
  if (fd.fd < 0) throw error(ctx + step + ": open " + quoted(p) + ": " + errno_text(errno));
  if (::fsync(fd.fd) != 0) throw error(ctx + step + ": " + errno_text(errno));
  const int r = ::close(fd.fd);
  fd.fd = -1;
  if (r != 0) throw error(ctx + step + ": close: " + errno_text(errno));
}

// ---- temporaries ---------------------------------------------------------------------------
// A save writes "<file>.tmp.<pid>.<n>.<host>" (n counts this process's saves; libzip itself
// writes that through its own "<that>.XXXXXX" and renames it). A writer killed mid-save leaves
// one of the two behind, as large as the checkpoint; the next save of the same file removes
// those whose writer is gone:
//   - written on another host (by name): never touched, its pid means nothing here;
//   - another pid: removed when kill(pid, 0) fails with ESRCH. A live process that has
//     reused a dead writer's pid keeps that temporary until it too is gone: a stale file
//     may outlive its writer, a live writer's file is never removed;
//   - this process's pid: removed unless this process is writing it now (any thread; the
//     registry below). A container's trainer is often pid 1 at every start, so a stale
//     temporary with our own pid is the common case there, not a curiosity.

// This host in a temporary's name: the hostname, every byte outside [A-Za-z0-9-] as '_'.
inline std::string host_tag() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string s = name;
  for (char& c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) c = '_';
  return s;
}

// The temporaries (file names) this process is writing now, from any thread.
struct writing_registry {
  std::mutex m;
  std::set<std::string, std::less<>> names;
};
inline writing_registry& writing_now() {
  static writing_registry r;
  return r;
}

// Is `name` a temporary of the file named `target` written on `host`? Then `pid` is its
// writer and `base` the name without libzip's suffix.
inline bool parse_temporary(std::string_view name, std::string_view target, std::string_view host, pid_t& pid,
                            std::string_view& base) {
  const auto number = [&](std::string_view& s, long long& v) {
    std::size_t k = 0;
    v = 0;
    while (k < s.size() && k < 18 && s[k] >= '0' && s[k] <= '9') v = v * 10 + (s[k++] - '0');
    if (k == 0 || k == 18) return false;
    s.remove_prefix(k);
    return true;
  };
  std::string_view rest = name;
  if (!rest.starts_with(target) || !rest.substr(target.size()).starts_with(".tmp.")) return false;
  rest.remove_prefix(target.size() + 5);
  long long p = 0, n = 0;
  if (!number(rest, p) || !rest.starts_with('.')) return false;
  rest.remove_prefix(1);
  if (!number(rest, n) || !rest.starts_with('.')) return false;
  rest.remove_prefix(1);
  if (!rest.starts_with(host)) return false;
  rest.remove_prefix(host.size());
  if (!rest.empty()) {  // libzip's ".XXXXXX"
    if (rest.size() < 2 || rest.size() > 17 || rest[0] != '.') return false;
    for (const char c : rest.substr(1))
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  }
  if (p <= 0 || p > std::numeric_limits<pid_t>::max()) return false;
  pid = static_cast<pid_t>(p);
  base = name.substr(0, name.size() - rest.size());
  return true;
}

// Removes the stale temporaries of `file` (above). Best effort: a directory that cannot be
// listed or a file that cannot be removed is left as it is, and the save goes on.
inline void remove_stale_temporaries(const std::filesystem::path& file, std::string_view host) {
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  const std::string target = file.filename().string();
  const pid_t self = ::getpid();
  std::vector<std::filesystem::path> stale;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    pid_t pid = 0;
    std::string_view base;
    if (!parse_temporary(name, target, host, pid, base)) continue;
    bool dead = false;
    if (pid == self) {
      auto& r = writing_now();
      const std::lock_guard lock(r.m);
      dead = !r.names.contains(base);
    } else {
      dead = ::kill(pid, 0) == -1 && errno == ESRCH;
    }
    if (dead) stale.push_back(it->path());
  }
  for (const auto& p : stale) std::filesystem::remove(p, ec);
}

// Registers a temporary as being written by this process for its lifetime.
struct writing_temporary {
  std::string name;
  explicit writing_temporary(std::string n) : name(std::move(n)) {
    auto& r = writing_now();
    const std::lock_guard lock(r.m);
    r.names.insert(name);
  }
  writing_temporary(const writing_temporary&) = delete;
  writing_temporary& operator=(const writing_temporary&) = delete;
  ~writing_temporary() {
    auto& r = writing_now();
    const std::lock_guard lock(r.m);
    r.names.erase(name);
  }
};

}  // namespace gradus::io::detail
