#pragma once
// gradus-run's output: write_all (the whole string to a file descriptor, one write() when the
// pipe takes it), say (a "gradus-run: " line on stderr), and what its messages are made of:
// describe_status (a wait status in words), format_seconds, shell_quote.
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

namespace gradus_run {

inline void write_all(int fd, const std::string& s) {
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

inline void say(const std::string& s) { write_all(2, "gradus-run: " + s + "\n"); }

inline std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

// 1, 0.5, 2.25: seconds as an option takes them.
inline std::string format_seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", s);
  return text;
}

inline std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-+=./:,@%") ==
                        std::string::npos)
    return s;
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace gradus_run
