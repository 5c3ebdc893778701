#pragma once
// Fault points: named places in a protocol (a checkpoint's save: before and after each
// rename) where the fault tests stop a process, so that "killed at every point of the save"
// is a test that hits each point every time instead of a timer that hits some of them
// (RocksDB's sync points and FoundationDB's simulated faults serve the same purpose).
//
//   GRADUS_FAULT_POINT=checkpoint.part.written@1#2 ./train ...
//
// ends the process with SIGKILL the 2nd time it reaches "checkpoint.part.written", on the
// rank whose RANK variable is 1. "@rank" and "#n" are optional (any rank; the 1st time).
// A process restarted by gradus-run (GRADUS_RESTART_COUNT set and not 0) ignores the
// variable: the restart shows the recovery. Where the stages or ranks are threads of one
// process (the unit tests), fault_hook() takes the place of the variable: it is called with
// the point's name and may throw to end that rank's work there.
//
// The variable is read once per process; a point costs a load and a compare when unset.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

namespace gradus::detail {

/// The in-process hook (tests): set it before the threads that reach the points start, and
/// clear it after they end.
inline std::function<void(std::string_view)>& fault_hook() {
  static std::function<void(std::string_view)> hook;
  return hook;
}

/// GRADUS_FAULT_POINT as parsed: the point, the rank (-1: any) and the passage (1: the first).
struct fault_spec {
  std::string point;
  long rank = -1, nth = 1;
};

/// "name[@rank][#n]" -> fault_spec; an empty point where the text is empty or malformed.
inline fault_spec parse_fault_spec(std::string_view s) {
  fault_spec f;
  const auto number = [](std::string_view t, long& v) {
    if (t.empty() || t.size() > 9) return false;
    v = 0;
    for (const char c : t) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    return true;
  };
  if (const auto hash = s.rfind('#'); hash != std::string_view::npos) {
    if (!number(s.substr(hash + 1), f.nth) || f.nth < 1) return {};
    s = s.substr(0, hash);
  }
  if (const auto at = s.rfind('@'); at != std::string_view::npos) {
    if (!number(s.substr(at + 1), f.rank)) return {};
    s = s.substr(0, at);
  }
  f.point = std::string(s);
  return f;
}

/// This process's armed point (none when the variable is unset, malformed, names another
/// rank, or this process is a restart).
inline const fault_spec& armed_fault() {
  static const fault_spec armed = [] {
    const char* v = std::getenv("GRADUS_FAULT_POINT");
    if (!v || !*v) return fault_spec{};
    if (const char* rc = std::getenv("GRADUS_RESTART_COUNT"); rc && *rc && std::string_view(rc) != "0") return fault_spec{};
    fault_spec f = parse_fault_spec(v);
    if (f.rank >= 0) {
      const char* r = std::getenv("RANK");
      if (!r || std::to_string(f.rank) != r) return fault_spec{};
    }
    return f;
  }();
  return armed;
}

/// A named place where the fault tests may stop this process (see above).
inline void fault_point(std::string_view name) {
  if (const auto& hook = fault_hook()) hook(name);
  const fault_spec& f = armed_fault();
  if (f.point.empty() || f.point != name) return;
  static std::atomic<long> passed{0};
  if (++passed == f.nth) ::raise(SIGKILL);
}

}  // namespace gradus::detail
