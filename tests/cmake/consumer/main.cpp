// The whole consumer: gradus::cpu_simd (cpu_simd.cpp), then writes a 2x2 array to an .npz
// file and reads them back with gradus::io (libzip), reads a TF_CONFIG with gradus::cluster
// (nlohmann_json), and checks that the communicators' headers and targets (comm.cpp:
// gradus::ring, gradus::ps and their old names) are there. Exit status 0 only if all agree.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <gradus/gradus.hpp>
#include <gradus/io/npz.hpp>
#include <gradus/parallel/cluster.hpp>

namespace g = gradus;

int check_cpu_simd();     // cpu_simd.cpp
int comm_world_of_one();  // comm.cpp

int main() {
  const int bad = check_cpu_simd();
  const float values[4] = {0, 3, 0, 2.5f};  // a 2x2 array to round-trip
  const auto npz = std::filesystem::temp_directory_path() / ("gradus_consumer." + std::to_string(::getpid()) + ".npz");
  g::io::write_npz(npz, {{"a/values", "float32", {2, 2}, values}});
  const auto back = g::io::read_npz(npz);
  std::filesystem::remove(npz);
  const bool npz_ok = back.size() == 1 && back[0].name == "a/values" && back[0].dtype == g::element_type::f32 &&
                      back[0].shape == g::dims{2, 2} && back[0].bytes.size() == sizeof values &&
                      std::memcmp(back[0].bytes.data(), values, sizeof values) == 0;
  std::printf("consumer: .npz round trip %s\n", npz_ok ? "ok" : "WRONG");

  const auto spec = g::cluster::from_env(std::map<std::string, std::string>{
      {"TF_CONFIG", R"({"cluster": {"worker": ["127.0.0.1:7000", "127.0.0.1:7001"]}, "task": {"type": "worker", "index": 1}})"}});
  const bool cluster_ok = spec.rank == 1 && spec.world_size == 2 && spec.rendezvous() == "tcp://127.0.0.1:7000";
  std::printf("consumer: cluster spec %s\n", cluster_ok ? "ok" : "WRONG");
  const bool comm_ok = comm_world_of_one() == 1;
  std::printf("consumer: communicators %s\n", comm_ok ? "ok" : "WRONG");
  return bad || !npz_ok || !cluster_ok || !comm_ok;
}
