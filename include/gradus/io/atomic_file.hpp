#pragma once
// An atomic, durable file replacement (what write_npz, write_npy and write_safetensors do):
// the file is written to a temporary "<file>.tmp.<pid>.<n>.<host>" beside it, fsynced,
// renamed over the file, and the directory fsynced (replace_atomically). Here: that
// sequence, fsync of a file or a directory, the writing of a new file from byte ranges,
// and the temporaries' names, the registry of those this process is writing, and the
// clean-up of those a killed writer left behind. Apart from the writers because none of it
// knows a file format.
//
// POSIX (open, fsync, getpid, kill, gethostname).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"

namespace gradus::io::detail {

/// (appended, not "'" + s: g++ 12's -Wrestrict misfires on operator+(const char*, string&&))
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

/// fsync the file or directory at `p`.
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

/// This host in a temporary's name: the hostname, every byte outside [A-Za-z0-9-] as '_'.
inline std::string host_tag() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string s = name;
  for (char& c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) c = '_';
  return s;
}

/// The temporaries (file names) this process is writing now, from any thread.
struct writing_registry {
  std::mutex m;
  std::set<std::string, std::less<>> names;
};
inline writing_registry& writing_now() {
  static writing_registry r;
  return r;
}

/// Is `name` a temporary of the file named `target` written on `host`? Then `pid` is its
/// writer and `base` the name without libzip's suffix.
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

/// Removes the stale temporaries of `file` (above). Best effort: a directory that cannot be
/// listed or a file that cannot be removed is left as it is, and the save goes on.
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

/// Registers a temporary as being written by this process for its lifetime.
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

/// Creates `tmp` (which must not exist) holding the given byte ranges one after another.
/// Throws naming `tmp` on failure; `tmp` may then exist and is the caller's to remove.
inline void write_new_file(const std::filesystem::path& tmp, std::span<const std::span<const std::byte>> parts,
                           const std::string& ctx) {
  fd_handle fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.fd < 0) throw error(ctx + "create temporary file " + quoted(tmp) + ": " + errno_text(errno));
  for (const auto& part : parts) {
    for (std::size_t at = 0; at < part.size();) {
      const ssize_t n = ::write(fd.fd, part.data() + at, part.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw error(ctx + "write temporary file " + quoted(tmp) + ": " + errno_text(n < 0 ? errno : EIO));
      at += static_cast<std::size_t>(n);
    }
  }
  const int r = ::close(fd.fd);
  fd.fd = -1;
  if (r != 0) throw error(ctx + "close temporary file " + quoted(tmp) + ": " + errno_text(errno));
}
inline void write_new_file(const std::filesystem::path& tmp, std::initializer_list<std::span<const std::byte>> parts,
                           const std::string& ctx) {
  write_new_file(tmp, std::span<const std::span<const std::byte>>(parts.begin(), parts.size()), ctx);
}

/// Replaces `file` atomically with what write_tmp(tmp) writes to the new file `tmp`: tmp is
/// "<file>.tmp.<pid>.<n>.<host>" in the same directory; it is fsynced and renamed over
/// `file`, then the directory is fsynced. On any failure the temporary file is removed,
/// `file` is left as it was, and a gradus::error (ctx first) names the failing step.
/// Temporaries of `file` left by writers that were killed mid-save are removed first
/// (remove_stale_temporaries).
inline void replace_atomically(const std::filesystem::path& file, const std::string& ctx,
                               const std::function<void(const std::filesystem::path& tmp)>& write_tmp) {
  static std::atomic<unsigned long> counter{0};
  const std::string host = host_tag();
  std::filesystem::path tmp = file;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++) + "." + host;
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  // Clean up before registering: a stale file of this very name (an earlier process with our
  // pid) must go, and nothing of ours exists on disk before it is registered.
  remove_stale_temporaries(file, host);
  const writing_temporary writing(tmp.filename().string());
  try {
    write_tmp(tmp);
    fsync_path(tmp, false, ctx, "fsync temporary file");
    if (::rename(tmp.c_str(), file.c_str()) != 0)
      throw error(ctx + "rename " + quoted(tmp) + " over it: " + errno_text(errno));
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  // The new file is in place; without this the rename itself may not survive a crash.
  fsync_path(dir, true, ctx, "fsync directory");
}

}  // namespace gradus::io::detail
