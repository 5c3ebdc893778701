// The C++ side of the interop tests with numpy and with the safetensors spec (io_interop.py):
//   io_interop write FILE.npz             the reference arrays with gradus::io::write_npz
//   io_interop check FILE.npz             read_npz gives exactly the reference arrays (order,
//                                         names, dtypes, shapes, bytes)
//   io_interop write-npy DIR              each reference array k with write_npy, as DIR/k.npy
//   io_interop write-safetensors FILE     the reference arrays with write_safetensors, with
//                                         the metadata {"format": "pt", "writer": "gradus"}
//   io_interop same GOT WANT              GOT and WANT (.npy, .npz or .safetensors, each read
//                                         by its gradus reader) hold the same arrays in the
//                                         same order: dtype, shape and bytes, and names where
//                                         both hold several; a .safetensors file's metadata
//                                         is printed, "metadata KEY=VALUE" a line
//   io_interop refuse FILE TEXT           reading FILE throws gradus::error containing TEXT
// The reference arrays are also built by io_interop.py; keep the two in step. Their bytes
// come from a 64-bit LCG, so the floats include NaNs with payloads, infinities, -0 and
// subnormals: a bit-exact check, not a numeric one.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <gradus/io/npy.hpp>
#include <gradus/io/npz.hpp>
#include <gradus/io/safetensors.hpp>

namespace gio = gradus::io;

namespace {

struct reference {
  std::string name, dtype;  // dtype: numpy's name, as npz_array_ref takes it
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
    r[k].bytes.resize(static_cast<std::size_t>(r[k].shape.numel()) * gradus::size_of(*gradus::element_type_named(r[k].dtype)));
    for (auto& b : r[k].bytes) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      b = static_cast<std::byte>(state >> 56);
    }
  }
  return r;
}

// Reads any of the three formats by its extension.
std::vector<gio::npz_array> load(const std::filesystem::path& file) {
  if (file.extension() == ".npy") return {gio::read_npy(file)};
  if (file.extension() == ".npz") return gio::read_npz(file);
  gio::safetensors_metadata meta;
  auto arrays = gio::read_safetensors(file, &meta);
  for (const auto& [k, v] : meta) std::printf("metadata %s=%s\n", k.c_str(), v.c_str());
  return arrays;
}

int compare(const std::vector<gio::npz_array>& got, const std::vector<reference>& want, const char* file,
            bool names) {
  int bad = 0;
  if (got.size() != want.size()) {
    std::fprintf(stderr, "io_interop: %s holds %zu arrays, want %zu\n", file, got.size(), want.size());
    bad = 1;
  }
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const auto& g = got[i];
    const auto& w = want[i];
    const std::string dtype(gradus::name_of(g.dtype));
    const bool ok = (!names || g.name == w.name) && dtype == w.dtype && g.shape == w.shape && g.bytes == w.bytes;
    std::printf("io_interop: %-16s %-8s %-20s %s\n", g.name.c_str(), dtype.c_str(),
                gradus::to_string(g.shape).c_str(), ok ? "ok" : "WRONG");
    if (!ok) {
      std::fprintf(stderr, "io_interop: %s: array %zu is '%s' %s %s (%zu bytes), want '%s' %s %s (%zu bytes)\n", file,
                   i, g.name.c_str(), dtype.c_str(), gradus::to_string(g.shape).c_str(), g.bytes.size(),
                   w.name.c_str(), w.dtype.c_str(), gradus::to_string(w.shape).c_str(), w.bytes.size());
      bad = 1;
    }
  }
  return bad;
}

// Views of refs, valid while refs lives.
std::vector<gio::npz_array_ref> refs_of(const std::vector<reference>& refs) {
  std::vector<gio::npz_array_ref> arrays;
  for (const auto& r : refs) arrays.push_back({r.name, r.dtype, r.shape, r.bytes.data()});
  return arrays;
}

int run(const std::string& mode, const char* a, const char* b) {
  if (mode == "write") {
    gio::write_npz(a, refs_of(references()));
  } else if (mode == "check") {
    return compare(gio::read_npz(a), references(), a, true);
  } else if (mode == "write-npy") {
    const auto refs = references();  // the refs point into these
    const auto arrays = refs_of(refs);
    for (std::size_t k = 0; k < arrays.size(); ++k)
      gio::write_npy(std::filesystem::path(a) / (std::to_string(k) + ".npy"), arrays[k]);
  } else if (mode == "write-safetensors") {
    gio::write_safetensors(a, refs_of(references()), {{"format", "pt"}, {"writer", "gradus"}});
  } else if (mode == "same") {
    std::vector<reference> want;
    for (auto& w : load(b)) want.push_back({std::move(w.name), std::string(gradus::name_of(w.dtype)), w.shape, std::move(w.bytes)});
    const bool names = std::filesystem::path(a).extension() != ".npy";
    return compare(load(a), want, a, names);
  } else if (mode == "refuse") {
    try {
      load(a);
    } catch (const gradus::error& e) {
      const bool ok = std::string(e.what()).find(b) != std::string::npos;
      std::printf("io_interop: %s refused%s: %s\n", a, ok ? "" : " WITHOUT the text wanted", e.what());
      return ok ? 0 : 1;
    }
    std::fprintf(stderr, "io_interop: %s was read, not refused (wanted: %s)\n", a, b);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc >= 3 ? argv[1] : "";
  const bool one = mode == "write" || mode == "check" || mode == "write-npy" || mode == "write-safetensors";
  const bool two = mode == "same" || mode == "refuse";
  if (!((one && argc == 3) || (two && argc == 4))) {
    std::fprintf(stderr, "usage: io_interop write|check|write-npy|write-safetensors PATH, or same|refuse PATH X\n");
    return 2;
  }
  try {
    return run(mode, argv[2], two ? argv[3] : nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "io_interop: %s\n", e.what());
    return 1;
  }
}
