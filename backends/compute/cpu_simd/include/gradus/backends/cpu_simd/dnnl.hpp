#pragma once
// cpu_simd's float convolutions through oneDNN (Debian's libdnnl-dev 2.6, what PyTorch runs
// its CPU convolutions on), where CMake found it (GRADUS_HAVE_DNNL, option GRADUS_DNNL).
//
// Why oneDNN rather than im2col + GEMM: LeNet's convolutions are GEMMs with k = 25 or
// m = 6-16, where OpenBLAS spends much of its time packing, and im2col / col2im copy every
// pixel 25 times; oneDNN's jit kernels convolve directly. mnist_cnn's epoch: 1.48-1.51 s against
// 1.87-1.96 s with GRADUS_DNNL=0 (AMD EPYC Zen 4, 2 threads; benchmarks/README.md).
//
// How a call runs: the batch is cut into threads() slices (fewer when the batch is
// smaller), each with primitives of its own that were created with OpenMP's thread count
// at 1, and the team runs the slices. So, as for cpu_simd::gemm's blocks, the bits depend
// on threads() and the shape only, never on the team the governor picks: a slice is one
// single-threaded oneDNN call whichever thread runs it, and the weight gradient adds the
// slices' partial sums in slice order. (oneDNN threading its own calls would make the weight
// gradient depend on the thread count: its jit reduction across threads changed all 150
// elements of conv1's weight gradient between 1 and 2 threads. And a primitive created for
// 2 threads deadlocked when run by 1, so every primitive is created and run at 1.) Each
// slice owns its scratchpads and its buffers.
//
// Layouts: each primitive is created for oneDNN's own layouts (format `any`: channels in
// blocks of 8 or 16), with reorders from the tensors' NCHW / OIHW before the call and back
// after it, into buffers of the slice's own. In the tensors' layouts oneDNN runs its
// gemm-based convolution; in its own, its direct jit kernels, which on 32-image slices of
// LeNet took 86-230 us per pass against 324-366 us (conv2's backward passes) and 0.40 ms
// (conv1's weight gradient), reorders included in the comparison.
//
// Left to the caller's im2col path: a shape oneDNN has no primitive for (its
// primitive_desc throws; remembered), double tensors (oneDNN's f64 convolutions are not in
// 2.6), and the data gradient of a one-channel input (oneDNN pads the channel to a block
// of 16: 2.1-3.0 ms for a 32-image slice of LeNet's conv1, whose input needs no gradient
// in training anyway).
//
// GRADUS_DNNL=0 in the environment, or cpu_dnnl::set_enabled(false), sends every call to
// the im2col path. What a call allocates: only inside oneDNN's execute (its argument
// lists and execution context, the same each call; tests/exec/test_alloc.cpp counts them);
// the primitives, buffers and scratchpads are made once per (shape, pass, slice count).
#include <cstdint>
#include <type_traits>

#include "gradus/graph/ops/conv_geometry.hpp"

namespace gradus::cpu_dnnl {

using dim = std::int64_t;
static_assert(std::is_same_v<dim, index_t>, "gradus: oneDNN's dims are conv_geometry's extents");

enum class conv_pass { forward, data, weights };

}  // namespace gradus::cpu_dnnl

#if defined(GRADUS_HAVE_DNNL) && GRADUS_HAVE_DNNL
#include <omp.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gradus/backends/cpu_simd/threads.hpp"

namespace gradus::cpu_dnnl {

/// -1: from GRADUS_DNNL (on unless it is "0"); 0 or 1: set_enabled's.
inline std::atomic<int> enabled_state{-1};
inline bool enabled() {
  const int s = enabled_state.load(std::memory_order_relaxed);
  if (s >= 0) return s == 1;
  const char* e = std::getenv("GRADUS_DNNL");
  const bool on = !(e && std::string_view(e) == "0");
  enabled_state.store(on ? 1 : 0, std::memory_order_relaxed);
  return on;
}
inline void set_enabled(bool on) { enabled_state.store(on ? 1 : 0, std::memory_order_relaxed); }

/// Plans a thread keeps (primitives per shape): past this many, the older half is dropped, so
/// a program that keeps changing shapes does not grow without bound.
constexpr std::size_t max_plans = 128;

inline const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

/// One argument of a slice's primitive: `user` is the tensor in its own layout (NCHW or OIHW,
/// its data handle set on each call); `prim` is what the primitive reads or writes: `user`
/// itself, or a buffer of the slice's own in the primitive's layout, with a reorder from
/// `user` before the call (an input) or to `user` after it (an output).
struct conv_arg {
  dnnl::memory user, prim, scratchpad;
  dnnl::primitive reorder;
  std::unordered_map<int, dnnl::memory> args;
  bool reordered = false;
};

/// One slice of the batch: images [n0, n1), its convolution primitive and its arguments.
struct conv_slice {
  dim n0 = 0, n1 = 0;
  dnnl::primitive prim;
  conv_arg a, b, out;  ///< see conv(): forward x, w -> y; data dy, w -> dx; weights x, dy -> dw
  dnnl::memory scratchpad;
  std::unordered_map<int, dnnl::memory> args;
  dnnl::stream stream;
  void run() {
    if (a.reordered) a.reorder.execute(stream, a.args);
    if (b.reordered) b.reorder.execute(stream, b.args);
    prim.execute(stream, args);
    if (out.reordered) out.reorder.execute(stream, out.args);
    stream.wait();
  }
};

inline void bind_arg(conv_arg& arg, const dnnl::memory::desc& plain, const dnnl::memory::desc& want, bool input) {
  const auto& eng = engine();
  arg.user = dnnl::memory(plain, eng, DNNL_MEMORY_NONE);
  if (want == plain) {
    arg.prim = arg.user;
    return;
  }
  arg.prim = dnnl::memory(want, eng);  // oneDNN allocates the slice's own buffer
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::memory& from = input ? arg.user : arg.prim;
  const dnnl::memory& to = input ? arg.prim : arg.user;
  const dnnl::reorder::primitive_desc pd(from, to, attr);
  arg.reorder = dnnl::reorder(pd);
  arg.scratchpad = dnnl::memory(pd.scratchpad_desc(), eng);
  arg.args = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}, {DNNL_ARG_SCRATCHPAD, arg.scratchpad}};
  arg.reordered = true;
}

/// Whether oneDNN runs a bf16 pass with one of its direct jit kernels. Where it has none it
/// takes its gemm-based bf16 convolution, which for LeNet's conv1 weight gradient (one input
/// channel) took 4x the fp32 pass's time: such a shape takes the caller's path instead.
inline bool direct_kernel(const dnnl::primitive_desc_base& pd) {
  return std::string_view(pd.impl_info_str()).find("gemm") == std::string_view::npos;
}

/// `bf16`: the primitive reads its two inputs as bf16 (the reorders from the tensors' float
/// round them to nearest even) and writes its float output with fp32 sums. Returns false
/// (nothing built) for a bf16 pass oneDNN has no direct kernel for.
inline bool build_slice(conv_slice& sl, const conv_geometry& sh, conv_pass pass, bool bf16) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const dim nb = sl.n1 - sl.n0;
  const dnnl::memory::desc x_md({nb, sh.c, sh.h, sh.w}, dt::f32, tag::nchw);
  const dnnl::memory::desc w_md({sh.o, sh.c, sh.window.kh, sh.window.kw}, dt::f32, tag::oihw);
  const dnnl::memory::desc y_md({nb, sh.o, sh.oh(), sh.ow()}, dt::f32, tag::nchw);
  // The primitive in oneDNN's own layouts (format `any`: channels in blocks of 8 or 16),
  // with reorders from and to the tensors' NCHW / OIHW around the call. In the tensors'
  // layouts oneDNN runs its gemm-based convolution; in its own, its direct jit kernels,
  // 1.6-2.2x faster on LeNet's two layers' three passes even with the reorders
  // (single-threaded on 32-image slices, AMD EPYC Zen 4; benchmarks/README.md).
  const dt in = bf16 ? dt::bf16 : dt::f32;
  auto pick = [](const dnnl::memory::desc& md, dt type) { return dnnl::memory::desc(md.dims(), type, tag::any); };
  // what each pass reads in `in` and writes in f32: forward x, w -> y; data dy, w -> dx;
  // weights x, dy -> dw
  const dt x_t = pass == conv_pass::data ? dt::f32 : in, w_t = pass == conv_pass::weights ? dt::f32 : in,
           y_t = pass == conv_pass::forward ? dt::f32 : in;
  // oneDNN checks (h - kh + pad_l + pad_r) / s + 1 == oh with the same floor division as
  // gradus' window2d, so the right padding is p too.
  const dnnl::memory::dims strides{sh.window.stride, sh.window.stride}, pad{sh.window.pad, sh.window.pad};
  const auto& eng = engine();
  // Each slice owns its scratchpad (allocated here, once): with oneDNN's default, the
  // library's scratchpad, two slices' calls running at once crashed in its gemm-based
  // convolution.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                      pick(x_md, in), pick(w_md, in), pick(y_md, y_t), strides, pad, pad),
      attr, eng);
  dnnl::memory::desc scratch_md;
  switch (pass) {
    case conv_pass::forward:
      if (bf16 && !direct_kernel(fwd)) return false;
      sl.prim = dnnl::convolution_forward(fwd);
      scratch_md = fwd.scratchpad_desc();
      bind_arg(sl.a, x_md, fwd.src_desc(), true);
      bind_arg(sl.b, w_md, fwd.weights_desc(), true);
      bind_arg(sl.out, y_md, fwd.dst_desc(), false);
      sl.args = {{DNNL_ARG_SRC, sl.a.prim}, {DNNL_ARG_WEIGHTS, sl.b.prim}, {DNNL_ARG_DST, sl.out.prim}};
      break;
    case conv_pass::data: {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, pick(x_md, x_t),
                                                pick(w_md, w_t), pick(y_md, y_t), strides, pad, pad),
          attr, eng, fwd);
      if (bf16 && !direct_kernel(pd)) return false;
      sl.prim = dnnl::convolution_backward_data(pd);
      scratch_md = pd.scratchpad_desc();
      bind_arg(sl.a, y_md, pd.diff_dst_desc(), true);
      bind_arg(sl.b, w_md, pd.weights_desc(), true);
      bind_arg(sl.out, x_md, pd.diff_src_desc(), false);
      sl.args = {{DNNL_ARG_DIFF_DST, sl.a.prim}, {DNNL_ARG_WEIGHTS, sl.b.prim}, {DNNL_ARG_DIFF_SRC, sl.out.prim}};
      break;
    }
    case conv_pass::weights: {
      const dnnl::convolution_backward_weights::primitive_desc pd(
          dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, pick(x_md, x_t),
                                                   pick(w_md, w_t), pick(y_md, y_t), strides, pad, pad),
          attr, eng, fwd);
      if (bf16 && !direct_kernel(pd)) return false;
      sl.prim = dnnl::convolution_backward_weights(pd);
      scratch_md = pd.scratchpad_desc();
      bind_arg(sl.a, x_md, pd.src_desc(), true);
      bind_arg(sl.b, y_md, pd.diff_dst_desc(), true);
      bind_arg(sl.out, w_md, pd.diff_weights_desc(), false);
      sl.args = {{DNNL_ARG_SRC, sl.a.prim}, {DNNL_ARG_DIFF_DST, sl.b.prim}, {DNNL_ARG_DIFF_WEIGHTS, sl.out.prim}};
      break;
    }
  }
  sl.scratchpad = dnnl::memory(scratch_md, eng);  // oneDNN allocates it (size 0: none)
  sl.args.emplace(DNNL_ARG_SCRATCHPAD, sl.scratchpad);
  sl.stream = dnnl::stream(eng);
  return true;
}

struct conv_plan {
  conv_geometry shape{};
  conv_pass pass{};
  int slices = 0;
  bool bf16 = false;    ///< bf16 inputs (build_slice)
  bool usable = false;  ///< false: oneDNN refused the shape (or has no direct bf16 kernel): the caller's path
  std::vector<conv_slice> slice;
  std::vector<float> partial;  ///< weights: slices 1.. write their sums here, [slices - 1][o*c*kh*kw]
};

/// The calling thread's plans, made on first use of a (shape, pass, slice count, input type).
inline conv_plan& plan_for(const conv_geometry& sh, conv_pass pass, int slices, bool bf16) {
  thread_local std::vector<std::unique_ptr<conv_plan>> plans;
  for (auto& p : plans)
    if (p->shape == sh && p->pass == pass && p->slices == slices && p->bf16 == bf16) return *p;
  auto p = std::make_unique<conv_plan>();
  p->shape = sh, p->pass = pass, p->slices = slices, p->bf16 = bf16;
  p->slice.resize(static_cast<std::size_t>(slices));
  try {
    // created at one OpenMP thread: each slice runs single-threaded (see the top)
    bool built = true;
    cpu_threads::blas_on_one_thread([&] {
      for (int i = 0; i < slices && built; ++i) {
        conv_slice& sl = p->slice[static_cast<std::size_t>(i)];
        sl.n0 = sh.n * i / slices, sl.n1 = sh.n * (i + 1) / slices;
        built = build_slice(sl, sh, pass, bf16);
      }
    });
    if (pass == conv_pass::weights)
      p->partial.assign(static_cast<std::size_t>((slices - 1) * sh.o * sh.patch()), 0.f);
    p->usable = built;
    if (!built) p->slice.clear();
  } catch (const dnnl::error&) {
    p->slice.clear();  // oneDNN has no primitive for this shape in these layouts
  }
  if (plans.size() >= max_plans) plans.erase(plans.begin(), plans.begin() + max_plans / 2);  // oldest first
  plans.push_back(std::move(p));
  return *plans.back();
}

/// run_slice(0) ... run_slice(slices - 1), each a one-thread oneDNN call, on the team
/// (cpu_threads::team(): fewer threads while other processes hold cores). The slices are cut
/// by threads() alone, so the results never depend on the team.
template <class F>
void on_team(int slices, F&& run_slice) {
  const int team = std::min(slices, cpu_threads::team());
  if (team <= 1) {
    cpu_threads::blas_on_one_thread([&] {
      for (int i = 0; i < slices; ++i) run_slice(i);
    });
    return;
  }
  std::exception_ptr failed;  // an exception must not leave the parallel region
#pragma omp parallel for num_threads(team) schedule(static)
  for (int i = 0; i < slices; ++i) {
    omp_set_num_threads(1);  // this implicit task's count: oneDNN asks it inside the call
    try {
      run_slice(i);
    } catch (...) {
#pragma omp critical(gradus_dnnl_failed)
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

/// Runs one pass through oneDNN and returns true, or returns false (nothing written) where
/// the caller's own path must run: oneDNN switched off, or no primitive for the shape.
///   forward  a = x, b = w, out = y      data  a = dy, b = w, out = dx
///   weights  a = x, b = dy, out = dw
/// `bf16`: a and b are read as bf16 (rounded to nearest even), the products summed in fp32
/// (the caller checks that the CPU has bf16 instructions: cpu_dnnl::bf16_native).
inline bool conv(conv_pass pass, const conv_geometry& sh, const float* a, const float* b, float* out,
                 bool bf16 = false) {
  if (!enabled() || sh.n <= 0) return false;
  if (pass == conv_pass::data && sh.c == 1) return false;  // see the top
  const int slices = static_cast<int>(std::min<dim>(std::max(1, cpu_threads::threads()), sh.n));
  conv_plan& pl = plan_for(sh, pass, slices, bf16);
  if (!pl.usable) return false;
  const dim x_img = sh.c * sh.h * sh.w, y_img = sh.o * sh.pixels(), w_size = sh.o * sh.patch();
  const dim a_img = pass == conv_pass::data ? y_img : x_img;
  const dim b_img = pass == conv_pass::weights ? y_img : 0;  // the weights are shared
  const dim out_img = pass == conv_pass::forward ? y_img : pass == conv_pass::data ? x_img : 0;
  auto run_slice = [&](int i) {
    conv_slice& sl = pl.slice[static_cast<std::size_t>(i)];
    sl.a.user.set_data_handle(const_cast<float*>(a + sl.n0 * a_img));
    sl.b.user.set_data_handle(const_cast<float*>(b + sl.n0 * b_img));
    float* o = pass != conv_pass::weights || i == 0 ? out + sl.n0 * out_img
                                                     : pl.partial.data() + (i - 1) * w_size;
    sl.out.user.set_data_handle(o);
    sl.run();
  };
  on_team(slices, run_slice);
  if (pass == conv_pass::weights)
    for (int i = 1; i < slices; ++i) {
      const float* p = pl.partial.data() + (i - 1) * w_size;
      for (dim j = 0; j < w_size; ++j) out[j] += p[j];
    }
  return true;
}

}  // namespace gradus::cpu_dnnl

#else
/// Built without oneDNN: every call takes the caller's own path.
namespace gradus::cpu_dnnl {
inline bool enabled() { return false; }
inline void set_enabled(bool) {}
inline bool conv(conv_pass, const conv_geometry&, const float*, const float*, float*, bool = false) { return false; }
}  // namespace gradus::cpu_dnnl
#endif
