// npz_interop write FILE   writes the reference arrays with gradus::io::write_npz
// npz_interop check FILE   reads FILE with gradus::io::read_npz and checks that it holds
//                          exactly the reference arrays (order, names, dtypes, shapes, bytes)
// The reference arrays are also built by npz_interop.py; keep the two in step. Their bytes
// come from a 64-bit LCG, so the floats include NaNs with payloads, infinities, -0 and
// subnormals: a bit-exact check, not a numeric one.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <gradus/io/npz.hpp>

namespace gio = gradus::io;

namespace {

struct reference {
  std::string name, dtype;
  gradus::dims shape;
  std::vector<std::byte> bytes;
};

std::vector<reference> references() {
  std::vector<reference> r = {
      {"w1/adam_m", "float32", {3, 4}, {}},
      {"w1/adam_v", "float64", {2, 3, 5}, {}},
      {"step", "int64", {}, {}},
      {"labels", "int32", {7}, {}},
      {"mask", "uint8", {2, 1, 3, 1, 2, 2}, {}},
      {"empty", "float32", {0, 3}, {}},
      {"bias", "float64", {}, {}},
      {"gewicht_gr\xc3\xb6\xc3\x9f" "e", "float32", {2}, {}},
  };
  for (std::size_t k = 0; k < r.size(); ++k) {
    std::uint64_t state = 0x9E3779B97F4A7C15ull * (k + 1);
    r[k].bytes.resize(static_cast<std::size_t>(r[k].shape.numel()) * gio::npz_itemsize(r[k].dtype));
    for (auto& b : r[k].bytes) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<std::byte>(state >> 56);
    }
  }
  return r;
}

int check(const char* file) {
  const auto want = references();
  const auto got = gio::read_npz(file);
  int bad = 0;
  if (got.size() != want.size()) {
    std::fprintf(stderr, "npz_interop: %s holds %zu arrays, want %zu\n", file, got.size(), want.size());
    bad = 1;
  }
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const auto& g = got[i];
    const auto& w = want[i];
    const bool ok = g.name == w.name && g.dtype == w.dtype && g.shape == w.shape && g.bytes == w.bytes;
    std::printf("npz_interop: %-16s %-8s %-20s %s\n", g.name.c_str(), g.dtype.c_str(),
                gradus::to_string(g.shape).c_str(), ok ? "ok" : "WRONG");
    if (!ok) {
      std::fprintf(stderr, "npz_interop: array %zu is '%s' %s %s (%zu bytes), want '%s' %s %s (%zu bytes)\n", i,
                   g.name.c_str(), g.dtype.c_str(), gradus::to_string(g.shape).c_str(), g.bytes.size(),
                   w.name.c_str(), w.dtype.c_str(), gradus::to_string(w.shape).c_str(), w.bytes.size());
      bad = 1;
    }
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 3 ? argv[1] : "";
  if (mode != "write" && mode != "check") {
    std::fprintf(stderr, "usage: npz_interop write|check FILE\n");
    return 2;
  }
  try {
    if (mode == "check") return check(argv[2]);
    const auto refs = references();
    std::vector<gio::npz_array_ref> arrays;
    for (const auto& r : refs) arrays.push_back({r.name, r.dtype, r.shape, r.bytes.data()});
    gio::write_npz(argv[2], arrays);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "npz_interop: %s\n", e.what());
    return 1;
  }
}
