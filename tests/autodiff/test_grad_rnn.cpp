#define BOOST_TEST_MODULE autodiff_grad_rnn
// The fused recurrent layers: forward values of lstm and gru against the recurrence
// written out with plain loops here (PyTorch's equations), for T = 1 and 3; gradients
// w.r.t. every operand against central differences in double; one BPTT kernel however
// many gradients are asked for; shape errors; select / last_step and their adjoint.
#include "../support/check.hpp"
#include "../support/finite_difference.hpp"

#include <array>
#include <cmath>
#include <string>
#include <vector>

using namespace gradus_test;

namespace {

constexpr g::index_t B = 3, I = 4, H = 5;

// ---- reference: the recurrence with plain loops -----------------------------------------
double sig(double v) { return 1 / (1 + std::exp(-v)); }

// a [rows, k] @ w [k, cols] (+ bias) for one step
std::vector<double> affine(const double* a, const std::vector<double>& w, g::index_t rows, g::index_t k,
                           g::index_t cols) {
  std::vector<double> r(static_cast<std::size_t>(rows * cols), 0.0);
  for (g::index_t i = 0; i < rows; ++i)
    for (g::index_t j = 0; j < cols; ++j)
      for (g::index_t q = 0; q < k; ++q)
        r[static_cast<std::size_t>(i * cols + j)] += a[i * k + q] * w[static_cast<std::size_t>(q * cols + j)];
  return r;
}

std::vector<double> lstm_reference(const std::vector<double>& x, const std::vector<double>& wx,
                                   const std::vector<double>& wh, const std::vector<double>& b, g::index_t T) {
  std::vector<double> hs(static_cast<std::size_t>(T * B * H)), h(static_cast<std::size_t>(B * H), 0.0), c(h);
  for (g::index_t t = 0; t < T; ++t) {
    const auto ax = affine(x.data() + t * B * I, wx, B, I, 4 * H), ah = affine(h.data(), wh, B, H, 4 * H);
    for (g::index_t r = 0; r < B; ++r)
      for (g::index_t j = 0; j < H; ++j) {
        auto pre = [&](g::index_t k) {
          const auto at = static_cast<std::size_t>(r * 4 * H + k * H + j);
          return ax[at] + ah[at] + b[static_cast<std::size_t>(k * H + j)];
        };
        const double ig = sig(pre(0)), fg = sig(pre(1)), gg = std::tanh(pre(2)), og = sig(pre(3));
        const auto at = static_cast<std::size_t>(r * H + j);
        c[at] = fg * c[at] + ig * gg;
        h[at] = og * std::tanh(c[at]);
      }
    std::copy(h.begin(), h.end(), hs.begin() + t * B * H);
  }
  return hs;
}

std::vector<double> gru_reference(const std::vector<double>& x, const std::vector<double>& wx,
                                  const std::vector<double>& wh, const std::vector<double>& bx,
                                  const std::vector<double>& bh, g::index_t T) {
  std::vector<double> hs(static_cast<std::size_t>(T * B * H)), h(static_cast<std::size_t>(B * H), 0.0);
  for (g::index_t t = 0; t < T; ++t) {
    const auto ax = affine(x.data() + t * B * I, wx, B, I, 3 * H), ah = affine(h.data(), wh, B, H, 3 * H);
    std::vector<double> next(h.size());
    for (g::index_t r = 0; r < B; ++r)
      for (g::index_t j = 0; j < H; ++j) {
        auto xp = [&](g::index_t k) {
          return ax[static_cast<std::size_t>(r * 3 * H + k * H + j)] + bx[static_cast<std::size_t>(k * H + j)];
        };
        auto hp = [&](g::index_t k) {
          return ah[static_cast<std::size_t>(r * 3 * H + k * H + j)] + bh[static_cast<std::size_t>(k * H + j)];
        };
        const double rg = sig(xp(0) + hp(0)), zg = sig(xp(1) + hp(1)), ng = std::tanh(xp(2) + rg * hp(2));
        const auto at = static_cast<std::size_t>(r * H + j);
        next[at] = (1 - zg) * ng + zg * h[at];
      }
    h.swap(next);  // (h = next: a false -Warray-bounds of g++ 12 at -O3)
    std::copy(h.begin(), h.end(), hs.begin() + t * B * H);
  }
  return hs;
}

double max_abs_diff(const g::tensor_view<const double>& got, const std::vector<double>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got[static_cast<g::index_t>(i)] - want[i]));
  return worst;
}

// ---- variables, one set per sequence length --------------------------------------------
template <g::index_t T>
struct lstm_vars {
  g::variable<"x", double, T, B, I> x;
  g::variable<"wx", double, I, 4 * H> wx;
  g::variable<"wh", double, H, 4 * H> wh;
  g::variable<"b", double, 4 * H> b;
  g::variable<"wo", double, T, B, H> wo;  // weights of the loss: every step contributes
  g::variable<"wl", double, B, H> wl;
};
template <g::index_t T>
struct gru_vars {
  g::variable<"x", double, T, B, I> x;
  g::variable<"wx", double, I, 3 * H> wx;
  g::variable<"wh", double, H, 3 * H> wh;
  g::variable<"bx", double, 3 * H> bx;
  g::variable<"bh", double, 3 * H> bh;
  g::variable<"wo", double, T, B, H> wo;
  g::variable<"wl", double, B, H> wl;
};

template <class Loss, class V>
void fd_check(session& s, const std::string& what, const Loss& loss, const V& v) {
  const double err = fd_error(s, loss, g::grad(loss, v), v);
  BOOST_TEST_MESSAGE(what << ": max relative error " << err);
  BOOST_TEST(err < 1e-6, what << ": max relative error " << err);
}

template <g::index_t T>
void check_lstm() {
  session s;
  lstm_vars<T> v;
  const auto x = set_random(s, v.x, -1, 1), wx = set_random(s, v.wx, -0.8, 0.8), wh = set_random(s, v.wh, -0.8, 0.8),
             b = set_random(s, v.b, -0.5, 0.5);
  set_random(s, v.wo, -1, 1);
  set_random(s, v.wl, -1, 1);
  const auto hs = g::lstm(v.x, v.wx, v.wh, v.b);
  const auto got = s.run(hs);
  BOOST_TEST(same_shape(got, {T, B, H}));
  const double diff = max_abs_diff(got, lstm_reference(x, wx, wh, b, T));
  BOOST_TEST(diff < 1e-12, "lstm T=" << T << ": forward differs from the loops by " << diff);

  // every step through wo, and the last step again through last_step (a second path)
  const auto loss = g::sum(hs * v.wo) + g::sum(g::tanh(g::last_step(hs)) * v.wl);
  const std::string t = " (T=" + std::to_string(T) + ")";
  fd_check(s, "lstm d/dxs" + t, loss, v.x);
  fd_check(s, "lstm d/dwx" + t, loss, v.wx);
  fd_check(s, "lstm d/dwh" + t, loss, v.wh);
  fd_check(s, "lstm d/db" + t, loss, v.b);
}

template <g::index_t T>
void check_gru() {
  session s;
  gru_vars<T> v;
  const auto x = set_random(s, v.x, -1, 1), wx = set_random(s, v.wx, -0.8, 0.8), wh = set_random(s, v.wh, -0.8, 0.8),
             bx = set_random(s, v.bx, -0.5, 0.5), bh = set_random(s, v.bh, -0.5, 0.5);
  set_random(s, v.wo, -1, 1);
  set_random(s, v.wl, -1, 1);
  const auto hs = g::gru(v.x, v.wx, v.wh, v.bx, v.bh);
  const auto got = s.run(hs);
  BOOST_TEST(same_shape(got, {T, B, H}));
  const double diff = max_abs_diff(got, gru_reference(x, wx, wh, bx, bh, T));
  BOOST_TEST(diff < 1e-12, "gru T=" << T << ": forward differs from the loops by " << diff);

  const auto loss = g::sum(hs * v.wo) + g::sum(g::tanh(g::last_step(hs)) * v.wl);
  const std::string t = " (T=" + std::to_string(T) + ")";
  fd_check(s, "gru d/dxs" + t, loss, v.x);
  fd_check(s, "gru d/dwx" + t, loss, v.wx);
  fd_check(s, "gru d/dwh" + t, loss, v.wh);
  fd_check(s, "gru d/dbx" + t, loss, v.bx);
  fd_check(s, "gru d/dbh" + t, loss, v.bh);
}

}  // namespace

BOOST_AUTO_TEST_CASE(lstm_forward_and_gradients_one_step) { check_lstm<1>(); }
BOOST_AUTO_TEST_CASE(lstm_forward_and_gradients_three_steps) { check_lstm<3>(); }
BOOST_AUTO_TEST_CASE(gru_forward_and_gradients_one_step) { check_gru<1>(); }
BOOST_AUTO_TEST_CASE(gru_forward_and_gradients_three_steps) { check_gru<3>(); }

// float: the same values within float's precision, at other extents (dyn T and B).
BOOST_AUTO_TEST_CASE(float_forward_matches_the_loops) {
  g::session<g::cpu_simd> s;
  dyn_placeholder<"xs", float, 3> xs;
  g::variable<"wx", float, I, 4 * H> wx;
  g::variable<"wh", float, H, 4 * H> wh;
  g::variable<"b", float, 4 * H> b;
  constexpr g::index_t T = 7;
  const auto x = uniform<double>(static_cast<std::size_t>(T * B * I), -1, 1), vwx = uniform<double>(I * 4 * H, -0.5, 0.5),
             vwh = uniform<double>(H * 4 * H, -0.5, 0.5), vb = uniform<double>(4 * H, -0.5, 0.5);
  auto to_f = [](const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); };
  const auto fx = to_f(x), fwx = to_f(vwx), fwh = to_f(vwh), fb = to_f(vb);
  gradus::assign(s, wx, g::view(fwx.data(), {I, 4 * H}));
  gradus::assign(s, wh, g::view(fwh.data(), {H, 4 * H}));
  gradus::assign(s, b, g::view(fb.data(), {4 * H}));
  // the reference from the float values, in double
  const auto want = lstm_reference(std::vector<double>(fx.begin(), fx.end()), std::vector<double>(fwx.begin(), fwx.end()),
                                   std::vector<double>(fwh.begin(), fwh.end()), std::vector<double>(fb.begin(), fb.end()), T);
  const auto got = s.run(g::lstm(xs, wx, wh, b), xs = g::view(fx.data(), {T, B, I}));
  BOOST_TEST(same_shape(got, {T, B, H}));
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(double(got[static_cast<g::index_t>(i)]) - want[i]));
  BOOST_TEST(worst < 1e-5, "float lstm differs from the loops by " << worst);
}

// Gradients of all four operands: the forward runs once, BPTT once; the input's GEMM
// only when its gradient is asked for.
BOOST_AUTO_TEST_CASE(one_backward_kernel_for_every_gradient) {
  session s;
  lstm_vars<3> v;
  set_random(s, v.x, -1, 1);
  set_random(s, v.wx, -1, 1);
  set_random(s, v.wh, -1, 1);
  set_random(s, v.b, -1, 1);
  set_random(s, v.wo, -1, 1);
  const auto loss = g::sum(g::lstm(v.x, v.wx, v.wh, v.b) * v.wo);
  const auto [dx, dwx, dwh, db] = g::grad(loss, v.x, v.wx, v.wh, v.b);
  s.run(loss, dx, dwx, dwh, db);
  BOOST_TEST(s.stats().count("lstm") == 1u);
  BOOST_TEST(s.stats().count("lstm_backward") == 1u);
  BOOST_TEST(s.stats().count("lstm_backward_input") == 1u);
  s.run(loss, dwx, dwh, db);
  BOOST_TEST(s.stats().count("lstm_backward") == 1u);
  BOOST_TEST(s.stats().count("lstm_backward_input") == 0u);

  gru_vars<3> u;
  set_random(s, u.bx, -1, 1);
  set_random(s, u.bh, -1, 1);
  g::variable<"gwx", double, I, 3 * H> gwx;
  g::variable<"gwh", double, H, 3 * H> gwh;
  set_random(s, gwx, -1, 1);
  set_random(s, gwh, -1, 1);
  const auto gl = g::sum(g::gru(v.x, gwx, gwh, u.bx, u.bh) * v.wo);
  const auto [gx, gx1, gx2, gx3, gx4] = g::grad(gl, v.x, gwx, gwh, u.bx, u.bh);
  s.run(gl, gx, gx1, gx2, gx3, gx4);
  BOOST_TEST(s.stats().count("gru") == 1u);
  BOOST_TEST(s.stats().count("gru_backward") == 1u);
}

BOOST_AUTO_TEST_CASE(bad_shapes_are_a_shape_error_naming_op_and_shapes) {
  g::session<g::cpu_simd> s;
  dyn_placeholder<"xs", float, 3> xs;
  g::variable<"wx", float, I, 4 * H> wx;
  g::variable<"wh", float, H, 4 * H> wh;
  g::variable<"b", float, 4 * H> b;
  g::variable<"gwx", float, I, 3 * H> gwx;
  g::variable<"gwh", float, H, 3 * H> gwh;
  g::variable<"bx", float, 3 * H> bx;
  g::variable<"bh", float, 3 * H> bh;
  const std::vector<float> zeros(1000, 0.0f);
  gradus::assign(s, wx, g::view(zeros.data(), {I, 4 * H}));
  gradus::assign(s, wh, g::view(zeros.data(), {H, 4 * H}));
  gradus::assign(s, b, g::view(zeros.data(), {4 * H}));
  gradus::assign(s, gwx, g::view(zeros.data(), {I, 3 * H}));
  gradus::assign(s, gwh, g::view(zeros.data(), {H, 3 * H}));
  gradus::assign(s, bx, g::view(zeros.data(), {3 * H}));
  gradus::assign(s, bh, g::view(zeros.data(), {3 * H}));
  auto message = [&](auto&& f) -> std::string {
    try {
      f();
    } catch (const g::shape_error& e) {
      return e.what();
    }
    return "no shape_error";
  };
  BOOST_TEST(message([&] { s.run(g::lstm(xs, wx, wh, b), xs = g::view(zeros.data(), {2, 3, 6})); }) ==
             "gradus: lstm: operands of shapes xs (2, 3, 6), wx (4, 20), wh (5, 20), b (20,) do not fit "
             "(expected xs [T, B, I], wx [I, 4H], wh [H, 4H], b [4H])");
  BOOST_TEST(message([&] { s.run(g::gru(xs, gwx, gwh, bx, bh), xs = g::view(zeros.data(), {2, 3, 7})); }) ==
             "gradus: gru: operands of shapes xs (2, 3, 7), wx (4, 15), wh (5, 15), bx (15,), bh (15,) do not fit "
             "(expected xs [T, B, I], wx [I, 3H], wh [H, 3H], bx [3H], bh [3H])");
  // the right shapes run
  BOOST_TEST(same_shape(s.run(g::lstm(xs, wx, wh, b), xs = g::view(zeros.data(), {2, 3, 4})), {2, 3, 5}));
}

// T = 0 and B = 0: empty hs, zero weight gradients.
BOOST_AUTO_TEST_CASE(empty_sequences) {
  session s;
  dyn_placeholder<"xs", double, 3> xs;
  lstm_vars<1> v;
  set_random(s, v.wx, -1, 1);
  set_random(s, v.wh, -1, 1);
  set_random(s, v.b, -1, 1);
  const std::vector<double> none;
  const auto hs = g::lstm(xs, v.wx, v.wh, v.b);
  const auto loss = g::sum(hs);
  for (const auto& d : {std::array<g::index_t, 3>{0, 3, I}, std::array<g::index_t, 3>{2, 0, I}}) {
    const auto [l, dwx, dwh, db] = s.run(loss, g::grad(loss, v.wx), g::grad(loss, v.wh), g::grad(loss, v.b),
                                         xs = g::view(none.data(), d));
    BOOST_TEST(l[0] == 0.0);
    BOOST_TEST(equal(dwx, std::vector<double>(I * 4 * H, 0.0)));
    BOOST_TEST(equal(dwh, std::vector<double>(H * 4 * H, 0.0)));
    BOOST_TEST(equal(db, std::vector<double>(4 * H, 0.0)));
  }
}

// select: a view at an offset (no copy step), negative indices from the end, its
// adjoint through finite differences, and an index_error outside the axis.
BOOST_AUTO_TEST_CASE(select_and_last_step) {
  session s;
  g::variable<"a", double, 4, 2, 3> a;
  g::variable<"w", double, 2, 3> w;
  const auto va = set_random(s, a, -1, 1);
  set_random(s, w, -1, 1);
  for (g::index_t i : {0, 2, -1, -4}) {
    const auto got = s.run(g::select(a, i));
    BOOST_TEST(same_shape(got, {2, 3}));
    const g::index_t at = i < 0 ? i + 4 : i;
    BOOST_TEST(equal(got, std::vector<double>(va.begin() + at * 6, va.begin() + at * 6 + 6)));
  }
  BOOST_TEST(equal(s.run(g::last_step(a)), std::vector<double>(va.end() - 6, va.end())));
  fd_check(s, "d/da sum(tanh(select(a, 1)) * w)", g::sum(g::tanh(g::select(a, 1)) * w), a);
  fd_check(s, "d/da sum(last_step(exp(a)) * w)", g::sum(g::last_step(g::exp(a)) * w), a);
  fd_check(s, "d/dw select of select_backward", g::sum(g::select(g::select_backward(g::exp(w), 2, a), 2) * w), w);
  try {
    s.run(g::select(a, 4));
    BOOST_ERROR("no index_error");
  } catch (const g::index_error& e) {
    BOOST_TEST(std::string(e.what()) == "gradus: select: index 4 is outside [-4, 4) of the leading axis of shape (4, 2, 3)");
  }
}

// time_major: [B, T*I] rows as fed -> [T, B, I].
BOOST_AUTO_TEST_CASE(time_major_layout) {
  g::session<g::cpu_simd> s;
  g::placeholder<"x", float, g::dyn, 6> x;
  const std::vector<float> v{0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15};  // B = 2, T = 3, I = 2
  const auto got = s.run(g::time_major<3, 2>(x), x = g::view(v.data(), {2, 6}));
  BOOST_TEST(same_shape(got, {3, 2, 2}));
  BOOST_TEST(equal(got, std::vector<float>{0, 1, 10, 11, 2, 3, 12, 13, 4, 5, 14, 15}));
}

// The classifier's whole path, rows [B, T*I] -> time_major -> lstm / gru -> last_step ->
// dense -> softmax cross-entropy, differentiated w.r.t. the rows and the weights.
BOOST_AUTO_TEST_CASE(sequence_classifier_path) {
  constexpr g::index_t T = 3;
  g::variable<"rows", double, B, T * I> rows;
  g::variable<"fw", double, H, 2> fw;
  g::placeholder<"y", std::int32_t, B> y;
  const std::vector<std::int32_t> labels{1, 0, 1};
  const auto feed = y = g::view(labels.data(), {B});
  const auto xs = g::time_major<T, I>(rows);
  session s1, s2;  // the two cells' variables share names
  lstm_vars<T> v;
  gru_vars<T> u;
  for (session* s : {&s1, &s2}) {
    set_random(*s, rows, -1, 1);
    set_random(*s, fw, -1, 1);
  }
  set_random(s1, v.wx, -0.8, 0.8);
  set_random(s1, v.wh, -0.8, 0.8);
  set_random(s1, v.b, -0.5, 0.5);
  set_random(s2, u.wx, -0.8, 0.8);
  set_random(s2, u.wh, -0.8, 0.8);
  set_random(s2, u.bx, -0.5, 0.5);
  set_random(s2, u.bh, -0.5, 0.5);
  const auto l1 = g::mean(g::softmax_cross_entropy(g::matmul(g::last_step(g::lstm(xs, v.wx, v.wh, v.b)), fw), y));
  const auto l2 = g::mean(g::softmax_cross_entropy(g::matmul(g::last_step(g::gru(xs, u.wx, u.wh, u.bx, u.bh)), fw), y));
  for (const auto& [what, err] :
       {std::pair{"lstm classifier d/drows", fd_error(s1, l1, g::grad(l1, rows), rows, feed)},
        std::pair{"lstm classifier d/dwh", fd_error(s1, l1, g::grad(l1, v.wh), v.wh, feed)},
        std::pair{"gru classifier d/drows", fd_error(s2, l2, g::grad(l2, rows), rows, feed)},
        std::pair{"gru classifier d/dwh", fd_error(s2, l2, g::grad(l2, u.wh), u.wh, feed)}}) {
    BOOST_TEST_MESSAGE(what << ": max relative error " << err);
    BOOST_TEST(err < 1e-6, what << ": max relative error " << err);
  }
  // the drawing names the fused kernels
  const std::string dot = g::to_dot(l1, g::grad(l1, v.wh));
  BOOST_TEST(dot.find("label=\"lstm\\n") != std::string::npos, dot);
  BOOST_TEST(dot.find("label=\"lstm_backward\\n") != std::string::npos, dot);
}
