#pragma once
// Cluster discovery: who am I, how many are we, where do we meet. `cluster::from_env()`
// reads the environment that a cluster's own launcher already sets, so a job started by
// TensorFlow tooling, torchrun, Slurm's srun, OpenMPI's mpirun, a Kubernetes Job or
// gradus-run needs no gradus-specific configuration. The first format present wins:
//
//   1. TF_CONFIG      TensorFlow's JSON, unchanged: {"cluster": {"chief": ["h:p"],
//                     "worker": ["h:p", ...], "ps": ["h:p", ...]}, "task": {"type":
//                     "worker", "index": 1}}. The chief is rank 0 and the workers follow
//                     (as MultiWorkerMirroredStrategy counts them); "master" is accepted
//                     for "chief" (Estimator-era configs); ps and evaluator tasks are not
//                     members of the worker world (rank -1, task_type "ps"/"evaluator").
//   2. torchrun       RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                     MASTER_PORT (gradus-run sets the same). MASTER_ADDR is required when
//                     WORLD_SIZE > 1; MASTER_PORT defaults to 29500, LOCAL_RANK to 0 and
//                     LOCAL_WORLD_SIZE to LOCAL_RANK + 1. Without RANK, a Kubernetes Indexed
//                     Job's JOB_COMPLETION_INDEX is the rank (WORLD_SIZE and MASTER_ADDR set
//                     in the pod template). With GRADUS_ROLE=ps (and no RANK) the process is
//                     parameter-server task GRADUS_PS_INDEX instead.
//   3. Slurm          SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                     SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE and
//                     SLURM_STEP_NODELIST / SLURM_JOB_NODELIST (hostlist syntax, expanded
//                     here: "node[01-03,07],gpu5"). The master is the first node; the port
//                     is GRADUS_MASTER_PORT, else MASTER_PORT, else 29500 + SLURM_JOB_ID
//                     mod 10000 (two jobs sharing a node do not collide).
//   4. OpenMPI        OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//                     OMPI_COMM_WORLD_LOCAL_SIZE; master from GRADUS_MASTER_ADDR/PORT, else
//                     MASTER_ADDR/PORT, else 127.0.0.1:29500.
//   5. GRADUS_CLUSTER a gradus JSON cluster file (or the JSON text itself, when the value
//                     starts with '{'):
//                       {"workers": ["10.0.0.1:29500", "10.0.0.2:29500"],   required
//                        "ps":      ["10.0.0.3:29600"],                     optional
//                        "role":    "worker",            optional: "worker" (default) or "ps"
//                        "rank":    1}                   index within the role
//                     GRADUS_ROLE and GRADUS_RANK override "role" and "rank", so one file
//                     can serve every process. The master is workers[0]. Unknown keys are
//                     errors (a typo must not silently make a world of one).
//   6. none of these  a world of one (source "default").
//
// TF_CONFIG without a cluster: `{}` (or one with neither "cluster" nor "task") says
// nothing and counts as absent, as an empty TF_CONFIG does (TensorFlow reads both as a
// local run), so the next format is tried. A task without a cluster, or an empty
// cluster, is an error: TensorFlow would run it as a single local process, but here
// `--comm ring` would then train alone without a word, and a task index only means
// something in a cluster.
//
// With formats 2-4, GRADUS_PS="h:p,h:p" lists the parameter-server tasks (gradus-run --ps
// sets it). With every format, GRADUS_BIND_ADDR picks the interface to listen on
// (spec::bind_addr: an address, an interface name, or "*" for every one). spec records
// where master_addr and master_port came from (master_addr_from, master_port_from), so
// that an error can say which variable to change (spec::rendezvous_origin()). A malformed
// spec throws gradus::error naming the variable and the field, e.g.
//   TF_CONFIG: task.index = 5 but cluster.worker has 2 entries
//   TF_CONFIG: cluster missing (task is worker 0 of what?)
//   RANK = 'x' is not an integer
//   WORLD_SIZE missing while RANK is set
//
// About 760 lines, one concept: the cluster spec and its readers. Each launcher's format is
// a small parser, but they share the precedence above, the checks and the error wording, and
// a reader of one needs the others' rules (which format wins, what a ps task is); they stay
// together so that the precedence is read in one place.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gradus/core/error.hpp"

namespace gradus::cluster {

/// A host and a port, as written "host:port" or "[v6addr]:port".
struct endpoint {
  std::string host;  ///< a host name or address; an IPv6 address without its brackets
  int port = 0;      ///< 1-65535 once parsed (parse_endpoint)
  /// "host:port", with brackets around an IPv6 address
  std::string str() const {
    return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};

/// Where this process stands in a job, as cluster::from_env() reads it from the launcher's
/// environment: its rank and the world's size, the workers on its host, where the ranks
/// meet, the parameter-server tasks, and where each came from (for errors). A
/// default-constructed one is a world of one: rank 0 of 1, meeting at 127.0.0.1:29500.
struct spec {
  int rank = 0;              ///< index in the worker world; -1 for ps and evaluator tasks
  int world_size = 1;        ///< number of workers (the all-reduce world)
  int local_rank = 0;        ///< index among this host's workers
  int local_world_size = 1;  ///< workers on this host
  std::string master_addr = "127.0.0.1";  ///< the rendezvous host: rank 0's (rendezvous())
  int master_port = 29500;                ///< the rendezvous port
  /// Where master_addr and master_port came from: a variable ("MASTER_ADDR", "MASTER_PORT",
  /// "GRADUS_MASTER_ADDR", "GRADUS_MASTER_PORT"), an entry ("TF_CONFIG cluster.chief[0]",
  /// "TF_CONFIG cluster.worker[0]", "GRADUS_CLUSTER workers[0]", "SLURM_JOB_NODELIST (first
  /// node)"), a rule ("29500 + SLURM_JOB_ID mod 10000") or "default 127.0.0.1" / "default 29500".
  std::string master_addr_from = "default 127.0.0.1";
  std::string master_port_from = "default 29500";  ///< where master_port came from (as master_addr_from)
  /// GRADUS_BIND_ADDR: the interface rank 0's rendezvous and every data socket listen on (an
  /// address, an interface name, or "*" for every one); empty: chosen from the rendezvous
  /// address (ring_options::bind_host).
  std::string bind_addr;
  std::vector<std::string> hosts;  ///< "host:port" per worker rank, where the format lists them
                                   /// (TF_CONFIG, GRADUS_CLUSTER); empty otherwise
  std::vector<std::string> nodes;  ///< Slurm: the expanded node list (one per node, not per rank)
  std::vector<std::string> ps;     ///< parameter-server tasks, "host:port"
  std::string task_type = "worker";  ///< "chief" (TF_CONFIG's), "worker", "ps" or "evaluator"
  int task_index = 0;                ///< index within task_type
  std::string source = "default";    ///< the format read: "TF_CONFIG", "torchrun", "slurm", "openmpi", "gradus-json", "default"
  /// Which job this process belongs to, so that ranks of two jobs sent to one rendezvous port
  /// do not meet: GRADUS_JOB_ID (gradus-run sets one per job), else "torchrun " followed by
  /// TORCHELASTIC_RUN_ID (torchrun's `--rdzv-id`), else "slurm " followed by SLURM_JOB_ID and,
  /// where set, "." SLURM_STEP_ID; empty when none is set (ranks started by hand: a second
  /// claim of a rank is then refused alone).
  std::string job_id;

  /// Whether this process is a member of the worker world: a chief or a worker, not a ps or
  /// evaluator task (whose rank is -1).
  bool is_worker() const { return task_type == "worker" || task_type == "chief"; }
  /// Whether this process is the worker of rank 0: TF_CONFIG's chief, else worker 0.
  bool is_chief() const { return is_worker() && rank == 0; }
  /// Where the ranks meet: "tcp://master_addr:master_port".
  std::string rendezvous() const { return "tcp://" + endpoint{master_addr, master_port}.str(); }
  /// Where the rendezvous came from, for errors: "MASTER_ADDR=node1 and MASTER_PORT=29500
  /// (torchrun)", "TF_CONFIG cluster.worker[0] = localhost:12345", "node01 from
  /// SLURM_JOB_NODELIST (first node) and port 31234 from 29500 + SLURM_JOB_ID mod 10000
  /// (slurm)", "the default 127.0.0.1 and the default port 29500".
  std::string rendezvous_origin() const {
    if (master_addr_from == master_port_from) return master_addr_from + " = " + endpoint{master_addr, master_port}.str();
    const auto is_variable = [](const std::string& from) {
      return !from.empty() && std::all_of(from.begin(), from.end(), [](char ch) { return (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_'; });
    };
    const auto part = [&](const std::string& from, const std::string& value, const std::string& what) {
      if (is_variable(from)) return from + "=" + value;
      if (from.rfind("default", 0) == 0) return "the default " + what + value;
      return what + value + " from " + from;
    };
    std::string s = part(master_addr_from, master_addr, "") + " and " + part(master_port_from, std::to_string(master_port), "port ");
    return source == "default" ? s : s + " (" + source + ")";
  }
};

/// Where from_env looks a variable up: the process environment, a map (tests), or any
/// function of the name.
using env_lookup = std::function<std::optional<std::string>(const std::string&)>;

namespace detail {

inline std::optional<long long> parse_integer(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r')) s.remove_suffix(1);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  long long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || end != s.data() + s.size()) return std::nullopt;
  return v;
}

/// An integer variable: nullopt when absent; an error when present and not an integer in
/// [lo, hi].
inline std::optional<long long> integer_var(const env_lookup& env, const std::string& name, long long lo, long long hi) {
  const auto text = env(name);
  if (!text) return std::nullopt;
  const auto v = parse_integer(*text);
  if (!v) throw error(name + " = '" + *text + "' is not an integer");
  if (*v < lo || *v > hi)
    throw error(name + " = " + std::to_string(*v) + " is out of range (" + std::to_string(lo) + " to " +
                std::to_string(hi) + ")");
  return *v;
}

/// The same as an int (hi must fit one; SLURM_JOB_ID, which need not, is read as a long long).
inline std::optional<int> int_var(const env_lookup& env, const std::string& name, long long lo,
                                  long long hi = 1LL << 30) {
  const auto v = integer_var(env, name, lo, hi);
  if (!v) return std::nullopt;
  return static_cast<int>(*v);
}

/// A host variable (MASTER_ADDR, GRADUS_MASTER_ADDR): nullopt when absent; an error when empty.
inline std::optional<std::string> host_var(const env_lookup& env, const std::string& name) {
  auto text = env(name);
  if (text && text->empty()) throw error(name + " is empty");
  return text;
}

inline int required_int(const env_lookup& env, const std::string& name, long long lo, const std::string& because) {
  const auto v = int_var(env, name, lo);
  if (!v) throw error(name + " missing while " + because + " is set");
  return *v;
}

inline int port_var(const env_lookup& env, const std::string& name) {
  const auto text = env(name);
  if (!text) return 0;
  const auto v = parse_integer(*text);
  if (!v) throw error(name + " = '" + *text + "' is not an integer");
  if (*v < 1 || *v > 65535) throw error(name + " = " + std::to_string(*v) + " is not a port (1-65535)");
  return static_cast<int>(*v);
}

inline void check_ranks(spec& s, const std::string& rank_name, const std::string& size_name,
                        const std::string& local_rank_name, const std::string& local_size_name) {
  if (s.world_size < 1) throw error(size_name + " = " + std::to_string(s.world_size) + " (must be at least 1)");
  if (s.rank >= s.world_size)
    throw error(rank_name + " = " + std::to_string(s.rank) + " but " + size_name + " = " + std::to_string(s.world_size) +
                " (a rank must be below the world size)");
  if (s.local_world_size < 1)
    throw error(local_size_name + " = " + std::to_string(s.local_world_size) + " (must be at least 1)");
  if (s.local_world_size > s.world_size)
    throw error(local_size_name + " = " + std::to_string(s.local_world_size) + " but " + size_name + " = " +
                std::to_string(s.world_size) + " (more processes on this host than in the world)");
  if (s.local_rank >= s.local_world_size)
    throw error(local_rank_name + " = " + std::to_string(s.local_rank) + " but " + local_size_name + " = " +
                std::to_string(s.local_world_size) + " (a local rank must be below the local world size)");
}

/// local_rank / local_world_size from a per-rank host list (TF_CONFIG, gradus JSON): the
/// workers that share this worker's host.
inline void locals_from_hosts(spec& s) {
  if (s.rank < 0 || s.hosts.empty()) return;
  const auto host_of = [](const std::string& hp) { return hp.substr(0, hp.rfind(':')); };
  const std::string mine = host_of(s.hosts[static_cast<std::size_t>(s.rank)]);
  s.local_rank = 0;
  s.local_world_size = 0;
  for (std::size_t r = 0; r < s.hosts.size(); ++r)
    if (host_of(s.hosts[r]) == mine) {
      if (static_cast<int>(r) < s.rank) ++s.local_rank;
      ++s.local_world_size;
    }
}

}  // namespace detail

/// "host:port" or "[v6addr]:port" -> endpoint; `what` names the field in the error.
inline endpoint parse_endpoint(std::string_view text, const std::string& what) {
  const auto bad = [&](const std::string& why) {
    return error(what + " = '" + std::string(text) + "' is not host:port (" + why + ")");
  };
  endpoint e;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) throw bad("unclosed '['");
    e.host = std::string(text.substr(1, close - 1));
    if (close + 1 >= text.size() || text[close + 1] != ':') throw bad("no port");
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw bad("no port");
    e.host = std::string(text.substr(0, colon));
    if (e.host.find(':') != std::string::npos) throw bad("an IPv6 address needs brackets");
    port = text.substr(colon + 1);
  }
  if (e.host.empty()) throw bad("empty host");
  // str() brackets a host with ':' only: "[[x]:1" would be host "[x", written "[x:1"
  if (e.host.find_first_of("[]") != std::string::npos) throw bad("'[' or ']' inside the host");
  const auto p = detail::parse_integer(port);
  if (!p || *p < 1 || *p > 65535) throw bad("the port must be an integer in 1-65535");
  e.port = static_cast<int>(*p);
  return e;
}

/// Slurm's compressed hostlist: "node[01-03,07],gpu5" -> node01 node02 node03 node07 gpu5.
/// Several bracket groups in one name expand to their product ("r[1-2]n[1-2]" -> r1n1 r1n2
/// r2n1 r2n2); a range keeps the zero padding of its first bound. `what` names the variable
/// in the error. At most 2^20 hosts and 2^24 bytes of names, checked before they are made.
inline std::vector<std::string> expand_hostlist(std::string_view list, const std::string& what = "hostlist") {
  constexpr std::size_t max_hosts = 1u << 20;  // bounds every loop below
  constexpr std::size_t max_bytes = std::size_t{1} << 24;  // and every string's growth
  const auto bad = [&](const std::string& why) {
    return error(what + " = '" + std::string(list) + "' is not a valid hostlist (" + why + ")");
  };
  // Split at top-level commas.
  std::vector<std::string_view> items;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const char c = i < list.size() ? list[i] : ',';
    if (c == '[') {
      if (++depth > 1) throw bad("nested '['");
    } else if (c == ']') {
      if (--depth < 0) throw bad("']' without '['");
    } else if (c == ',' && depth == 0) {
      if (i == start) throw bad("empty host name");
      items.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) throw bad("unclosed '['");
  std::vector<std::string> hosts;
  std::size_t host_bytes = 0;  // of the names in hosts
  const auto too_long = [&] { return bad("its names come to more than 2^24 bytes"); };
  for (const auto item : items) {
    std::vector<std::string> partial{""};
    std::size_t partial_bytes = 0;  // of the names in partial
    std::size_t i = 0;
    while (i < item.size()) {
      const auto open = item.find('[', i);
      const auto literal = item.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
      if (literal.size() > (max_bytes - host_bytes - partial_bytes) / partial.size()) throw too_long();
      partial_bytes += literal.size() * partial.size();
      for (auto& p : partial) p += literal;
      if (open == std::string_view::npos) break;
      const auto close = item.find(']', open);
      const auto body = item.substr(open + 1, close - open - 1);
      if (body.empty()) throw bad("empty '[]'");
      std::vector<std::string> suffixes;
      std::size_t b = 0;
      while (b <= body.size()) {
        auto comma = body.find(',', b);
        if (comma == std::string_view::npos) comma = body.size();
        const auto range = body.substr(b, comma - b);
        const auto dash = range.find('-');
        const auto lo_text = range.substr(0, dash);
        const auto hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
        const auto digits = [](std::string_view t) {
          return !t.empty() && std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        };
        if (!digits(lo_text) || !digits(hi_text) || lo_text.size() > 9 || hi_text.size() > 9)
          throw bad("'" + std::string(range) + "' is not a number or a range a-b");
        const long lo = std::stol(std::string(lo_text)), hi = std::stol(std::string(hi_text));
        if (hi < lo) throw bad("range '" + std::string(range) + "' runs backwards");
        if (static_cast<std::size_t>(hi - lo) >= max_hosts) throw bad("range '" + std::string(range) + "' is too long");
        if (suffixes.size() + static_cast<std::size_t>(hi - lo) >= max_hosts) throw bad("more than 2^20 hosts");
        for (long v = lo; v <= hi; ++v) {
          std::string n = std::to_string(v);
          if (n.size() < lo_text.size()) n.insert(0, lo_text.size() - n.size(), '0');
          suffixes.push_back(std::move(n));
        }
        b = comma + 1;
      }
      if (partial.size() * suffixes.size() > max_hosts) throw bad("more than 2^20 hosts");
      std::size_t suffix_bytes = 0;
      for (const auto& s : suffixes) suffix_bytes += s.size();
      // each prefix once per suffix, each suffix once per prefix (below 2^44: no overflow)
      const std::size_t next_bytes = partial_bytes * suffixes.size() + suffix_bytes * partial.size();
      if (next_bytes > max_bytes - host_bytes) throw too_long();
      std::vector<std::string> next;
      next.reserve(partial.size() * suffixes.size());
      for (const auto& p : partial)
        for (const auto& s : suffixes) next.push_back(p + s);
      partial = std::move(next);
      partial_bytes = next_bytes;
      i = close + 1;
    }
    for (auto& p : partial) {
      if (hosts.size() >= max_hosts) throw bad("more than 2^20 hosts");
      hosts.push_back(std::move(p));
    }
    host_bytes += partial_bytes;
  }
  return hosts;
}

/// Slurm's tasks-per-node list: "2(x3),1" -> 2 2 2 1.
inline std::vector<int> expand_tasks_per_node(std::string_view text, const std::string& what) {
  const auto bad = [&] { return error(what + " = '" + std::string(text) + "' is not a tasks-per-node list like 2(x3),1"); };
  std::vector<int> counts;
  std::size_t b = 0;
  while (b <= text.size()) {
    auto comma = text.find(',', b);
    if (comma == std::string_view::npos) comma = text.size();
    auto item = text.substr(b, comma - b);
    long long repeat = 1;
    if (const auto paren = item.find('('); paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item[paren + 1] != 'x' || item.back() != ')') throw bad();
      const auto r = detail::parse_integer(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1 || *r > (1 << 20)) throw bad();
      repeat = *r;
      item = item.substr(0, paren);
    }
    const auto n = detail::parse_integer(item);
    if (!n || *n < 0 || *n > (1 << 20) || counts.size() + static_cast<std::size_t>(repeat) > (1u << 20)) throw bad();
    counts.insert(counts.end(), static_cast<std::size_t>(repeat), static_cast<int>(*n));
    b = comma + 1;
  }
  return counts;
}

namespace detail {

/// A JSON value that must be an array of "host:port" strings; `field` names it in errors.
inline std::vector<std::string> endpoint_list(const nlohmann::json& j, const std::string& var, const std::string& field) {
  if (!j.is_array()) throw error(var + ": " + field + " must be a list of \"host:port\" strings, not " + j.dump());
  std::vector<std::string> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const std::string f = field + "[" + std::to_string(i) + "]";
    if (!j[i].is_string()) throw error(var + ": " + f + " = " + j[i].dump() + " is not a \"host:port\" string");
    out.push_back(parse_endpoint(j[i].get<std::string>(), var + ": " + f).str());
  }
  return out;
}

inline nlohmann::json parse_json(const std::string& text, const std::string& var) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    const std::size_t at = e.byte > 0 ? e.byte - 1 : 0;
    const std::size_t from = at > 20 ? at - 20 : 0;
    throw error(var + ": invalid JSON at byte " + std::to_string(e.byte) + " (near '" + text.substr(from, at - from + 1) +
                "'): " + e.what());
  } catch (const nlohmann::json::out_of_range& e) {  // a number beyond a double's range: 1e999
    throw error(var + ": invalid JSON, a number out of range: " + e.what());
  }
}

/// A JSON index: an integer, or a string of digits (TF's Estimator accepted "1").
inline int json_index(const nlohmann::json& j, const std::string& var, const std::string& field) {
  if (j.is_number_integer()) {
    const auto v = j.get<long long>();
    if (v < 0 || v > (1 << 30)) throw error(var + ": " + field + " = " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
  }
  if (j.is_string()) {
    const auto v = parse_integer(j.get<std::string>());
    if (v && *v >= 0 && *v <= (1 << 30)) return static_cast<int>(*v);
  }
  throw error(var + ": " + field + " = " + j.dump() + " is not a non-negative integer");
}

/// The master is hosts[0], which the format calls `from` ("TF_CONFIG cluster.worker[0]").
inline void master_from_first(spec& s, const std::string& from) {
  const auto e = parse_endpoint(s.hosts.front(), s.source);
  s.master_addr = e.host;
  s.master_port = e.port;
  s.master_addr_from = s.master_port_from = from;
}

/// nullopt: a TF_CONFIG that says nothing (no cluster, no task), which counts as absent.
inline std::optional<spec> from_tf_config(const std::string& text) {
  const std::string var = "TF_CONFIG";
  const auto j = parse_json(text, var);
  if (!j.is_object()) throw error(var + ": must be a JSON object, not " + j.dump());
  spec s;
  s.source = var;
  const bool has_cluster = j.contains("cluster") && !j["cluster"].is_null();
  const bool has_task = j.contains("task") && !j["task"].is_null();
  if (!has_cluster || (j["cluster"].is_object() && j["cluster"].empty())) {
    if (!has_cluster && !has_task) return std::nullopt;
    std::string which = "this task";
    if (has_task && j["task"].is_object() && j["task"].contains("type") && j["task"]["type"].is_string())
      which = j["task"]["type"].get<std::string>() + " " + (j["task"].contains("index") ? j["task"]["index"].dump() : "0");
    throw error(var + ": cluster " + (has_cluster ? "is empty" : "missing") + " (" +
                (has_task ? "task is " + which + " of what?" : "a cluster with no tasks") +
                ") — TF_CONFIG must list the cluster's tasks, e.g. {\"cluster\": {\"worker\": [\"host1:2222\", "
                "\"host2:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}; unset it to train alone");
  }
  const auto& c = j["cluster"];
  if (!c.is_object()) throw error(var + ": cluster must be an object of task lists, not " + c.dump());
  const auto list = [&](const char* name) {
    return c.contains(name) ? endpoint_list(c[name], var, std::string("cluster.") + name) : std::vector<std::string>{};
  };
  auto chief = list("chief");
  const auto master = list("master");
  if (!chief.empty() && !master.empty()) throw error(var + ": cluster has both chief and master (master is the old name of chief)");
  if (chief.empty()) chief = master;
  const std::string chief_name = master.empty() ? "chief" : "master";
  if (chief.size() > 1)
    throw error(var + ": cluster." + chief_name + " has " + std::to_string(chief.size()) + " entries (at most 1)");
  const auto worker = list("worker");
  s.ps = list("ps");
  const auto evaluator = list("evaluator");
  if (chief.empty() && worker.empty()) throw error(var + ": cluster has no chief and no worker");
  s.hosts = chief;
  s.hosts.insert(s.hosts.end(), worker.begin(), worker.end());
  s.world_size = static_cast<int>(s.hosts.size());
  master_from_first(s, var + " cluster." + (chief.empty() ? std::string("worker") : chief_name) + "[0]");

  if (!j.contains("task")) {
    if (s.world_size == 1 && s.ps.empty()) return s;  // the only task there is
    throw error(var + ": task missing (the cluster lists " + std::to_string(s.world_size + static_cast<int>(s.ps.size())) +
                " tasks; which one is this?)");
  }
  const auto& t = j["task"];
  if (!t.is_object()) throw error(var + ": task must be an object {\"type\": ..., \"index\": ...}, not " + t.dump());
  if (!t.contains("type")) throw error(var + ": task.type missing");
  if (!t["type"].is_string()) throw error(var + ": task.type = " + t["type"].dump() + " is not a string");
  const std::string type = t["type"].get<std::string>();
  const int index = t.contains("index") ? json_index(t["index"], var, "task.index") : 0;
  const auto check_index = [&](const std::string& name, std::size_t n) {
    if (static_cast<std::size_t>(index) >= n)
      throw error(var + ": task.index = " + std::to_string(index) + " but cluster." + name + " has " + std::to_string(n) +
                  (n == 1 ? " entry" : " entries"));
  };
  s.task_index = index;
  if (type == "chief" || type == "master") {
    if (chief.empty()) throw error(var + ": task.type = '" + type + "' but the cluster has no " + type);
    check_index(type, chief.size());
    s.task_type = "chief";
    s.rank = 0;
  } else if (type == "worker") {
    check_index("worker", worker.size());
    s.task_type = "worker";
    s.rank = static_cast<int>(chief.size()) + index;
  } else if (type == "ps") {
    check_index("ps", s.ps.size());
    s.task_type = "ps";
    s.rank = -1;
  } else if (type == "evaluator") {
    if (!evaluator.empty()) check_index("evaluator", evaluator.size());
    s.task_type = "evaluator";
    s.rank = -1;
  } else {
    throw error(var + ": task.type = '" + type + "' is not one of chief, master, worker, ps, evaluator");
  }
  locals_from_hosts(s);
  return s;
}

inline spec from_torchrun(const env_lookup& env) {
  spec s;
  s.source = "torchrun";
  const auto role = env("GRADUS_ROLE").value_or("worker");
  if (role != "worker" && role != "ps") throw error("GRADUS_ROLE = '" + role + "' is not worker or ps");
  const bool has_rank = env("RANK").has_value();
  s.world_size = required_int(env, "WORLD_SIZE", 1, has_rank ? "RANK" : "GRADUS_ROLE");
  if (role == "ps") {
    if (has_rank) throw error("RANK is set while GRADUS_ROLE = ps (a parameter server has no worker rank)");
    s.task_type = "ps";
    s.rank = -1;
    s.task_index = required_int(env, "GRADUS_PS_INDEX", 0, "GRADUS_ROLE=ps");
  } else {
    // a Kubernetes Indexed Job gives each pod JOB_COMPLETION_INDEX (0 .. completions - 1):
    // the rank, where RANK is not set
    const char* rank_name = has_rank ? "RANK" : "JOB_COMPLETION_INDEX";
    if (!env(rank_name))
      throw error("RANK missing while WORLD_SIZE is set (a Kubernetes Indexed Job: JOB_COMPLETION_INDEX gives it)");
    s.rank = *int_var(env, rank_name, 0);
    s.task_index = s.rank;
    s.local_rank = int_var(env, "LOCAL_RANK", 0).value_or(0);
    s.local_world_size = int_var(env, "LOCAL_WORLD_SIZE", 1).value_or(s.local_rank + 1);
    check_ranks(s, rank_name, "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  }
  if (const auto addr = host_var(env, "MASTER_ADDR")) {
    s.master_addr = *addr;
    s.master_addr_from = "MASTER_ADDR";
  } else if (s.world_size > 1) {
    throw error("MASTER_ADDR missing while RANK is set (world size " + std::to_string(s.world_size) + ")");
  }
  if (const int p = port_var(env, "MASTER_PORT")) {
    s.master_port = p;
    s.master_port_from = "MASTER_PORT";
  }
  return s;
}

inline spec from_slurm(const env_lookup& env) {
  spec s;
  s.source = "slurm";
  s.rank = *int_var(env, "SLURM_PROCID", 0);
  s.task_index = s.rank;
  s.world_size = env("SLURM_NTASKS") ? *int_var(env, "SLURM_NTASKS", 1)
                                     : required_int(env, "SLURM_NPROCS", 1, "SLURM_PROCID (and SLURM_NTASKS is not)");
  s.local_rank = int_var(env, "SLURM_LOCALID", 0).value_or(0);
  // Tasks on this node: SLURM_STEP_TASKS_PER_NODE (srun's step) or SLURM_TASKS_PER_NODE
  // (the allocation), indexed by SLURM_NODEID.
  const std::string tpn_var = env("SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  const auto node_id = int_var(env, "SLURM_NODEID", 0);
  if (const auto tpn = env(tpn_var); tpn && node_id) {
    const auto counts = expand_tasks_per_node(*tpn, tpn_var);
    if (static_cast<std::size_t>(*node_id) >= counts.size())
      throw error("SLURM_NODEID = " + std::to_string(*node_id) + " but " + tpn_var + " = '" + *tpn + "' lists " +
                  std::to_string(counts.size()) + " nodes");
    s.local_world_size = counts[static_cast<std::size_t>(*node_id)];
  } else {
    s.local_world_size = s.local_rank + 1;  // at least
  }
  check_ranks(s, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", tpn_var);
  const std::string list_var = env("SLURM_STEP_NODELIST") ? "SLURM_STEP_NODELIST" : "SLURM_JOB_NODELIST";
  if (const auto list = env(list_var)) {
    s.nodes = expand_hostlist(*list, list_var);
    if (s.nodes.empty()) throw error(list_var + " is empty");
    s.master_addr = s.nodes.front();
    s.master_addr_from = list_var + " (first node)";
  } else if (s.world_size > 1 && !env("GRADUS_MASTER_ADDR")) {
    throw error("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST missing while SLURM_PROCID is set (world size " +
                std::to_string(s.world_size) + ")");
  }
  if (const auto addr = host_var(env, "GRADUS_MASTER_ADDR")) {
    s.master_addr = *addr;
    s.master_addr_from = "GRADUS_MASTER_ADDR";
  }
  if (const int p = port_var(env, "GRADUS_MASTER_PORT")) {
    s.master_port = p;
    s.master_port_from = "GRADUS_MASTER_PORT";
  } else if (const int q = port_var(env, "MASTER_PORT")) {
    s.master_port = q;
    s.master_port_from = "MASTER_PORT";
  } else if (const auto job = integer_var(env, "SLURM_JOB_ID", 0, 1LL << 62)) {
    s.master_port = 29500 + static_cast<int>(*job % 10000);
    s.master_port_from = "29500 + SLURM_JOB_ID mod 10000";
  }
  return s;
}

inline spec from_openmpi(const env_lookup& env) {
  spec s;
  s.source = "openmpi";
  s.rank = *int_var(env, "OMPI_COMM_WORLD_RANK", 0);
  s.task_index = s.rank;
  s.world_size = required_int(env, "OMPI_COMM_WORLD_SIZE", 1, "OMPI_COMM_WORLD_RANK");
  s.local_rank = int_var(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0).value_or(0);
  s.local_world_size = int_var(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1).value_or(s.local_rank + 1);
  check_ranks(s, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE");
  if (const auto addr = host_var(env, "GRADUS_MASTER_ADDR")) {
    s.master_addr = *addr;
    s.master_addr_from = "GRADUS_MASTER_ADDR";
  } else if (const auto maddr = host_var(env, "MASTER_ADDR")) {
    s.master_addr = *maddr;
    s.master_addr_from = "MASTER_ADDR";
  }
  if (const int p = port_var(env, "GRADUS_MASTER_PORT")) {
    s.master_port = p;
    s.master_port_from = "GRADUS_MASTER_PORT";
  } else if (const int q = port_var(env, "MASTER_PORT")) {
    s.master_port = q;
    s.master_port_from = "MASTER_PORT";
  }
  return s;
}

inline spec from_gradus_json(const env_lookup& env, const std::string& value) {
  const std::string var = "GRADUS_CLUSTER";
  std::string text = value, where = var;
  if (value.find_first_not_of(" \t\r\n") == std::string::npos) throw error(var + " is empty");
  if (value[value.find_first_not_of(" \t\r\n")] != '{') {
    std::ifstream in(value, std::ios::binary);
    if (!in) throw error(var + ": cannot read the cluster file '" + value + "'");
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    where = var + " file '" + value + "'";
  }
  const auto j = parse_json(text, where);
  if (!j.is_object()) throw error(where + ": must be a JSON object, not " + j.dump());
  for (const auto& [key, v] : j.items())
    if (key != "workers" && key != "ps" && key != "role" && key != "rank")
      throw error(where + ": unknown key '" + key + "' (expected workers, ps, role, rank)");
  if (!j.contains("workers")) throw error(where + ": workers missing");
  spec s;
  s.source = "gradus-json";
  s.hosts = endpoint_list(j["workers"], where, "workers");
  if (s.hosts.empty()) throw error(where + ": workers is empty");
  if (j.contains("ps")) s.ps = endpoint_list(j["ps"], where, "ps");
  s.world_size = static_cast<int>(s.hosts.size());
  master_from_first(s, var + " workers[0]");

  std::string role = "worker";
  if (const auto r = env("GRADUS_ROLE")) {
    role = *r;
    if (role != "worker" && role != "ps") throw error("GRADUS_ROLE = '" + role + "' is not worker or ps");
  } else if (j.contains("role")) {
    if (!j["role"].is_string() || (j["role"] != "worker" && j["role"] != "ps"))
      throw error(where + ": role = " + j["role"].dump() + " is not \"worker\" or \"ps\"");
    role = j["role"].get<std::string>();
  }
  int index = 0;
  std::string index_name;
  if (const auto r = int_var(env, "GRADUS_RANK", 0)) {
    index = *r;
    index_name = "GRADUS_RANK";
  } else if (j.contains("rank")) {
    index = json_index(j["rank"], where, "rank");
    index_name = where + ": rank";
  } else if (s.world_size > 1 || role == "ps") {
    throw error(where + ": rank missing (set \"rank\" in the file or GRADUS_RANK in the environment)");
  }
  const auto& list = role == "ps" ? s.ps : s.hosts;
  if (static_cast<std::size_t>(index) >= list.size())
    throw error(index_name + " = " + std::to_string(index) + " but " + (role == "ps" ? "ps" : "workers") + " has " +
                std::to_string(list.size()) + (list.size() == 1 ? " entry" : " entries"));
  s.task_type = role;
  s.task_index = index;
  s.rank = role == "ps" ? -1 : index;
  locals_from_hosts(s);
  return s;
}

inline void ps_from_env(spec& s, const env_lookup& env) {
  const auto list = env("GRADUS_PS");
  if (!list || list->empty()) return;
  std::size_t b = 0;
  for (int i = 0; b <= list->size(); ++i) {
    auto comma = list->find(',', b);
    if (comma == std::string::npos) comma = list->size();
    s.ps.push_back(parse_endpoint(std::string_view(*list).substr(b, comma - b), "GRADUS_PS[" + std::to_string(i) + "]").str());
    b = comma + 1;
  }
  if (s.task_type == "ps" && static_cast<std::size_t>(s.task_index) >= s.ps.size())
    throw error("GRADUS_PS_INDEX = " + std::to_string(s.task_index) + " but GRADUS_PS has " + std::to_string(s.ps.size()) +
                (s.ps.size() == 1 ? " entry" : " entries"));
}

}  // namespace detail

/// The cluster this process belongs to, from `env` (see the top of this file for the
/// formats and their order).
inline spec from_env(const env_lookup& env) {
  const auto present = [&](const char* name) {
    const auto v = env(name);
    return v && v->find_first_not_of(" \t\r\n") != std::string::npos;
  };
  spec s;
  std::optional<spec> tf;
  if (present("TF_CONFIG")) tf = detail::from_tf_config(*env("TF_CONFIG"));
  if (tf) {
    s = std::move(*tf);
  } else if (env("RANK") || env("WORLD_SIZE")) {
    s = detail::from_torchrun(env);
    detail::ps_from_env(s, env);
  } else if (env("SLURM_PROCID")) {
    s = detail::from_slurm(env);
    detail::ps_from_env(s, env);
  } else if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE")) {
    if (!env("OMPI_COMM_WORLD_RANK")) throw error("OMPI_COMM_WORLD_RANK missing while OMPI_COMM_WORLD_SIZE is set");
    s = detail::from_openmpi(env);
    detail::ps_from_env(s, env);
  } else if (const auto file = env("GRADUS_CLUSTER")) {
    s = detail::from_gradus_json(env, *file);
  }  // else a world of one
  if (present("GRADUS_JOB_ID")) s.job_id = *env("GRADUS_JOB_ID");
  else if (present("TORCHELASTIC_RUN_ID")) s.job_id = "torchrun " + *env("TORCHELASTIC_RUN_ID");
  else if (present("SLURM_JOB_ID")) s.job_id = "slurm " + *env("SLURM_JOB_ID") + (present("SLURM_STEP_ID") ? "." + *env("SLURM_STEP_ID") : "");
  if (const auto bind = env("GRADUS_BIND_ADDR")) {
    if (bind->find_first_not_of(" \t\r\n") == std::string::npos) throw error("GRADUS_BIND_ADDR is empty");
    s.bind_addr = *bind;
  }
  return s;
}

/// From a map of variables (tests, or a spec assembled by hand).
inline spec from_env(const std::map<std::string, std::string>& vars) {
  return from_env(env_lookup([&vars](const std::string& name) -> std::optional<std::string> {
    const auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  }));
}

/// From the process environment.
inline spec from_env() {
  return from_env(env_lookup([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  }));
}

}  // namespace gradus::cluster
