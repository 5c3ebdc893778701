#pragma once
// Checkpoints: every tensor a session holds (variables and optimizer state, by name) and
// the step counter, in a .npz file that numpy.load reads (np.load(f)["w1"],
// np.load(f)["w1/adam_m"], np.load(f)["global_step"]).
//
//   g::save_checkpoint(s, "run/ckpt.npz");     // atomic: temporary file + rename
//   g::restore_checkpoint(s, "run/ckpt.npz");  // all or nothing
//
// restore compares the file with the session — the variables the graph declared
// (minimize() declares its variables and creates the optimizer state) — and refuses a
// file whose names, dtypes or shapes differ, listing every difference; nothing is written
// into the session unless everything matches.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/io/npz.hpp"

namespace gradus {

inline constexpr std::string_view global_step_key = "global_step";

template <class Backend>
void save_checkpoint(const session<Backend>& s, const std::filesystem::path& file) {
  const auto entries = s.entries();
  std::vector<std::vector<std::byte>> host(entries.size());
  std::vector<io::npz_array_ref> arrays;
  arrays.reserve(entries.size() + 1);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.name == global_step_key)
      throw error("gradus: save_checkpoint '" + file.string() + "': a variable is named '" +
                  std::string(global_step_key) + "', the key of the step counter");
    if (!e.initialized)
      throw error("gradus: save_checkpoint '" + file.string() + "': variable '" + std::string(e.name) +
                  "' has no value yet; nothing was written");
    const std::size_t bytes = static_cast<std::size_t>(e.shape.numel()) * io::npz_itemsize(e.dtype);
    host[i].resize(bytes);
    Backend::copy_to_host(host[i].data(), e.data, bytes);
    arrays.push_back({std::string(e.name), e.dtype, e.shape, host[i].data()});
  }
  const std::int64_t step = s.global_step();
  arrays.push_back({std::string(global_step_key), "int64", dims{}, &step});
  io::write_npz(file, arrays);
}

template <class Backend>
void restore_checkpoint(session<Backend>& s, const std::filesystem::path& file) {
  const std::vector<io::npz_array> arrays = io::read_npz(file);
  std::map<std::string, const io::npz_array*, std::less<>> by_name;
  for (const auto& a : arrays) by_name.emplace(a.name, &a);

  std::vector<std::string> diffs;
  const auto entries = s.entries();
  for (const auto& e : entries) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      diffs.push_back("missing from the file: '" + std::string(e.name) + "' " + to_string(e.shape) + " " +
                      std::string(e.dtype));
      continue;
    }
    const io::npz_array& a = *it->second;
    if (a.dtype != e.dtype || !(a.shape == e.shape))
      diffs.push_back("'" + std::string(e.name) + "': the session has " + to_string(e.shape) + " " +
                      std::string(e.dtype) + ", the file " + to_string(a.shape) + " " + a.dtype);
  }
  const io::npz_array* step = nullptr;
  for (const auto& a : arrays) {
    if (a.name == global_step_key) {
      step = &a;
      if (a.dtype != "int64" || a.shape.rank != 0)
        diffs.push_back("'" + std::string(global_step_key) + "' must be a scalar int64, the file has " +
                        to_string(a.shape) + " " + a.dtype);
      continue;
    }
    bool known = false;
    for (const auto& e : entries) known = known || e.name == a.name;
    if (!known)
      diffs.push_back("not in the session: '" + a.name + "' " + to_string(a.shape) + " " + a.dtype);
  }
  if (!step) diffs.push_back("missing from the file: '" + std::string(global_step_key) + "' (the step counter)");
  if (!diffs.empty()) {
    std::string msg = "gradus: restore_checkpoint '" + file.string() + "': the checkpoint does not match the " +
                      "session (nothing was restored):";
    for (const auto& d : diffs) msg += "\n  " + d;
    throw error(msg);
  }
  for (const auto& e : entries) {
    const io::npz_array& a = *by_name.find(e.name)->second;
    Backend::copy_to_device(e.data, a.bytes.data(), a.bytes.size());
    s.mark_initialized(e.name);
  }
  std::int64_t st = 0;
  std::memcpy(&st, step->bytes.data(), sizeof st);
  s.set_global_step(st);
}

}  // namespace gradus
