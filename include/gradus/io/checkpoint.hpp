#pragma once
// Checkpoints: every tensor a session holds (variables and optimizer state, by name) and
// the step counter, in a .npz file that numpy.load reads (np.load(f)["w1"],
// np.load(f)["w1/adam_m"], np.load(f)["global_step"]).
//
//   g::save_checkpoint(s, "run/ckpt.npz");     // atomic: temporary file + rename
//   g::restore_checkpoint(s, "run/ckpt.npz");  // all or nothing
//
//   // a data-parallel job: record the world size, and refuse to resume with another one
//   g::save_checkpoint(s, "run/ckpt.npz", {.world_size = spec.world_size});
//   g::restore_checkpoint(s, "run/ckpt.npz", {.world_size = spec.world_size});
//
// restore compares the file with the session — the variables the graph declared
// (minimize() declares its variables and creates the optimizer state) — and refuses a
// file whose names, dtypes or shapes differ, listing every difference; nothing is written
// into the session unless everything matches. It also refuses, naming the file and the
// array, a negative global_step and any NaN or Inf in a variable or optimizer array (the
// first bad element's index and the count of bad elements in each such array): resuming
// from a diverged run would only diverge again, silently, one epoch later.
//
// World size. In data-parallel training one global step consumes world_size x batch
// examples, so the step counter, the learning-rate schedule it drives and the position in
// the data all mean something else under another world size. With options.world_size > 0,
// save records it as the int64 scalar "gradus/world_size" (np.load(f)["gradus/world_size"])
// and restore refuses a file recorded with another one. A file without the field (written
// before it existed, or without the option) restores under any world size, as does any
// file when restore is given no world size.
//
// Pipelines (parallel/pipeline): each stage writes its own file (Megatron-LM's one file per
// stage), holding only that stage's tensors (options.only) and recording "gradus/stages" and
// "gradus/stage"; the files of one save are committed together (io/checkpoint_set.hpp:
// "run/ckpt.npz" -> "run/ckpt-7.stage-1-of-2.npz" and the record "run/ckpt.commit").
// restore refuses a stage file given to a run without stages, a whole-model file given to a
// stage, and a file of another stage count or stage, naming both.
//
// A save killed mid-write leaves its temporary behind; the next save of the same file
// removes it (io::write_npz).
//
// Inference: io/weights.hpp's load_weights takes the variables alone from a checkpoint
// (skipping the optimizer's state and the step counter), into a session of the forward
// graph; save_weights writes the variables alone.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/io/checkpoint_set.hpp"
#include "gradus/io/npz.hpp"

namespace gradus {

/// The names a checkpoint keeps for itself (int64 scalars in the .npz; a session tensor named
/// like one is refused by save_checkpoint): the step counter, always written.
inline constexpr std::string_view global_step_key = "global_step";
inline constexpr std::string_view world_size_key = "gradus/world_size";  ///< checkpoint_options::world_size, when > 0
inline constexpr std::string_view stages_key = "gradus/stages";  ///< a pipeline stage file's stage count
inline constexpr std::string_view stage_key = "gradus/stage";  ///< a pipeline stage file's stage
/// The session's precision policy's compute type (core/precision.hpp), as element_type's
/// value: informational, since masters are fp32 under every policy and a checkpoint of one
/// policy loads into a session of another.
inline constexpr std::string_view precision_key = "gradus/precision";
/// A policy's own state (the loss scaler's, train/loss_scale.hpp): restored where both the
/// file and the session hold it; a file without it leaves the session's (a checkpoint of an
/// unscaled policy into an fp16 session), and a session without it ignores the file's.
inline bool policy_state(std::string_view name) { return name.starts_with("loss_scaler/"); }

/// What a checkpoint records about the job besides the session, and what restore expects.
struct checkpoint_options {
  /// The number of data-parallel ranks of the job (cluster_spec::world_size). save: recorded
  /// when > 0. restore: when > 0, a file recorded with another world size is refused.
  int world_size = 0;
  /// A pipeline's stage (stages > 0): save records both; restore refuses a file of another
  /// stage count or stage, and a file without them (a whole model's).
  int stages = 0, stage = 0;  ///< this rank's stage, 0 to stages - 1 (with stages > 0)
  /// The session's tensors the file holds (save) or must hold (restore), by name; empty: all.
  std::vector<std::string> only = {};
};

/// The file of stage `stage` of an S-stage pipeline's checkpoint `file` in the layout of gradus
/// 0.1 (one file per stage, replaced in place, no commit record): "run/ckpt.npz" ->
/// "run/ckpt.stage-1-of-2.npz". Such a set is still restored; a save replaces it with a
/// committed set (io/checkpoint_set.hpp).
inline std::filesystem::path stage_checkpoint_file(const std::filesystem::path& file, int stage, int stages) {
  auto r = file;
  r.replace_filename(file.stem().string() + ".stage-" + std::to_string(stage) + "-of-" + std::to_string(stages) +
                     file.extension().string());
  return r;
}

/// The file that holds stage `stage` of the pipeline checkpoint `file` now: the part its
/// commit record names ("run/ckpt.npz" -> "run/ckpt-7.stage-1-of-2.npz", io/checkpoint_set.hpp),
/// e.g. to load one stage's weights (load_weights). Throws gradus::error when `file` has no
/// commit record of stages, or `stage` is not one of its stages.
inline std::filesystem::path committed_stage_file(const std::filesystem::path& file, int stage) {
  const auto c = read_checkpoint_commit(file);
  if (!c || c->kind != "stage")
    throw error("gradus: checkpoint '" + file.string() + "': no commit record of a pipeline's stages ('" +
                checkpoint_commit_file(file).string() + "')");
  if (stage < 0 || stage >= c->parts)
    throw error("gradus: checkpoint '" + file.string() + "': stage " + std::to_string(stage) + " of a pipeline of " +
                std::to_string(c->parts) + " stages");
  return checkpoint_part_file(file, "stage", stage, c->parts, c->save);
}

/// The stage counts S of the pipelined checkpoints of `file` present, ascending: its commit
/// record's (a malformed record counts as none here) and those of 0.1-layout sets (their
/// stage-0 file, stage_checkpoint_file(file, 0, S)).
inline std::vector<int> stage_checkpoints_present(const std::filesystem::path& file) {
  std::vector<int> r;
  try {
    if (const auto c = read_checkpoint_commit(file); c && c->kind == "stage") r.push_back(c->parts);
  } catch (const error&) {
  }
  const auto dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  const std::string head = file.stem().string() + ".stage-0-of-", tail = file.extension().string();
  std::error_code ec;
  for (const auto& de : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = de.path().filename().string();
    if (n.size() <= head.size() + tail.size() || n.compare(0, head.size(), head) != 0 ||
        n.compare(n.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string digits = n.substr(head.size(), n.size() - head.size() - tail.size());
    if (digits.empty() || digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    r.push_back(std::stoi(digits));
  }
  std::sort(r.begin(), r.end());
  r.erase(std::unique(r.begin(), r.end()), r.end());
  return r;
}

namespace detail {

/// The first non-finite element of a float32/float64 array held as bytes, and how many there
/// are; count 0 when every element is finite (or the dtype is not floating point).
struct nonfinite_scan {
  std::size_t first = 0, count = 0;
  double value = 0;
};
inline nonfinite_scan scan_nonfinite(const io::npz_array& a) {
  nonfinite_scan r;
  const auto scan = [&]<class T>(T) {
    const std::size_t n = a.bytes.size() / sizeof(T);
    for (std::size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, a.bytes.data() + i * sizeof(T), sizeof(T));
      if (!std::isfinite(v)) {
        if (r.count++ == 0) {
          r.first = i;
          r.value = static_cast<double>(v);
        }
      }
    }
  };
  if (a.dtype == element_type::f32) scan(float{});
  if (a.dtype == element_type::f64) scan(double{});
  return r;
}

/// "[2, 5]": the C-order index of flat element i of shape.
/// The session's tensors options.only names (all of them when it is empty); a name it lists
/// that the session lacks is an error of `what`.
template <class Entries>
Entries selected(Entries all, const checkpoint_options& options, const std::string& what) {
  if (options.only.empty()) return all;
  Entries r;
  for (const auto& name : options.only) {
    auto it = std::find_if(all.begin(), all.end(), [&](const auto& e) { return e.name == name; });
    if (it == all.end()) throw error(what + "the session holds no tensor named '" + name + "'");
    r.push_back(*it);
  }
  return r;
}

inline bool reserved_key(std::string_view name) {
  return name == global_step_key || name == world_size_key || name == stages_key || name == stage_key ||
         name == precision_key;
}

inline std::string multi_index(const dims& shape, std::size_t i) {
  std::vector<index_t> idx(shape.rank);
  for (std::size_t k = shape.rank; k-- > 0;) {
    const auto e = static_cast<std::size_t>(shape.d[k]);
    idx[k] = static_cast<index_t>(e ? i % e : 0);
    i = e ? i / e : 0;
  }
  std::string out = "[";
  for (std::size_t k = 0; k < idx.size(); ++k) out += (k ? ", " : "") + std::to_string(idx[k]);
  return out + "]";
}

/// "'w' (3, 4) float32: element 5 [1, 1] is nan (2 of 12 elements are not finite)", or ""
/// when every element of the array is finite: one line of a refusal to load NaN or Inf.
inline std::string nonfinite_report(const io::npz_array& a) {
  const auto r = scan_nonfinite(a);
  if (!r.count) return {};
  return "'" + a.name + "' " + to_string(a.shape) + " " + std::string(name_of(a.dtype)) + ": element " +
         std::to_string(r.first) + (a.shape.rank > 1 ? " " + multi_index(a.shape, r.first) : std::string()) + " is " +
         (std::isnan(r.value) ? "nan" : r.value > 0 ? "inf" : "-inf") + " (" + std::to_string(r.count) + " of " +
         std::to_string(a.shape.numel()) + " elements are not finite)";
}

/// Host copies of a session's tensors, as the arrays io::write_npz writes (refs point into
/// bytes). A tensor named like a reserved key, or without a value yet, is an error; `ctx`
/// ("gradus: save_checkpoint 'f': ") names the operation and the file.
struct host_arrays {
  std::vector<std::vector<std::byte>> bytes;
  std::vector<io::npz_array_ref> refs;
};
template <class Backend, class Entries>
host_arrays copy_to_host(const Entries& entries, const std::string& ctx) {
  host_arrays r;
  r.bytes.resize(entries.size());
  r.refs.reserve(entries.size() + 4);  // (save_checkpoint appends its reserved scalars)
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (reserved_key(e.name))
      throw error(ctx + "a variable is named '" + std::string(e.name) + "', a key the checkpoint keeps for itself");
    if (!e.initialized)
      throw error(ctx + "variable '" + std::string(e.name) + "' has no value yet; nothing was written");
    const std::size_t n = static_cast<std::size_t>(e.shape.numel()) * size_of(e.dtype);
    r.bytes[i].resize(n);
    Backend::copy_to_host(r.bytes[i].data(), e.data, n);
    r.refs.push_back({std::string(e.name), e.dtype, e.shape, r.bytes[i].data()});
  }
  return r;
}

}  // namespace detail

/// Writes every tensor of `s` (or options.only's), the global step and the options' world size
/// and stage layout to `file`, a .npz, atomically (io::write_npz). Copies out of a device run
/// on the session's stream. Throws gradus::error, leaving `file` as it was, when a tensor has
/// no value yet, is named like a reserved key, options.only names a tensor `s` lacks, the
/// world size is negative or the stage is not one of `stages`, or the write fails.
template <class Backend>
void save_checkpoint(const session<Backend>& s, const std::filesystem::path& file,
                     const checkpoint_options& options = {}) {
  const auto bound = s.bind();  // the copies out of a device go on the session's stream
  const std::string ctx = "gradus: save_checkpoint '" + file.string() + "': ";
  auto host = detail::copy_to_host<Backend>(detail::selected(s.entries(), options, ctx), ctx);
  auto& arrays = host.refs;
  if (options.world_size < 0)
    throw error("gradus: save_checkpoint '" + file.string() + "': world_size " + std::to_string(options.world_size) +
                " is negative (0: not recorded)");
  if (options.stages < 0 || (options.stages > 0 && (options.stage < 0 || options.stage >= options.stages)))
    throw error("gradus: save_checkpoint '" + file.string() + "': stage " + std::to_string(options.stage) + " of " +
                std::to_string(options.stages) + " stages is not a stage");
  const std::int64_t step = s.global_step();
  const std::int64_t world = options.world_size, stages = options.stages, stage = options.stage;
  const auto precision = static_cast<std::int64_t>(precision_of_backend_t<Backend>::compute_type);
  arrays.push_back({std::string(global_step_key), element_type::i64, dims{}, &step});
  arrays.push_back({std::string(precision_key), element_type::i64, dims{}, &precision});
  if (world > 0) arrays.push_back({std::string(world_size_key), element_type::i64, dims{}, &world});
  if (stages > 0) {
    arrays.push_back({std::string(stages_key), element_type::i64, dims{}, &stages});
    arrays.push_back({std::string(stage_key), element_type::i64, dims{}, &stage});
  }
  io::write_npz(file, arrays);
}

/// Loads `file` (written by save_checkpoint) into `s`: every tensor (or options.only's) and the
/// global step, all or nothing. Throws gradus::error, with nothing restored, naming every
/// difference when the file's names, dtypes or shapes differ from the session's, on a missing
/// or negative step counter, another world size or stage layout than `options` asks for
/// (see checkpoint_options), or any NaN or Inf in a tensor; and when the file is unreadable
/// (io::read_npz).
template <class Backend>
void restore_checkpoint(session<Backend>& s, const std::filesystem::path& file,
                        const checkpoint_options& options = {}) {
  const auto bound = s.bind();
  const std::vector<io::npz_array> arrays = io::read_npz(file);
  std::map<std::string, const io::npz_array*, std::less<>> by_name;
  for (const auto& a : arrays) by_name.emplace(a.name, &a);

  std::vector<std::string> diffs;
  auto entries = detail::selected(s.entries(), options, "gradus: restore_checkpoint '" + file.string() + "': ");
  std::erase_if(entries, [&](const auto& e) { return policy_state(e.name) && !by_name.contains(e.name); });
  for (const auto& e : entries) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      diffs.push_back("missing from the file: '" + std::string(e.name) + "' " + to_string(e.shape) + " " +
                      std::string(name_of(e.dtype)));
      continue;
    }
    const io::npz_array& a = *it->second;
    if (a.dtype != e.dtype || !(a.shape == e.shape))
      diffs.push_back("'" + std::string(e.name) + "': the session has " + to_string(e.shape) + " " +
                      std::string(name_of(e.dtype)) + ", the file " + to_string(a.shape) + " " +
                      std::string(name_of(a.dtype)));
  }
  const io::npz_array* step = nullptr;
  const io::npz_array* world = nullptr;
  const io::npz_array* stages = nullptr;
  const io::npz_array* stage = nullptr;
  const io::npz_array* precision = nullptr;  // informational (precision_key)
  for (const auto& a : arrays) {
    if (detail::reserved_key(a.name)) {
      (a.name == global_step_key ? step
       : a.name == world_size_key ? world
       : a.name == stages_key     ? stages
       : a.name == stage_key      ? stage
                                  : precision) = &a;
      if (a.dtype != element_type::i64 || a.shape.rank != 0)
        diffs.push_back("'" + a.name + "' must be a scalar int64, the file has " + to_string(a.shape) + " " +
                        std::string(name_of(a.dtype)));
      continue;
    }
    bool known = policy_state(a.name);  // another policy's state: ignored where the session has none
    for (const auto& e : entries) known = known || e.name == a.name;
    if (!known)
      diffs.push_back("not in the session: '" + a.name + "' " + to_string(a.shape) + " " + std::string(name_of(a.dtype)));
  }
  (void)precision;  // any policy's checkpoint loads
  if (!step) diffs.push_back("missing from the file: '" + std::string(global_step_key) + "' (the step counter)");
  if (!diffs.empty() || (stages && stages->bytes.size() == 8) != (options.stages > 0)) {
    // the pipeline's layout first: it explains the differences of names
    if (stages && stages->bytes.size() == 8 && options.stages == 0) {
      std::int64_t n = 0;
      std::memcpy(&n, stages->bytes.data(), sizeof n);
      throw error("gradus: restore_checkpoint '" + file.string() + "': the file holds one stage of a " + std::to_string(n) +
                  "-stage pipeline, not a whole model; resume it as a pipeline of " + std::to_string(n) +
                  " stages (--stages " + std::to_string(n) + "); nothing was restored");
    }
    if (!stages && options.stages > 0)
      throw error("gradus: restore_checkpoint '" + file.string() + "': the file holds a whole model, not stage " +
                  std::to_string(options.stage) + " of a " + std::to_string(options.stages) +
                  "-stage pipeline; resume it without stages, or start a new run; nothing was restored");
    std::string msg = "gradus: restore_checkpoint '" + file.string() + "': the checkpoint does not match the " +
                      "session (nothing was restored):";
    for (const auto& d : diffs) msg += "\n  " + d;
    throw error(msg);
  }

  // The contents: a step counter that counts, a world size that matches, finite values.
  const std::string ctx = "gradus: restore_checkpoint '" + file.string() + "': ";
  const auto scalar = [](const io::npz_array& a) {
    std::int64_t v = 0;
    std::memcpy(&v, a.bytes.data(), sizeof v);
    return v;
  };
  const std::int64_t st = scalar(*step);
  if (st < 0)
    throw error(ctx + "'" + std::string(global_step_key) + "' is " + std::to_string(st) +
                "; a step counter is never negative (a corrupt or hand-edited file?); nothing was restored");
  if (world) {
    const std::int64_t w = scalar(*world);
    if (w < 1)
      throw error(ctx + "'" + std::string(world_size_key) + "' is " + std::to_string(w) +
                  "; a world has at least one rank (a corrupt or hand-edited file?); nothing was restored");
    if (options.world_size > 0 && w != options.world_size) {
      const std::string ws = std::to_string(w);
      throw error(ctx + "written by a job of " + ws + " ranks; this job has " + std::to_string(options.world_size) +
                  ": the global step counts steps of " + ws + " x batch examples, so the learning-rate schedule " +
                  "and the position in the data would be wrong. Resume with " + ws +
                  " ranks, or start a new run; nothing was restored");
    }
  }
  if (options.stages > 0) {
    const std::int64_t n = scalar(*stages), k = stage ? scalar(*stage) : -1;
    if (n != options.stages)
      throw error(ctx + "written by a pipeline of " + std::to_string(n) + " stages; this job runs " +
                  std::to_string(options.stages) + ": resume with --stages " + std::to_string(n) +
                  ", or start a new run; nothing was restored");
    if (k != options.stage)
      throw error(ctx + "holds stage " + std::to_string(k) + " of the pipeline, and this rank runs stage " +
                  std::to_string(options.stage) + " (a renamed file?); nothing was restored");
  }
  std::vector<std::string> bad;
  for (const auto& e : entries)
    if (auto b = detail::nonfinite_report(*by_name.find(e.name)->second); !b.empty()) bad.push_back(std::move(b));
  if (!bad.empty()) {
    std::string msg = ctx + "the checkpoint holds NaN or Inf (a diverged run?); nothing was restored:";
    for (const auto& b : bad) msg += "\n  " + b;
    throw error(msg);
  }

  for (const auto& e : entries) {
    const io::npz_array& a = *by_name.find(e.name)->second;
    Backend::copy_to_device(e.data, a.bytes.data(), a.bytes.size());
    s.mark_initialized(e.name);
  }
  s.set_global_step(st);
}

}  // namespace gradus
