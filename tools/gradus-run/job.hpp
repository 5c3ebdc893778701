#pragma once
// A job: the processes of a data-parallel job that gradus-run starts on this host (plan_job)
// and supervises to the end (run_job), restarts (--max-restarts) included.
//
// Each child gets torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), which gradus::cluster::from_env() reads. A rank that fails
// (non-zero exit, signal) stops the others: SIGTERM to their process groups, SIGKILL after
// --grace seconds. The final line of a failed job names the rank that the workers' fault
// file blames (fault_file.hpp).
//
// With --max-restarts K, a job with parameter servers starts a process (worker or server)
// that fails by itself again, alone, up to K times: same argv, same environment, plus
// GRADUS_RESTART_COUNT (1, 2, ...) so that it knows to resume from its checkpoint; the others
// run on. A collective job (no --ps: a ring, MPI-style or pipeline job, whose ranks cannot
// take one restarted rank back into a collective) restarts as a group, torchrun's rule: every
// rank stopped, then all started again with GRADUS_RESTART_COUNT, up to K times in all. A
// process gradus-run stopped is never restarted, and nothing is restarted once the job is
// stopping.
//
// A job with parameter servers has succeeded once its chief (rank 0) exits 0 — a TFJob's
// default success policy: the chief ends the job only after the last collective every live
// worker took part in. A worker that fails after that is reported, not restarted and no
// failure of the job; a restart still waiting for its delay is called off; a worker still
// running 10 s later (a restart that never reached the job) is stopped.
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "blame.hpp"
#include "fault_file.hpp"
#include "options.hpp"
#include "output.hpp"
#include "ports.hpp"
#include "process.hpp"
#include "trace_merge.hpp"

namespace gradus_run {

// A program that starts a job's ranks itself (Open MPI's mpirun, MPICH's mpiexec, Slurm's
// srun): gradus-run supervises it as the job's one process, without torchrun's variables
// (its ranks take theirs from it), so that --max-restarts restarts the whole job.
inline bool starts_its_own_ranks(const std::string& program) {
  const auto name = std::filesystem::path(program).filename().string();
  return name == "mpirun" || name == "mpiexec" || name == "orterun" || name == "srun";
}

// The job's processes on this host.
inline std::vector<child> plan_job(const options& o) {
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
  const std::string job_id = "gradus-run-" + std::to_string(::getpid()) + "-" + std::to_string(port);
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
    if (!o.trace_dir.empty()) c.env_set["GRADUS_TRACE"] = trace_file_of(o.trace_dir, first_rank + i, false);
    // One job's ranks carry one id (this gradus-run's), so that the ring's rendezvous refuses
    // a rank of another job sent to the same port; ranks of several hosts' gradus-runs
    // (--node-rank) cannot share one, and a GRADUS_JOB_ID the user set is kept.
    if (o.node_rank < 0 && !std::getenv("GRADUS_JOB_ID")) c.env_set["GRADUS_JOB_ID"] = job_id;
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
    if (!o.trace_dir.empty()) c.env_set["GRADUS_TRACE"] = trace_file_of(o.trace_dir, i, true);
    cs.push_back(std::move(c));
  }
  return cs;
}

// "rank 1: 2 of 2, ps0: 1 of 2": the processes that were restarted alone; "" when none was.
inline std::string restarts_used(const std::vector<child>& cs, int max_restarts) {
  std::string used;
  for (const auto& c : cs)
    if (c.restarts > 0)
      used += (used.empty() ? "" : ", ") + process_name(c) + ": " + std::to_string(c.restarts) + " of " +
              std::to_string(max_restarts);
  return used;
}

// A job: every process at once. A failure (a process that exits non-zero or is killed by a
// signal not gradus-run's) is settled first: for a moment (the settle time, at most --grace)
// the others may fail too, by themselves, and say why, before anything is stopped; then
// blame.hpp names the process that set it off, and the job either restarts (--max-restarts:
// the failed processes alone in a job with --ps, unless a verdict says the job as a whole
// failed; every process otherwise) or stops. fault_file: where the processes write their
// verdicts (empty: not read).
inline int run_job(std::vector<child>& cs, const options& o, const std::filesystem::path& fault_file) {
  const auto job_start = steady::now();
  std::optional<steady::time_point> deadline;
  if (o.timeout > 0) deadline = job_start + std::chrono::duration_cast<steady::duration>(seconds(o.timeout));
  const auto restart_delay = std::chrono::duration_cast<steady::duration>(seconds(o.restart_delay));
  const auto settle_time = std::chrono::duration_cast<steady::duration>(seconds(std::min(1.0, o.grace)));
  child* failure = nullptr;          // the job's failure: whose exit status gradus-run returns
  std::string failure_text;          // and the final line's account of it
  std::uintmax_t verdicts_from = 0;  // the fault file's length at the latest restart: older verdicts are dealt with
  int spawn_error = 0;
  int interrupted = 0;
  bool timed_out = false, ps_stopping = false;
  // failures not yet settled: the processes that failed by themselves since the first of
  // them, and when the settle time ends
  std::vector<child*> unsettled;
  std::optional<steady::time_point> settle_until;
  // a job with parameter servers: when its chief (rank 0 on this host) exited 0, and what
  // happened to the other workers after it (the final line)
  std::optional<steady::time_point> chief_done_at;
  std::string after_chief;
  bool stragglers_stopped = false;
  const auto note_after_chief = [&](const std::string& what) {
    after_chief += (after_chief.empty() ? "" : "; ") + what;
    say(what);
  };

  const auto stop_all = [&](int sig) {
    for (auto& c : cs) signal_child(c, sig, o.grace);
  };
  const auto stopping = [&] { return failure || interrupted || timed_out || spawn_error; };
  // A collective job (no parameter servers) restarts every process together, and so does a
  // job with parameter servers whose failure is the whole job's: group_restarts counts those
  // restarts, group_causes says what set off each.
  const bool group = o.ps == 0;
  int group_restarts = 0;
  std::string group_causes;
  bool regrouping = false;     // the processes are being stopped for a group restart
  bool regroup_due = false;    // every process has exited: all start again at regroup_at
  steady::time_point regroup_at{};
  for (auto& c : cs) {
    if (const int e = spawn(c)) {
      spawn_error = e;
      say("cannot start '" + c.argv[0] + "' for rank " + c.label + ": " + std::strerror(e));
      stop_all(SIGTERM);
      break;
    }
  }
  // Starts c again (the same argv and environment plus GRADUS_RESTART_COUNT=count and
  // GRADUS_RESTART_SCOPE: "job" when every process starts again, "process" when it alone
  // does); false, with the job stopping, when it cannot be started.
  const auto restart = [&](child& c, int count, const char* scope) {
    drain_stream(c.label, c.out);
    drain_stream(c.label, c.err);
    c.env_set["GRADUS_RESTART_COUNT"] = std::to_string(count);
    c.env_set["GRADUS_RESTART_SCOPE"] = scope;
    c.stopped_by_us = c.timed_out = false;
    c.kill_at.reset();
    if (const int e = spawn(c)) {
      spawn_error = e;
      say("cannot restart '" + c.argv[0] + "' for " + process_name(c) + ": " + std::strerror(e) +
          "; stopping the other ranks");
      stop_all(SIGTERM);
      return false;
    }
    c.done = false;
    c.status = 0;
    return true;
  };
  // The unsettled failures, settled: who set them off, then a restart or the job's failure.
  const auto settle = [&] {
    const std::vector<child*> failed = std::exchange(unsettled, {});
    settle_until.reset();
    for (child* c : failed) {  // their last words, before anyone quotes them
      drain_stream(c->label, c->out);
      drain_stream(c->label, c->err);
    }
    const auto verdicts = read_verdicts(fault_file, verdicts_from);
    const auto account = first_failure(cs, failed, verdicts);
    const auto job_wide = group ? std::nullopt : job_wide_failure(verdicts);
    if (stopping() || !account.origin) return;  // the job is stopping already
    if (group || job_wide) {
      if (regrouping) return;  // a restart of the whole job is under way: these are its doing
      // the verdict's words, unless they are the origin's own, quoted already
      const std::string verdict =
          job_wide && job_wide->observer != account.origin->label
              ? " (" + label_name(job_wide->observer) + ": " + job_wide->message + ")"
              : std::string();
      if (group_restarts >= o.max_restarts) {
        failure = account.origin;
        failure_text = account.text;
        say(account.text + (job_wide ? "; the job cannot go on" + verdict : std::string()) + "; stopping the other " +
            (group ? "ranks" : "processes"));
        stop_all(SIGTERM);
        return;
      }
      ++group_restarts;
      group_causes += (group_causes.empty() ? "" : "; ") + account.text;
      regrouping = true;
      for (auto& c : cs) c.restart_at.reset();  // every process starts again: none alone
      for (child* c : failed) ::kill(-c->pid, SIGKILL);  // helpers it left would hold its ports
      verdicts_from = fault_file_length(fault_file);
      const std::string whole = job_wide ? "; the job cannot go on without a restart of every process" + verdict : "";
      say(account.text + whole +
          (cs.size() == 1 ? "; restarting it in " : "; stopping the other " + std::string(group ? "ranks" : "processes") +
                                                         " and restarting all " + std::to_string(cs.size()) + " in ") +
          format_seconds(o.restart_delay) + " s (restart " + std::to_string(group_restarts) + " of " +
          std::to_string(o.max_restarts) + ")");
      stop_all(SIGTERM);
      return;
    }
    // a job with parameter servers: each failed process alone, while it has restarts left
    for (child* c : failed)
      if (c->restarts >= o.max_restarts || (c->is_ps && ps_stopping)) {
        failure = account.origin;
        failure_text = account.text;
        say(account.text + "; stopping the other ranks");
        stop_all(SIGTERM);
        return;
      }
    for (child* c : failed) {
      ++c->restarts;
      c->restart_at = steady::now() + restart_delay;
      // What is left of its process group (a helper it started) would hold its ports.
      ::kill(-c->pid, SIGKILL);
      say(process_name(*c) + " " + describe_status(c->status) + "; restarting it in " + format_seconds(o.restart_delay) +
          " s (restart " + std::to_string(c->restarts) + " of " + std::to_string(o.max_restarts) + ")");
    }
    verdicts_from = fault_file_length(fault_file);
  };
  const auto busy = [&] {
    return std::any_of(cs.begin(), cs.end(),
                       [](const child& c) { return c.running || c.has_open_streams() || c.restart_at; }) ||
           regrouping || settle_until;
  };
  while (busy()) {
    auto wait = steady::duration(std::chrono::milliseconds(200));
    for (const auto& c : cs)
      if (c.restart_at) wait = std::min(wait, *c.restart_at - steady::now());
    if (regroup_due) wait = std::min(wait, regroup_at - steady::now());
    if (settle_until) wait = std::min(wait, *settle_until - steady::now());
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
    if (!group && !chief_done_at)
      for (const child* c : finished)
        if (!c->is_ps && c->label == "0" && !c->failed()) chief_done_at = steady::now();
    // A process that failed by itself waits to be settled with the others that fail within
    // the settle time; while the job stops or restarts as a whole, failures are its doing.
    for (child* c : finished) {
      if (!c->failed() || c->stopped_by_us || stopping() || regrouping) continue;
      if (chief_done_at && !c->is_ps) {  // the job has succeeded already
        note_after_chief(process_name(*c) + " " + describe_status(c->status) + " after the chief finished the job; not restarted");
        continue;
      }
      unsettled.push_back(c);
      if (!settle_until) settle_until = steady::now() + settle_time;
    }
    if (settle_until && (steady::now() >= *settle_until || stopping() ||
                         std::none_of(cs.begin(), cs.end(), [](const child& c) { return c.running; })))
      settle();
    // Workers all done and fine: the parameter servers have served their purpose.
    if (!ps_stopping && !settle_until &&
        std::none_of(cs.begin(), cs.end(), [](const child& c) { return !c.is_ps && (!c.done || c.restart_at); }) &&
        std::any_of(cs.begin(), cs.end(), [](const child& c) { return c.is_ps && (c.running || c.restart_at); })) {
      ps_stopping = true;
      for (auto& c : cs)
        if (c.is_ps) signal_child(c, SIGTERM, o.grace);
    }
    if (deadline && !timed_out && steady::now() >= *deadline) {
      timed_out = true;
      say("timeout: the job ran past " + format_seconds(o.timeout) + " s; stopping the ranks");
      stop_all(SIGTERM);
    }
    // A group restart: once every process has exited, and the delay has passed, all start
    // again; called off when the job stops.
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
          ps_stopping = false;
          for (auto& c : cs)
            if (!restart(c, group_restarts, "job")) break;
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
      if (!c.is_ps && chief_done_at) {
        c.restart_at.reset();
        note_after_chief(process_name(c) + "'s restart is called off: the chief finished the job");
        continue;
      }
      if (steady::now() < *c.restart_at) continue;
      c.restart_at.reset();
      restart(c, c.restarts, "process");
    }
    if (chief_done_at && !stragglers_stopped && !stopping() && steady::now() - *chief_done_at > seconds(10)) {
      stragglers_stopped = true;
      for (auto& c : cs)
        if (!c.is_ps && c.running) {
          note_after_chief(process_name(c) + " still ran 10 s after the chief finished the job; stopping it");
          signal_child(c, SIGTERM, o.grace);
        }
    }
    enforce_kill_deadlines(cs);
    close_orphaned_streams(cs, o.grace);
  }
  std::string used;
  if (group_restarts)
    used = std::to_string(group_restarts) + " of " + std::to_string(o.max_restarts) + ", after: " + group_causes;
  if (const auto alone = restarts_used(cs, o.max_restarts); !alone.empty()) used += (used.empty() ? "" : "; ") + alone;
  const auto restarts_note = used.empty() ? std::string() : " (restarts used: " + used + ")";
  if (spawn_error) {
    if (!used.empty()) say("failed" + restarts_note);
    return 127;
  }
  if (failure) {
    say("failed: " + failure_text + restarts_note);
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
  // Everything exited 0.
  if (!after_chief.empty()) say("finished: the chief exited 0 (after it: " + after_chief + ")" + restarts_note);
  else if (!used.empty()) say("finished: the workers exited 0" + restarts_note);
  return 0;
}

}  // namespace gradus_run
