#pragma once
// cuda: images (NCHW, OIHW, dilation 1). Convolutions through cuDNN on a GPU (the three
// calls the conv node was built around: forward, backward data, backward filter; the
// algorithm from cuDNN's heuristics, asked once per shape, its workspace from the pool),
// cpu_simd's convolutions in the cuda-omp build. im2col / col2im and pooling are kernels
// of their own: one thread per output element, each gathering what it needs, so no thread
// writes another's element and every sum runs in cpu_simd's order (the same bits on both
// backends).
#include <algorithm>
#include <limits>
#include <map>
#include <memory>

#include "gradus/backends/cuda/device_pool.hpp"
#include "gradus/backends/cuda/layout.hpp"
#include "gradus/core/dtype.hpp"
#include "gradus/core/half.hpp"
#include "gradus/exec/compute_kernels.hpp"
#include "gradus/graph/ops/conv_geometry.hpp"

#if GRADUS_CUDA_GPU
#include <cudnn.h>
#endif

namespace gradus {

namespace cuda_kernels {

// Each kernel holds its call's conv_geometry and the output extents OH, OW, computed once
// on the host (a division saved in every thread).

/// col [C*KH*KW, N*OH*OW]: element (row (ch, i, j), column (b, y, q)) is pixel
/// (y*s - p + i, q*s - p + j) of channel ch of image b, 0 in the padding.
template <class T>
struct im2col_fn {
  const T* x;
  conv_geometry g;
  index_t oh, ow, cols;
  T* col;
  GRADUS_HD void operator()(index_t e) const {
    const index_t kh = g.window.kh, kw = g.window.kw, s = g.window.stride, p = g.window.pad;
    const index_t r = e / cols, cidx = e - r * cols;
    const index_t ch = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
    const index_t b = cidx / (oh * ow), y = (cidx / ow) % oh, q = cidx % ow;
    const index_t iy = y * s - p + i, ix = q * s - p + j;
    col[e] = (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) ? T(0) : x[((b * g.c + ch) * g.h + iy) * g.w + ix];
  }
};

/// x [N,C,H,W]: each pixel sums the col entries im2col read it into, over (i, j) in order.
template <class T>
struct col2im_fn {
  const T* col;
  conv_geometry g;
  index_t oh, ow, cols;
  T* x;
  GRADUS_HD void operator()(index_t e) const {
    const index_t kh = g.window.kh, kw = g.window.kw, s = g.window.stride, p = g.window.pad;
    const index_t ix = e % g.w, iy = (e / g.w) % g.h, ch = (e / (g.w * g.h)) % g.c, b = e / (g.w * g.h * g.c);
    T acc = T(0);
    for (index_t i = 0; i < kh; ++i) {
      const index_t ty = iy + p - i;  // = y * s
      if (ty < 0 || ty % s || ty / s >= oh) continue;
      const index_t y = ty / s;
      for (index_t j = 0; j < kw; ++j) {
        const index_t tx = ix + p - j;
        if (tx < 0 || tx % s || tx / s >= ow) continue;
        const index_t q = tx / s;
        acc += col[((ch * kh + i) * kw + j) * cols + (b * oh + y) * ow + q];
      }
    }
    x[e] = acc;
  }
};

template <class T>
GRADUS_HD T max_nan(T m, T e) {  // max that propagates a NaN from either side
  return (e > m || (e != e && m == m)) ? e : m;
}

/// max skips the padding (PyTorch's -inf), avg counts it as zeros (count_include_pad)
template <class T>
struct pool_fn {
  bool is_max;
  const T* x;
  conv_geometry g;
  index_t oh, ow;
  T* y;
  GRADUS_HD void operator()(index_t e) const {
    const index_t h = g.h, w = g.w, kh = g.window.kh, kw = g.window.kw, s = g.window.stride, p = g.window.pad;
    const index_t b = e % ow, a = (e / ow) % oh, pl = e / (ow * oh);
    const T* in = x + pl * h * w;
    const index_t y0 = a * s - p > 0 ? a * s - p : 0, y1 = a * s - p + kh < h ? a * s - p + kh : h;
    const index_t x0 = b * s - p > 0 ? b * s - p : 0, x1 = b * s - p + kw < w ? b * s - p + kw : w;
    T acc = is_max ? -std::numeric_limits<T>::infinity() : T(0);
    if (is_max) {
      for (index_t u = y0; u < y1; ++u)
        for (index_t v = x0; v < x1; ++v) acc = max_nan(acc, in[u * w + v]);
      y[e] = acc;
    } else {
      for (index_t u = y0; u < y1; ++u)
        for (index_t v = x0; v < x1; ++v) acc += in[u * w + v];
      y[e] = acc * (T(1) / static_cast<T>(kh * kw));
    }
  }
};

/// dx: each pixel sums, over the windows holding it in scan order, g of the window if the
/// pixel is that window's first maximum (max; a NaN counts as the maximum) or g / (KH*KW).
template <class T>
struct pool_grad_fn {
  bool is_max;
  const T* x;
  const T* gr;
  conv_geometry g;
  index_t oh, ow;
  T* dx;
  GRADUS_HD void operator()(index_t e) const {
    const index_t h = g.h, w = g.w, kh = g.window.kh, kw = g.window.kw, s = g.window.stride, p = g.window.pad;
    const index_t v0 = e % w, u0 = (e / w) % h, pl = e / (w * h);
    const T* in = x + pl * h * w;
    const T* gp = gr + pl * oh * ow;
    const T inv = T(1) / static_cast<T>(kh * kw);
    T acc = T(0);
    for (index_t a = 0; a < oh; ++a) {
      const index_t ys = a * s - p;
      if (u0 < ys || u0 >= ys + kh) continue;
      for (index_t b = 0; b < ow; ++b) {
        const index_t xs = b * s - p;
        if (v0 < xs || v0 >= xs + kw) continue;
        if (!is_max) {
          acc += gp[a * ow + b] * inv;
          continue;
        }
        const index_t y0 = ys > 0 ? ys : 0, y1 = ys + kh < h ? ys + kh : h;
        const index_t x0 = xs > 0 ? xs : 0, x1 = xs + kw < w ? xs + kw : w;
        index_t best = y0 * w + x0;
        for (index_t u = y0; u < y1; ++u)
          for (index_t v = x0; v < x1; ++v) {
            const T c = in[u * w + v], m = in[best];
            if (c > m || (c != c && m == m)) best = u * w + v;
          }
        if (best == u0 * w + v0) acc += gp[a * ow + b];
      }
    }
    dx[e] = acc;
  }
};

/// dst[i] = src[i] rounded to bf16 (or fp16), back in float (core/half.hpp's bits).
struct round_half_fn {
  const float* src;
  float* dst;
  bool bf16;
  GRADUS_HD void operator()(index_t i) const {
    dst[i] = bf16 ? half_bits::bf16_to_float(half_bits::bf16_from_float(src[i]))
                  : half_bits::f16_to_float(half_bits::f16_from_float(src[i]));
  }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct images_section : layout_section {
  /// A convolution pass of a mixed-precision session (exec/compute_kernels.hpp): both float
  /// operands rounded to bf16 or fp16 in device scratch, then the fp32 pass (cuDNN on a GPU,
  /// cpu_simd's in the cuda-omp build): the low-precision numbers (rounded operands, fp32
  /// sums), not yet cuDNN's bf16 / fp16 tensor-core kernels.
  static void conv2d_low(element_type compute, conv_pass_kind pass, const float* a, const float* b,
                         const conv_geometry& g, float* out) {
    if (compute == element_type::f32) return run_pass(pass, a, b, g, out);
    const auto [na, nb] = conv_operand_sizes(pass, g);
    const bool bf = compute == element_type::bf16;
    cuda_detail::device_scratch<float> ar(static_cast<std::size_t>(na)), br(static_cast<std::size_t>(nb));
    for_n(na, cuda_kernels::round_half_fn{a, ar.get(), bf});
    for_n(nb, cuda_kernels::round_half_fn{b, br.get(), bf});
    run_pass(pass, ar.get(), br.get(), g, out);
  }

  template <class T>
  static void conv2d(const T* x, const T* wt, const conv_geometry& g, T* y) {
#if GRADUS_CUDA_GPU
    conv_call<T>(pass::forward, x, wt, y, g);
#else
    cpu_simd::conv2d(x, wt, g, y);
#endif
  }
  template <class T>
  static void conv2d_backward_data(const T* dy, const T* wt, const conv_geometry& g, T* dx) {
#if GRADUS_CUDA_GPU
    conv_call<T>(pass::data, dy, wt, dx, g);
#else
    cpu_simd::conv2d_backward_data(dy, wt, g, dx);
#endif
  }
  template <class T>
  static void conv2d_backward_weights(const T* x, const T* dy, const conv_geometry& g, T* dw) {
#if GRADUS_CUDA_GPU
    conv_call<T>(pass::weights, x, dy, dw, g);
#else
    cpu_simd::conv2d_backward_weights(x, dy, g, dw);
#endif
  }

  template <class T>
  static void run_pass(conv_pass_kind pass, const T* a, const T* b, const conv_geometry& g, T* out) {
    if (pass == conv_pass_kind::forward) conv2d(a, b, g, out);
    else if (pass == conv_pass_kind::data) conv2d_backward_data(a, b, g, out);
    else conv2d_backward_weights(a, b, g, out);
  }

  template <class T>
  static void im2col(const T* x, const conv_geometry& g, T* col) {
    const index_t oh = g.oh(), ow = g.ow(), cols = g.n * oh * ow;
    for_n(g.patch() * cols, cuda_kernels::im2col_fn<T>{x, g, oh, ow, cols, col});
  }
  template <class T>
  static void col2im(const T* col, const conv_geometry& g, T* x) {
    const index_t oh = g.oh(), ow = g.ow();
    for_n(g.planes() * g.h * g.w, cuda_kernels::col2im_fn<T>{col, g, oh, ow, g.n * oh * ow, x});
  }
  template <class T>
  static void pool2d(bool is_max, const T* x, const conv_geometry& g, T* y) {
    const index_t oh = g.oh(), ow = g.ow();
    for_n(g.planes() * oh * ow, cuda_kernels::pool_fn<T>{is_max, x, g, oh, ow, y});
  }
  template <class T>
  static void pool2d_grad(bool is_max, const T* x, const T* g, const conv_geometry& geo, T* dx) {
    for_n(geo.planes() * geo.h * geo.w, cuda_kernels::pool_grad_fn<T>{is_max, x, g, geo, geo.oh(), geo.ow(), dx});
  }

 protected:
#if GRADUS_CUDA_GPU
  enum class pass { forward, data, weights };
  static void check_dnn(cudnnStatus_t st, const char* what) {
    if (st != CUDNN_STATUS_SUCCESS)
      throw cuda_error(std::string("gradus: cuda: ") + what + ": " + cudnnGetErrorString(st));
  }
  static cudnnHandle_t dnn() {
    struct holder {
      cudnnHandle_t h = nullptr;
      holder() { check_dnn(cudnnCreate(&h), "cudnnCreate"); }
      holder(const holder&) = delete;
      holder& operator=(const holder&) = delete;
      ~holder() { cudnnDestroy(h); }
    };
    thread_local holder h;
    check_dnn(cudnnSetStream(h.h, stream()), "cudnnSetStream");
    return h.h;
  }
  /// The descriptors of one convolution shape.
  template <class T>
  struct conv_desc {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    explicit conv_desc(const conv_geometry& g) {
      constexpr cudnnDataType_t dt = std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
      const auto i = [](index_t v) { return static_cast<int>(v); };
      check_dnn(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
      check_dnn(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
      check_dnn(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
      check_dnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
      const index_t s = g.window.stride, p = g.window.pad;
      check_dnn(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, dt, i(g.n), i(g.c), i(g.h), i(g.w)),
                "cudnnSetTensor4dDescriptor");
      check_dnn(cudnnSetFilter4dDescriptor(w, dt, CUDNN_TENSOR_NCHW, i(g.o), i(g.c), i(g.window.kh), i(g.window.kw)),
                "cudnnSetFilter4dDescriptor");
      check_dnn(cudnnSetConvolution2dDescriptor(conv, i(p), i(p), i(s), i(s), 1, 1, CUDNN_CROSS_CORRELATION, dt),
                "cudnnSetConvolution2dDescriptor");
      if constexpr (std::is_same_v<T, float>)  // no TF32: float results
        check_dnn(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
      check_dnn(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, dt, i(g.n), i(g.o), i(g.oh()), i(g.ow())),
                "cudnnSetTensor4dDescriptor");
    }
    conv_desc(const conv_desc&) = delete;
    conv_desc& operator=(const conv_desc&) = delete;
    ~conv_desc() {
      cudnnDestroyConvolutionDescriptor(conv);
      cudnnDestroyFilterDescriptor(w);
      cudnnDestroyTensorDescriptor(y);
      cudnnDestroyTensorDescriptor(x);
    }
  };
  /// One convolution's descriptors and, per pass, the algorithm cuDNN's heuristics chose
  /// and its workspace size: asked once per shape and thread (a training step asks the
  /// same few shapes every time), not on every call.
  template <class T>
  struct conv_plan {
    conv_desc<T> d;
    int algo[3] = {-1, -1, -1};  ///< by pass; -1: not asked yet
    std::size_t workspace[3] = {0, 0, 0};
    explicit conv_plan(const conv_geometry& g) : d(g) {}
  };
  template <class T>
  static conv_plan<T>& plan_for(const conv_geometry& g) {
    thread_local std::map<conv_geometry, std::unique_ptr<conv_plan<T>>> plans;
    auto& slot = plans[g];
    if (!slot) slot = std::make_unique<conv_plan<T>>(g);
    return *slot;
  }
  /// The first of the heuristics' `got` answers (fastest first) that cuDNN can run here
  /// (status success) in the descriptor's math (float: FMA, no TF32), deterministic ones
  /// first: a non-deterministic algorithm (atomic adds, e.g. some backward-filter ones) gives
  /// other bits on every run of the same program and seed (seen on an H200: mnist_cnn_cuda's
  /// seed 1 reached 97.66%, 97.82% and 96.55% in three runs), which PyTorch only avoids under
  /// torch.backends.cudnn.deterministic. Without a deterministic one, the fastest usable.
  template <class T, class Perf>
  static int usable_algorithm(const Perf* perf, int got, const char* what) {
    const auto usable = [&](int i) {
      return perf[i].status == CUDNN_STATUS_SUCCESS && (!std::is_same_v<T, float> || perf[i].mathType == CUDNN_FMA_MATH);
    };
    for (int i = 0; i < got; ++i)
      if (usable(i) && perf[i].determinism == CUDNN_DETERMINISTIC) return static_cast<int>(perf[i].algo);
    for (int i = 0; i < got; ++i)
      if (usable(i)) return static_cast<int>(perf[i].algo);
    throw cuda_error(std::string("gradus: cuda: ") + what + ": none of cuDNN's " + std::to_string(got) +
                     " algorithms for this convolution can run (in FMA math)");
  }
  /// forward: a = x, b = w, out = y; data: a = dy, b = w, out = dx; weights: a = x, b = dy, out = dw
  template <class T>
  static void conv_call(pass ps, const T* a, const T* b, T* out, const conv_geometry& g) {
    conv_plan<T>& pl = plan_for<T>(g);
    const conv_desc<T>& d = pl.d;
    const T one = 1, zero = 0;
    cudnnHandle_t hd = dnn();
    const int k = static_cast<int>(ps);
    int got = 0;
    if (ps == pass::forward) {
      if (pl.algo[k] < 0) {
        cudnnConvolutionFwdAlgoPerf_t perf[8];
        check_dnn(cudnnGetConvolutionForwardAlgorithm_v7(hd, d.x, d.w, d.conv, d.y, 8, &got, perf), "cudnnGetConvolutionForwardAlgorithm_v7");
        const int a = usable_algorithm<T>(perf, got, "cudnnGetConvolutionForwardAlgorithm_v7");
        check_dnn(cudnnGetConvolutionForwardWorkspaceSize(hd, d.x, d.w, d.conv, d.y, static_cast<cudnnConvolutionFwdAlgo_t>(a),
                                                          &pl.workspace[k]), "workspace size");
        pl.algo[k] = a;
      }
      cuda_detail::device_scratch<unsigned char> work(pl.workspace[k]);
      check_dnn(cudnnConvolutionForward(hd, &one, d.x, a, d.w, b, d.conv, static_cast<cudnnConvolutionFwdAlgo_t>(pl.algo[k]),
                                        work.get(), pl.workspace[k], &zero, d.y, out),
                "cudnnConvolutionForward");
    } else if (ps == pass::data) {
      if (pl.algo[k] < 0) {
        cudnnConvolutionBwdDataAlgoPerf_t perf[8];
        check_dnn(cudnnGetConvolutionBackwardDataAlgorithm_v7(hd, d.w, d.y, d.conv, d.x, 8, &got, perf), "cudnnGetConvolutionBackwardDataAlgorithm_v7");
        const int a = usable_algorithm<T>(perf, got, "cudnnGetConvolutionBackwardDataAlgorithm_v7");
        check_dnn(cudnnGetConvolutionBackwardDataWorkspaceSize(hd, d.w, d.y, d.conv, d.x,
                                                               static_cast<cudnnConvolutionBwdDataAlgo_t>(a), &pl.workspace[k]),
                  "workspace size");
        pl.algo[k] = a;
      }
      cuda_detail::device_scratch<unsigned char> work(pl.workspace[k]);
      check_dnn(cudnnConvolutionBackwardData(hd, &one, d.w, b, d.y, a, d.conv, static_cast<cudnnConvolutionBwdDataAlgo_t>(pl.algo[k]),
                                             work.get(), pl.workspace[k], &zero, d.x, out),
                "cudnnConvolutionBackwardData");
    } else {
      if (pl.algo[k] < 0) {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[8];
        check_dnn(cudnnGetConvolutionBackwardFilterAlgorithm_v7(hd, d.x, d.y, d.conv, d.w, 8, &got, perf), "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
        const int a = usable_algorithm<T>(perf, got, "cudnnGetConvolutionBackwardFilterAlgorithm_v7");
        check_dnn(cudnnGetConvolutionBackwardFilterWorkspaceSize(hd, d.x, d.y, d.conv, d.w,
                                                                 static_cast<cudnnConvolutionBwdFilterAlgo_t>(a), &pl.workspace[k]),
                  "workspace size");
        pl.algo[k] = a;
      }
      cuda_detail::device_scratch<unsigned char> work(pl.workspace[k]);
      check_dnn(cudnnConvolutionBackwardFilter(hd, &one, d.x, a, d.y, b, d.conv, static_cast<cudnnConvolutionBwdFilterAlgo_t>(pl.algo[k]),
                                               work.get(), pl.workspace[k], &zero, d.w, out),
                "cudnnConvolutionBackwardFilter");
    }
  }
#endif
};

}  // namespace cuda_sections
}  // namespace gradus
