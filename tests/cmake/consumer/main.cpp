// Evaluates relu(x·w + b) with gradus::cpu_simd (a BLAS GEMM, then a fused SIMD pass) and
// checks every value against a plain loop: exit status 0 only if all of them agree. Then
// writes the values to an .npz file and reads them back with gradus::io (libzip), and
// reads a TF_CONFIG with gradus::cluster (nlohmann_json), and checks that the communicators'
// headers and targets (comm.cpp: gradus::ring, gradus::ps and their old names) are there.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <gradus/backends/cpu_simd.hpp>
#include <gradus/parallel/cluster.hpp>
#include <gradus/gradus.hpp>
#include <gradus/io/npz.hpp>

namespace g = gradus;

int comm_world_of_one();  // comm.cpp

int main() {
  g::placeholder<"x", float, g::dyn, 3> x;
  g::variable<"w", float, 3, 2> w;
  g::variable<"b", float, 2> b;

  const xt::xtensor<float, 2> xv = {{1, 2, 3}, {-1, 0, 4}};
  const xt::xtensor<float, 2> wv = {{1, -1}, {0.5f, 2}, {-2, 1}};
  const xt::xtensor<float, 1> bv = {0.25f, -3};

  g::session<g::cpu_simd> s;
  s.assign(w, wv);
  s.assign(b, bv);
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

  const auto npz = std::filesystem::temp_directory_path() / ("gradus_consumer." + std::to_string(::getpid()) + ".npz");
  g::io::write_npz(npz, {{"relu/want", "float32", {2, 2}, want}});
  const auto back = g::io::read_npz(npz);
  std::filesystem::remove(npz);
  const bool npz_ok = back.size() == 1 && back[0].name == "relu/want" && back[0].dtype == "float32" &&
                      back[0].shape == g::dims{2, 2} && back[0].bytes.size() == sizeof want &&
                      std::memcmp(back[0].bytes.data(), want, sizeof want) == 0;
  std::printf("consumer: .npz round trip %s\n", npz_ok ? "ok" : "WRONG");

  const auto spec = g::cluster::from_env(std::map<std::string, std::string>{
      {"TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:7000", "127.0.0.1:7001"]}, "task": {"type": "worker", "index": 1}})"}});
  const bool cluster_ok = spec.rank == 1 && spec.world_size == 2 && spec.rendezvous() == "tcp://127.0.0.1:7000";
  std::printf("consumer: cluster spec %s\n", cluster_ok ? "ok" : "WRONG");
  const bool comm_ok = comm_world_of_one() == 1;
  std::printf("consumer: communicators %s\n", comm_ok ? "ok" : "WRONG");
  return bad || !npz_ok || !cluster_ok || !comm_ok;
}
