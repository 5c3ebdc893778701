#pragma once
// gradus-run's options: what main (gradus_run.cpp) parses from the command line with CLI11,
// and run_job (job.hpp) and run_sweep (sweep.hpp) read.
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <string>
#include <vector>

namespace gradus_run {

struct options {
  int np = 1;
  int ps = 0;
  std::vector<std::string> hosts;
  int node_rank = -1;
  std::string master_addr;
  int port = 0;
  double timeout = 0;
  double grace = 5;
  std::vector<std::string> sweeps;
  int parallel = 0;
  bool dry_run = false;
  int max_restarts = 0;
  double restart_delay = 1;
  std::string trace_dir;  // --trace DIR: each process's timeline there, merged at the end
  std::vector<std::string> command;
};

}  // namespace gradus_run
