#pragma once
// Pipeline schedules: the order in which one stage runs the forward (F) and backward (B)
// passes of a batch's M micro-batches.
//
//   gpipe  all M forwards, then all M backwards (Huang et al., GPipe, arXiv 1811.06965): M
//          micro-batches of activations alive at once, or only the stage inputs with
//          re-materialisation (the forward recomputed in the backward pass)
//   1f1b   PipeDream-flush (Narayanan et al.; Megatron-LM's and DeepSpeed's schedule): stage k
//          runs min(S - k - 1, M) forwards, then alternates one forward and one backward, then
//          the remaining backwards: at most S - k micro-batches of activations alive
//
// Both flush at the end of the batch (one synchronous update), so both compute exactly what
// the unsplit model does; their idle time ("bubble") is the same, (S - 1) / (M + S - 1) of
// the batch for equal stages; 1F1B holds fewer activations.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/error.hpp"

namespace gradus::parallel {

/// A pipeline schedule (above): GPipe, or 1F1B (PipeDream-flush).
enum class schedule_kind { gpipe, one_f_one_b };

/// "gpipe" or "1f1b": the name parse_schedule reads.
inline std::string_view schedule_name(schedule_kind k) { return k == schedule_kind::gpipe ? "gpipe" : "1f1b"; }

/// The schedule named "gpipe" or "1f1b" (as a `--schedule` flag gives it); throws gradus::error
/// naming any other string.
inline schedule_kind parse_schedule(std::string_view s) {
  if (s == "gpipe") return schedule_kind::gpipe;
  if (s == "1f1b") return schedule_kind::one_f_one_b;
  throw error("gradus: pipeline: unknown schedule '" + std::string(s) + "'; use gpipe or 1f1b");
}

/// One operation of a stage's schedule: the forward or the backward pass of one micro-batch.
struct pipeline_op {
  bool forward;  ///< true: the forward pass; false: the backward
  int micro;  ///< 0 .. M - 1
  /// The same pass of the same micro-batch.
  bool operator==(const pipeline_op&) const = default;
};

/// Stage `stage`'s operations for one batch of `micro` micro-batches over `stages` stages.
inline std::vector<pipeline_op> schedule_for(schedule_kind kind, int stage, int stages, int micro) {
  if (stages < 1 || stage < 0 || stage >= stages || micro < 1)
    throw error("gradus: pipeline: schedule of stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                " with " + std::to_string(micro) + " micro-batches is out of range");
  std::vector<pipeline_op> ops;
  ops.reserve(2 * static_cast<std::size_t>(micro));
  if (kind == schedule_kind::gpipe) {
    for (int m = 0; m < micro; ++m) ops.push_back({true, m});
    for (int m = 0; m < micro; ++m) ops.push_back({false, m});
    return ops;
  }
  const int warm = std::min(stages - stage - 1, micro);
  int f = 0, b = 0;
  for (; f < warm; ++f) ops.push_back({true, f});
  for (; f < micro; ++f, ++b) {
    ops.push_back({true, f});
    ops.push_back({false, b});
  }
  for (; b < micro; ++b) ops.push_back({false, b});
  return ops;
}

/// The most micro-batches whose forward has run and backward has not, at once.
inline int max_in_flight(const std::vector<pipeline_op>& ops) {
  int alive = 0, most = 0;
  for (const auto& op : ops) most = std::max(most, alive += op.forward ? 1 : -1);
  return most;
}

/// GPipe's bubble for equal stages: (S - 1) / (M + S - 1).
inline double ideal_bubble(int stages, int micro) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro + stages - 1);
}

/// The sizes of M micro-batches of a batch of B rows: as even as possible, the first B % M
/// one row larger (torch.tensor_split's rule). M > B leaves empty micro-batches, refused.
inline std::vector<long> micro_batch_sizes(long batch, int micro) {
  if (micro < 1 || batch < micro)
    throw error("gradus: pipeline: a batch of " + std::to_string(batch) + " rows cannot be split into " +
                std::to_string(micro) + " micro-batches; use --micro-batches between 1 and the batch size");
  std::vector<long> s(static_cast<std::size_t>(micro), batch / micro);
  for (long i = 0; i < batch % micro; ++i) ++s[static_cast<std::size_t>(i)];
  return s;
}

}  // namespace gradus::parallel
