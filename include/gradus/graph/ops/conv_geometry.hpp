#pragma once
// The geometry of the windowed ops over NCHW images (conv2d and its two adjoints, im2col /
// col2im, max and average pooling and their gradients; dilation 1), in two parts:
//
//   window2d       kernel extents, stride and zero padding (the same along H and W): what
//                  the op's type carries (its template argument), known at compile time;
//   conv_geometry  one call's whole geometry at run time: the input [N, C, H, W], the
//                  output channels O (conv2d: the filters), and the window. It is the one
//                  argument every backend entry point of the images section takes
//                  (exec/backend.hpp), and what cpu_simd's oneDNN plans and the cuda
//                  backend's kernels and cuDNN descriptors are keyed on and read.
//
// The output extents are computed here and nowhere else: OH = (H + 2 pad - KH) / stride + 1
// (floor division, as PyTorch, oneDNN and cuDNN), likewise OW.
#include <compare>

#include "gradus/core/shape.hpp"

namespace gradus {

/// A 2-D window: kernel extents, stride and zero padding (the same along H and W).
struct window2d {
  /// The kernel's height.
  index_t kh, kw, stride, pad;
  /// \var kw
  /// The kernel's width.

  /// \var stride
  /// The step between windows, along H and W.

  /// \var pad
  /// The zero rows and columns added on each side, along H and W.

  /// the output extent over an input extent `in` (dyn stays dyn) for a kernel extent k
  constexpr index_t out(index_t in, index_t k) const {
    return in == dyn ? dyn : (in + 2 * pad - k) / stride + 1;
  }
  /// The output height over an input height h: (h + 2 pad - kh) / stride + 1 (dyn stays dyn).
  constexpr index_t oh(index_t h) const { return out(h, kh); }
  /// The output width over an input width w, likewise.
  constexpr index_t ow(index_t w) const { return out(w, kw); }
  /// Member-wise.
  constexpr bool operator==(const window2d&) const = default;
  /// Member-wise, in the order kh, kw, stride, pad.
  constexpr auto operator<=>(const window2d&) const = default;
};

/// One call of a windowed op: input x [n, c, h, w], o output channels (conv2d's filters: the
/// weights are [o, c, kh, kw]; 0 for the ops without filters), the window. Pooling treats
/// its n * c planes alike. Ordered (<=>), so that a backend can key its plans on it.
struct conv_geometry {
  /// The number of images.
  index_t n = 0, c = 0, h = 0, w = 0;
  /// \var c
  /// The input's channels.

  /// \var h
  /// The input's height.

  /// \var w
  /// The input's width.

  index_t o = 0;                 ///< output channels: conv2d's filters; 0 for the ops without filters
  window2d window{0, 0, 1, 0};   ///< the window
  /// The output height.
  constexpr index_t oh() const { return window.oh(h); }
  /// The output width.
  constexpr index_t ow() const { return window.ow(w); }
  constexpr index_t planes() const { return n * c; }          ///< the input's [h, w] planes
  constexpr index_t pixels() const { return oh() * ow(); }     ///< one output plane's pixels
  constexpr index_t patch() const { return c * window.kh * window.kw; }  ///< one filter's, one im2col column's entries
  /// Member-wise.
  constexpr bool operator==(const conv_geometry&) const = default;
  /// Member-wise, in declaration order: a key for a backend's plans.
  constexpr auto operator<=>(const conv_geometry&) const = default;
};

/// The geometry of `win` over an input of dims x [N, C, H, W], with o output channels.
constexpr conv_geometry geometry_of(const dims& x, const window2d& win, index_t o = 0) {
  return {x.d[0], x.d[1], x.d[2], x.d[3], o, win};
}

}  // namespace gradus
