#pragma once
// Who failed first. When processes of a job fail within a moment of each other, most of them
// fail because of one: a rank that died, stopped answering, or failed by itself and told the
// others. run_job (job.hpp) waits that moment (its settle time) and then asks here which
// process set the failure off, using the verdicts of the job's fault file (fault_file.hpp) and
// the processes' own last error lines, and how the final line tells it:
//   - the first verdict that blames a process of this job other than its author: a blamed
//     process that failed by itself is the origin, in its own words ("rank 0 exited with
//     status 1: gradus: restore_checkpoint ..."); one still running, or stopped by gradus-run,
//     is named as its neighbour saw it ("ps1 stopped responding (silent; noticed by rank 0)")
//     before the neighbour's own account;
//   - no such verdict: the first process that failed, one killed by a signal of its own first
//     (its neighbours more likely failed because of it), in its own words.
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <sys/wait.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "fault_file.hpp"
#include "output.hpp"
#include "process.hpp"

namespace gradus_run {

// "rank 1" or "ps0": how the lines about one process name it.
inline std::string process_name(const child& c) { return c.is_ps || c.is_launcher ? c.label : "rank " + c.label; }
// The same from a label alone ("1" -> "rank 1", "ps0" -> "ps0"), as the verdicts give them.
inline std::string label_name(const std::string& label) { return label.rfind("ps", 0) == 0 ? label : "rank " + label; }

// "rank 0 exited with status 1: gradus: ..." — its status, and its own last error line where
// it exited by itself (a process killed by a signal said nothing about it).
inline std::string own_account(const child& c) {
  std::string text = process_name(c) + " " + describe_status(c.status);
  if (WIFEXITED(c.status))
    if (const auto why = c.reason(); !why.empty()) text += ": " + why;
  return text;
}

// The process that set a failure off, and the final line's account of it.
struct failure_account {
  child* origin = nullptr;  // whose exit status gradus-run returns
  std::string text;
};

// Of `failed` (the processes that failed by themselves, in the order they were reaped), the
// one that set the failure off (see above); `verdicts`: the fault file's since the job (re)started.
inline failure_account first_failure(std::vector<child>& cs, const std::vector<child*>& failed,
                                     const std::vector<verdict>& verdicts) {
  child* first = nullptr;
  for (child* c : failed)
    if (!first || (WIFSIGNALED(c->status) && !WIFSIGNALED(first->status))) first = c;
  const auto find = [&](const std::string& label) -> child* {
    for (auto& c : cs)
      if (c.label == label) return &c;
    return nullptr;
  };
  for (const auto& v : verdicts) {
    if (v.kind == "job" || v.peer == v.observer) continue;
    child* peer = find(v.peer);
    child* observer = find(v.observer);
    if (!peer || !observer) continue;
    if (peer->failed() && !peer->stopped_by_us) return {peer, own_account(*peer)};
    const std::string saw = v.kind == "silent" ? "stopped responding" : v.kind == "gone" ? "died" : "failed";
    child* reporter = std::find(failed.begin(), failed.end(), observer) != failed.end() ? observer : first;
    if (!reporter || reporter == peer) continue;
    return {reporter, process_name(*peer) + " " + saw + " (" + v.kind + "; noticed by " + process_name(*observer) +
                          ") \u2014 " + own_account(*reporter)};
  }
  if (!first) return {};
  return {first, own_account(*first)};
}

// The first verdict that the job as a whole failed ("ps 0 fails the job: ..."), if any.
inline std::optional<verdict> job_wide_failure(const std::vector<verdict>& verdicts) {
  for (const auto& v : verdicts)
    if (v.kind == "job") return v;
  return std::nullopt;
}

}  // namespace gradus_run
