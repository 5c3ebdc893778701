#pragma once
// Faults: who failed first. A job's processes get GRADUS_FAULT_FILE, a file in a private
// directory made for the job (removed on exit), where the library writes its verdicts
// (core/fault_file.hpp): "rank A blames rank B (gone|silent|failed): ..." when a peer dies,
// stops answering or fails and says so, "ps A fails the job: ..." when the job cannot go on
// whoever is restarted alone. When the job fails, the final line names the process the
// verdicts blame rather than the neighbour that noticed first; a job-wide failure restarts
// the whole job.
//
// Here: the job's directory (job_directory; fault_file_pattern, what dry runs show) and the
// verdicts read back from its fault file (verdict, parse_verdict, read_verdicts); run_job
// (job.hpp) reads them.
// Part of gradus-run: gradus_run.cpp includes it (namespace gradus_run: see there).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ios>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace gradus_run {

// A private directory for the job (mkdtemp, mode 0700) holding the file that the workers'
// communicators append their verdicts to; removed with everything in it when gradus-run
// returns or throws (a SIGKILLed gradus-run leaves it behind: it is small).
struct job_directory {
  std::filesystem::path dir, fault_file;
  job_directory() {
    const char* t = std::getenv("TMPDIR");
    std::string templ = (t && *t ? std::string(t) : std::string("/tmp")) + "/gradus-run.XXXXXX";
    if (!::mkdtemp(templ.data()))
      throw std::runtime_error("cannot create a private directory " + templ + ": " + std::strerror(errno) +
                               " (set TMPDIR to a writable directory)");
    dir = templ;
    fault_file = dir / "faults";
    const int fd = ::open(fault_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) ::close(fd);
  }
  job_directory(const job_directory&) = delete;
  job_directory& operator=(const job_directory&) = delete;
  ~job_directory() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

// What dry runs show for GRADUS_FAULT_FILE: where it would be.
inline std::string fault_file_pattern() {
  const char* t = std::getenv("TMPDIR");
  return (t && *t ? std::string(t) : std::string("/tmp")) + "/gradus-run.XXXXXX/faults";
}

// One line of the fault file (the library's core/fault_file.hpp writes them):
//   "<who> blames <who> (<gone|silent|failed>): <message>"   observer, peer and kind
//   "<who> fails the job: <message>"                        observer; kind "job", no peer
// where <who> is "rank N" or "ps N"; here each is the label of its child ("N", "psN").
struct verdict {
  std::string observer, peer, kind, message;
};

inline std::optional<verdict> parse_verdict(const std::string& line) {
  const auto literal = [&](std::size_t& p, const std::string& text) {
    if (line.compare(p, text.size(), text) != 0) return false;
    p += text.size();
    return true;
  };
  const auto who = [&](std::size_t& p, std::string& label) {
    std::string prefix;
    if (literal(p, "rank ")) {
      prefix = "";
    } else if (literal(p, "ps ")) {
      prefix = "ps";
    } else {
      return false;
    }
    const auto b = p;
    while (p < line.size() && p - b < 9 && line[p] >= '0' && line[p] <= '9') ++p;
    if (p == b) return false;
    label = prefix + line.substr(b, p - b);
    return true;
  };
  verdict v;
  std::size_t p = 0;
  if (!who(p, v.observer)) return std::nullopt;
  if (literal(p, " fails the job: ")) {
    v.kind = "job";
  } else {
    if (!literal(p, " blames ") || !who(p, v.peer) || !literal(p, " (")) return std::nullopt;
    for (const char* k : {"gone", "silent", "failed"})
      if (literal(p, std::string(k) + "): ")) {
        v.kind = k;
        break;
      }
    if (v.kind.empty()) return std::nullopt;
  }
  v.message = line.substr(p);
  return v;
}

// The verdicts in the fault file (in the order they were appended) from byte `from` on.
inline std::vector<verdict> read_verdicts(const std::filesystem::path& file, std::uintmax_t from) {
  std::vector<verdict> r;
  if (file.empty()) return r;
  std::ifstream in(file);
  in.seekg(static_cast<std::streamoff>(from));
  std::string line;
  for (int n = 0; n < 100000 && std::getline(in, line); ++n)
    if (auto v = parse_verdict(line)) r.push_back(std::move(*v));
  return r;
}

// The fault file's length now: verdicts before it are dealt with once the job restarts.
inline std::uintmax_t fault_file_length(const std::filesystem::path& file) {
  std::error_code ec;
  const auto n = file.empty() ? 0 : std::filesystem::file_size(file, ec);
  return ec ? 0 : n;
}

}  // namespace gradus_run
