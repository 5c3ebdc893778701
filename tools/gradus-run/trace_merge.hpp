#pragma once
// gradus-run --trace DIR: each process of the job is given its own timeline file through
// GRADUS_TRACE (DIR/rank-N.json for worker N, DIR/ps-N.json for parameter-server task N; the
// examples' --trace reads it, examples/comm_options.hpp), and when the job ends the files
// are merged into DIR/trace.json: one Chrome Trace Event file, one process per rank, their
// clocks put on one time line. Each file's timestamps count from its recorder's start, and
// its otherData.clock_origin_unix_us says when that was on the host's clock: each file's
// events are shifted by their origin's distance from the earliest one. (The ranks of one
// host share that clock; ranks on several hosts are as close as the hosts' clocks are.)
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>


namespace gradus_run {

inline std::string quoted_path(const std::string& s) { return "'" + s + "'"; }

/// The timeline file of worker `rank` (or parameter-server task `rank` when `ps`) in `dir`.
inline std::string trace_file_of(const std::string& dir, int rank, bool ps) {
  return (std::filesystem::path(dir) / ((ps ? "ps-" : "rank-") + std::to_string(rank) + ".json")).string();
}

/// Merges the per-process files of `dir` (rank-*.json, ps-*.json) into dir/trace.json and
/// returns a line saying what it wrote (for say()) (or why it wrote nothing). A file that does not
/// parse is named and left out; the others are merged.
inline std::string merge_traces(const std::string& dir) {
  namespace fs = std::filesystem;
  struct part {
    fs::path file;
    nlohmann::json events;
    std::int64_t origin;
  };
  std::vector<part> parts;
  std::string skipped;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool ours = (name.rfind("rank-", 0) == 0 || name.rfind("ps-", 0) == 0) && e.path().extension() == ".json";
    if (!ours) continue;
    try {
      std::ifstream in(e.path());
      std::stringstream text;
      text << in.rdbuf();
      nlohmann::json j = nlohmann::json::parse(text.str());
      parts.push_back({e.path(), std::move(j.at("traceEvents")),
                       j.at("otherData").at("clock_origin_unix_us").get<std::int64_t>()});
    } catch (const std::exception& x) {
      skipped += (skipped.empty() ? "" : ", ") + quoted_path(e.path().string()) + " (" + x.what() + ")";
    }
  }
  if (ec) return "--trace: cannot read the directory " + quoted_path(dir) + ": " + ec.message();
  if (parts.empty())
    return "--trace: no process wrote a timeline into " + quoted_path(dir) +
           (skipped.empty() ? std::string(" (does the program take --trace? the examples do)") : ": " + skipped);
  std::sort(parts.begin(), parts.end(), [](const part& a, const part& b) { return a.file < b.file; });
  std::int64_t origin = parts.front().origin;
  for (const auto& p : parts) origin = std::min(origin, p.origin);
  nlohmann::json merged = nlohmann::json::array();
  for (auto& p : parts)
    for (auto& ev : p.events) {
      if (ev.contains("ts")) ev["ts"] = ev["ts"].get<std::int64_t>() + (p.origin - origin);
      merged.push_back(std::move(ev));
    }
  const nlohmann::json out = {{"traceEvents", std::move(merged)},
                              {"displayTimeUnit", "ms"},
                              {"otherData", {{"clock_origin_unix_us", origin}, {"processes", parts.size()}}}};
  const fs::path file = fs::path(dir) / "trace.json", tmp = fs::path(dir) / "trace.json.tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << out.dump() << "\n";
    if (!f) return "--trace: cannot write " + quoted_path(tmp.string());
  }
  fs::rename(tmp, file, ec);
  if (ec) return "--trace: cannot write " + quoted_path(file.string()) + ": " + ec.message();
  return "the job's timeline: " + file.string() + " (" + std::to_string(parts.size()) +
         " processes; open it in Perfetto or chrome://tracing)" + (skipped.empty() ? "" : "; left out: " + skipped);
}

}  // namespace gradus_run
