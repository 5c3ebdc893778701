#pragma once
// nn::embedding<"emb", Vocab, Dim, T = float, Sparse = false>: a table variable
// "emb/table" [Vocab, Dim]; applied to int32 indices of any shape it gathers their rows
// ([..., Dim]). Its gradient is the scatter-add of the incoming rows (repeated indices
// accumulate) into the table's shape:
//   Sparse = false  dense, as PyTorch's Embedding(sparse=False): every row is written
//                   (untouched ones with zeros) and the optimizer updates every row;
//   Sparse = true   sparse rows (embedding_lookup; PyTorch's sparse=True, TensorFlow's
//                   IndexedSlices): a train_step updates only the rows the batch named,
//                   lazily (see train/train_step.hpp) — for large vocabularies.
#include <cstdint>

#include "gradus/core/fixed_string.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/ops/index.hpp"
#include "gradus/nn/init.hpp"

namespace gradus::nn {

/// A lookup table of `Vocab` rows of `Dim` values, the variable `Name + "/table"`
/// `[Vocab, Dim]` of dtype `T`: applied to int32 indices of shape `[...]` it gives their rows,
/// `[..., Dim]`. The table's gradient is the scatter-add of the incoming rows (repeated indices
/// add up). With `Sparse = false` (the default) that gradient is dense and the optimizer
/// updates every row; with `Sparse = true` a train_step updates only the rows the batch named
/// (optimizer state and weight decay of the others untouched), for large vocabularies.
template <fixed_string Name, index_t Vocab, index_t Dim, class T = float, bool Sparse = false>
struct embedding {
  static_assert(Vocab > 0 && Dim > 0, "gradus: nn::embedding: extents must be positive");
  variable<Name + "/table", T, Vocab, Dim> table;  ///< the rows, `[Vocab, Dim]`, named `Name + "/table"`

  /// The rows of `idx` (int32, any shape `[...]`) -> `[..., Dim]`: gather(table, idx), or
  /// embedding_lookup(table, idx) when `Sparse`. An index outside `[0, Vocab)` is an
  /// index_error when the expression runs.
  template <expression Idx>
  auto operator()(const Idx& idx) const {
    if constexpr (Sparse) return embedding_lookup(table, idx);
    else return gather(table, idx);
  }
  /// Gives the table its first value from `how`, by default init::normal with mean 0 and
  /// standard deviation 1 (as PyTorch's nn.Embedding), seeded by `seed` and the table's name.
  template <class Backend, class Init = init::normal>
  void initialize(session<Backend>& s, std::uint64_t seed, const Init& how = init::normal{0, 1}) const {
    gradus::initialize(s, table, how, seed);
  }
};

}  // namespace gradus::nn
