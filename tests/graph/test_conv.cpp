// conv2d, max_pool2d, avg_pool2d and flatten against direct loops over the definitions
// (no im2col in the reference), with stride and padding, float and double; conv2d's data
// and weight gradients in float, through oneDNN (where built with it) and through
// im2col + GEMM, against double loops, with bits that depend on threads() and not on the
// team; bad shapes are shape_errors naming the op and the shapes.
#define BOOST_TEST_MODULE graph_conv
#include "../support/check.hpp"

#include <bit>
#include <cstring>
#include <limits>

namespace g = gradus;
using namespace gradus_test;

namespace {

// y[n,o,a,b] = sum_{c,i,j} x[n,c,a*s-p+i, b*s-p+j] * w[o,c,i,j], zero outside the image.
template <class T>
std::vector<double> conv_ref(const std::vector<T>& x, const std::vector<T>& w, int n, int c, int h, int wd, int o,
                             int k, int s, int p) {
  const int oh = (h + 2 * p - k) / s + 1, ow = (wd + 2 * p - k) / s + 1;
  std::vector<double> y(static_cast<std::size_t>(n * o * oh * ow), 0.0);
  for (int b = 0; b < n; ++b)
    for (int q = 0; q < o; ++q)
      for (int a = 0; a < oh; ++a)
        for (int e = 0; e < ow; ++e) {
          double acc = 0;
          for (int ch = 0; ch < c; ++ch)
            for (int i = 0; i < k; ++i)
              for (int j = 0; j < k; ++j) {
                const int yy = a * s - p + i, xx = e * s - p + j;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                acc += static_cast<double>(x[static_cast<std::size_t>(((b * c + ch) * h + yy) * wd + xx)]) *
                       static_cast<double>(w[static_cast<std::size_t>(((q * c + ch) * k + i) * k + j)]);
              }
          y[static_cast<std::size_t>(((b * o + q) * oh + a) * ow + e)] = acc;
        }
  return y;
}

// The adjoints of y = conv(x, w) for an output adjoint u [n,o,oh,ow], by the definition:
// dx[n,c,yy,xx] = sum of u[n,o,a,e] w[o,c,i,j] over a*s-p+i = yy, e*s-p+j = xx, and
// dw[o,c,i,j] = sum over n, a, e of u[n,o,a,e] x[n,c,a*s-p+i,e*s-p+j].
template <class T>
void conv_adjoint_ref(const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>& u, int n, int c, int h,
                      int wd, int o, int k, int s, int p, std::vector<double>& dx, std::vector<double>& dw) {
  const int oh = (h + 2 * p - k) / s + 1, ow = (wd + 2 * p - k) / s + 1;
  dx.assign(x.size(), 0.0);
  dw.assign(w.size(), 0.0);
  for (int b = 0; b < n; ++b)
    for (int q = 0; q < o; ++q)
      for (int a = 0; a < oh; ++a)
        for (int e = 0; e < ow; ++e) {
          const double g = static_cast<double>(u[static_cast<std::size_t>(((b * o + q) * oh + a) * ow + e)]);
          for (int ch = 0; ch < c; ++ch)
            for (int i = 0; i < k; ++i)
              for (int j = 0; j < k; ++j) {
                const int yy = a * s - p + i, xx = e * s - p + j;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                const auto xi = static_cast<std::size_t>(((b * c + ch) * h + yy) * wd + xx);
                const auto wi = static_cast<std::size_t>(((q * c + ch) * k + i) * k + j);
                dx[xi] += g * static_cast<double>(w[wi]);
                dw[wi] += g * static_cast<double>(x[xi]);
              }
        }
}

// max over the window's pixels inside the image; avg: their sum / k^2.
template <class T>
std::vector<double> pool_ref(bool is_max, const std::vector<T>& x, int planes, int h, int w, int k, int s, int p) {
  const int oh = (h + 2 * p - k) / s + 1, ow = (w + 2 * p - k) / s + 1;
  std::vector<double> y;
  for (int pl = 0; pl < planes; ++pl)
    for (int a = 0; a < oh; ++a)
      for (int b = 0; b < ow; ++b) {
        double acc = is_max ? -std::numeric_limits<double>::infinity() : 0.0;
        for (int i = 0; i < k; ++i)
          for (int j = 0; j < k; ++j) {
            const int yy = a * s - p + i, xx = b * s - p + j;
            if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
            const double v = static_cast<double>(x[static_cast<std::size_t>((pl * h + yy) * w + xx)]);
            acc = is_max ? std::max(acc, v) : acc + v;
          }
        y.push_back(is_max ? acc : acc / (k * k));
      }
  return y;
}

}  // namespace

BOOST_AUTO_TEST_CASE_TEMPLATE(conv2d_against_direct_loops, T, real_types) {
  g::session<g::cpu_simd> s;
  // 3 -> 4 channels, 3x3 kernel, 9x7 images; stride/padding combinations in one graph each
  g::placeholder<"x", T, g::dyn, 3, 9, 7> x;
  g::placeholder<"w", T, 4, 3, 3, 3> w;
  const auto y11 = g::conv2d<1, 0>(x, w);
  const auto y12 = g::conv2d<1, 2>(x, w);  // padding 2 with a 3x3 kernel: columns of zeros
  const auto y21 = g::conv2d<2, 1>(x, w);
  const auto y32 = g::conv2d<3, 2>(x, w);
  static_assert(std::is_same_v<g::shape_t<decltype(y11)>, g::shape<g::dyn, 4, 7, 5>>);
  static_assert(std::is_same_v<g::shape_t<decltype(y21)>, g::shape<g::dyn, 4, 5, 4>>);
  for (int n : {1, 2, 5}) {
    const auto xs = uniform<T>(static_cast<std::size_t>(n * 3 * 9 * 7), -1, 1);
    const auto ws = uniform<T>(4 * 3 * 3 * 3, -1, 1);
    const auto fx = (x = g::view(xs.data(), {n, 3, 9, 7}));
    const auto fw = (w = g::view(ws.data(), {4, 3, 3, 3}));
    const auto [r11, r12, r21, r32] = s.run(y11, y12, y21, y32, fx, fw);
    const double tol = 30 * rtol<T>();
    BOOST_TEST(same_shape(r11, {n, 4, 7, 5}));
    BOOST_TEST(close(r11, conv_ref(xs, ws, n, 3, 9, 7, 4, 3, 1, 0), tol, {}, tol));
    BOOST_TEST(same_shape(r12, {n, 4, 11, 9}));
    BOOST_TEST(close(r12, conv_ref(xs, ws, n, 3, 9, 7, 4, 3, 1, 2), tol, {}, tol));
    BOOST_TEST(same_shape(r21, {n, 4, 5, 4}));
    BOOST_TEST(close(r21, conv_ref(xs, ws, n, 3, 9, 7, 4, 3, 2, 1), tol, {}, tol));
    BOOST_TEST(same_shape(r32, {n, 4, 4, 3}));
    BOOST_TEST(close(r32, conv_ref(xs, ws, n, 3, 9, 7, 4, 3, 3, 2), tol, {}, tol));
  }
}

// conv2d's three passes in float, for shapes of LeNet (conv1: one input channel, whose data
// gradient oneDNN leaves to im2col; conv2), a strided, padded one and an odd batch (slices
// of unequal size): through oneDNN (where built with it) and through im2col + GEMM
// (GRADUS_DNNL's switch), each against double loops, and each giving the same bits on a
// team of 1 as on a team of 2 (threads() 2 in both).
BOOST_AUTO_TEST_CASE(conv2d_passes_float_both_paths_every_team) {
  struct conv_case {
    int n, c, h, w, o, k, s, p;
  };
  const conv_case cases[] = {{64, 1, 28, 28, 6, 5, 1, 0}, {64, 6, 12, 12, 16, 5, 1, 0}, {7, 3, 9, 7, 4, 3, 2, 1},
                             {5, 4, 6, 6, 3, 3, 1, 1}};
  g::cpu_simd::set_threads(2);
  for (const bool dnnl : {true, false}) {
    g::cpu_dnnl::set_enabled(dnnl);
    for (const conv_case& cc : cases) {
      const int oh = (cc.h + 2 * cc.p - cc.k) / cc.s + 1, ow = (cc.w + 2 * cc.p - cc.k) / cc.s + 1;
      const auto xs = uniform<float>(static_cast<std::size_t>(cc.n * cc.c * cc.h * cc.w), -1, 1);
      const auto ws = uniform<float>(static_cast<std::size_t>(cc.o * cc.c * cc.k * cc.k), -0.5, 0.5);
      const auto us = uniform<float>(static_cast<std::size_t>(cc.n * cc.o * oh * ow), -1, 1);
      std::vector<double> y_ref = conv_ref(xs, ws, cc.n, cc.c, cc.h, cc.w, cc.o, cc.k, cc.s, cc.p), dx_ref, dw_ref;
      conv_adjoint_ref(xs, ws, us, cc.n, cc.c, cc.h, cc.w, cc.o, cc.k, cc.s, cc.p, dx_ref, dw_ref);
      std::vector<float> out[2][3];  // [team - 1][y, dx, dw]
      for (int team = 1; team <= 2; ++team) {
        g::cpu_simd::pin_team(team);
        g::cpu_simd::before_run();  // hands the team to OpenMP, as session::run does
        auto& [y, dx, dw] = out[team - 1];
        y.resize(y_ref.size()), dx.resize(xs.size()), dw.resize(ws.size());
        const g::conv_geometry geo{cc.n, cc.c, cc.h, cc.w, cc.o, {cc.k, cc.k, cc.s, cc.p}};
        g::cpu_simd::conv2d(xs.data(), ws.data(), geo, y.data());
        g::cpu_simd::conv2d_backward_data(us.data(), ws.data(), geo, dx.data());
        g::cpu_simd::conv2d_backward_weights(xs.data(), us.data(), geo, dw.data());
        BOOST_TEST(omp_get_max_threads() == team);  // oneDNN's calls left OpenMP's count as it was
      }
      const std::string what = std::string(dnnl ? "oneDNN" : "im2col") + " n" + std::to_string(cc.n) + " c" +
                               std::to_string(cc.c) + " " + std::to_string(cc.h) + "x" + std::to_string(cc.w) + " o" +
                               std::to_string(cc.o) + " k" + std::to_string(cc.k) + " s" + std::to_string(cc.s) +
                               " p" + std::to_string(cc.p);
      const std::vector<double>* refs[3] = {&y_ref, &dx_ref, &dw_ref};
      const char* pass[3] = {"forward", "data gradient", "weight gradient"};
      for (int i = 0; i < 3; ++i) {
        const auto& a = out[0][i];
        const auto& b = out[1][i];
        BOOST_TEST(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0,
                   what << " " << pass[i] << ": bits differ between a team of 1 and of 2");
        // the weight gradient sums over the batch: its terms' count sets the tolerance
        const double atol = i == 2 ? 2e-5 * std::sqrt(double(cc.n * oh * ow)) : 2e-5 * cc.c * cc.k;
        BOOST_TEST(close(g::view(b.data(), {static_cast<g::index_t>(b.size())}), *refs[i], 1e-5,
                         {}, atol),
                   what << " " << pass[i]);
      }
    }
  }
  g::cpu_dnnl::set_enabled(true);
  g::cpu_simd::pin_team(0);
}

// Through a session: the conv node and its two gradient kernels (not im2col, matmul and
// permutes), and the gradients of a float loss against double loops on both paths.
BOOST_AUTO_TEST_CASE(conv2d_gradients_through_the_graph) {
  g::variable<"x", float, 6, 6, 12, 12> x;
  g::variable<"w", float, 16, 6, 5, 5> w;
  g::variable<"u", float, 6, 16, 8, 8> u;
  const auto xs = uniform<float>(6 * 6 * 12 * 12, -1, 1), ws = uniform<float>(16 * 6 * 25, -0.5, 0.5),
             us = uniform<float>(6 * 16 * 64, -1, 1);
  std::vector<double> dx_ref, dw_ref;
  conv_adjoint_ref(xs, ws, us, 6, 6, 12, 12, 16, 5, 1, 0, dx_ref, dw_ref);
  for (const bool dnnl : {true, false}) {
    g::cpu_dnnl::set_enabled(dnnl);
    g::session<g::cpu_simd> s;
    g::assign(s, x, g::view(xs.data(), {6, 6, 12, 12}));
    g::assign(s, w, g::view(ws.data(), {16, 6, 5, 5}));
    g::assign(s, u, g::view(us.data(), {6, 16, 8, 8}));
    const auto loss = g::sum(g::conv2d(x, w) * u);
    const auto [gx, gw] = g::grad(loss, x, w);
    const auto [l, rx, rw] = s.run(loss, gx, gw);
    BOOST_TEST(close(rx, dx_ref, 1e-5, {}, 2e-5 * 16 * 25), (dnnl ? "oneDNN" : "im2col") << " dx");
    BOOST_TEST(close(rw, dw_ref, 1e-5, {}, 2e-5 * 48), (dnnl ? "oneDNN" : "im2col") << " dw");
    const auto& st = s.stats();
    BOOST_TEST(st.count("conv2d") == 1u);
    BOOST_TEST(st.count("conv2d_data_grad") == 1u);
    BOOST_TEST(st.count("conv2d_weight_grad") == 1u);
    BOOST_TEST(st.count("im2col") + st.count("matmul") + st.count("permute") == 0u);
  }
  g::cpu_dnnl::set_enabled(true);
}

// The backend interface (exec/backend.hpp) is checked by section: cpu_simd has every one;
// a type with memory functions only is a backend_memory and no backend.
struct memory_only {
  static constexpr const char* name = "memory_only";
  static constexpr std::size_t alignment = 64;
  static void* allocate(std::size_t);
  static void deallocate(void*);
  static void copy_to_device(void*, const void*, std::size_t);
  static void copy_to_host(void*, const void*, std::size_t);
  static void copy(void*, const void*, std::size_t);
};
static_assert(g::backend<g::cpu_simd> && g::backend_images<g::cpu_simd, float>);
static_assert(g::backend_memory<memory_only> && !g::backend_images<memory_only, float> && !g::backend<memory_only>);
// The sections' helpers are protected (backends/compute/cpu_simd/*.hpp): the GEMM cut, the k slices,
// the scratch buffers and the streaming stores are not part of the interface.
template <class B>
concept exposes_gemm_cut = requires { B::gemm_plan(1, 1, 1, 1, 1); };
template <class B>
concept exposes_split_k = requires { B::split_k_min_slice; };
template <class B>
concept exposes_scratch = requires { B::template scratch<float>(0, 1); };
struct open_gemm : g::cpu_simd_sections::gemm_section {
  using gemm_section::gemm_plan;  // the probe itself: it sees a member made public
};
static_assert(exposes_gemm_cut<open_gemm> && !exposes_gemm_cut<g::cpu_simd>);
static_assert(!exposes_split_k<g::cpu_simd> && !exposes_scratch<g::cpu_simd> && g::cpu_simd::parallel_threshold > 0);

// LeNet's first layer at MNIST size with a batch large enough for the threaded paths.
BOOST_AUTO_TEST_CASE(conv2d_lenet_size_threaded) {
  g::session<g::cpu_simd> s;
  g::placeholder<"x", float, g::dyn, 1, 28, 28> x;
  g::placeholder<"w", float, 6, 1, 5, 5> w;
  const int n = 64;
  const auto xs = uniform<float>(static_cast<std::size_t>(n * 28 * 28), 0, 1);
  const auto ws = uniform<float>(150, -0.5, 0.5);
  const auto r = s.run(g::conv2d(x, w), x = g::view(xs.data(), {n, 1, 28, 28}), w = g::view(ws.data(), {6, 1, 5, 5}));
  BOOST_TEST(same_shape(r, {n, 6, 24, 24}));
  BOOST_TEST(close(r, conv_ref(xs, ws, n, 1, 28, 28, 6, 5, 1, 0), 1e-4, {}, 1e-5));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(pooling_against_direct_loops, T, real_types) {
  g::session<g::cpu_simd> s;
  g::placeholder<"x", T, g::dyn, 3, 9, 8> x;
  const auto m2 = g::max_pool2d<2>(x);
  const auto m31 = g::max_pool2d<3, 2, 1>(x);  // padded windows: the padding never wins
  const auto a2 = g::avg_pool2d<2>(x);
  const auto a31 = g::avg_pool2d<3, 2, 1>(x);  // padding counts as zeros (count_include_pad)
  static_assert(std::is_same_v<g::shape_t<decltype(m2)>, g::shape<g::dyn, 3, 4, 4>>);
  for (int n : {1, 4, 70}) {
    // all negative: a padded zero would win a max if padding were read
    const auto xs = uniform<T>(static_cast<std::size_t>(n * 3 * 9 * 8), -2, -0.5);
    const auto [rm2, rm31, ra2, ra31] = s.run(m2, m31, a2, a31, x = g::view(xs.data(), {n, 3, 9, 8}));
    BOOST_TEST(same_shape(rm2, {n, 3, 4, 4}));
    BOOST_TEST(close(rm2, pool_ref(true, xs, n * 3, 9, 8, 2, 2, 0), 0.0));
    BOOST_TEST(same_shape(rm31, {n, 3, 5, 4}));
    BOOST_TEST(close(rm31, pool_ref(true, xs, n * 3, 9, 8, 3, 2, 1), 0.0));
    BOOST_TEST(close(ra2, pool_ref(false, xs, n * 3, 9, 8, 2, 2, 0), 10 * rtol<T>()));
    BOOST_TEST(same_shape(ra31, {n, 3, 5, 4}));
    BOOST_TEST(close(ra31, pool_ref(false, xs, n * 3, 9, 8, 3, 2, 1), 10 * rtol<T>()));
  }
}

BOOST_AUTO_TEST_CASE(max_pool_propagates_nan) {
  g::session<g::cpu_simd> s;
  g::placeholder<"x", double, 1, 1, 2, 4> x;
  const std::vector<double> xs{1, std::nan(""), 5, 2, 3, 4, 0, 1};
  const auto r = s.run(g::max_pool2d<2>(x), x = g::view(xs.data(), {1, 1, 2, 4}));
  BOOST_TEST(std::isnan(r[0]));
  BOOST_TEST(r[1] == 5.0);
}

BOOST_AUTO_TEST_CASE(flatten_is_a_view) {
  g::session<g::cpu_simd> s;
  g::placeholder<"x", float, g::dyn, 2, 3, 4> x;
  const auto f = g::flatten(x);
  static_assert(std::is_same_v<g::shape_t<decltype(f)>, g::shape<g::dyn, 24>>);
  const auto xs = uniform<float>(48, -1, 1);
  const auto r = s.run(f, x = g::view(xs.data(), {2, 2, 3, 4}));
  BOOST_TEST(same_shape(r, {2, 24}));
  BOOST_TEST(r.data() == xs.data());  // no copy: the feed's own memory
  BOOST_TEST(s.stats().kernels == 0u);
}

BOOST_AUTO_TEST_CASE(bad_shapes_name_the_op) {
  g::session<g::cpu_simd> s;
  g::placeholder<"x", float, g::dyn, g::dyn, g::dyn, g::dyn> x;
  const std::vector<float> xs(2 * 3 * 2 * 2, 1.0f);
  // a 3x3 pooling window over 2x2 images
  BOOST_CHECK_EXCEPTION(s.run(g::max_pool2d<3>(x), x = g::view(xs.data(), {2, 3, 2, 2})), g::shape_error,
                        [](const g::shape_error& e) {
                          const std::string m = e.what();
                          BOOST_TEST_MESSAGE(m);
                          return m.find("max_pool2d") != std::string::npos && m.find("(2, 3, 2, 2)") != std::string::npos &&
                                 m.find("3x3 window") != std::string::npos;
                        });
}
