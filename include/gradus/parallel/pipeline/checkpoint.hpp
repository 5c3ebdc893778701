#pragma once
// Checkpoints of a pipelined run: one file per stage (io/checkpoint.hpp's stage_checkpoint_file:
// "run/ckpt.npz" -> "run/ckpt.stage-K-of-S.npz", Megatron-LM's layout), each holding that
// stage's variables, their optimizer slots and the global step, and recording the world and
// the stage layout.
//
//   step.save_checkpoint("run/ckpt.npz");       // every rank; replica 0 of each stage writes its file
//   bool resumed = step.restore_checkpoint("run/ckpt.npz");   // every rank; false: none yet
//
// Save: replica 0 of each stage writes its file (atomically: io::write_npz). Restore is one
// agreement over every rank (a single all-reduce of what each stage found), so every rank
// makes the same decision and a bad checkpoint fails the whole job at once, each rank naming
// the cause, instead of one rank failing and the others waiting for it:
//   - no stage file at all: nothing restored, false (a first run of --resume);
//   - stage 0 finds no file of its own but a whole model's file, or stage files of another
//     stage count: refused, naming them (resume with that --stages, or without stages);
//   - some stages' files present and others missing (a job stopped between two stages'
//     saves, or files on another host's disk): refused, naming the missing files;
//   - a file that does not match its stage (another model, another stage, NaN...): that
//     rank's error, and every other rank names the stage that failed;
//   - stage files holding different global steps (written at different epochs): refused,
//     naming each stage's step;
// else each stage's replica 0 restored its file, and its replicas take the tensors and the
// step from it (broadcast in the stage's sub-group): only replica 0 of a stage reads a disk.
#include <cstdint>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/io/checkpoint.hpp"
#include "gradus/parallel/pipeline/transfers.hpp"

namespace gradus::parallel {

/// Replica 0 of `p`'s stage writes the stage's file of `file` (stage_checkpoint_file); the other
/// replicas write nothing. Throws gradus::error as save_checkpoint does.
template <class Comm>
void save_pipeline_checkpoint(pipeline_base<Comm>& p, const std::filesystem::path& file) {
  const auto& st = p.stats();
  if (st.replica == 0) p.save_stage_file(stage_checkpoint_file(file, st.stage, st.stages));
}

/// Restores every stage from its file of `file` (see above); every rank must call it. Returns
/// false when no stage file exists, true when all were restored; else throws gradus::error on
/// every rank, naming the cause.
template <class Comm>
bool restore_pipeline_checkpoint(pipeline_base<Comm>& p, const std::filesystem::path& file) {
  const auto& st = p.stats();
  const int S = st.stages, world = p.world_size(), rank = p.rank();
  // what this rank found: only replica 0 of each stage (ranks 0 .. S-1) looks
  enum found : int { not_looked = 0, restored = 1, missing = 2, failed = 3, whole_model = 4, other_stages = 5 };
  int code = not_looked;
  double detail = 0;  // restored: the global step; other_stages: their stage count
  std::string why;
  const auto mine = stage_checkpoint_file(file, st.stage, S);
  const std::string head = "gradus: pipeline stage " + std::to_string(st.stage) + " (rank " + std::to_string(rank) +
                           "): checkpoint '" + file.string() + "': ";
  if (st.replica == 0) {
    std::error_code ec;
    if (std::filesystem::exists(mine, ec)) {
      // any failure is told to the other ranks (the agreement below), never thrown past it:
      // they would wait for this rank until their deadline and blame it for silence
      try {
        detail = static_cast<double>(p.restore_stage_file(mine));
        code = restored;
      } catch (const error& e) {
        code = failed;
        why = e.what();
      } catch (const std::exception& e) {
        code = failed;
        why = head + "could not restore this stage's file '" + mine.string() + "': " + e.what();
      }
    } else {
      code = missing;
      if (st.stage == 0) {
        for (const int n : stage_checkpoints_present(file))
          if (n != S) code = other_stages, detail = n;
        if (code == missing && std::filesystem::exists(file, ec)) code = whole_model;
      }
    }
  }
  std::vector<double> all(2 * static_cast<std::size_t>(world), 0.0);
  all[2 * static_cast<std::size_t>(rank)] = code;
  all[2 * static_cast<std::size_t>(rank) + 1] = detail;
  p.allreduce_sum(std::span<double>(all));
  const auto code_of = [&](int k) { return static_cast<int>(all[2 * static_cast<std::size_t>(k)]); };
  const auto detail_of = [&](int k) { return all[2 * static_cast<std::size_t>(k) + 1]; };

  for (int k = 0; k < S; ++k)
    if (code_of(k) == failed) {
      if (k == rank) throw error(why);
      throw error(head + "stage " + std::to_string(k) + " (rank " + std::to_string(k) + ") could not restore its file '" +
                  stage_checkpoint_file(file, k, S).string() + "' (its error says why); the job stops");
    }
  int present = 0;
  for (int k = 0; k < S; ++k) present += code_of(k) == restored ? 1 : 0;
  if (present == 0) {
    if (code_of(0) == other_stages) {
      const int n = static_cast<int>(detail_of(0));
      throw error(head + "the files there are a pipeline of " + std::to_string(n) + " stages ('" +
                  stage_checkpoint_file(file, 0, n).string() + "'...); this job runs " + std::to_string(S) +
                  ": resume with --stages " + std::to_string(n) + ", or start a new run");
    }
    if (code_of(0) == whole_model)
      throw error(head + "the file holds a whole model (a run without stages); this job runs a pipeline of " +
                  std::to_string(S) + " stages and looks for '" + stage_checkpoint_file(file, 0, S).string() +
                  "'...: resume without --stages, or start a new run");
    return false;
  }
  if (present < S) {
    std::string have, lack;
    int first_missing = -1;
    for (int k = 0; k < S; ++k) {
      std::string& list = code_of(k) == restored ? have : lack;
      list += (list.empty() ? "" : ", ") + std::to_string(k);
      if (code_of(k) != restored && first_missing < 0) first_missing = k;
    }
    throw error(head + "incomplete: the file of stage(s) " + lack + " is missing ('" +
                stage_checkpoint_file(file, first_missing, S).string() + "'), stage(s) " + have +
                " have theirs. A job stopped between two stages' saves, or files on another host's disk? Put " +
                "every stage's file where its rank reads it, or start a new run");
  }
  for (int k = 1; k < S; ++k)
    if (detail_of(k) != detail_of(0)) {
      std::string steps;
      for (int j = 0; j < S; ++j)
        steps += (j ? ", stage " : "stage ") + std::to_string(j) + " step " + std::to_string(static_cast<std::int64_t>(detail_of(j)));
      throw error(head + "the stages' files hold different global steps (" + steps +
                  "): they were written at different times (a job stopped while saving?); restore a consistent set, " +
                  "or start a new run");
    }
  p.broadcast_to_replicas();
  return true;
}

}  // namespace gradus::parallel
