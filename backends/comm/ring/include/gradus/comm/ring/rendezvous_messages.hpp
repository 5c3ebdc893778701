#pragma once
// The ring's rendezvous messages, as text with one field a line (zmq_ring::rendezvous sends
// and receives them; tests/fuzz/fuzz_ring_rendezvous.cpp feeds the parsers arbitrary bytes,
// since anyone who reaches rank 0's rendezvous port can send it a registration):
//
//   registration (rank k -> rank 0)   "gradus-ring/9", rank, world_size, host, machine, the
//                                     transport asked for, the job id (may be empty), the
//                                     process id, the launch (net::launch_identity), then
//                                     one address a line
//   answer (rank 0 -> rank k)         "ok", the transport chosen, the ZeroMQ scheme, every
//                                     rank's data address, every rank's point-to-point
//                                     address, [every rank's shm:// or tcpd:// address when
//                                     the transport has its own data path], then how many
//                                     ranks share each rank's machine ("2 2 1")
//   refusal (rank 0 -> rank k)        "error", the reason
//
// The parsers check every field and say what is wrong, for rank 0 to refuse with (or rank k
// to fail with); they never throw.
#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace gradus::ring {

/// The first line of a registration: the protocol and its version (another is refused).
inline constexpr std::string_view registration_magic = "gradus-ring/9";

/// "a\nb\n" -> {"a", "b"}; a last line without '\n' counts, an empty last piece does not.
inline std::vector<std::string> split_lines(std::string_view s) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= s.size()) {
    const auto nl = s.find('\n', start);
    if (nl == std::string_view::npos) {
      if (start < s.size()) out.emplace_back(s.substr(start));
      break;
    }
    out.emplace_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

/// Words separated by spaces.
inline std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && s[i] == ' ') ++i;
    const std::size_t j = s.find(' ', i);
    if (i < s.size()) out.emplace_back(s.substr(i, (j == std::string_view::npos ? s.size() : j) - i));
    i = j == std::string_view::npos ? s.size() : j;
  }
  return out;
}

/// A whole decimal int (no sign but '-', no spaces, no trailing text), else nullopt.
inline std::optional<int> parse_int(std::string_view s) {
  int v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

/// What rank k tells rank 0 at the rendezvous.
struct registration {
  /// \var rank
  /// The registering rank (rank 0 refuses one outside [0, world) or already present).
  /// \var world
  /// Its world_size (rank 0 refuses one that differs from its own).
  int rank = -1, world = -1;
  /// \var host
  /// Its host name (net::hostname()).
  /// \var machine
  /// Its machine and network namespace (net::machine_and_netns()): ranks that share it may
  /// use shared memory and ipc.
  /// \var want
  /// The transport it asks for (ring_options::transport): every rank must ask for the same.
  /// \var job
  /// Its job id (ring_options::job_id; may be empty): rank 0 refuses a rank of another job.
  /// \var pid
  /// Its process id (errors name the process).
  /// \var launch
  /// What started it (net::launch_identity: the parent process and its start): when two
  /// processes claim one rank, the one of rank 0's launch is kept.
  std::string host, machine, want, job, pid, launch;
  std::vector<std::string> addrs;  ///< every address it listens on, each with its scheme (tcp://, ipc://, shm://, tcpd://, p2p+...)
};

/// A registration as the text rank k sends: one field a line, then one address a line.
inline std::string format_registration(const registration& r) {
  std::string s = std::string(registration_magic) + "\n" + std::to_string(r.rank) + "\n" + std::to_string(r.world) + "\n" +
                  r.host + "\n" + r.machine + "\n" + r.want + "\n" + r.job + "\n" + r.pid + "\n" + r.launch + "\n";
  for (const auto& a : r.addrs) s += a + "\n";
  return s;
}

/// The registration in `body`, or nullopt with `why` saying what is wrong with it.
inline std::optional<registration> parse_registration(std::string_view body, std::string& why) {
  const auto lines = split_lines(body);
  if (lines.size() < 10 || lines[0] != registration_magic) {
    why = "a malformed registration (not a gradus ring rank, or one of another gradus version?)";
    return std::nullopt;
  }
  const auto rank = parse_int(lines[1]), world = parse_int(lines[2]);
  if (!rank || !world) {
    why = "a registration with a malformed rank or world_size";
    return std::nullopt;
  }
  return registration{*rank,    *world,   lines[3], lines[4], lines[5], lines[6], lines[7], lines[8],
                      std::vector<std::string>(lines.begin() + 9, lines.end())};
}

/// Whether a transport has a data path of its own (its addresses travel in the answer).
inline bool has_data_path(std::string_view transport) { return transport == "shm" || transport == "tcp"; }

/// What rank 0 tells every rank once all have registered.
struct answer {
  /// \var transport
  /// The data path chosen: "shm", "tcp", "zmq-ipc", "zmq-tcp" or "inproc".
  /// \var zmq_scheme
  /// The scheme of the ZeroMQ sockets (control plane, and data for zmq-*): tcp, ipc or inproc.
  std::string transport, zmq_scheme;
  /// \var table
  /// Every rank's ZeroMQ data address, by rank.
  /// \var p2p_table
  /// Every rank's point-to-point address (ring::mesh), by rank.
  /// \var data_table
  /// Every rank's address on its own data path (shm:// or tcpd://), by rank; empty for the
  /// ZeroMQ paths.
  std::vector<std::string> table, p2p_table, data_table;
  std::vector<int> local_ranks;  ///< how many ranks share each rank's machine
};

/// An answer as the text rank 0 sends ("ok", then one field a line).
inline std::string format_answer(const answer& a) {
  std::string s = "ok\n" + a.transport + "\n" + a.zmq_scheme + "\n";
  for (const auto* t : {&a.table, &a.p2p_table, &a.data_table})
    for (const auto& e : *t) s += e + "\n";
  for (std::size_t r = 0; r < a.local_ranks.size(); ++r) {
    if (r) s += ' ';
    s += std::to_string(a.local_ranks[r]);
  }
  return s + "\n";
}

/// A refusal as the text rank 0 sends ("error", then the reason).
inline std::string format_refusal(std::string_view reason) { return "error\n" + std::string(reason); }

/// Rank 0's reply in `body` to a rank of a world of `world`: an answer; or nullopt with
/// `why` holding rank 0's refusal (`refused` set) or what is malformed about the reply.
inline std::optional<answer> parse_answer(std::string_view body, int world, std::string& why, bool& refused) {
  refused = false;
  const auto lines = split_lines(body);
  if (lines.empty()) {
    why = "empty answer from rank 0";
    return std::nullopt;
  }
  if (lines[0] == "error") {
    refused = true;
    why = lines.size() > 1 && !lines[1].empty() ? lines[1] : "rank 0 refused the registration";
    return std::nullopt;
  }
  const std::size_t w = world > 0 ? static_cast<std::size_t>(world) : 0;
  if (lines[0] != "ok" || lines.size() < 4 || w == 0 || lines.size() != 4 + (has_data_path(lines[1]) ? 3 * w : 2 * w)) {
    why = "malformed answer from rank 0 (a different gradus version?)";
    return std::nullopt;
  }
  answer a;
  a.transport = lines[1];
  a.zmq_scheme = lines[2];
  const auto at = [&](std::size_t i) { return lines.begin() + 3 + static_cast<std::ptrdiff_t>(i); };
  a.table.assign(at(0), at(w));
  a.p2p_table.assign(at(w), at(2 * w));
  if (has_data_path(a.transport)) a.data_table.assign(at(2 * w), lines.end() - 1);
  for (const auto& c : split_words(lines.back())) {
    const auto n = parse_int(c);
    if (!n || *n < 1) {
      why = "malformed answer from rank 0 (ranks per machine '" + lines.back() + "')";
      return std::nullopt;
    }
    a.local_ranks.push_back(*n);
  }
  if (a.local_ranks.size() != w) {
    why = "malformed answer from rank 0 (" + std::to_string(a.local_ranks.size()) + " ranks-per-machine counts for " +
          std::to_string(w) + " ranks)";
    return std::nullopt;
  }
  return a;
}

}  // namespace gradus::ring
