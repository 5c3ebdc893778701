#pragma once
// cuda: images (NCHW, OIHW, dilation 1). Convolutions through cuDNN on a GPU (the three
// calls the conv node was built around: forward, backward data, backward filter; the
// algorithm from cuDNN's heuristics, asked once per shape, its workspace from the pool),
// cpu_simd's convolutions in the cuda-omp build. im2col / col2im and pooling are kernels
// of their own: one thread per output element, each gathering what it needs, so no thread
// writes another's element and every sum runs in cpu_simd's order (the same bits on both
// backends).
#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <memory>

#include "gradus/backends/cuda/layout.hpp"

#if GRADUS_CUDA_GPU
#include <cudnn.h>
#endif

namespace gradus {

namespace cuda_kernels {

struct window {
  index_t c, h, w, kh, kw, s, p, oh, ow;
};

// col [C*KH*KW, N*OH*OW]: element (row (ch, i, j), column (b, y, q)) is pixel
// (y*s - p + i, q*s - p + j) of channel ch of image b, 0 in the padding.
template <class T>
struct im2col_fn {
  const T* x;
  window g;
  index_t cols;
  T* col;
  GRADUS_HD void operator()(index_t e) const {
    const index_t r = e / cols, cidx = e - r * cols;
    const index_t ch = r / (g.kh * g.kw), i = (r / g.kw) % g.kh, j = r % g.kw;
    const index_t b = cidx / (g.oh * g.ow), y = (cidx / g.ow) % g.oh, q = cidx % g.ow;
    const index_t iy = y * g.s - g.p + i, ix = q * g.s - g.p + j;
    col[e] = (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) ? T(0) : x[((b * g.c + ch) * g.h + iy) * g.w + ix];
  }
};

// x [N,C,H,W]: each pixel sums the col entries im2col read it into, over (i, j) in order.
template <class T>
struct col2im_fn {
  const T* col;
  window g;
  index_t cols;
  T* x;
  GRADUS_HD void operator()(index_t e) const {
    const index_t ix = e % g.w, iy = (e / g.w) % g.h, ch = (e / (g.w * g.h)) % g.c, b = e / (g.w * g.h * g.c);
    T acc = T(0);
    for (index_t i = 0; i < g.kh; ++i) {
      const index_t ty = iy + g.p - i;  // = y * s
      if (ty < 0 || ty % g.s || ty / g.s >= g.oh) continue;
      const index_t y = ty / g.s;
      for (index_t j = 0; j < g.kw; ++j) {
        const index_t tx = ix + g.p - j;
        if (tx < 0 || tx % g.s || tx / g.s >= g.ow) continue;
        const index_t q = tx / g.s;
        acc += col[((ch * g.kh + i) * g.kw + j) * cols + (b * g.oh + y) * g.ow + q];
      }
    }
    x[e] = acc;
  }
};

template <class T>
GRADUS_HD T max_nan(T m, T e) {  // max that propagates a NaN from either side
  return (e > m || (e != e && m == m)) ? e : m;
}

// max skips the padding (PyTorch's -inf), avg counts it as zeros (count_include_pad)
template <class T>
struct pool_fn {
  bool is_max;
  const T* x;
  window g;
  T* y;
  GRADUS_HD void operator()(index_t e) const {
    const index_t b = e % g.ow, a = (e / g.ow) % g.oh, pl = e / (g.ow * g.oh);
    const T* in = x + pl * g.h * g.w;
    const index_t y0 = a * g.s - g.p > 0 ? a * g.s - g.p : 0, y1 = a * g.s - g.p + g.kh < g.h ? a * g.s - g.p + g.kh : g.h;
    const index_t x0 = b * g.s - g.p > 0 ? b * g.s - g.p : 0, x1 = b * g.s - g.p + g.kw < g.w ? b * g.s - g.p + g.kw : g.w;
    T acc = is_max ? -std::numeric_limits<T>::infinity() : T(0);
    if (is_max) {
      for (index_t u = y0; u < y1; ++u)
        for (index_t v = x0; v < x1; ++v) acc = max_nan(acc, in[u * g.w + v]);
      y[e] = acc;
    } else {
      for (index_t u = y0; u < y1; ++u)
        for (index_t v = x0; v < x1; ++v) acc += in[u * g.w + v];
      y[e] = acc * (T(1) / static_cast<T>(g.kh * g.kw));
    }
  }
};

// dx: each pixel sums, over the windows holding it in scan order, g of the window if the
// pixel is that window's first maximum (max; a NaN counts as the maximum) or g / (KH*KW).
template <class T>
struct pool_grad_fn {
  bool is_max;
  const T* x;
  const T* gr;
  window g;
  T* dx;
  GRADUS_HD void operator()(index_t e) const {
    const index_t v0 = e % g.w, u0 = (e / g.w) % g.h, pl = e / (g.w * g.h);
    const T* in = x + pl * g.h * g.w;
    const T* gp = gr + pl * g.oh * g.ow;
    const T inv = T(1) / static_cast<T>(g.kh * g.kw);
    T acc = T(0);
    for (index_t a = 0; a < g.oh; ++a) {
      const index_t ys = a * g.s - g.p;
      if (u0 < ys || u0 >= ys + g.kh) continue;
      for (index_t b = 0; b < g.ow; ++b) {
        const index_t xs = b * g.s - g.p;
        if (v0 < xs || v0 >= xs + g.kw) continue;
        if (!is_max) {
          acc += gp[a * g.ow + b] * inv;
          continue;
        }
        const index_t y0 = ys > 0 ? ys : 0, y1 = ys + g.kh < g.h ? ys + g.kh : g.h;
        const index_t x0 = xs > 0 ? xs : 0, x1 = xs + g.kw < g.w ? xs + g.kw : g.w;
        index_t best = y0 * g.w + x0;
        for (index_t u = y0; u < y1; ++u)
          for (index_t v = x0; v < x1; ++v) {
            const T c = in[u * g.w + v], m = in[best];
            if (c > m || (c != c && m == m)) best = u * g.w + v;
          }
        if (best == u0 * g.w + v0) acc += gp[a * g.ow + b];
      }
    }
    dx[e] = acc;
  }
};

}  // namespace cuda_kernels

namespace cuda_sections {

struct images_section : layout_section {
  template <class T>
  static void conv2d(const T* x, const T* wt, index_t n, index_t c, index_t h, index_t w, index_t o, index_t kh,
                     index_t kw, index_t s, index_t p, T* y) {
#if GRADUS_CUDA_GPU
    conv_call<T>(pass::forward, x, wt, y, n, c, h, w, o, kh, kw, s, p);
#else
    cpu_simd::conv2d(x, wt, n, c, h, w, o, kh, kw, s, p, y);
#endif
  }
  template <class T>
  static void conv2d_backward_data(const T* dy, const T* wt, index_t n, index_t c, index_t h, index_t w, index_t o,
                                   index_t kh, index_t kw, index_t s, index_t p, T* dx) {
#if GRADUS_CUDA_GPU
    conv_call<T>(pass::data, dy, wt, dx, n, c, h, w, o, kh, kw, s, p);
#else
    cpu_simd::conv2d_backward_data(dy, wt, n, c, h, w, o, kh, kw, s, p, dx);
#endif
  }
  template <class T>
  static void conv2d_backward_weights(const T* x, const T* dy, index_t n, index_t c, index_t h, index_t w, index_t o,
                                      index_t kh, index_t kw, index_t s, index_t p, T* dw) {
#if GRADUS_CUDA_GPU
    conv_call<T>(pass::weights, x, dy, dw, n, c, h, w, o, kh, kw, s, p);
#else
    cpu_simd::conv2d_backward_weights(x, dy, n, c, h, w, o, kh, kw, s, p, dw);
#endif
  }

  template <class T>
  static void im2col(const T* x, index_t n, index_t c, index_t h, index_t w, index_t kh, index_t kw, index_t s,
                     index_t p, T* col) {
    const auto g = geometry(c, h, w, kh, kw, s, p);
    const index_t cols = n * g.oh * g.ow;
    for_n(c * kh * kw * cols, cuda_kernels::im2col_fn<T>{x, g, cols, col});
  }
  template <class T>
  static void col2im(const T* col, index_t n, index_t c, index_t h, index_t w, index_t kh, index_t kw, index_t s,
                     index_t p, T* x) {
    const auto g = geometry(c, h, w, kh, kw, s, p);
    for_n(n * c * h * w, cuda_kernels::col2im_fn<T>{col, g, n * g.oh * g.ow, x});
  }
  template <class T>
  static void pool2d(bool is_max, const T* x, index_t planes, index_t h, index_t w, index_t kh, index_t kw, index_t s,
                     index_t p, T* y) {
    const auto g = geometry(1, h, w, kh, kw, s, p);
    for_n(planes * g.oh * g.ow, cuda_kernels::pool_fn<T>{is_max, x, g, y});
  }
  template <class T>
  static void pool2d_grad(bool is_max, const T* x, const T* g, index_t planes, index_t h, index_t w, index_t kh,
                          index_t kw, index_t s, index_t p, T* dx) {
    const auto geo = geometry(1, h, w, kh, kw, s, p);
    for_n(planes * h * w, cuda_kernels::pool_grad_fn<T>{is_max, x, g, geo, dx});
  }

 protected:
  static cuda_kernels::window geometry(index_t c, index_t h, index_t w, index_t kh, index_t kw, index_t s, index_t p) {
    return {c, h, w, kh, kw, s, p, (h + 2 * p - kh) / s + 1, (w + 2 * p - kw) / s + 1};
  }

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
  // The descriptors of one convolution shape.
  template <class T>
  struct conv_desc {
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    conv_desc(index_t n, index_t c, index_t h, index_t wd, index_t o, index_t kh, index_t kw, index_t s, index_t p) {
      constexpr cudnnDataType_t dt = std::is_same_v<T, float> ? CUDNN_DATA_FLOAT : CUDNN_DATA_DOUBLE;
      const auto i = [](index_t v) { return static_cast<int>(v); };
      check_dnn(cudnnCreateTensorDescriptor(&x), "cudnnCreateTensorDescriptor");
      check_dnn(cudnnCreateTensorDescriptor(&y), "cudnnCreateTensorDescriptor");
      check_dnn(cudnnCreateFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
      check_dnn(cudnnCreateConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
      check_dnn(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, dt, i(n), i(c), i(h), i(wd)), "cudnnSetTensor4dDescriptor");
      check_dnn(cudnnSetFilter4dDescriptor(w, dt, CUDNN_TENSOR_NCHW, i(o), i(c), i(kh), i(kw)), "cudnnSetFilter4dDescriptor");
      check_dnn(cudnnSetConvolution2dDescriptor(conv, i(p), i(p), i(s), i(s), 1, 1, CUDNN_CROSS_CORRELATION, dt),
                "cudnnSetConvolution2dDescriptor");
      if constexpr (std::is_same_v<T, float>)  // no TF32: float results
        check_dnn(cudnnSetConvolutionMathType(conv, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
      check_dnn(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, dt, i(n), i(o), i((h + 2 * p - kh) / s + 1),
                                           i((wd + 2 * p - kw) / s + 1)),
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
  // One convolution's descriptors and, per pass, the algorithm cuDNN's heuristics chose
  // and its workspace size: asked once per shape and thread (a training step asks the
  // same few shapes every time), not on every call.
  template <class T>
  struct conv_plan {
    conv_desc<T> d;
    int algo[3] = {-1, -1, -1};  // by pass; -1: not asked yet
    std::size_t workspace[3] = {0, 0, 0};
    conv_plan(index_t n, index_t c, index_t h, index_t w, index_t o, index_t kh, index_t kw, index_t s, index_t p)
        : d(n, c, h, w, o, kh, kw, s, p) {}
  };
  template <class T>
  static conv_plan<T>& plan_for(index_t n, index_t c, index_t h, index_t w, index_t o, index_t kh, index_t kw,
                                index_t s, index_t p) {
    thread_local std::map<std::array<index_t, 9>, std::unique_ptr<conv_plan<T>>> plans;
    auto& slot = plans[{n, c, h, w, o, kh, kw, s, p}];
    if (!slot) slot = std::make_unique<conv_plan<T>>(n, c, h, w, o, kh, kw, s, p);
    return *slot;
  }
  // The first of the heuristics' `got` answers (fastest first) that cuDNN can run here
  // (status success) in the descriptor's math (float: FMA, no TF32).
  template <class T, class Perf>
  static int usable_algorithm(const Perf* perf, int got, const char* what) {
    for (int i = 0; i < got; ++i)
      if (perf[i].status == CUDNN_STATUS_SUCCESS && (!std::is_same_v<T, float> || perf[i].mathType == CUDNN_FMA_MATH))
        return static_cast<int>(perf[i].algo);
    throw cuda_error(std::string("gradus: cuda: ") + what + ": none of cuDNN's " + std::to_string(got) +
                     " algorithms for this convolution can run (in FMA math)");
  }
  // forward: a = x, b = w, out = y; data: a = dy, b = w, out = dx; weights: a = x, b = dy, out = dw
  template <class T>
  static void conv_call(pass ps, const T* a, const T* b, T* out, index_t n, index_t c, index_t h, index_t w, index_t o,
                        index_t kh, index_t kw, index_t s, index_t p) {
    conv_plan<T>& pl = plan_for<T>(n, c, h, w, o, kh, kw, s, p);
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
