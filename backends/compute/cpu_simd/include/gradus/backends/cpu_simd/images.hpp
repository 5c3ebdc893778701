#pragma once
// cpu_simd: images. Convolutions (oneDNN for float where found, cpu_simd/dnnl.hpp; else
// im2col and GEMM), im2col / col2im, max and average pooling and their gradients.
#include "gradus/backends/cpu_simd/dnnl.hpp"
#include "gradus/backends/cpu_simd/layout.hpp"

namespace gradus::cpu_simd_sections {

struct images_section : layout_section {
  // ---- convolution (NCHW input and output, OIHW weights, dilation 1) --------------------
  // float: oneDNN where it was found (cpu_simd/dnnl.hpp). Otherwise im2col into columns
  // [C*KH*KW, N*OH*OW] and GEMMs: the forward is one batched GEMM whose items are the
  // images (W [O, C*KH*KW] times image n's columns, written straight into y's NCHW), the
  // data gradient the transposed GEMM and col2im, the weight gradient one GEMM over the
  // whole batch (dY permuted to [O, N*OH*OW], times the columns transposed; its long k is
  // cut by threads() in split_k). The columns live in a per-thread scratch buffer that
  // grows to the largest convolution the thread has run and is reused after.

  template <class T>
  static void conv2d(const T* x, const T* wt, const conv_geometry& g, T* y) {
    if constexpr (std::is_same_v<T, float>)
      if (cpu_dnnl::conv(cpu_dnnl::conv_pass::forward, g, x, wt, y)) return;
    const index_t hw = g.pixels(), ckk = g.patch();
    T* col = scratch<T>(0, ckk * g.n * hw);
    im2col(x, g, col);
    gemm(false, false, g.o, hw, ckk, T(1), wt, ckk, 0, col, g.n * hw, hw, T(0), y, hw, g.o * hw, g.n);
  }
  template <class T>
  static void conv2d_backward_data(const T* dy, const T* wt, const conv_geometry& g, T* dx) {
    if constexpr (std::is_same_v<T, float>)
      if (cpu_dnnl::conv(cpu_dnnl::conv_pass::data, g, dy, wt, dx)) return;
    const index_t hw = g.pixels(), ckk = g.patch();
    T* col = scratch<T>(0, ckk * g.n * hw);
    gemm(true, false, ckk, hw, g.o, T(1), wt, ckk, 0, dy, hw, g.o * hw, T(0), col, g.n * hw, hw, g.n);
    col2im(col, g, dx);
  }
  template <class T>
  static void conv2d_backward_weights(const T* x, const T* dy, const conv_geometry& g, T* dw) {
    if constexpr (std::is_same_v<T, float>)
      if (cpu_dnnl::conv(cpu_dnnl::conv_pass::weights, g, x, dy, dw)) return;
    const index_t hw = g.pixels(), ckk = g.patch();
    T* col = scratch<T>(0, ckk * g.n * hw);
    T* dyt = scratch<T>(1, g.o * g.n * hw);
    im2col(x, g, col);
    dims nohw;
    nohw.rank = 3, nohw.d[0] = g.n, nohw.d[1] = g.o, nohw.d[2] = hw;
    permute(dy, nohw, std::array<std::size_t, max_rank>{1, 0, 2}, dyt);
    gemm(false, true, g.o, ckk, g.n * hw, T(1), dyt, g.n * hw, 0, col, g.n * hw, 0, T(0), dw, ckk, 0, index_t(1));
  }

  /// ---- images (NCHW, dilation 1) ---------------------------------------------------------
  /// col [C*KH*KW, N*OH*OW]: row (c, i, j) holds pixel (oh*s - p + i, ow*s - p + j) of
  /// channel c for every (n, oh, ow); zeros where that falls in the padding. One thread
  /// per row block: each writes whole rows of col.
  template <class T>
  static void im2col(const T* x, const conv_geometry& g, T* col) {
    const index_t n = g.n, c = g.c, h = g.h, w = g.w, kh = g.window.kh, kw = g.window.kw, s = g.window.stride,
                  p = g.window.pad, oh = g.oh(), ow = g.ow();
    const index_t rows = c * kh * kw, cols = n * oh * ow;
    const bool par = rows * cols >= parallel_threshold && rows > 1;
    if (p == 0 && s == 1) {  // no padding, unit stride: every row piece is a plain copy
#pragma omp parallel for schedule(static) if (par)
      for (index_t r = 0; r < rows; ++r) {
        const index_t ch = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
        T* out = col + r * cols;
        for (index_t b = 0; b < n; ++b) {
          const T* src = x + (b * c + ch) * h * w + i * w + j;
          for (index_t y = 0; y < oh; ++y, out += ow, src += w)
            for (index_t q = 0; q < ow; ++q) out[q] = src[q];
        }
      }
      return;
    }
#pragma omp parallel for schedule(static) if (par)
    for (index_t r = 0; r < rows; ++r) {
      const index_t ch = r / (kh * kw), i = (r / kw) % kh, j = r % kw;
      // the output columns whose input column ow*s - p + j lies inside [0, w)
      const index_t ow0 = std::min(ow, p > j ? (p - j + s - 1) / s : 0);
      const index_t ow1 = std::max(ow0, std::min(ow, w + p - j > 0 ? (w + p - j + s - 1) / s : 0));
      T* out = col + r * cols;
      for (index_t b = 0; b < n; ++b) {
        const T* plane = x + (b * c + ch) * h * w;
        for (index_t y = 0; y < oh; ++y, out += ow) {
          const index_t iy = y * s - p + i;
          if (iy < 0 || iy >= h) {
            std::fill(out, out + ow, T(0));
            continue;
          }
          const T* src = plane + iy * w - p + j;
          std::fill(out, out + ow0, T(0));
          if (s == 1)  // rows are short (OW): a loop the compiler vectorises beats a memcpy call
            for (index_t q = ow0; q < ow1; ++q) out[q] = src[q];
          else
            for (index_t q = ow0; q < ow1; ++q) out[q] = src[q * s];
          std::fill(out + ow1, out + ow, T(0));
        }
      }
    }
  }
  /// x [N,C,H,W] = 0, then every entry of col added back at the pixel im2col read it from.
  /// One thread per (n, c) plane: planes are disjoint, the sum order within one is fixed.
  template <class T>
  static void col2im(const T* col, const conv_geometry& g, T* x) {
    const index_t n = g.n, c = g.c, h = g.h, w = g.w, kh = g.window.kh, kw = g.window.kw, s = g.window.stride,
                  p = g.window.pad, oh = g.oh(), ow = g.ow();
    const index_t cols = n * oh * ow;
    const bool par = n * c * h * w * kh * kw >= parallel_threshold && n * c > 1;
#pragma omp parallel for schedule(static) if (par)
    for (index_t pl = 0; pl < n * c; ++pl) {
      const index_t b = pl / c, ch = pl % c;
      T* plane = x + pl * h * w;
      std::fill(plane, plane + h * w, T(0));
      for (index_t i = 0; i < kh; ++i)
        for (index_t j = 0; j < kw; ++j) {
          const index_t ow0 = std::min(ow, p > j ? (p - j + s - 1) / s : 0);
          const index_t ow1 = std::max(ow0, std::min(ow, w + p - j > 0 ? (w + p - j + s - 1) / s : 0));
          const T* in = col + ((ch * kh + i) * kw + j) * cols + b * oh * ow;
          for (index_t y = 0; y < oh; ++y, in += ow) {
            const index_t iy = y * s - p + i;
            if (iy < 0 || iy >= h) continue;
            T* dst = plane + iy * w - p + j;
            for (index_t q = ow0; q < ow1; ++q) dst[q * s] += in[q];
          }
        }
    }
  }
  /// Pooling over the n * c independent [H, W] planes: max skips the padding (PyTorch's
  /// -inf), avg counts it as zeros and divides by KH*KW (count_include_pad).
  template <class T>
  static void pool2d(bool is_max, const T* x, const conv_geometry& g, T* y) {
    const index_t planes = g.planes(), h = g.h, w = g.w, kh = g.window.kh, kw = g.window.kw, s = g.window.stride,
                  p = g.window.pad, oh = g.oh(), ow = g.ow();
    const T inv = T(1) / static_cast<T>(kh * kw);
    const bool par = planes * h * w >= parallel_threshold && planes > 1;
    if (kh == 2 && kw == 2 && s == 2 && p == 0) {  // LeNet's and VGG's pooling: no bounds, no padding
#pragma omp parallel for schedule(static) if (par)
      for (index_t pl = 0; pl < planes; ++pl)
        for (index_t a = 0; a < oh; ++a) {
          const T* r0 = x + pl * h * w + 2 * a * w;
          const T* r1 = r0 + w;
          T* out = y + (pl * oh + a) * ow;
          if (is_max)
            for (index_t b = 0; b < ow; ++b)
              out[b] = max_nan(max_nan(r0[2 * b], r0[2 * b + 1]), max_nan(r1[2 * b], r1[2 * b + 1]));
          else
            for (index_t b = 0; b < ow; ++b) out[b] = ((r0[2 * b] + r0[2 * b + 1]) + (r1[2 * b] + r1[2 * b + 1])) * inv;
        }
      return;
    }
#pragma omp parallel for schedule(static) if (par)
    for (index_t pl = 0; pl < planes; ++pl) {
      const T* in = x + pl * h * w;
      T* out = y + pl * oh * ow;
      for (index_t a = 0; a < oh; ++a)
        for (index_t b = 0; b < ow; ++b) {
          const index_t y0 = std::max<index_t>(a * s - p, 0), y1 = std::min(a * s - p + kh, h);
          const index_t x0 = std::max<index_t>(b * s - p, 0), x1 = std::min(b * s - p + kw, w);
          T acc = is_max ? -std::numeric_limits<T>::infinity() : T(0);
          for (index_t u = y0; u < y1; ++u)
            for (index_t v = x0; v < x1; ++v) {
              const T e = in[u * w + v];
              if (!is_max) acc += e;
              else acc = max_nan(acc, e);
            }
          out[a * ow + b] = is_max ? acc : acc * inv;
        }
    }
  }
  /// dx = 0; max: each g goes to the first maximum of its window (scan order; a NaN wins,
  /// as it does in the forward max); avg: g / (KH*KW) to every pixel of its window.
  template <class T>
  static void pool2d_grad(bool is_max, const T* x, const T* g, const conv_geometry& geo, T* dx) {
    const index_t planes = geo.planes(), h = geo.h, w = geo.w, kh = geo.window.kh, kw = geo.window.kw,
                  s = geo.window.stride, p = geo.window.pad, oh = geo.oh(), ow = geo.ow();
    const T inv = T(1) / static_cast<T>(kh * kw);
    const bool par = planes * h * w >= parallel_threshold && planes > 1;
    if (kh == 2 && kw == 2 && s == 2 && p == 0) {  // windows tile the plane: write each pixel once
#pragma omp parallel for schedule(static) if (par)
      for (index_t pl = 0; pl < planes; ++pl) {
        T* out = dx + pl * h * w;
        if (h % 2) std::fill(out + (h - 1) * w, out + h * w, T(0));
        for (index_t a = 0; a < oh; ++a) {
          const T* r0 = x + pl * h * w + 2 * a * w;
          const T* r1 = r0 + w;
          T* d0 = out + 2 * a * w;
          T* d1 = d0 + w;
          const T* gp = g + (pl * oh + a) * ow;
          if (w % 2) d0[w - 1] = d1[w - 1] = T(0);
          for (index_t b = 0; b < ow; ++b) {
            const T gv = is_max ? gp[b] : gp[b] * inv;
            if (!is_max) {
              d0[2 * b] = d0[2 * b + 1] = d1[2 * b] = d1[2 * b + 1] = gv;
              continue;
            }
            // the first maximum in scan order (a NaN counts as the maximum), as the general path
            const T v0 = r0[2 * b], v1 = r0[2 * b + 1], v2 = r1[2 * b], v3 = r1[2 * b + 1];
            int k = 0;
            T m = v0;
            if (v1 > m || (v1 != v1 && m == m)) k = 1, m = v1;
            if (v2 > m || (v2 != v2 && m == m)) k = 2, m = v2;
            if (v3 > m || (v3 != v3 && m == m)) k = 3;
            d0[2 * b] = k == 0 ? gv : T(0);
            d0[2 * b + 1] = k == 1 ? gv : T(0);
            d1[2 * b] = k == 2 ? gv : T(0);
            d1[2 * b + 1] = k == 3 ? gv : T(0);
          }
        }
      }
      return;
    }
#pragma omp parallel for schedule(static) if (par)
    for (index_t pl = 0; pl < planes; ++pl) {
      const T* in = x + pl * h * w;
      const T* gp = g + pl * oh * ow;
      T* out = dx + pl * h * w;
      std::fill(out, out + h * w, T(0));
      for (index_t a = 0; a < oh; ++a)
        for (index_t b = 0; b < ow; ++b) {
          const index_t y0 = std::max<index_t>(a * s - p, 0), y1 = std::min(a * s - p + kh, h);
          const index_t x0 = std::max<index_t>(b * s - p, 0), x1 = std::min(b * s - p + kw, w);
          const T gv = gp[a * ow + b];
          if (is_max) {
            index_t best = y0 * w + x0;
            for (index_t u = y0; u < y1; ++u)
              for (index_t v = x0; v < x1; ++v)
                if (in[u * w + v] > in[best] || (std::isnan(in[u * w + v]) && !std::isnan(in[best]))) best = u * w + v;
            out[best] += gv;
          } else {
            for (index_t u = y0; u < y1; ++u)
              for (index_t v = x0; v < x1; ++v) out[u * w + v] += gv * inv;
          }
        }
    }
  }

 protected:
  /// The calling thread's scratch buffer `which` (0 or 1), at least `count` elements: grown
  /// (never shrunk) to the largest request, freed when the thread ends.
  struct scratch_buffer {
    void* data = nullptr;
    std::size_t bytes = 0;
    scratch_buffer() = default;
    scratch_buffer(const scratch_buffer&) = delete;
    scratch_buffer& operator=(const scratch_buffer&) = delete;
    ~scratch_buffer() { deallocate(data); }
  };
  template <class T>
  static T* scratch(int which, index_t count) {
    thread_local scratch_buffer buf[2];
    scratch_buffer& b = buf[which];
    const std::size_t want = static_cast<std::size_t>(count) * sizeof(T);
    if (want > b.bytes) {
      void* p = allocate(want);
      deallocate(b.data);
      b.data = p, b.bytes = want;
    }
    return static_cast<T*>(b.data);
  }
  /// max that propagates a NaN from either side (std::max keeps its first argument)
  template <class T>
  static T max_nan(T m, T e) {
    return (e > m || (e != e && m == m)) ? e : m;
  }
};

}  // namespace gradus::cpu_simd_sections
