// libFuzzer target for the CURVE key files (gradus/comm/net/curve_keys.hpp). The first byte
// picks the reader: load_public_key (a .pub file, held in memory: memory_file.hpp) or
// load_key_pair (a <name>.key file, written with mode 0600, or 0640 when the byte says so,
// into a directory of its own under the temp directory, removed when the target exits);
// the rest is the file's text. A key read is Z85 and, for a pair, the public key of its
// secret key; written back as gradus-keygen writes it (public_key_file_text,
// secret_key_file_text), it reads back the same. Every refusal is a gradus::error naming
// the file (a 0640 key pair file always is one).
#include "fuzz_check.hpp"
#include "memory_file.hpp"

#include <gradus/comm/net/curve_keys.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace {

namespace net = gradus::net;

// <temp>/gradus-fuzz-curve-keys.XXXXXX, removed (with what is in it) at exit.
struct key_dir {
  std::string path;
  key_dir() {
    std::string t = (std::filesystem::temp_directory_path() / "gradus-fuzz-curve-keys.XXXXXX").string();
    if (!::mkdtemp(t.data())) {
      std::perror("mkdtemp");
      std::abort();
    }
    path = t;
  }
  ~key_dir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
  // <dir>/pair.key holding exactly `text`, with `mode`: a new file each time (on ext4,
  // truncating one and writing it again flushes it to the disk at close: 4 ms an input)
  std::string hold(std::string_view text, mode_t mode) const {
    const std::string file = path + "/pair.key";
    ::unlink(file.c_str());
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0 && ::fchmod(fd, mode) == 0);
    FUZZ_CHECK(::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    ::close(fd);
    return file;
  }
};

bool refused(const std::string& file, const auto& read) {
  try {
    read();
    return false;
  } catch (const gradus::error& e) {
    const std::string_view msg = e.what();
    FUZZ_CHECK(msg.starts_with("gradus: ") && msg.find("'" + file + "'") != std::string_view::npos);
    return true;
  }
}

void public_key(std::string_view text) {
  static gradus::fuzz::memory_file file("fuzz_curve_keys.pub");
  const std::string& path = file.hold(reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  std::string key;
  if (refused(path, [&] { key = net::load_public_key(path); })) return;
  FUZZ_CHECK(net::z85_key_problem(key).empty());
  const std::string again = net::public_key_file_text(key, "fuzz");
  file.hold(reinterpret_cast<const std::uint8_t*>(again.data()), again.size());
  FUZZ_CHECK(net::load_public_key(path) == key);
}

void key_pair(std::string_view text, bool readable_by_group) {
  static const key_dir dir;
  const std::string path = dir.hold(text, readable_by_group ? 0640 : 0600);
  net::key_pair kp;
  const bool no = refused(path, [&] { kp = net::load_key_pair(path); });
  if (readable_by_group) FUZZ_CHECK(no);
  if (no) return;
  FUZZ_CHECK(net::z85_key_problem(kp.public_key).empty() && net::z85_key_problem(kp.secret_key).empty());
  FUZZ_CHECK(net::public_key_of(kp.secret_key) == kp.public_key);
  net::check_key_pair(kp, "fuzz");  // throws (fails the target) unless the pair is sound
  dir.hold(net::secret_key_file_text(kp, "fuzz"), 0600);
  const auto back = net::load_key_pair(path);
  FUZZ_CHECK(back.public_key == kp.public_key && back.secret_key == kp.secret_key);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if ((data[0] & 1) == 0) public_key(text);
  else key_pair(text, data[0] & 2);
  return 0;
}
