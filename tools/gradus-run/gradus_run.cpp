// gradus-run: start a data-parallel job's processes on this host, or a hyper-parameter
// sweep of independent single-process runs. See tools/gradus-run/README.md and --help.
//
//   gradus-run -np N [--ps M] [--hosts h1,h2 [--node-rank R]] [--port P] [--timeout S] [--max-restarts K]
//              program args...
//   gradus-run --sweep 'lr=0.01,0.05,0.1' [--sweep 'batch=32,64'] [--parallel K] program args...
//
// This file holds the command line (CLI11) and main; the rest is in the headers beside it,
// one part each, each one's opening comment saying more:
//   output.hpp      write_all, say, and the text of messages (wait statuses, seconds, quoting)
//   process.hpp     a child process: spawn, signal_child, gradus-run's signal handling, and
//                   the pump loop that copies the children's lines behind "[label] " and
//                   reaps them (PR_SET_PDEATHSIG: children die with gradus-run)
//   ports.hpp       free TCP ports on 127.0.0.1; is_local_host
//   fault_file.hpp  the job's private directory and the verdicts of its fault file
//                   (GRADUS_FAULT_FILE: whom the workers blame)
//   options.hpp     the options
//   job.hpp         a job: plan_job (torchrun's environment), run_job (the first failure
//                   stops the rest; --max-restarts per process with --ps, as a group without)
//   sweep.hpp       a sweep: its runs, at most --parallel at a time, and their table
//   trace_merge.hpp --trace DIR: a timeline file per process, merged when the job ends
// gradus-run stays one program and one translation unit: only this file includes the headers.
// They define everything in namespace gradus_run, the functions inline, as the examples'
// shared headers do (namespace gradus_examples): that is what a header may hold whoever
// includes it. An anonymous namespace in each header would do for this one includer, but a
// second one (a test of parse_verdict, say) would get its own copy of signal_pipe and, under
// -Wall -Werror, an error for each function of the header that it does not call.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <CLI/CLI.hpp>

#include "fault_file.hpp"
#include "job.hpp"
#include "options.hpp"
#include "output.hpp"
#include "ports.hpp"
#include "process.hpp"
#include "sweep.hpp"

namespace {

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

// Seconds in [0, most]. CLI11's NonNegativeNumber and Range let NaN through (every
// comparison with it is false), and NonNegativeNumber's message writes DBL_MAX out in
// full (309 digits); this says what was expected and what was given.
CLI::Validator seconds_check(double most) {
  char range[64];
  std::snprintf(range, sizeof range, "in [0, %.15g]", most);
  return CLI::Validator(
      [most, text = std::string(range)](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (s.empty() || *end != '\0' || !std::isfinite(v) || v < 0 || v > most)
          return "expected a finite number of seconds " + text + ", got " + s;
        return {};
      },
      "SECONDS " + std::string(range));
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gradus_run;
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
      ->check(seconds_check(1e9));  // ~31 years: as steady_clock nanoseconds, far from int64's 292 years
  app.add_option("--grace", o.grace, "seconds between SIGTERM and SIGKILL when stopping processes")
      ->check(seconds_check(3600));
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
      ->check(seconds_check(3600));
  app.add_option("--trace", o.trace_dir,
                 "each process writes its timeline to DIR/rank-N.json (ps tasks: DIR/ps-N.json; GRADUS_TRACE, which "
                 "the examples' --trace reads), merged into DIR/trace.json when the job ends (Perfetto, chrome://tracing)")
      ->type_name("DIR");
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
    if (!o.sweeps.empty() && !o.trace_dir.empty())
      throw CLI::ValidationError("--trace", "traces a job's processes; a sweep's runs take their own --trace FILE");
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
        c.env_set["GRADUS_FAULT_FILE"] = fault_file_pattern();
      print_dry_run(cs);
      return 0;
    }
    const job_directory job;
    for (auto& c : cs)
      c.env_set["GRADUS_FAULT_FILE"] = job.fault_file.string();
    if (!o.trace_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(o.trace_dir, ec);
      if (ec) throw std::runtime_error("--trace: cannot make the directory '" + o.trace_dir + "': " + ec.message());
    }
    install_signal_handlers();
    const int rc = run_job(cs, o, job.fault_file);
    if (!o.trace_dir.empty()) say(merge_traces(o.trace_dir));  // a failed job's timelines too
    return rc;
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
