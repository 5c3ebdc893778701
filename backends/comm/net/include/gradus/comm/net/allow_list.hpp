#pragma once
// The allow-list of a CURVE server: which client public keys may connect, and the rank
// each may act as (a worker's rank comes from its key, never from what it writes in a
// message). Read from a file of "<public key> <rank>" lines; blank and comment lines are
// skipped:
//   # worker keys of job 17
//   rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7 0     # worker 0's w0.pub
//   Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[I#LV{hID 1
//   JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6 *     # any rank: a tool, not a worker
// A key appears once; a rank may have several keys (a key being replaced).
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/comm/net/curve_keys.hpp"
#include "gradus/core/error.hpp"

namespace gradus::net {

/// An allow-list rank meaning "any rank": the key's holder may act as every worker.
inline constexpr int any_rank = -1;

namespace detail_security {
inline std::string rank_text(int rank) { return rank == any_rank ? std::string("*") : std::to_string(rank); }
}  // namespace detail_security

/// Which client keys may connect, and the worker rank each may act as.
class allow_list {
 public:
  allow_list() = default;

  /// Lets `public_key` (Z85) connect as worker `rank` (>= 0) or as any rank (any_rank).
  void allow(const std::string& public_key, int rank) {
    if (const auto p = z85_key_problem(public_key); !p.empty()) throw error("gradus: allow_list: the public key " + p);
    if (rank < any_rank) throw error("gradus: allow_list: rank " + std::to_string(rank) + " (a worker rank >= 0, or any_rank)");
    if (const auto it = ranks_.find(public_key); it != ranks_.end())
      throw error("gradus: allow_list: key " + public_key + " is listed twice (ranks " + detail_security::rank_text(it->second) + " and " +
                  detail_security::rank_text(rank) + ")");
    ranks_.emplace(public_key, rank);
  }

  /// The rank a key may act as (any_rank: every one); nothing when it is not listed.
  std::optional<int> rank_of(std::string_view public_key) const {
    const auto it = ranks_.find(std::string(public_key));
    if (it == ranks_.end()) return std::nullopt;
    return it->second;
  }
  /// How many keys are listed.
  std::size_t size() const { return ranks_.size(); }
  /// Whether no key is listed (a CURVE server with an empty list would accept nobody).
  bool empty() const { return ranks_.empty(); }
  /// Every listed key (Z85) with its rank (any_rank: every one), ordered by key.
  const std::map<std::string, int>& entries() const { return ranks_; }

  /// One line of the file format: `"<key> <rank>"`, with an optional comment.
  static std::string line(const std::string& public_key, int rank, std::string_view comment = {}) {
    return public_key + " " + detail_security::rank_text(rank) + (comment.empty() ? "" : "  # " + std::string(comment)) + "\n";
  }

  /// Reads the `"<public key> <rank>"` format; errors name `origin` and the line.
  static allow_list parse(std::string_view text, const std::string& origin) {
    allow_list out;
    std::map<std::string, int> first_line;
    for (const auto& [n, line] : detail_security::content_lines(text)) {
      const std::string where = "gradus: allow-list '" + origin + "' line " + std::to_string(n) + ": ";
      const auto w = detail_security::words(line);
      if (w.size() != 2)
        throw error(where + "'" + line + "' is not '<public key> <rank>' (rank: a worker rank, or * for any; a comment follows ' # ')" +
                    detail_security::comment_hint(line));
      const std::string& key = w[0];
      const std::string& rank_text = w[1];
      if (const auto p = z85_key_problem(key); !p.empty()) throw error(where + "the public key " + p + detail_security::comment_hint(line));
      int rank = any_rank;
      if (rank_text != "*") {
        if (rank_text.empty() || rank_text.size() > 7 || !std::all_of(rank_text.begin(), rank_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
          throw error(where + "rank '" + rank_text + "' is not a worker rank (0, 1, ...) or * (any rank)");
        rank = std::atoi(rank_text.c_str());
      }
      if (const auto it = first_line.find(key); it != first_line.end())
        throw error(where + "key " + key + " is listed again (first on line " + std::to_string(it->second) + "); a key may act as one rank, or * for all");
      first_line[key] = n;
      out.ranks_.emplace(key, rank);
    }
    return out;
  }
  /// Reads the allow-list file at `path` (the format above). Throws gradus::error when the
  /// file cannot be read or a line is malformed (naming the file and the line), or when a key
  /// is listed twice.
  static allow_list load(const std::string& path) { return parse(detail_security::read_file(path, "allow-list"), path); }

 private:
  std::map<std::string, int> ranks_;  ///< Z85 public key -> rank or any_rank
};

}  // namespace gradus::net
