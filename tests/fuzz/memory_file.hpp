#pragma once
// A file in memory (memfd_create), for targets whose reader takes a path: each input is
// written into it and the reader opens "/proc/self/fd/<fd>". Nothing touches a file
// system, so a crash leaves nothing behind. Linux only, as the fuzz targets are.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace gradus::fuzz {

class memory_file {
 public:
  explicit memory_file(const char* name) : fd_(::memfd_create(name, MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  memory_file(const memory_file&) = delete;
  memory_file& operator=(const memory_file&) = delete;
  ~memory_file() { ::close(fd_); }

  // The file now holds exactly these bytes.
  const std::string& hold(const std::uint8_t* data, std::size_t size) {
    bool ok = ::ftruncate(fd_, 0) == 0;
    for (std::size_t at = 0; ok && at < size;) {
      const ssize_t n = ::pwrite(fd_, data + at, size - at, static_cast<off_t>(at));
      ok = n > 0;
      at += ok ? static_cast<std::size_t>(n) : 0;
    }
    if (!ok) {
      std::perror("memory_file");
      std::abort();
    }
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace gradus::fuzz
