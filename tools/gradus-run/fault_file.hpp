#pragma once
// Faults: who stopped responding. A job's workers get GRADUS_FAULT_FILE, a file in a private
// directory made for the job (removed on exit), where a ring communicator writes "rank A
// blames rank B (gone|silent): ..." when a peer dies or stops answering; when the job fails,
// the final line names the blamed rank rather than the neighbour that noticed first.
//
// Here: the job's directory (job_directory; fault_file_pattern, what dry runs show) and the
// verdicts read back from its fault file (blame, parse_blame, first_blame); run_job
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

// One line of the fault file: "rank <observer> blames rank <peer> (<gone|silent>): <message>".
struct blame {
  std::string observer, peer, kind;
};

inline std::optional<blame> parse_blame(const std::string& line) {
  const auto digits = [&](std::size_t& p, std::string& out) {
    const auto b = p;
    while (p < line.size() && p - b < 9 && line[p] >= '0' && line[p] <= '9') ++p;
    out = line.substr(b, p - b);
    return !out.empty();
  };
  const auto literal = [&](std::size_t& p, const std::string& text) {
    if (line.compare(p, text.size(), text) != 0) return false;
    p += text.size();
    return true;
  };
  blame b;
  std::size_t p = 0;
  if (!literal(p, "rank ") || !digits(p, b.observer) || !literal(p, " blames rank ") || !digits(p, b.peer) ||
      !literal(p, " ("))
    return std::nullopt;
  if (literal(p, "gone): ")) {
    b.kind = "gone";
  } else if (literal(p, "silent): ")) {
    b.kind = "silent";
  } else {
    return std::nullopt;
  }
  return b;
}

// The first verdict in the fault file (in the order they were appended) from byte `from` on,
// if any.
inline std::optional<blame> first_blame(const std::filesystem::path& file, std::uintmax_t from) {
  std::ifstream in(file);
  in.seekg(static_cast<std::streamoff>(from));
  std::string line;
  for (int n = 0; n < 100000 && std::getline(in, line); ++n)
    if (auto b = parse_blame(line)) return b;
  return std::nullopt;
}

}  // namespace gradus_run
