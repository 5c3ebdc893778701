// Evaluates relu(x·w + b) with gradus::cpu_simd (a BLAS GEMM, then a fused SIMD pass) and
// checks every value against a plain loop; prints the version of the gradus it was compiled
// against (<gradus/version.hpp>), which the packaging tests compare with the one they expect.
// The small consumer (small.cpp) is this alone; main.cpp adds the other components.
#include <cmath>
#include <cstdio>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/version.hpp>

namespace g = gradus;

static_assert(GRADUS_VERSION_NUMBER == GRADUS_VERSION_MAJOR * 10000 + GRADUS_VERSION_MINOR * 100 + GRADUS_VERSION_PATCH);

// 0 when every value agrees
int check_cpu_simd() {
  std::printf("consumer: gradus %s\n", GRADUS_VERSION);
  g::placeholder<"x", float, g::dyn, 3> x;
  g::variable<"w", float, 3, 2> w;
  g::variable<"b", float, 2> b;

  const xt::xtensor<float, 2> xv = {{1, 2, 3}, {-1, 0, 4}};
  const xt::xtensor<float, 2> wv = {{1, -1}, {0.5f, 2}, {-2, 1}};
  const xt::xtensor<float, 1> bv = {0.25f, -3};

  g::session<g::cpu_simd> s;
  g::assign(s, w, wv);
  g::assign(s, b, bv);
  auto y = s.run(g::relu(g::matmul(x, w) + b), x = xv);

  // x·w + b = {{-3.75, 3}, {-9.25, 2}}; relu keeps the second column.
  const float want[4] = {0, 3, 0, 2};
  int bad = y.shape().rank == 2 && y.shape().d[0] == 2 && y.shape().d[1] == 2 ? 0 : 1;
  for (g::index_t i = 0; i < 4 && !bad; ++i)
    if (std::abs(y[i] - want[i]) > 1e-6f) {
      std::fprintf(stderr, "consumer: element %ld is %g, want %g\n", static_cast<long>(i), static_cast<double>(y[i]),
                   static_cast<double>(want[i]));
      bad = 1;
    }
  std::printf("consumer: relu(x w + b) = {{%g, %g}, {%g, %g}} %s\n", static_cast<double>(y[0]),
              static_cast<double>(y[1]), static_cast<double>(y[2]), static_cast<double>(y[3]), bad ? "WRONG" : "ok");
  return bad;
}
