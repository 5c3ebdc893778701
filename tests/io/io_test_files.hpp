#pragma once
// What the gradus::io tests (test_npz.cpp, test_npy.cpp, test_safetensors.cpp) share: a
// scratch directory per test, whole-file reads and writes, an NPY file built byte by byte,
// little-endian bytes of values, and the check that a call throws gradus::error naming
// given things. Include after <boost/test/unit_test.hpp>.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

#include <gradus/core/error.hpp>

namespace gradus::test {

// A fresh directory per test, removed afterwards.
struct scratch {
  std::filesystem::path dir;
  scratch() {
    static std::atomic<int> n{0};
    dir = std::filesystem::temp_directory_path() /
          ("gradus_test_io." + std::to_string(::getpid()) + "." + std::to_string(n++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  ~scratch() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path operator/(const std::string& name) const { return dir / name; }
  std::vector<std::string> files() const {
    std::vector<std::string> r;
    for (const auto& e : std::filesystem::directory_iterator(dir)) r.push_back(e.path().filename().string());
    std::sort(r.begin(), r.end());
    return r;
  }
};

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
inline void spit(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// An NPY file or entry: magic, version, header length, `dict` padded like numpy (spaces,
// '\n', `align` bytes; `growth` extra spaces first, as numpy >= 1.24 leaves), then `data`.
inline std::string npy(const std::string& dict, const std::string& data, int major = 1, std::size_t growth = 0,
                       std::size_t align = 64) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string h = dict + std::string(growth, ' ');
  const std::size_t total = (prefix + h.size() + 1 + align - 1) / align * align;
  h.resize(total - prefix - 1, ' ');
  h += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const std::size_t n = h.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (major != 1) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  return out + h + data;
}

// The bytes of values as this (little-endian) host holds them.
template <class T>
std::string raw(std::initializer_list<T> v) {
  std::string s(v.size() * sizeof(T), '\0');
  if (!s.empty()) std::memcpy(s.data(), std::data(v), s.size());
  return s;
}
inline std::string floats(std::initializer_list<float> v) { return raw<float>(v); }

// Runs f, which must throw gradus::error whose message contains every needle.
inline void expect_error(const std::function<void()>& f, std::initializer_list<std::string> needles) {
  try {
    f();
  } catch (const gradus::error& e) {
    const std::string msg = e.what();
    BOOST_TEST_MESSAGE("error: " << msg);
    for (const auto& n : needles)
      BOOST_CHECK_MESSAGE(msg.find(n) != std::string::npos, "'" << msg << "' lacks '" << n << "'");
    return;
  }
  BOOST_ERROR("no gradus::error thrown (wanted one naming: " << *needles.begin() << ")");
}

}  // namespace gradus::test
