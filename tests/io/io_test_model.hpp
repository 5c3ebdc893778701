#pragma once
// The small classifier the checkpoint and weights tests (test_checkpoint.cpp,
// test_weights.cpp) train and save: x [N, 20] -> dense1 (16, tanh) -> dense2 (4), its
// initial values, a session's tensors as bytes, a scratch directory and the text of the
// gradus::error a call throws.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>

namespace gradus::test {

inline placeholder<"x", float, dyn, 20> x;
inline placeholder<"y", std::int32_t, dyn> y;
inline variable<"dense1/w", float, 20, 16> w1;
inline variable<"dense1/b", float, 16> b1;
inline variable<"dense2/w", float, 16, 4> w2;
inline variable<"dense2/b", float, 4> b2;

inline auto logits() { return matmul(tanh(matmul(x, w1) + b1), w2) + b2; }
inline auto loss() { return mean(softmax_cross_entropy(logits(), y)); }

inline void init(session<cpu_simd>& s) {
  initialize(s, w1, init::glorot_uniform{}, 11);
  initialize(s, b1, init::zeros{}, 11);
  initialize(s, w2, init::glorot_uniform{}, 11);
  initialize(s, b2, init::constant{0.1}, 11);
}

// Every tensor the session holds, by name, as bytes.
inline std::map<std::string, std::vector<std::byte>> snapshot(const session<cpu_simd>& s) {
  std::map<std::string, std::vector<std::byte>> r;
  for (const auto& e : s.entries()) {
    const std::size_t bytes = static_cast<std::size_t>(e.shape.numel()) * size_of(e.dtype);
    r[std::string(e.name)].assign(static_cast<const std::byte*>(e.data), static_cast<const std::byte*>(e.data) + bytes);
  }
  return r;
}

// A directory of its own (`tag` and the process id), removed afterwards.
struct temp_dir {
  std::filesystem::path p;
  explicit temp_dir(const std::string& tag = "io")
      : p(std::filesystem::temp_directory_path() / ("gradus_" + tag + "_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(p);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() { std::filesystem::remove_all(p); }
};

// The text of the gradus::error f() throws; "no error" if none.
inline std::string error_of(auto&& f) {
  try {
    f();
  } catch (const error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace gradus::test
