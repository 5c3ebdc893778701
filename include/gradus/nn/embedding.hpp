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

template <fixed_string Name, index_t Vocab, index_t Dim, class T = float, bool Sparse = false>
struct embedding {
  static_assert(Vocab > 0 && Dim > 0, "gradus: nn::embedding: extents must be positive");
  variable<Name + "/table", T, Vocab, Dim> table;

  template <expression Idx>
  auto operator()(const Idx& idx) const {
    if constexpr (Sparse) return embedding_lookup(table, idx);
    else return gather(table, idx);
  }
  /// N(0, 1), as PyTorch's nn.Embedding
  template <class Backend, class Init = init::normal>
  void initialize(session<Backend>& s, std::uint64_t seed, const Init& how = init::normal{0, 1}) const {
    gradus::initialize(s, table, how, seed);
  }
};

}  // namespace gradus::nn
