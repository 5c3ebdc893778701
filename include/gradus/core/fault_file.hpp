#pragma once
// Verdicts for the launcher: a process that fails because of another one says whom it blames
// in the file GRADUS_FAULT_FILE names (gradus-run gives its processes one per job), so that
// the job's final line names the process whose failure started it rather than the first
// neighbour that noticed. One line per verdict:
//
//   rank 1 blames rank 0 (gone): <the error>      its peer died (a fresh connection is refused)
//   rank 1 blames ps 1 (silent): <the error>      its peer stopped answering (stopped, hung, cut off)
//   rank 0 blames rank 1 (failed): <the error>    its peer failed by itself and said so (its own
//                                                 error says why)
//   ps 0 fails the job: <the reason>              the job cannot go on whoever is restarted alone
//                                                 (a bsp worker lost, a server without its state):
//                                                 a launcher restarts the whole job, if anything
//
// A rank is "rank N", a parameter server "ps N". Each line is one write(2) on an O_APPEND
// descriptor, so lines of concurrent processes never interleave; the error's own line breaks
// become spaces. Nothing is written where the variable is unset.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

namespace gradus::detail {

/// Appends `line` (one verdict, ending in '\n') to GRADUS_FAULT_FILE, if set. Never throws.
inline void append_fault_line(const std::string& line) noexcept {
  const char* path = std::getenv("GRADUS_FAULT_FILE");
  if (!path || !*path) return;
  const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  const auto n = ::write(fd, line.data(), line.size());
  (void)n;
  ::close(fd);
}

/// "<who> blames <peer> (<kind>): <text>" (see above); who and peer are "rank N" or "ps N",
/// kind "gone", "silent" or "failed". Never throws.
inline void record_blame(std::string_view who, std::string_view peer, std::string_view kind, std::string text) noexcept {
  try {
    std::replace(text.begin(), text.end(), '\n', ' ');
    std::replace(text.begin(), text.end(), '\r', ' ');
    append_fault_line(std::string(who) + " blames " + std::string(peer) + " (" + std::string(kind) + "): " + text + "\n");
  } catch (...) {  // (an allocation failed: the verdict is lost, the error itself still travels)
  }
}

/// "<who> fails the job: <reason>" (see above). Never throws.
inline void record_job_failure(std::string_view who, std::string reason) noexcept {
  try {
    std::replace(reason.begin(), reason.end(), '\n', ' ');
    std::replace(reason.begin(), reason.end(), '\r', ' ');
    append_fault_line(std::string(who) + " fails the job: " + reason + "\n");
  } catch (...) {
  }
}

}  // namespace gradus::detail
