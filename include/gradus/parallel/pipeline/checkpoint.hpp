#pragma once
// Checkpoints of a pipelined run: one file per stage (Megatron-LM's layout), each holding that
// stage's variables, their optimizer slots and the global step, and recording the world and
// the stage layout; the stages' files of one save are committed together by a commit record
// (io/checkpoint_set.hpp), so that a job killed at any point of a save restarts from the
// newest complete set:
//
//   step.save_checkpoint("run/ckpt.npz");   // every rank: run/ckpt-N.stage-K-of-S.npz, run/ckpt.commit
//   bool resumed = step.restore_checkpoint("run/ckpt.npz");   // every rank; false: none yet
//
// Save (save_checkpoint_set): replica 0 of each stage writes its file under the save's number,
// rank 0 then writes the commit record, and the parts of earlier saves go. Every step's
// outcome is agreed by all ranks, so a failed save fails every rank, naming the stage, and
// keeps the previous set.
//
// Restore is two agreements over every rank (a single all-reduce each), so every rank makes
// the same decision and a bad checkpoint fails the whole job at once, each rank naming the
// cause, instead of one rank failing and the others waiting for it:
//   1. rank 0 reads the commit record (and each stage's replica 0 looks for a file of gradus
//      0.1's layout, "run/ckpt.stage-K-of-S.npz", which is still restored):
//      - none, and no 0.1 set: nothing restored, false (a first run of --resume, or a job
//        killed during its first save: its uncommitted files are removed by the next save);
//      - a whole model's file, or a record (or 0.1 files) of another stage count: refused,
//        naming them (resume with that --stages, or without stages);
//      - a malformed record: refused, naming it;
//   2. each stage's replica 0 restores the file the record names:
//      - a file missing (files on another host's disk?): refused, naming the missing files;
//      - a file of another size than the record's, or one that does not match its stage
//        (another model, NaN...): that rank's error, and every other rank names the stage;
//      - a file of another global step than the record's (0.1 sets: than stage 0's): refused,
//        naming each stage's step;
// else each stage's replica 0 restored its file, and its replicas take the tensors and the
// step from it (broadcast in the stage's sub-group): only replica 0 of a stage reads a disk.
#include <cstdint>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/fault_file.hpp"
#include "gradus/io/checkpoint.hpp"
#include "gradus/io/checkpoint_set.hpp"
#include "gradus/parallel/pipeline/transfers.hpp"

namespace gradus::parallel {

namespace detail {
inline std::string stage_who(int stage, int rank) {
  return "pipeline stage " + std::to_string(stage) + " (rank " + std::to_string(rank) + ")";
}
}  // namespace detail

/// Saves every stage of `p` as one committed set of `file` (see above): every rank calls it;
/// replica 0 of each stage writes its stage's file, rank 0 the commit record. Throws
/// gradus::error on every rank, the previous set kept, when a stage's file or the record
/// cannot be written.
template <class Comm>
void save_pipeline_checkpoint(pipeline_base<Comm>& p, const std::filesystem::path& file) {
  const auto& st = p.stats();
  checkpoint_set_role role{"stage", st.stages, st.replica == 0 ? st.stage : -1, p.rank() == 0,
                           detail::stage_who(st.stage, p.rank()), p.rank()};
  if (st.replica == 0) role.superseded.push_back(stage_checkpoint_file(file, st.stage, st.stages));
  save_checkpoint_set(
      file, role, [&](std::span<double> x) { p.allreduce_sum(x); },
      [&](const std::filesystem::path& part) { return p.save_stage_file(part); });
}

/// Restores every stage from the committed set of `file` (see above); every rank must call it.
/// Returns false when there is no set, true when all were restored; else throws
/// gradus::error on every rank, naming the cause.
template <class Comm>
bool restore_pipeline_checkpoint(pipeline_base<Comm>& p, const std::filesystem::path& file) {
  const auto& st = p.stats();
  const int S = st.stages, world = p.world_size(), rank = p.rank();
  const std::string head = "gradus: " + detail::stage_who(st.stage, rank) + ": checkpoint '" + file.string() + "': ";

  // 1. what there is: rank 0 reads the record; each stage's replica 0 looks for a 0.1 file
  enum found : int { nothing = 0, record = 1, bad_record = 2, whole_model = 3, other_stages = 4, legacy = 5 };
  const std::size_t P = static_cast<std::size_t>(S);
  std::vector<double> seen(4 + P + static_cast<std::size_t>(world), 0.0);  // code, save, step, detail, bytes[S], legacy[world]
  std::string why;
  std::error_code ec;
  if (rank == 0) {
    int found0 = nothing;
    try {
      if (const auto c = read_checkpoint_commit(file)) {
        if (c->kind != "stage") {
          found0 = bad_record;
          why = head + "its commit record '" + checkpoint_commit_file(file).string() + "' is of " + c->kind +
                " parts, not a pipeline's stages; start a new run, or give another --checkpoint";
        } else if (c->parts != S) {
          found0 = other_stages;
          seen[3] = c->parts;
        } else {
          found0 = record;
          seen[1] = static_cast<double>(c->save);
          seen[2] = static_cast<double>(c->global_step);
          for (std::size_t k = 0; k < P; ++k) seen[4 + k] = static_cast<double>(c->bytes[k]);
        }
      }
    } catch (const error& e) {
      found0 = bad_record;
      why = e.what();
    }
    if (found0 == nothing) {
      for (const int n : stage_checkpoints_present(file))
        if (n != S) found0 = other_stages, seen[3] = n;
      if (found0 == nothing && std::filesystem::exists(file, ec)) found0 = whole_model;
    }
    seen[0] = found0;
  }
  if (st.replica == 0 && std::filesystem::exists(stage_checkpoint_file(file, st.stage, S), ec))
    seen[4 + P + static_cast<std::size_t>(rank)] = 1;
  p.allreduce_sum(std::span<double>(seen));
  int code = static_cast<int>(seen[0]);
  bool any_legacy = false;
  for (int k = 0; k < S; ++k) any_legacy = any_legacy || seen[4 + P + static_cast<std::size_t>(k)] != 0;
  const auto failed_because = [&](int peer, const std::string& text) {
    gradus::detail::record_blame("rank " + std::to_string(rank), "rank " + std::to_string(peer), "failed", text);
    return error(text);
  };
  if (code == bad_record) {
    if (rank == 0) throw error(why);
    throw failed_because(0, head + "rank 0 could not use the commit record '" + checkpoint_commit_file(file).string() +
                                "' (its error says why); the job stops");
  }
  if (code != record && any_legacy) code = legacy;  // a 0.1 set of this stage count
  if (code == other_stages) {
    const int n = static_cast<int>(seen[3]);
    throw error(head + "the files there are a pipeline of " + std::to_string(n) + " stages (commit record '" +
                checkpoint_commit_file(file).string() + "'); this job runs " + std::to_string(S) +
                ": resume with --stages " + std::to_string(n) + ", or start a new run");
  }
  if (code == whole_model)
    throw error(head + "the file holds a whole model (a run without stages); this job runs a pipeline of " +
                std::to_string(S) + " stages and looks for its commit record '" + checkpoint_commit_file(file).string() +
                "': resume without --stages, or start a new run");
  if (code == nothing) return false;

  // 2. each stage's replica 0 restores the file the record names
  const auto save = static_cast<std::int64_t>(seen[1]);
  const auto step_of_record = static_cast<std::int64_t>(seen[2]);
  const auto part_of = [&](int k) {
    return code == record ? checkpoint_part_file(file, "stage", k, S, save) : stage_checkpoint_file(file, k, S);
  };
  enum outcome : int { not_looked = 0, restored = 1, missing = 2, failed = 3 };
  int mine_code = not_looked;
  double detail = 0;  // restored: the global step
  const auto mine = part_of(st.stage);
  if (st.replica == 0) {
    if (std::filesystem::exists(mine, ec)) {
      // any failure is told to the other ranks (the agreement below), never thrown past it:
      // they would wait for this rank until their deadline and blame it for silence
      try {
        const auto want = static_cast<std::uintmax_t>(seen[4 + static_cast<std::size_t>(st.stage)]);
        if (const auto have = std::filesystem::file_size(mine); code == record && have != want)
          throw error(head + "its file '" + mine.string() + "' has " + std::to_string(have) + " bytes, the commit record '" +
                      checkpoint_commit_file(file).string() + "' says " + std::to_string(want) +
                      ": it was replaced or cut after the commit; restore the set from a copy, or start a new run");
        detail = static_cast<double>(p.restore_stage_file(mine));
        mine_code = restored;
      } catch (const error& e) {
        mine_code = failed;
        why = e.what();
      } catch (const std::exception& e) {
        mine_code = failed;
        why = head + "could not restore this stage's file '" + mine.string() + "': " + e.what();
      }
    } else {
      mine_code = missing;
    }
  }
  std::vector<double> all(2 * static_cast<std::size_t>(world), 0.0);
  all[2 * static_cast<std::size_t>(rank)] = mine_code;
  all[2 * static_cast<std::size_t>(rank) + 1] = detail;
  p.allreduce_sum(std::span<double>(all));
  const auto code_of = [&](int k) { return static_cast<int>(all[2 * static_cast<std::size_t>(k)]); };
  const auto detail_of = [&](int k) { return all[2 * static_cast<std::size_t>(k) + 1]; };

  for (int k = 0; k < S; ++k)
    if (code_of(k) == failed) {
      if (k == rank) throw error(why);
      throw failed_because(k, head + "stage " + std::to_string(k) + " (rank " + std::to_string(k) +
                                  ") could not restore its file '" + part_of(k).string() + "' (its error says why); the job stops");
    }
  int present = 0;
  for (int k = 0; k < S; ++k) present += code_of(k) == restored ? 1 : 0;
  if (present < S) {
    std::string have, lack;
    int first_missing = -1;
    for (int k = 0; k < S; ++k) {
      std::string& list = code_of(k) == restored ? have : lack;
      list += (list.empty() ? "" : ", ") + std::to_string(k);
      if (code_of(k) != restored && first_missing < 0) first_missing = k;
    }
    throw error(head + "incomplete: the file of stage(s) " + lack + " is missing ('" + part_of(first_missing).string() +
                "')" + (have.empty() ? std::string() : ", stage(s) " + have + " have theirs") +
                (code == record ? " (the commit record '" + checkpoint_commit_file(file).string() + "' names them)" : "") +
                ". Files on another host's disk? Put every stage's file where its rank reads it, or start a new run");
  }
  const double want_step = code == record ? static_cast<double>(step_of_record) : detail_of(0);
  for (int k = 0; k < S; ++k)
    if (detail_of(k) != want_step) {
      std::string steps;
      for (int j = 0; j < S; ++j)
        steps += (j ? ", stage " : "stage ") + std::to_string(j) + " step " + std::to_string(static_cast<std::int64_t>(detail_of(j)));
      throw error(head + "the stages' files hold different global steps (" + steps + ")" +
                  (code == record ? ", the commit record step " + std::to_string(step_of_record) +
                                        ": a file was replaced after the commit; "
                                  : ": they were written at different times (a job stopped while saving?); ") +
                  "restore a consistent set, or start a new run");
    }
  p.broadcast_to_replicas();
  return true;
}

}  // namespace gradus::parallel
