#pragma once
// Mixed precision as a policy type: which element type the compute-heavy ops run in, which
// the master weights and the optimizer state are kept in, what gradients travel as, and
// whether the loss is scaled. It is part of a session's type,
//
//   g::session<g::cpu_simd>                   full_precision: today's fp32 bits, exactly
//   g::session<g::cpu_simd, g::mixed_bf16>    GEMMs, convolutions and RNN cell GEMMs in bf16
//   g::session<g::cuda, g::mixed_fp16>        fp16, with dynamic loss scaling
//
// so every choice it implies is made at compile time: an fp16 policy without a loss scaler
// does not compile, and each op says once, as a trait (op_precision below), whether it runs
// in the compute type or is kept in fp32 whatever the policy. Accumulation is always fp32:
// a low-precision GEMM rounds its operands to the compute type and sums their products in
// fp32 into an fp32 result (oneDNN's, cuBLAS's and PyTorch autocast's contract), so every
// buffer a graph holds stays fp32 and the ops kept in fp32 read exactly what they would in
// an fp32 model.
//
// Kept in fp32 whatever the policy (their nodes say nothing, so the rule's default holds):
// softmax / log-softmax, every loss, sums, means and norms, exp / log / pow, batch-norm
// statistics and weights, elementwise chains, the optimizer update and its state.
#include <type_traits>

#include "gradus/core/dtype.hpp"

namespace gradus {

/// No loss scaling: what fp32 and bf16 need (bf16 has float's exponent range).
struct no_loss_scale {};
/// Dynamic loss scaling with PyTorch GradScaler's schedule (train/loss_scale.hpp): the loss
/// is multiplied by a scale before the backward pass, the gradients divided by it after; a
/// step whose gradients hold Inf or NaN is skipped and the scale halved; after `growth_interval`
/// clean steps it doubles.
struct dynamic_loss_scale {};

/// A precision policy: Compute (float, bf16 or f16) is what matmul, convolution and the RNN
/// cells' GEMMs round their operands to; Master (float) what variables and optimizer state
/// are kept in; Comm (float, bf16 or f16) what gradients travel as between ranks; Scale
/// no_loss_scale or dynamic_loss_scale.
template <class Compute, class Master = float, class Comm = Compute, class Scale = no_loss_scale>
struct precision {
  static_assert(std::is_same_v<Compute, float> || std::is_same_v<Compute, bf16> || std::is_same_v<Compute, f16>,
                "gradus: precision<Compute, ...>: the compute type is float, g::bf16 or g::f16");
  static_assert(std::is_same_v<Master, float>,
                "gradus: precision<..., Master, ...>: master weights and optimizer state are float");
  static_assert(std::is_same_v<Comm, float> || std::is_same_v<Comm, bf16> || std::is_same_v<Comm, f16>,
                "gradus: precision<..., Comm, ...>: gradients travel as float, g::bf16 or g::f16");
  static_assert(std::is_same_v<Scale, no_loss_scale> || std::is_same_v<Scale, dynamic_loss_scale>,
                "gradus: precision<..., Scale>: g::no_loss_scale or g::dynamic_loss_scale");
  static_assert(!std::is_same_v<Compute, f16> || std::is_same_v<Scale, dynamic_loss_scale>,
                "gradus: fp16 compute needs a loss scaler (small gradients underflow fp16's 2^-24): "
                "write g::mixed_fp16, i.e. g::precision<g::f16, float, g::f16, g::dynamic_loss_scale>");
  using compute = Compute;  ///< what compute-precision ops round their operands to
  using master = Master;    ///< what variables and optimizer state are kept in
  using comm = Comm;        ///< what gradients travel as
  using scale = Scale;      ///< no_loss_scale or dynamic_loss_scale
  static constexpr element_type compute_type = element_type_of<Compute>;  ///< Compute as a value
  static constexpr element_type master_type = element_type_of<Master>;    ///< Master as a value
  static constexpr element_type comm_type = element_type_of<Comm>;        ///< Comm as a value
  static constexpr bool scales_loss = std::is_same_v<Scale, dynamic_loss_scale>;  ///< dynamic loss scaling?
  /// What a run fingerprint and a checkpoint record: "fp32", "bf16" or "fp16" (the compute
  /// type), with "/comm=..." where gradients travel in another type.
  static constexpr const char* name = std::is_same_v<Compute, bf16>  ? (std::is_same_v<Comm, bf16> ? "bf16" : "bf16/comm=fp32")
                                      : std::is_same_v<Compute, f16> ? (std::is_same_v<Comm, f16> ? "fp16" : "fp16/comm=fp32")
                                      : std::is_same_v<Comm, float>  ? "fp32"
                                                                     : "fp32/comm=low";
};

/// Every op in float: the default, and today's bits.
using full_precision = precision<float, float, float, no_loss_scale>;
/// TensorFlow's mixed_bfloat16: bf16 GEMMs and convolutions, fp32 masters, bf16 gradients
/// on the wire, no loss scaling.
using mixed_bf16 = precision<bf16, float, bf16, no_loss_scale>;
/// PyTorch AMP's fp16 (autocast + GradScaler): fp16 GEMMs and convolutions, fp32 masters,
/// fp16 gradients on the wire, dynamic loss scaling.
using mixed_fp16 = precision<f16, float, f16, dynamic_loss_scale>;

/// Whether P is a precision<...>.
template <class P>
inline constexpr bool is_precision_v = false;
/// (precision<...>: true)
template <class C, class M, class W, class S>
inline constexpr bool is_precision_v<precision<C, M, W, S>> = true;

/// Where an op runs: in the policy's compute type, or in fp32 whatever the policy.
enum class op_precision { compute, fp32 };

/// The rule, once per op: a node declaring `static constexpr op_precision precision =
/// op_precision::compute;` (matmul, convolution, the RNN cells) runs in the compute type;
/// every other node is kept in fp32.
template <class Node>
inline constexpr op_precision op_precision_of = [] {
  if constexpr (requires { Node::precision; }) return Node::precision;
  else return op_precision::fp32;
}();

/// A compute backend run under a precision policy: every section is Backend's (so a session
/// over it holds, plans and updates exactly as over Backend), with the policy attached for
/// the executor to consult per op (exec/graph_engine.hpp). session<B, P> is a
/// session<with_precision<B, P>> (exec/session.hpp).
template <class Backend, class Precision>
struct with_precision : Backend {
  static_assert(is_precision_v<Precision>, "gradus: with_precision<Backend, P>: P is a g::precision<...>");
  using base_backend = Backend;        ///< the backend whose sections it has
  using precision_policy = Precision;  ///< the policy the executor consults
};

/// The precision policy a backend runs under: with_precision's, else full_precision.
template <class B>
struct precision_of_backend {
  using type = full_precision;  ///< a plain backend's
};
/// (with_precision<B, P>: P)
template <class B>
  requires requires { typename B::precision_policy; }
struct precision_of_backend<B> {
  using type = typename B::precision_policy;  ///< its policy
};
/// precision_of_backend<B>::type.
template <class B>
using precision_of_backend_t = typename precision_of_backend<B>::type;

}  // namespace gradus
