#pragma once
// Server recovery from a checkpoint: ps::restore_from_checkpoint(file) is a restore_source
// (server_options::restore) that reads the chief's .npz (gradus::save_checkpoint: each
// variable by its name, its optimizer state as "<name>/<slot>", "global_step"). A
// restarted server calls it for each shard the rejoining workers declare again. Needs
// gradus::io (libzip), which the server itself does not: the source is a function so that
// a program may restore from anything (another format, a remote store).
#include <filesystem>
#include <memory>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gradus/comm/ps/server_options.hpp"
#include "gradus/io/checkpoint.hpp"
#include "gradus/io/npz.hpp"

namespace gradus::ps {

/// A restore_source (server_options::restore) over the checkpoint `file` the chief writes. It
/// reads the file once, at its first call (a restarted server's first shard), and throws
/// gradus::error there when the file does not exist or holds no int64 "global_step"; a call
/// throws when the variable is neither float32 nor float64, or when one of the optimizer's
/// state tensors is missing or of another dtype; a variable the file does not hold gives
/// nothing. Thread-safe.
inline restore_source restore_from_checkpoint(std::filesystem::path file) {
  struct cache {
    std::once_flag once;
    std::vector<io::npz_array> arrays;
    std::int64_t step = 0;
  };
  auto c = std::make_shared<cache>();
  return [file = std::move(file), c](const std::string& name, const std::vector<std::string>& slots) -> std::optional<restored_variable> {
    std::call_once(c->once, [&] {
      if (!std::filesystem::exists(file))
        throw error("gradus: parameter server: restarted, but there is no checkpoint '" + file.string() +
                    "' to restore from yet (the chief writes it: --checkpoint; the shards' values are lost)");
      c->arrays = io::read_npz(file);
      bool found = false;
      for (const auto& a : c->arrays)
        if (a.name == global_step_key && a.dtype == element_type::i64 && a.bytes.size() == 8) {
          std::memcpy(&c->step, a.bytes.data(), 8);
          found = true;
        }
      if (!found) throw error("gradus: parameter server: the checkpoint '" + file.string() + "' has no int64 '" + std::string(global_step_key) + "'");
    });
    const auto find = [&](const std::string& n) -> const io::npz_array* {
      for (const auto& a : c->arrays)
        if (a.name == n) return &a;
      return nullptr;
    };
    const auto* v = find(name);
    if (!v) return std::nullopt;
    if (v->dtype != element_type::f32 && v->dtype != element_type::f64)
      throw error("gradus: parameter server: the checkpoint's '" + name + "' is " + std::string(name_of(v->dtype)) +
                  " (float32 or float64)");
    restored_variable r;
    r.dt = v->dtype;
    r.values = v->bytes;
    r.step = c->step;
    for (const auto& s : slots) {
      const auto* a = find(name + "/" + s);
      if (!a) throw error("gradus: parameter server: the checkpoint '" + file.string() + "' has no optimizer state '" + name + "/" + s + "'");
      if (a->dtype != v->dtype)
        throw error("gradus: parameter server: the checkpoint's '" + name + "/" + s + "' is " + std::string(name_of(a->dtype)) +
                    ", its variable " + std::string(name_of(v->dtype)));
      r.slots.push_back(a->bytes);
    }
    return r;
  };
}

}  // namespace gradus::ps
