#pragma once
// A sweep: --sweep name=v1,v2,... (parse_sweep) once or more runs the program once per
// combination of the lists, a single-process run each with --name value appended and
// GRADUS_SWEEP_INDEX and GRADUS_SWEEP in its environment, at most --parallel at a time, and
// ends with a table of their outcomes (run_sweep). Runs are not restarted.
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "options.hpp"
#include "output.hpp"
#include "ports.hpp"
#include "process.hpp"

namespace gradus_run {

struct sweep_axis {
  std::string name;
  std::vector<std::string> values;
};

inline sweep_axis parse_sweep(const std::string& text) {
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

inline int run_sweep(const options& o) {
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

}  // namespace gradus_run
