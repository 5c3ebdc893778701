#pragma once
// matmul: 2-D [M,K]x[K,N], batched [B,M,K]x[B,K,N], and a 2-D operand broadcast over the
// other's batch. A transposed operand (transpose / matrix_transpose of anything) is not
// copied: it becomes the GEMM's transpose flag.
#include <string>
#include <tuple>

#include "gradus/graph/leaves.hpp"
#include "gradus/graph/node.hpp"
#include "gradus/graph/ops/shape_ops.hpp"

namespace gradus {

namespace detail {
/// What GEMM reads for an operand: the operand itself, or what a swap of its last two
/// axes was applied to (with the transpose flag set).
template <class X>
struct gemm_operand {
  using node = X;
  static constexpr bool trans = false;
  static const X& get(const X& x) { return x; }
};
template <class A>
struct gemm_operand<permute_node<A, 1, 0>> {
  using node = A;
  static constexpr bool trans = true;
  static const A& get(const permute_node<A, 1, 0>& x) { return x.a; }
};
template <class A>
struct gemm_operand<permute_node<A, 0, 2, 1>> {
  using node = A;
  static constexpr bool trans = true;
  static const A& get(const permute_node<A, 0, 2, 1>& x) { return x.a; }
};

template <class SA, class SB>
struct matmul_extents {
  static constexpr std::size_t ra = SA::rank, rb = SB::rank;
  static constexpr std::size_t rank = ra > rb ? ra : rb;
  static constexpr bool ranks_ok = (ra == 2 || ra == 3) && (rb == 2 || rb == 3);
  static constexpr index_t k_a = ranks_ok ? SA::extents[ra - 1] : 0;
  static constexpr index_t k_b = ranks_ok ? SB::extents[rb - 2] : 0;
  static constexpr index_t batch_a = ra == 3 ? SA::extents[0] : 1;
  static constexpr index_t batch_b = rb == 3 ? SB::extents[0] : 1;
  static constexpr bool inner_ok = k_a == dyn || k_b == dyn || k_a == k_b;  ///< the inner extents agree
  static constexpr bool ok =
      ranks_ok && inner_ok && (ra != 3 || rb != 3 || batch_a == dyn || batch_b == dyn || batch_a == batch_b);
  /// The dimensions a diagnostic names: the inner ones (a's last, b's second to last) where
  /// they differ, else the batch ones; -1 for ranks other than 2 or 3.
  static constexpr int bad_a = !ranks_ok ? -1 : !inner_ok ? static_cast<int>(ra) - 1 : 0;
  static constexpr int bad_b = !ranks_ok ? -1 : !inner_ok ? static_cast<int>(rb) - 2 : 0;  ///< b's, as bad_a
  static constexpr std::array<index_t, rank> value = [] {
    std::array<index_t, rank> r{};
    if constexpr (ranks_ok) {
      if constexpr (rank == 3) r[0] = ra == 3 ? (batch_a != dyn ? batch_a : batch_b) : batch_b;
      r[rank - 2] = SA::extents[ra - 2];
      r[rank - 1] = SB::extents[rb - 1];
    }
    return r;
  }();
};
}  // namespace detail

namespace op {
struct matmul {
  static constexpr const char* name = "matmul";
  template <class SA, class SB>
  static constexpr bool fits = detail::matmul_extents<SA, SB>::ok;
  /// The dimensions that disagree: detail::matmul_extents' bad_a and bad_b.
  template <class SA, class SB>
  using where = shape_mismatch::dimension_of_a_vs_b<detail::matmul_extents<SA, SB>::bad_a,
                                                    detail::matmul_extents<SA, SB>::bad_b>;
};
}  // namespace op

template <class A, class B>
struct matmul_node : expr_base {
  static_assert(check_dtypes<op::matmul, value_t<A>, value_t<B>>::value);
  static_assert(real_dtype<value_t<A>>, "gradus: matmul needs float or double operands");
  static_assert(check_shapes<op::matmul, shape_t<A>, shape_t<B>>::value);
  using value_type = value_t<A>;
  using shape_type = shape_of_array<detail::matmul_extents<shape_t<A>, shape_t<B>>>;
  static constexpr node_kind kind = node_kind::kernel;
  static constexpr const char* op_name = "matmul";
  static constexpr op_precision precision = op_precision::compute;  ///< a GEMM (core/precision.hpp)
  using lhs = detail::gemm_operand<A>;
  using rhs = detail::gemm_operand<B>;
  A a;
  B b;
  /// GEMM reads the operands under any transpose: those are what must be in buffers.
  auto operands() const { return std::tie(lhs::get(a), rhs::get(b)); }
  auto children() const { return std::tie(a, b); }

  /// Logical dims of an operand, given the dims of the buffer GEMM reads.
  static dims logical(dims d, bool trans) {
    if (trans) std::swap(d.d[d.rank - 1], d.d[d.rank - 2]);
    return d;
  }
  dims infer(const dims& pa, const dims& pb) const {
    const dims da = logical(pa, lhs::trans), db = logical(pb, rhs::trans);
    const index_t ka = da.d[da.rank - 1], kb = db.d[db.rank - 2];
    const index_t ba = da.rank == 3 ? da.d[0] : 1, bb = db.rank == 3 ? db.d[0] : 1;
    if (ka != kb || (da.rank == 3 && db.rank == 3 && ba != bb))
      throw shape_error("gradus: matmul: shapes " + to_string(da) + " and " + to_string(db) + " do not fit");
    dims r;
    r.rank = std::max(da.rank, db.rank);
    if (r.rank == 3) r.d[0] = da.rank == 3 ? ba : bb;
    r.d[r.rank - 2] = da.d[da.rank - 2];
    r.d[r.rank - 1] = db.d[db.rank - 1];
    return r;
  }
  template <class Backend>
  void compute(value_type* out, const dims& od, tensor_view<const value_type> pa,
               tensor_view<const value_type> pb) const {
    const dims da = logical(pa.shape(), lhs::trans);
    const index_t m = od.d[od.rank - 2], n = od.d[od.rank - 1], k = da.d[da.rank - 1];
    const index_t batch = od.rank == 3 ? od.d[0] : 1;
    // Row-major leading dimensions are the stored (not logical) row lengths.
    const index_t lda = pa.shape().d[pa.shape().rank - 1], ldb = pb.shape().d[pb.shape().rank - 1];
    const index_t sa = pa.shape().rank == 3 ? pa.shape().d[1] * pa.shape().d[2] : 0;
    const index_t sb = pb.shape().rank == 3 ? pb.shape().d[1] * pb.shape().d[2] : 0;
    Backend::gemm(lhs::trans, rhs::trans, m, n, k, value_type(1), pa.data(), lda, sa, pb.data(), ldb, sb,
                  value_type(0), out, n, m * n, batch);
  }
  bool operator==(const matmul_node&) const = default;
};

/// matmul(a, b): the matrix product. [M, K] x [K, N] -> [M, N]; batched, [B, M, K] x
/// [B, K, N] -> [B, M, N]; a 2-D operand next to a 3-D one is used for every batch entry.
/// float or double, one dtype. K and B must agree: a compile error where the static shapes
/// say so, else a shape_error at run time. A matrix_transpose() operand, or the transpose()
/// of a 2-D one, is not copied (the GEMM's transpose flag). Gradient: g b^T to a, a^T g to b
/// (matrix transposes), summed over the batch for a 2-D operand.
template <expression A, expression B>
auto matmul(const A& a, const B& b) {
  return matmul_node<A, B>{{}, a, b};
}

}  // namespace gradus
