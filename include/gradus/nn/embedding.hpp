#pragma once
// nn::embedding<"emb", Vocab, Dim>: a table variable "emb/table" [Vocab, Dim]; applied to
// int32 indices of any shape it gathers their rows ([..., Dim]). Its gradient is the
// scatter-add of the incoming rows (repeated indices accumulate) into a table-shaped
// tensor — dense: every row is written, untouched rows with zeros.
#include <cstdint>

#include "gradus/core/fixed_string.hpp"
#include "gradus/graph/leaves.hpp"
#include "gradus/graph/ops/index.hpp"
#include "gradus/train/init.hpp"

namespace gradus::nn {

template <fixed_string Name, index_t Vocab, index_t Dim, class T = float>
struct embedding {
  static_assert(Vocab > 0 && Dim > 0, "gradus: nn::embedding: extents must be positive");
  variable<Name + "/table", T, Vocab, Dim> table;

  template <expression Idx>
  auto operator()(const Idx& idx) const {
    return gather(table, idx);
  }
  // N(0, 1), as PyTorch's nn.Embedding
  template <class Backend, class Init = init::normal>
  void initialize(session<Backend>& s, std::uint64_t seed, const Init& how = init::normal{0, 1}) const {
    gradus::initialize(s, table, how, seed);
  }
};

}  // namespace gradus::nn
