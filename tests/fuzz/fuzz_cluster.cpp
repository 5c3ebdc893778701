// libFuzzer target for cluster discovery (gradus/parallel/cluster.hpp): from_env with an
// environment the input spells, as NAME=value records separated by NUL bytes (a value can
// hold no NUL, as a real one cannot). TF_CONFIG's JSON, the torchrun, Slurm and OpenMPI
// variables, GRADUS_CLUSTER's inline JSON (a value not starting with '{' names a file: left
// out here), GRADUS_PS and GRADUS_BIND_ADDR all go through the readers they would meet.
// An accepted spec keeps every promise the file makes: ranks within their worlds, a port
// in 1-65535, a non-empty master address, host lists of world_size entries that read back
// as the same endpoints, Slurm's job-id port rule. Each value also goes through
// parse_endpoint (an accepted endpoint reads back from str() as itself) and
// expand_hostlist. Every refusal is a gradus::error; anything else thrown fails the target.
#include "fuzz_check.hpp"

#include <gradus/parallel/cluster.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace cl = gradus::cluster;

std::uint64_t sink;

// Runs f; false when it throws gradus::error (with a message), which is a refusal.
bool accepted(const auto& f) {
  try {
    f();
    return true;
  } catch (const gradus::error& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
    return false;
  }
}

void check_endpoint_text(const std::string& text) {
  cl::endpoint e;
  if (!accepted([&] { e = cl::parse_endpoint(text, "fuzz"); })) return;
  FUZZ_CHECK(!e.host.empty() && e.port >= 1 && e.port <= 65535);
  cl::endpoint back;
  if (!accepted([&] { back = cl::parse_endpoint(e.str(), "fuzz"); })) {
    std::fprintf(stderr, "fuzz_cluster: '%s' reads as host '%s', whose str() '%s' does not read back\n", text.c_str(),
                 e.host.c_str(), e.str().c_str());
    FUZZ_CHECK(false);
  }
  FUZZ_CHECK(back.host == e.host && back.port == e.port);
}

void check_spec(const cl::spec& s, const std::map<std::string, std::string>& env) {
  FUZZ_CHECK(s.world_size >= 1);
  if (s.is_worker()) {
    FUZZ_CHECK(s.rank >= 0 && s.rank < s.world_size);
    FUZZ_CHECK(s.local_rank >= 0 && s.local_rank < s.local_world_size && s.local_world_size <= s.world_size);
  } else {
    FUZZ_CHECK(s.rank == -1 && (s.task_type == "ps" || s.task_type == "evaluator"));
  }
  FUZZ_CHECK(s.task_index >= 0);
  FUZZ_CHECK(!s.master_addr.empty() && s.master_port >= 1 && s.master_port <= 65535);
  FUZZ_CHECK(!s.hosts.empty() == (s.source == "TF_CONFIG" || s.source == "gradus-json"));
  if (!s.hosts.empty()) FUZZ_CHECK(s.hosts.size() == static_cast<std::size_t>(s.world_size));
  for (const auto& h : s.hosts) check_endpoint_text(h);
  for (const auto& p : s.ps) check_endpoint_text(p);
  if (s.task_type == "ps" && s.source != "TF_CONFIG") FUZZ_CHECK(static_cast<std::size_t>(s.task_index) < s.ps.size() || s.ps.empty());
  if (s.master_port_from == "29500 + SLURM_JOB_ID mod 10000") {
    const auto job = cl::detail::parse_integer(env.at("SLURM_JOB_ID"));
    FUZZ_CHECK(job && *job >= 0 && s.master_port == 29500 + *job % 10000);
  }
  sink += s.rendezvous().size() + s.rendezvous_origin().size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::map<std::string, std::string> env;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  for (std::size_t at = 0; at < in.size();) {
    const std::size_t end = std::min(in.find('\0', at), in.size());
    const std::string_view record = in.substr(at, end - at);
    at = end + 1;
    const std::size_t eq = record.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    env.insert_or_assign(std::string(record.substr(0, eq)), std::string(record.substr(eq + 1)));
  }
  if (const auto it = env.find("GRADUS_CLUSTER"); it != env.end()) {
    const auto first = it->second.find_first_not_of(" \t\r\n");
    if (first != std::string::npos && it->second[first] != '{') env.erase(it);  // a file's name: not read here
  }

  for (const auto& kv : env) {  // (Clang 14 cannot capture a structured binding)
    check_endpoint_text(kv.second);
    std::vector<std::string> hosts;
    if (accepted([&] { hosts = cl::expand_hostlist(kv.second, kv.first); }))
      for (const auto& h : hosts) FUZZ_CHECK(!h.empty());
  }

  cl::spec s;
  try {
    s = cl::from_env(env);
  } catch (const gradus::error& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_cluster: from_env threw something other than gradus::error: %s\n", e.what());
    FUZZ_CHECK(false);
  }
  check_spec(s, env);
  return 0;
}
