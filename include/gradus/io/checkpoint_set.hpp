#pragma once
// Checkpoints in several files (a pipeline's stages, one file each, written by different
// processes), made all-or-nothing by a commit record. Each file alone is replaced atomically
// (io/atomic_file.hpp), but a set of them is not: a job killed between two stages' renames
// would leave files of two different saves, and the last complete set would be gone. So:
//
//   1. every part is written under the new save's own name, beside the committed set:
//        "run/ckpt.npz" -> "run/ckpt-7.stage-0-of-2.npz", "run/ckpt-7.stage-1-of-2.npz"
//   2. once every part is on disk, one process (the coordinator) replaces the commit record
//      "run/ckpt.commit" atomically: it names the save, its global step and each part with
//      its size; the rename of this one small file is the commit;
//   3. only then are the parts of other saves removed.
// A kill anywhere leaves the newest commit record naming a complete set: before step 2 the
// previous one (its parts are still there), after it the new one. A restart reads the record
// and takes the set it names; parts no record names are removed by the next save. TensorFlow's
// "checkpoint" state file and Orbax's commit marker follow the same rule.
//
// Here: the names, the record (its text, read and written), the removal of superseded parts,
// and save_checkpoint_set, the protocol itself, over a sum across every rank that the caller
// gives (an all-reduce: each step's outcome is agreed, so every rank fails together, naming
// the cause, and none waits out a deadline for a rank that gave up). The record:
//
//   gradus-checkpoint-commit 1
//   save 7
//   global_step 188
//   kind stage
//   parts 2
//   part 0 ckpt-7.stage-0-of-2.npz 1912345
//   part 1 ckpt-7.stage-1-of-2.npz 23456
//
// Fault points (core/fault_point.hpp) mark each step of a save for the kill tests:
// checkpoint.part.before, checkpoint.part.written (each writer), checkpoint.commit.before,
// checkpoint.commit.written (the coordinator), checkpoint.cleanup.before,
// checkpoint.cleanup.done (each writer).
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <iterator>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/fault_file.hpp"
#include "gradus/core/fault_point.hpp"
#include "gradus/io/atomic_file.hpp"

namespace gradus {

/// The first line of a commit record: its format and version.
inline constexpr std::string_view checkpoint_commit_magic = "gradus-checkpoint-commit 1";

/// The commit record of a checkpoint set: "run/ckpt.npz" -> "run/ckpt.commit".
inline std::filesystem::path checkpoint_commit_file(const std::filesystem::path& file) {
  auto r = file;
  r.replace_filename(file.stem().string() + ".commit");
  return r;
}

/// Part `part` of `parts` of save number `save`: ("run/ckpt.npz", "stage", 1, 2, 7) ->
/// "run/ckpt-7.stage-1-of-2.npz".
inline std::filesystem::path checkpoint_part_file(const std::filesystem::path& file, std::string_view kind, int part,
                                                  int parts, std::int64_t save) {
  auto r = file;
  r.replace_filename(file.stem().string() + "-" + std::to_string(save) + "." + std::string(kind) + "-" +
                     std::to_string(part) + "-of-" + std::to_string(parts) + file.extension().string());
  return r;
}

/// What a commit record says.
struct checkpoint_commit {
  std::int64_t save = 0;         ///< the save's number (1, 2, ...): its parts' names carry it
  std::int64_t global_step = 0;  ///< the training step the set holds
  std::string kind;              ///< what a part is: "stage"
  int parts = 0;                 ///< how many parts the set has
  std::vector<std::uint64_t> bytes;  ///< each part's size, by part
};

/// The record's text (see above); part names are relative to the record's directory.
inline std::string format_checkpoint_commit(const checkpoint_commit& c, const std::filesystem::path& file) {
  std::string s = std::string(checkpoint_commit_magic) + "\nsave " + std::to_string(c.save) + "\nglobal_step " +
                  std::to_string(c.global_step) + "\nkind " + c.kind + "\nparts " + std::to_string(c.parts) + "\n";
  for (int k = 0; k < c.parts; ++k)
    s += "part " + std::to_string(k) + " " + checkpoint_part_file(file, c.kind, k, c.parts, c.save).filename().string() +
         " " + std::to_string(c.bytes[static_cast<std::size_t>(k)]) + "\n";
  return s;
}

/// The record in `text` for the checkpoint `file`, or nullopt with `why` saying what is wrong:
/// every line is checked, and each part's name must be the one its save and index give.
inline std::optional<checkpoint_commit> parse_checkpoint_commit(std::string_view text, const std::filesystem::path& file,
                                                                std::string& why) {
  std::vector<std::string_view> lines;
  for (std::size_t at = 0; at < text.size();) {
    const auto nl = text.find('\n', at);
    if (nl == std::string_view::npos) {
      why = "its last line is not ended (a record cut short?)";
      return std::nullopt;
    }
    lines.push_back(text.substr(at, nl - at));
    at = nl + 1;
  }
  const auto number = [](std::string_view s, auto& v) {
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && end == s.data() + s.size() && !s.empty();
  };
  const auto field = [&](std::size_t i, std::string_view key, std::string_view& value) {
    if (i >= lines.size() || !lines[i].starts_with(key) || lines[i].size() <= key.size() || lines[i][key.size()] != ' ')
      return false;
    value = lines[i].substr(key.size() + 1);
    return true;
  };
  if (lines.empty() || lines[0] != checkpoint_commit_magic) {
    why = "its first line is not '" + std::string(checkpoint_commit_magic) + "' (not a gradus commit record, or a newer one)";
    return std::nullopt;
  }
  const auto fail = [&](std::string reason) {
    why = std::move(reason);
    return std::optional<checkpoint_commit>();
  };
  checkpoint_commit c;
  std::string_view v;
  if (!field(1, "save", v) || !number(v, c.save) || c.save < 1) return fail("line 2 is not 'save N' (N >= 1)");
  if (!field(2, "global_step", v) || !number(v, c.global_step) || c.global_step < 0)
    return fail("line 3 is not 'global_step N' (N >= 0)");
  if (!field(3, "kind", v) || v.empty() || v.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") != std::string_view::npos)
    return fail("line 4 is not 'kind NAME'");
  c.kind = std::string(v);
  if (!field(4, "parts", v) || !number(v, c.parts) || c.parts < 1 || c.parts > 1 << 20)
    return fail("line 5 is not 'parts N' (1 <= N <= 2^20)");
  if (lines.size() != 5 + static_cast<std::size_t>(c.parts))
    return fail("it lists " + std::to_string(lines.size() - 5) + " parts for 'parts " + std::to_string(c.parts) + "'");
  for (int k = 0; k < c.parts; ++k) {
    const std::string want =
        std::to_string(k) + " " + checkpoint_part_file(file, c.kind, k, c.parts, c.save).filename().string() + " ";
    std::uint64_t n = 0;
    if (!field(5 + static_cast<std::size_t>(k), "part", v) || !v.starts_with(want) || !number(v.substr(want.size()), n))
      return fail("line " + std::to_string(6 + k) + " is not 'part " + want + "BYTES'");
    c.bytes.push_back(n);
  }
  return c;
}

/// The commit record of `file`, if there is one. Throws gradus::error naming the record when
/// it cannot be read or is malformed.
inline std::optional<checkpoint_commit> read_checkpoint_commit(const std::filesystem::path& file) {
  const auto record = checkpoint_commit_file(file);
  std::error_code ec;
  if (!std::filesystem::exists(record, ec)) return std::nullopt;
  const std::string ctx = "gradus: checkpoint '" + file.string() + "': commit record '" + record.string() + "': ";
  if (!std::filesystem::is_regular_file(record, ec)) throw error(ctx + "not a regular file");
  if (std::filesystem::file_size(record, ec) > (1u << 26)) throw error(ctx + "larger than any commit record");
  std::ifstream in(record, std::ios::binary);
  if (!in) throw error(ctx + "cannot open it");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string why;
  auto c = parse_checkpoint_commit(text, file, why);
  if (!c) throw error(ctx + "malformed: " + why + " (a hand-edited file? restore it, or remove it to start afresh)");
  return c;
}

/// Replaces the commit record of `file` with `c`, atomically (io/atomic_file.hpp).
inline void write_checkpoint_commit(const std::filesystem::path& file, const checkpoint_commit& c) {
  const auto record = checkpoint_commit_file(file);
  const std::string text = format_checkpoint_commit(c, file);
  const std::string ctx = "gradus: checkpoint '" + file.string() + "': write commit record '" + record.string() + "': ";
  io::detail::replace_atomically(record, ctx, [&](const std::filesystem::path& tmp) {
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(text.data()), text.size());
    io::detail::write_new_file(tmp, {bytes}, ctx);
  });
}

/// The save numbers of part `part` of `parts` of `kind` present beside `file`.
inline std::vector<std::int64_t> checkpoint_parts_present(const std::filesystem::path& file, std::string_view kind, int part,
                                                          int parts) {
  std::vector<std::int64_t> r;
  const auto dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  const std::string head = file.stem().string() + "-",
                    tail = "." + std::string(kind) + "-" + std::to_string(part) + "-of-" + std::to_string(parts) +
                           file.extension().string();
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.size() <= head.size() + tail.size() || !n.starts_with(head) || !n.ends_with(tail)) continue;
    const std::string_view digits = std::string_view(n).substr(head.size(), n.size() - head.size() - tail.size());
    std::int64_t save = 0;
    const auto [end_, e] = std::from_chars(digits.data(), digits.data() + digits.size(), save);
    if (e == std::errc() && end_ == digits.data() + digits.size() && save >= 1) r.push_back(save);
  }
  return r;
}

/// Removes the files of part `part` of `parts` of every save but `keep`, and `also` (files a
/// committed set supersedes). Best effort: one that cannot be removed stays (the next save
/// tries again), and the save goes on.
inline void remove_other_parts(const std::filesystem::path& file, std::string_view kind, int part, int parts,
                               std::int64_t keep, const std::vector<std::filesystem::path>& also = {}) {
  std::error_code ec;
  for (const auto n : checkpoint_parts_present(file, kind, part, parts))
    if (n != keep) std::filesystem::remove(checkpoint_part_file(file, kind, part, parts, n), ec);
  for (const auto& f : also) std::filesystem::remove(f, ec);
}

/// What a rank does in a save of a checkpoint set.
struct checkpoint_set_role {
  std::string kind = "stage";  ///< what a part is
  int parts = 1;               ///< how many parts the set has
  int part = -1;               ///< the part this rank writes; -1: none (a replica)
  bool coordinator = false;    ///< this rank writes the commit record (exactly one rank does)
  std::string who;             ///< this rank in errors: "pipeline stage 1 (rank 1)"
  int rank = 0;                ///< this rank in the world (the verdicts of core/fault_file.hpp)
  /// Files the new set supersedes that this rank removes after the commit (the layout of an
  /// earlier version).
  std::vector<std::filesystem::path> superseded = {};
};

/// Saves one set of `file` (see the top of this file); every rank calls it. `write_part(path)`
/// writes this rank's part (atomically, e.g. save_checkpoint) and returns the global step it
/// holds; it is called only where role.part >= 0. `sum(span<double>)` adds a vector over every
/// rank, in place. Returns the committed record. Throws gradus::error on every rank, the
/// previous set kept and this save's parts removed, when a part or the record could not be
/// written, or the parts hold different global steps: the rank that failed gives its own
/// error, the others name it.
template <class Sum, class Write>
checkpoint_commit save_checkpoint_set(const std::filesystem::path& file, const checkpoint_set_role& role, Sum&& sum,
                                      Write&& write_part) {
  const std::string head = "gradus: " + role.who + ": checkpoint '" + file.string() + "': ";
  // The save's number: one above the committed one and above any part the coordinator sees
  // (a part of an earlier, uncommitted save is never reused while its record could name it).
  // A malformed record is replaced by this save.
  double next = 0;
  if (role.coordinator) {
    std::int64_t top = 0;
    try {
      if (const auto c = read_checkpoint_commit(file)) top = c->save;
    } catch (const error&) {
    }
    for (int k = 0; k < role.parts; ++k)
      for (const auto n : checkpoint_parts_present(file, role.kind, k, role.parts)) top = std::max(top, n);
    next = static_cast<double>(top + 1);
  }
  sum(std::span<double>(&next, 1));
  const auto save = static_cast<std::int64_t>(next);

  // 1. the parts, each under this save's name
  const std::size_t P = static_cast<std::size_t>(role.parts);
  // [k]: 1 written, 2 failed; [P + k]: its bytes; [2P + k]: its step; [3P + k]: its writer's rank
  std::vector<double> state(4 * P, 0.0);
  std::string why;
  const auto mine = role.part >= 0 ? checkpoint_part_file(file, role.kind, role.part, role.parts, save) : std::filesystem::path();
  if (role.part >= 0) {
    detail::fault_point("checkpoint.part.before");
    try {
      const std::int64_t step = write_part(mine);
      state[static_cast<std::size_t>(role.part)] = 1;
      state[P + static_cast<std::size_t>(role.part)] = static_cast<double>(std::filesystem::file_size(mine));
      state[2 * P + static_cast<std::size_t>(role.part)] = static_cast<double>(step);
      state[3 * P + static_cast<std::size_t>(role.part)] = role.rank;
    } catch (const std::exception& e) {
      state[static_cast<std::size_t>(role.part)] = 2;
      state[3 * P + static_cast<std::size_t>(role.part)] = role.rank;
      why = e.what();
    }
    detail::fault_point("checkpoint.part.written");
  }
  sum(std::span<double>(state));
  const auto drop_mine = [&] {
    std::error_code ec;
    if (role.part >= 0) std::filesystem::remove(mine, ec);
  };
  for (std::size_t k = 0; k < P; ++k)
    if (state[k] != 1) {
      drop_mine();
      if (static_cast<int>(k) == role.part) throw error(why);
      const std::string text =
          head + (state[k] == 2 ? role.kind + " " + std::to_string(k) + " could not write its file '" +
                                      checkpoint_part_file(file, role.kind, static_cast<int>(k), role.parts, save).string() +
                                      "' (its error says why)"
                                : "no rank wrote part " + std::to_string(k) + " of " + std::to_string(P)) +
          "; nothing was committed, the previous checkpoint is kept";
      if (state[k] == 2)
        detail::record_blame("rank " + std::to_string(role.rank),
                             "rank " + std::to_string(static_cast<int>(state[3 * P + k])), "failed", text);
      throw error(text);
    }
  for (std::size_t k = 1; k < P; ++k)
    if (state[2 * P + k] != state[2 * P]) {
      drop_mine();
      std::string steps;
      for (std::size_t j = 0; j < P; ++j)
        steps += (j ? ", " : "") + role.kind + " " + std::to_string(j) + " step " +
                 std::to_string(static_cast<std::int64_t>(state[2 * P + j]));
      throw error(head + "the parts hold different global steps (" + steps +
                  "): the ranks did not save at the same step; nothing was committed, the previous checkpoint is kept");
    }

  // 2. the commit
  checkpoint_commit c{save, static_cast<std::int64_t>(state[2 * P]), role.kind, role.parts, {}};
  for (std::size_t k = 0; k < P; ++k) c.bytes.push_back(static_cast<std::uint64_t>(state[P + k]));
  double committed[2] = {0, 0};  // 1 committed, 2 failed; the coordinator's rank
  if (role.coordinator) {
    committed[1] = role.rank;
    detail::fault_point("checkpoint.commit.before");
    try {
      write_checkpoint_commit(file, c);
      committed[0] = 1;
    } catch (const std::exception& e) {
      committed[0] = 2;
      why = e.what();
    }
    detail::fault_point("checkpoint.commit.written");
  }
  sum(std::span<double>(committed));
  if (committed[0] != 1) {
    drop_mine();
    if (role.coordinator) throw error(why);
    const std::string text = head + "the commit record '" + checkpoint_commit_file(file).string() +
                             "' could not be written (the coordinator's error says why); the previous checkpoint is kept";
    detail::record_blame("rank " + std::to_string(role.rank), "rank " + std::to_string(static_cast<int>(committed[1])),
                         "failed", text);
    throw error(text);
  }

  // 3. what the new set supersedes
  if (role.part >= 0) {
    detail::fault_point("checkpoint.cleanup.before");
    remove_other_parts(file, role.kind, role.part, role.parts, save, role.superseded);
    detail::fault_point("checkpoint.cleanup.done");
  }
  return c;
}

}  // namespace gradus
