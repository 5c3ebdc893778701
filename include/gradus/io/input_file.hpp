#pragma once
// A file opened for reading by gradus::io's readers of plain files (.npy, .safetensors): its
// size, and exact reads whose errors name the file (ctx) and what was being read. POSIX.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>

#include "gradus/core/error.hpp"
#include "gradus/io/atomic_file.hpp"

namespace gradus::io::detail {

class input_file {
 public:
  /// ctx: the start of every error, e.g. "gradus: read_npy '<file>': ".
  input_file(const std::filesystem::path& file, std::string ctx) : ctx_(std::move(ctx)) {
    fd_.fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_.fd < 0) throw error(ctx_ + "open: " + errno_text(errno));
    struct stat st {};
    if (::fstat(fd_.fd, &st) != 0) throw error(ctx_ + "fstat: " + errno_text(errno));
    if (!S_ISREG(st.st_mode)) throw error(ctx_ + "not a regular file");
    size_ = static_cast<std::uint64_t>(st.st_size);
  }

  std::uint64_t size() const { return size_; }
  std::uint64_t position() const { return at_; }

  /// Reads exactly n bytes at the current position, or throws "truncated: the <what> ends
  /// after k of n bytes".
  void read(void* dst, std::size_t n, const char* what) {
    auto* d = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd_.fd, d + got, n - got, static_cast<off_t>(at_ + got));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw error(ctx_ + "reading the " + what + ": " + errno_text(errno));
      if (r == 0)
        throw error(ctx_ + "truncated: the " + what + " ends after " + std::to_string(got) + " of " +
                    std::to_string(n) + " bytes");
      got += static_cast<std::size_t>(r);
    }
    at_ += n;
  }

 private:
  fd_handle fd_;
  std::string ctx_;
  std::uint64_t size_ = 0, at_ = 0;
};

}  // namespace gradus::io::detail
