#pragma once
// CurveZMQ security for the parameter server: key pairs and their files, the allow-list of
// client keys, the ZAP handler that checks them, socket set-up, and the words for a
// refused handshake.
//
// How a connection is authenticated (RFC 26 CurveZMQ, RFC 27 ZAP):
//   1. the server's ROUTER is a CURVE server (make_curve_server) with ZAP domain
//      "gradus-ps"; each worker's DEALER is a CURVE client (make_curve_client) that knows
//      the server's public key and holds its own key pair;
//   2. during the handshake libzmq proves that the client holds the secret key of the
//      public key it presents, and asks the context's ZAP handler (zap_handler, at
//      inproc://zeromq.zap.01) whether that key may connect;
//   3. the handler answers 200 with User-Id "worker:<rank>" for a key in the allow-list,
//      400 otherwise: the client gets an ERROR and no connection, its socket monitor sees
//      ZMQ_EVENT_HANDSHAKE_FAILED_AUTH (describe_handshake_failure says what it means);
//   4. every message from an accepted connection carries that User-Id
//      (rank_from_user_id): a worker's rank comes from its key, never from what it writes
//      in a message or its routing id (ps-lite's weakness: node ids taken from an
//      unauthenticated identity frame).
//
// Failing closed: make_curve_server sets ZMQ_ZAP_ENFORCE_DOMAIN, so a CURVE server whose
// context has no ZAP handler refuses every client (libzmq's default would accept any key:
// encryption without authentication). A client without keys (NULL mechanism) never gets
// past the greeting of a CURVE server (mechanism mismatch). The handler itself refuses
// every mechanism but CURVE and every ZAP domain but "gradus-ps" (libzmq asks it about
// NULL connections only where a socket sets a ZAP domain).
//
// Requires libzmq >= 4.3.1 built with CURVE (libsodium): CVE-2019-6250 was a pre-auth
// remote code execution in 4.3.0 and older.
//
// Key files (gradus-keygen writes them). Z85 keys may hold '#' and '=', so a comment is a
// line that is a lone '#' or begins with '# ' (a hash and a blank), and a comment after a
// value is ' # ...' (blank, hash, blank).
//   <name>.pub  the public key: comment lines and one line holding the 40-character Z85
//               text. Give it out freely (the allow-list, the workers).
//   <name>.key  the key pair: "public-key = <z85>" and "secret-key = <z85>" lines; mode
//               0600, refused when group or others may read it (as ssh does).
//
// Allow-list file ("<public key> <rank>" lines; blank and comment lines are skipped):
//   # worker keys of job 17
//   rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7 0     # worker 0's w0.pub
//   Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[I#LV{hID 1
//   JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6 *     # any rank: a tool, not a worker
// A key appears once; a rank may have several keys (a key being replaced).
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gradus/core/error.hpp"

namespace gradus::ps {

// The ZAP domain of the parameter server's sockets; the handler refuses any other.
inline constexpr const char* curve_zap_domain = "gradus-ps";
// An allow-list rank meaning "any rank": the key's holder may act as every worker.
inline constexpr int any_rank = -1;
// The monitor events that say a handshake failed (for zmq_socket_monitor).
inline constexpr int handshake_failure_events =
    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;

// A CURVE key pair, each key as 40 characters of Z85 text.
struct key_pair {
  std::string public_key, secret_key;
};

namespace detail_security {

inline std::string errno_text(int e) { return std::strerror(e); }

inline std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

// Whether a (trimmed) line is a comment: a lone '#', or '#' and a blank (never a key:
// those hold no blanks).
inline bool is_comment(std::string_view t) { return t == "#" || t.starts_with("# ") || t.starts_with("#\t"); }

// The blank-separated words of a line, up to a comment word ("#" or "# ...").
inline std::vector<std::string> words(std::string_view line) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    at = line.find_first_not_of(" \t\r", at);
    if (at == std::string_view::npos) break;
    const auto end = line.find_first_of(" \t\r", at);
    const std::string_view w = line.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    if (w == "#") break;
    out.emplace_back(w);
    if (end == std::string_view::npos) break;
    at = end;
  }
  return out;
}

// The lines of a text that are neither blank nor comments, trimmed, each with its 1-based
// line number.
inline std::vector<std::pair<int, std::string>> content_lines(std::string_view text) {
  std::vector<std::pair<int, std::string>> out;
  int number = 0;
  std::size_t at = 0;
  while (at <= text.size()) {
    const auto nl = text.find('\n', at);
    const std::string_view line = text.substr(at, nl == std::string_view::npos ? std::string_view::npos : nl - at);
    ++number;
    if (auto t = trim(line); !t.empty() && !is_comment(t)) out.emplace_back(number, std::move(t));
    if (nl == std::string_view::npos) break;
    at = nl + 1;
  }
  return out;
}

// A key file line: "public-key = <key>", "secret-key = <key>", or a bare key (name "").
// Fails (nullopt) when it is none of these.
struct key_line {
  std::string name, value;
};
inline std::optional<key_line> parse_key_line(const std::string& line) {
  for (const char* name : {"public-key", "secret-key"}) {
    if (!line.starts_with(name)) continue;
    const auto eq = line.find_first_not_of(" \t", std::strlen(name));
    if (eq == std::string::npos || line[eq] != '=') continue;
    const auto w = words(std::string_view(line).substr(eq + 1));
    if (w.size() != 1) return std::nullopt;
    return key_line{name, w[0]};
  }
  const auto w = words(line);
  if (w.size() != 1) return std::nullopt;
  return key_line{"", w[0]};
}

// What to add to a key problem found on a line that begins with '#'.
inline std::string comment_hint(const std::string& line) {
  return line.starts_with("#") ? " (a comment line begins with '# ', a hash and a blank)" : "";
}

inline std::string read_file(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    throw error("gradus: cannot read the " + std::string(what) + " file '" + path + "': " + errno_text(e) +
                (e == ENOENT ? " (gradus-keygen <name> writes <name>.key and <name>.pub)" : ""));
  }
  std::string text;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      throw error("gradus: cannot read the " + std::string(what) + " file '" + path + "': " + errno_text(e));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (text.size() > (1u << 20)) {
      ::close(fd);
      throw error("gradus: the " + std::string(what) + " file '" + path + "' is larger than 1 MiB: not a gradus key or allow-list file");
    }
  }
  ::close(fd);
  return text;
}

// Writes `content` to `path` atomically (a temporary file in the same directory, synced,
// then renamed; or linked, which fails if `path` exists, when overwriting is not allowed).
inline void write_file_atomically(const std::string& path, const std::string& content, mode_t mode, bool overwrite) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) throw error("gradus: cannot write '" + path + "' (creating " + tmp + "): " + errno_text(errno));
  const auto fail = [&](const std::string& what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw error("gradus: cannot write '" + path + "': " + what + ": " + errno_text(e));
  };
  if (::fchmod(fd, mode) != 0) fail("fchmod");  // the umask may have taken bits; never adds any
  for (std::size_t at = 0; at < content.size();) {
    const ssize_t n = ::write(fd, content.data() + at, content.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write");
    at += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw error("gradus: cannot write '" + path + "': close: " + errno_text(e));
  }
  if (overwrite) {
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const int e = errno;
      ::unlink(tmp.c_str());
      throw error("gradus: cannot write '" + path + "': rename: " + errno_text(e));
    }
  } else {
    const int rc = ::link(tmp.c_str(), path.c_str());
    const int e = errno;
    ::unlink(tmp.c_str());
    if (rc != 0)
      throw error("gradus: cannot write '" + path + "': " +
                  (e == EEXIST ? std::string("it exists (gradus-keygen --force, or save_key_pair(..., true), replaces it)") : errno_text(e)));
  }
  const auto slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);  // the rename itself survives a crash
    ::close(dfd);
  }
}

inline std::string rank_text(int rank) { return rank == any_rank ? std::string("*") : std::to_string(rank); }

}  // namespace detail_security

// Throws gradus::error unless this libzmq can do CURVE and is 4.3.1 or newer.
inline void require_curve() {
  int major = 0, minor = 0, patch = 0;
  zmq_version(&major, &minor, &patch);
  const std::string version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
  if (!zmq_has("curve"))
    throw error("gradus: CURVE security: libzmq " + version +
                " was built without CURVE (zmq_has(\"curve\") is false); use one built with libsodium (Debian's libzmq5 is)");
  if (major * 10000 + minor * 100 + patch < 40301)
    throw error("gradus: CURVE security needs libzmq 4.3.1 or newer (CVE-2019-6250 let unauthenticated peers run code in older ones); this is " + version);
}

// Empty when `text` is a valid Z85 CURVE key; otherwise what is wrong with it.
inline std::string z85_key_problem(std::string_view text) {
  static constexpr std::string_view alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
  if (text.size() != 40)
    return "is " + std::to_string(text.size()) + " characters long; a CURVE key in Z85 is 40 (the file may be truncated or not a key)";
  for (std::size_t i = 0; i < text.size(); ++i)
    if (alphabet.find(text[i]) == std::string_view::npos) {
      const unsigned char c = static_cast<unsigned char>(text[i]);
      char shown[8];
      if (c >= 0x21 && c < 0x7f) std::snprintf(shown, sizeof shown, "'%c'", c);
      else std::snprintf(shown, sizeof shown, "0x%02x", c);
      return "has " + std::string(shown) + " at character " + std::to_string(i + 1) + ", which is not Z85";
    }
  std::uint8_t bin[32];
  const std::string z(text);
  if (!zmq_z85_decode(bin, z.c_str())) return "is not valid Z85 (a group of 5 characters overflows 32 bits)";
  return {};
}

// The 32 bytes of a key as Z85 text.
inline std::string z85_encode_key(const std::uint8_t (&key)[32]) {
  char text[41];
  if (!zmq_z85_encode(text, key, 32)) throw error("gradus: zmq_z85_encode failed");
  return std::string(text, 40);
}

// The public key of a secret key (both Z85).
inline std::string public_key_of(const std::string& secret_key) {
  if (const auto p = z85_key_problem(secret_key); !p.empty()) throw error("gradus: CURVE secret key " + p);
  char pub[41];
  if (zmq_curve_public(pub, secret_key.c_str()) != 0) throw error("gradus: zmq_curve_public: " + detail_security::errno_text(errno));
  return std::string(pub, 40);
}

// A fresh key pair (libsodium's random generator).
inline key_pair generate_key_pair() {
  require_curve();
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) throw error("gradus: zmq_curve_keypair failed: " + detail_security::errno_text(errno));
  key_pair kp{std::string(pub, 40), std::string(sec, 40)};
  std::memset(sec, 0, sizeof sec);
  return kp;
}

// Throws unless both keys are Z85 and the public key belongs to the secret key.
inline void check_key_pair(const key_pair& kp, const std::string& origin) {
  if (const auto p = z85_key_problem(kp.public_key); !p.empty()) throw error("gradus: " + origin + ": the public key " + p);
  if (const auto p = z85_key_problem(kp.secret_key); !p.empty()) throw error("gradus: " + origin + ": the secret key " + p);
  if (public_key_of(kp.secret_key) != kp.public_key)
    throw error("gradus: " + origin + ": the public key does not belong to the secret key (a file edited or mixed up with another's?)");
}

// The file names of a key pair: "<prefix>.key" and "<prefix>.pub". A path that already
// ends in ".key" or ".pub" names the pair by its prefix.
inline std::string key_prefix(const std::string& path) {
  if (path.size() > 4 && (path.ends_with(".key") || path.ends_with(".pub"))) return path.substr(0, path.size() - 4);
  return path;
}

inline std::string public_key_file_text(const std::string& public_key, std::string_view name) {
  return "# gradus CURVE public key of '" + std::string(name) +
         "' (gradus-keygen). Share it: servers list workers' keys in their allow-list,\n"
         "# workers are given the servers' keys.\n" +
         public_key + "\n";
}
inline std::string secret_key_file_text(const key_pair& kp, std::string_view name) {
  return "# gradus CURVE key pair of '" + std::string(name) +
         "' (gradus-keygen). SECRET: keep it on the host that uses it, mode 0600.\n"
         "public-key = " + kp.public_key + "\n" +
         "secret-key = " + kp.secret_key + "\n";
}

// Writes <prefix>.key (mode 0600) and <prefix>.pub (0644), each atomically. Refuses to
// replace either file unless `overwrite`.
inline void save_key_pair(const std::string& path, const key_pair& kp, bool overwrite = false) {
  const std::string prefix = key_prefix(path);
  check_key_pair(kp, "save_key_pair('" + prefix + "')");
  const std::string name = prefix.substr(prefix.rfind('/') == std::string::npos ? 0 : prefix.rfind('/') + 1);
  if (!overwrite)
    for (const auto& f : {prefix + ".key", prefix + ".pub"}) {
      struct stat st {};
      if (::lstat(f.c_str(), &st) == 0)
        throw error("gradus: save_key_pair: '" + f + "' exists; not replacing a key (gradus-keygen --force, or overwrite = true, replaces it)");
    }
  detail_security::write_file_atomically(prefix + ".key", secret_key_file_text(kp, name), 0600, overwrite);
  detail_security::write_file_atomically(prefix + ".pub", public_key_file_text(kp.public_key, name), 0644, overwrite);
}

// The public key in a .pub file (a bare key line, or "public-key = <key>"), or the public
// key of a .key file.
inline std::string load_public_key(const std::string& path) {
  const std::string text = detail_security::read_file(path, "CURVE public key");
  std::string key;
  int key_line = 0;
  for (const auto& [n, line] : detail_security::content_lines(text)) {
    const auto kl = detail_security::parse_key_line(line);
    if (!kl) throw error("gradus: CURVE public key file '" + path + "' line " + std::to_string(n) + ": '" + line + "' is not a key");
    if (kl->name == "secret-key") continue;  // a .key file: its public-key line is the answer
    if (!key.empty())
      throw error("gradus: CURVE public key file '" + path + "' holds two keys (lines " + std::to_string(key_line) + " and " + std::to_string(n) + ")");
    if (const auto p = z85_key_problem(kl->value); !p.empty())
      throw error("gradus: CURVE public key file '" + path + "' line " + std::to_string(n) + ": the key " + p + detail_security::comment_hint(line));
    key = kl->value;
    key_line = n;
  }
  if (key.empty()) throw error("gradus: CURVE public key file '" + path + "' holds no key (empty or truncated; gradus-keygen writes one)");
  return key;
}

// The key pair in <prefix>.key (`path` is the prefix or the .key file itself). Refused
// when group or others may access the file, when a key is not Z85, or when the public key
// does not belong to the secret key.
inline key_pair load_key_pair(const std::string& path) {
  const std::string file = key_prefix(path) + ".key";
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) {
    const int e = errno;
    throw error("gradus: cannot read the CURVE key pair file '" + file + "': " + detail_security::errno_text(e) +
                (e == ENOENT ? " (gradus-keygen <name> writes <name>.key and <name>.pub)" : ""));
  }
  if (st.st_mode & 0077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw error("gradus: CURVE key pair file '" + file + "' has mode " + mode +
                ": group or others may access it, and it holds a secret key; chmod 600 '" + file + "' (and make a new key if others read it)");
  }
  const std::string text = detail_security::read_file(file, "CURVE key pair");
  key_pair kp;
  std::map<std::string, int> seen;
  for (const auto& [n, line] : detail_security::content_lines(text)) {
    const auto kl = detail_security::parse_key_line(line);
    if (!kl || kl->name.empty())
      throw error("gradus: CURVE key pair file '" + file + "' line " + std::to_string(n) +
                  ": expected 'public-key = <key>' or 'secret-key = <key>' (is it a .pub file? the key pair is <name>.key)");
    const std::string& name = kl->name;
    if (seen.count(name)) throw error("gradus: CURVE key pair file '" + file + "' line " + std::to_string(n) + ": a second " + name);
    seen[name] = n;
    if (const auto p = z85_key_problem(kl->value); !p.empty())
      throw error("gradus: CURVE key pair file '" + file + "' line " + std::to_string(n) + ": the " + name + " " + p);
    (name == "public-key" ? kp.public_key : kp.secret_key) = kl->value;
  }
  if (kp.secret_key.empty()) throw error("gradus: CURVE key pair file '" + file + "' holds no secret-key line (empty or truncated?)");
  const std::string derived = public_key_of(kp.secret_key);
  if (!kp.public_key.empty() && kp.public_key != derived)
    throw error("gradus: CURVE key pair file '" + file + "' line " + std::to_string(seen["public-key"]) +
                ": the public key does not belong to the secret key (the file was edited or mixed up)");
  kp.public_key = derived;
  return kp;
}

// Which client keys may connect, and the worker rank each may act as.
class allow_list {
 public:
  allow_list() = default;

  // Lets `public_key` (Z85) connect as worker `rank` (>= 0) or as any rank (any_rank).
  void allow(const std::string& public_key, int rank) {
    if (const auto p = z85_key_problem(public_key); !p.empty()) throw error("gradus: allow_list: the public key " + p);
    if (rank < any_rank) throw error("gradus: allow_list: rank " + std::to_string(rank) + " (a worker rank >= 0, or any_rank)");
    if (const auto it = ranks_.find(public_key); it != ranks_.end())
      throw error("gradus: allow_list: key " + public_key + " is listed twice (ranks " + detail_security::rank_text(it->second) + " and " +
                  detail_security::rank_text(rank) + ")");
    ranks_.emplace(public_key, rank);
  }

  // The rank a key may act as (any_rank: every one); nothing when it is not listed.
  std::optional<int> rank_of(std::string_view public_key) const {
    const auto it = ranks_.find(std::string(public_key));
    if (it == ranks_.end()) return std::nullopt;
    return it->second;
  }
  std::size_t size() const { return ranks_.size(); }
  bool empty() const { return ranks_.empty(); }
  const std::map<std::string, int>& entries() const { return ranks_; }

  // One line of the file format: "<key> <rank>", with an optional comment.
  static std::string line(const std::string& public_key, int rank, std::string_view comment = {}) {
    return public_key + " " + detail_security::rank_text(rank) + (comment.empty() ? "" : "  # " + std::string(comment)) + "\n";
  }

  // Reads the "<public key> <rank>" format; errors name `origin` and the line.
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
  static allow_list load(const std::string& path) { return parse(detail_security::read_file(path, "allow-list"), path); }

 private:
  std::map<std::string, int> ranks_;  // Z85 public key -> rank or any_rank
};

// A connection the ZAP handler refused.
struct refusal {
  std::string public_key;  // the client's key (Z85); empty for a mechanism without keys
  std::string address;     // the client's IP address, as ZAP gives it
  std::string mechanism;   // "CURVE", "NULL", "PLAIN"
  std::string reason;      // the status text of the answer
  std::uint64_t times = 1; // refusals of this key from this address so far
};

// Answers libzmq's ZAP requests (RFC 27) for every socket of one ZeroMQ context: a CURVE
// client key in the allow-list is accepted (200) with User-Id "worker:<rank>" (or
// "worker:*" for any_rank); everything else is refused (400). Runs a thread that owns a
// REP socket bound at inproc://zeromq.zap.01.
//
// One ZAP handler per context: that endpoint can be bound once, so a second handler in
// the same context throws; servers sharing a context share one (for_context). Create it
// before the sockets that use CURVE begin a handshake (before bind/connect), and destroy
// it before its context; while it is gone, CURVE servers made by make_curve_server refuse
// every client (ZMQ_ZAP_ENFORCE_DOMAIN). The destructor stops the thread within
// milliseconds (a message on an inproc pair).
class zap_handler {
 public:
  static constexpr const char* endpoint = "inproc://zeromq.zap.01";

  zap_handler(zmq::context_t& ctx, allow_list allowed) : allowed_(std::move(allowed)), zap_(ctx, zmq::socket_type::rep) {
    require_curve();
    zap_.set(zmq::sockopt::linger, 0);
    try {
      zap_.bind(endpoint);
    } catch (const zmq::error_t& e) {
      if (e.num() == EADDRINUSE)
        throw error(std::string("gradus: zap_handler: this ZeroMQ context already has a ZAP handler (") + endpoint +
                    " is bound); one handler answers for every socket of a context");
      throw error(std::string("gradus: zap_handler: cannot bind ") + endpoint + ": " + e.what());
    }
    static std::atomic<unsigned long> counter{0};
    const std::string stop_ep = "inproc://gradus-zap-stop-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    stop_rx_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    stop_rx_.set(zmq::sockopt::linger, 0);
    stop_rx_.bind(stop_ep);
    stop_tx_ = zmq::socket_t(ctx, zmq::socket_type::pair);
    stop_tx_.set(zmq::sockopt::linger, 0);
    stop_tx_.connect(stop_ep);
    // zap_ and stop_rx_ belong to the thread from here on (its start orders the hand-over)
    thread_ = std::thread([this] { run(); });
  }
  zap_handler(const zap_handler&) = delete;
  zap_handler& operator=(const zap_handler&) = delete;
  ~zap_handler() {
    stopping_.store(true, std::memory_order_release);
    try {
      (void)stop_tx_.send(zmq::message_t(), zmq::send_flags::dontwait);
    } catch (const zmq::error_t&) {
    }
    if (thread_.joinable()) thread_.join();  // also bounded without the message: the thread polls every 100 ms
    try {
      zap_.unbind(endpoint);  // at once, so that a next handler may bind (closing frees it later)
    } catch (const zmq::error_t&) {
    }
    stop_tx_.close();
    stop_rx_.close();
    zap_.close();
  }

  // The handler of `ctx`, shared by the servers of one context (tests run several in one
  // process): made on first use, reused while it lives, for the same allow-list only.
  static std::shared_ptr<zap_handler> for_context(zmq::context_t& ctx, const allow_list& allowed) {
    static std::mutex mu;
    static std::map<void*, std::weak_ptr<zap_handler>> handlers;
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = handlers.begin(); it != handlers.end();) it = it->second.expired() ? handlers.erase(it) : std::next(it);
    auto& slot = handlers[ctx.handle()];
    if (auto h = slot.lock()) {
      if (h->allowed().entries() != allowed.entries())
        throw error("gradus: zap_handler: two parameter servers in one ZeroMQ context with different allow-lists (" +
                    std::to_string(h->allowed().size()) + " and " + std::to_string(allowed.size()) +
                    " keys); a context has one ZAP handler: give each server its own context");
      return h;
    }
    auto h = std::make_shared<zap_handler>(ctx, allowed);
    slot = h;
    return h;
  }

  std::uint64_t accepted() const { return accepted_.load(std::memory_order_relaxed); }
  std::uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  const allow_list& allowed() const { return allowed_; }

  // The latest refusal, for a server's log.
  std::optional<refusal> last_refusal() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }
  // The refusals of keys (and addresses) not reported before, oldest first: a server logs
  // each refused client once, not at each of its reconnections (every 100 ms by default).
  std::vector<refusal> take_new_refusals() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<refusal> out(fresh_.begin(), fresh_.end());
    fresh_.clear();
    return out;
  }

 private:
  struct answer {
    std::string code, text, user_id;
  };

  void run() {
    while (!stopping_.load(std::memory_order_acquire)) {
      zmq::pollitem_t items[2] = {{zap_.handle(), 0, ZMQ_POLLIN, 0}, {stop_rx_.handle(), 0, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 2, std::chrono::milliseconds(100));
      } catch (const zmq::error_t&) {
        return;  // the context is terminating
      }
      if (items[1].revents & ZMQ_POLLIN) return;
      if (items[0].revents & ZMQ_POLLIN) serve_one();
    }
  }

  void serve_one() {
    std::vector<zmq::message_t> req;
    try {
      do {
        zmq::message_t m;
        if (!zap_.recv(m, zmq::recv_flags::dontwait)) break;
        req.push_back(std::move(m));
      } while (req.back().more() && req.size() < 16);
      while (!req.empty() && req.back().more()) {  // more frames than ZAP has: drop the rest
        zmq::message_t m;
        if (!zap_.recv(m, zmq::recv_flags::dontwait)) break;
        req.back() = std::move(m);
      }
    } catch (const zmq::error_t&) {
      return;
    }
    if (req.empty()) return;
    const answer a = decide(req);
    const std::string request_id = req.size() > 1 ? req[1].to_string() : std::string();
    try {
      zap_.send(zmq::buffer(std::string_view("1.0")), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(request_id), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(a.code), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(a.text), zmq::send_flags::sndmore);
      zap_.send(zmq::buffer(a.user_id), zmq::send_flags::sndmore);
      zap_.send(zmq::message_t(), zmq::send_flags::none);  // no metadata
    } catch (const zmq::error_t&) {
      // the handshake that asked is gone; REP is ready for the next request
    }
  }

  // RFC 27 request: version, request id, domain, address, routing id, mechanism,
  // credentials (CURVE: the client's 32-byte long-term public key).
  answer decide(const std::vector<zmq::message_t>& req) {
    if (req.size() < 6 || req[0].to_string_view() != "1.0") return {"500", "malformed ZAP request (RFC 27, version 1.0)", ""};
    const std::string domain = req[2].to_string(), address = req[3].to_string(), mechanism = req[5].to_string();
    refusal r;
    r.address = address;
    r.mechanism = mechanism;
    if (mechanism == "CURVE" && req.size() == 7 && req[6].size() == 32) {
      std::uint8_t key[32];
      std::memcpy(key, req[6].data(), 32);
      r.public_key = z85_encode_key(key);
    }
    if (domain != curve_zap_domain) r.reason = "ZAP domain '" + domain + "' is not " + curve_zap_domain;
    else if (mechanism != "CURVE") r.reason = "mechanism " + mechanism + " is not allowed (CURVE only)";
    else if (r.public_key.empty()) r.reason = "malformed CURVE credentials";
    else if (const auto rank = allowed_.rank_of(r.public_key)) {
      accepted_.fetch_add(1, std::memory_order_relaxed);
      return {"200", "OK", "worker:" + detail_security::rank_text(*rank)};
    } else {
      r.reason = "key not in the allow-list";
    }
    refused_.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    const std::string who = r.public_key + " " + r.address;
    if (times_.size() >= 4096 && !times_.count(who)) times_.erase(times_.begin());  // bounded memory
    r.times = ++times_[who];
    last_ = r;
    if (r.times == 1) {
      fresh_.push_back(r);
      if (fresh_.size() > 64) fresh_.pop_front();
    }
    return {"400", r.reason, ""};
  }

  const allow_list allowed_;
  zmq::socket_t zap_, stop_rx_, stop_tx_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> accepted_{0}, refused_{0};
  mutable std::mutex mu_;
  std::optional<refusal> last_;
  std::deque<refusal> fresh_;
  std::map<std::string, std::uint64_t> times_;
};

// A ROUTER (or any socket that binds) as a CURVE server of the "gradus-ps" ZAP domain,
// failing closed when its context has no ZAP handler. Before bind().
inline void make_curve_server(zmq::socket_t& s, const key_pair& server) {
  require_curve();
  check_key_pair(server, "make_curve_server");
  s.set(zmq::sockopt::curve_server, 1);
  s.set(zmq::sockopt::curve_secretkey, server.secret_key);
  s.set(zmq::sockopt::zap_domain, std::string(curve_zap_domain));
  // ZMQ_ZAP_ENFORCE_DOMAIN (93): a draft constant in zmq.h, honoured by libzmq >= 4.3.0
  const int enforce = 1;
  if (zmq_setsockopt(s.handle(), 93, &enforce, sizeof enforce) != 0)
    throw error("gradus: make_curve_server: this libzmq refuses ZMQ_ZAP_ENFORCE_DOMAIN (" + detail_security::errno_text(errno) +
                "): without it a missing ZAP handler would let any key in");
}

// A DEALER (or any socket that connects) as a CURVE client with its own key pair, that
// trusts only the server holding `server_public_key`. Before connect().
inline void make_curve_client(zmq::socket_t& s, const key_pair& client, const std::string& server_public_key) {
  require_curve();
  check_key_pair(client, "make_curve_client");
  if (const auto p = z85_key_problem(server_public_key); !p.empty()) throw error("gradus: make_curve_client: the server's public key " + p);
  s.set(zmq::sockopt::curve_serverkey, server_public_key);
  s.set(zmq::sockopt::curve_publickey, client.public_key);
  s.set(zmq::sockopt::curve_secretkey, client.secret_key);
}

// The rank a message's connection was authenticated as: the ZAP handler's User-Id
// "worker:<rank>" (any_rank for "worker:*"). Nothing for a connection that was not
// authenticated (NULL mechanism, or no gradus ZAP handler). Read it from a frame that came
// over the wire: on a ROUTER, parts[1] and later, not the routing-id frame the ROUTER
// makes itself (it carries no metadata).
inline std::optional<int> rank_from_user_id(const zmq::message_t& m) {
  const char* uid = zmq_msg_gets(m.handle(), "User-Id");
  if (!uid) return std::nullopt;
  const std::string_view s(uid);
  if (!s.starts_with("worker:")) return std::nullopt;
  const std::string_view r = s.substr(7);
  if (r == "*") return any_rank;
  if (r.empty() || r.size() > 7 || !std::all_of(r.begin(), r.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::atoi(std::string(r).c_str());
}

// Whether a connection authenticated as `authenticated` (rank_from_user_id) may act as
// worker `claimed`.
inline bool may_act_as(std::optional<int> authenticated, int claimed) {
  return authenticated && (*authenticated == any_rank || *authenticated == claimed);
}

// Why a claim is refused, for the server's answer and log ("" when it may act so).
inline std::string rank_claim_refusal(std::optional<int> authenticated, int claimed, const std::string& peer_address = {}) {
  if (may_act_as(authenticated, claimed)) return {};
  const std::string from = peer_address.empty() ? std::string() : " from " + peer_address;
  if (!authenticated)
    return "a connection" + from + " without an authenticated CURVE key claims to be worker " + std::to_string(claimed) +
           " (this server accepts only keys in its allow-list)";
  return "a connection" + from + " whose CURVE key is allowed as worker " + std::to_string(*authenticated) + " claims to be worker " +
         std::to_string(claimed) + ": refused (a worker acts only as the rank its key is listed for in the allow-list)";
}

// What a monitor event of a client socket says about a failed handshake with the server at
// `server_address`; nothing for other events (a server that is not running gives none:
// only CONNECT_RETRIED). libzmq 4.3 gives up on a connection after
// ZMQ_EVENT_HANDSHAKE_FAILED_AUTH (a key not in the allow-list) or _PROTOCOL (one side
// without CURVE): the socket never connects and requests would wait in vain, so fail at
// once. After _NO_DETAIL (a wrong server public key; no ZAP handler) it reconnects and the
// event repeats; it also comes once when a server dies mid-handshake, so fail after a few
// in a row with no ZMQ_EVENT_HANDSHAKE_SUCCEEDED between, or name it at the deadline.
inline std::optional<std::string> describe_handshake_failure(std::uint16_t event, std::uint32_t value, const std::string& server_address) {
  const std::string at = "the parameter server at " + server_address;
  switch (event) {
    case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
      if (value == 400)
        return at + " refused this client's CURVE key (ZAP status 400): its public key is not in that server's allow-list "
                    "(GRADUS_PS_CURVE_ALLOW; gradus-keygen --allow <name>.pub --rank R --list <file> adds it), or this client "
                    "uses another key pair than the one listed (GRADUS_PS_CURVE_CLIENT_KEY)";
      if (value == 300) return at + " could not authenticate this client now (ZAP status 300, a temporary failure)";
      return at + " refused the connection (ZAP status " + std::to_string(value) + ": the server's authentication failed)";
    case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
        return at + " and this client disagree on security: one uses CURVE and the other does not (give the CURVE keys "
                    "(GRADUS_PS_CURVE_*) to both the ps tasks and the workers, or to neither)";
      if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC || value == ZMQ_PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE)
        return at + " failed the CURVE handshake (a cryptographic error): the server public key given to this client "
                    "(GRADUS_PS_CURVE_SERVER_PUB) is probably not that server's";
      if (value >= ZMQ_PROTOCOL_ERROR_ZAP_UNSPECIFIED && value <= ZMQ_PROTOCOL_ERROR_ZAP_INVALID_METADATA)
        return at + ": its ZAP handler answered malformed (protocol error " + std::to_string(value) + ")";
      {
        char hex[16];
        std::snprintf(hex, sizeof hex, "0x%08x", static_cast<unsigned>(value));
        return at + ": the ZMTP handshake failed (protocol error " + hex + "): is it a gradus parameter server of the same security settings?";
      }
    case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
      return at + " closed the connection during the handshake (" + detail_security::errno_text(static_cast<int>(value)) +
             "): with CURVE, most likely the server public key given to this client (GRADUS_PS_CURVE_SERVER_PUB) is not that "
             "server's (it cannot read the client's hello), or the server's ZAP handler is not running; or the server stopped mid-handshake";
    default: return std::nullopt;
  }
}

// ---- configuration ---------------------------------------------------------------------

// A ps task's CURVE settings: its key pair and the client keys it accepts.
struct curve_server_config {
  key_pair keys;
  allow_list allowed;
};
// A worker's CURVE settings: its key pair and the servers' public keys (one shared by every
// server, or one per server in task order).
struct curve_client_config {
  key_pair keys;
  std::vector<std::string> server_public_keys;
  const std::string& server_key(std::size_t server) const {
    if (server_public_keys.empty()) throw error("gradus: curve_client_config: no server public key");
    if (server_public_keys.size() == 1) return server_public_keys.front();
    if (server >= server_public_keys.size())
      throw error("gradus: curve_client_config: no public key for server " + std::to_string(server) + " (" +
                  std::to_string(server_public_keys.size()) + " given: one for all servers, or one per server)");
    return server_public_keys[server];
  }
};

using env_reader = std::function<const char*(const char*)>;
inline const char* process_env(const char* name) { return std::getenv(name); }

namespace detail_security {
// `text` with "{<name>}" replaced by `value` (a launcher gives every process one
// environment: keys/w{rank} names each worker's own key pair).
inline std::string expand(std::string text, const std::string& name, int value, const char* variable) {
  const std::string token = "{" + name + "}";
  for (auto at = text.find(token); at != std::string::npos; at = text.find(token, at)) {
    if (value < 0) throw error(std::string("gradus: ") + variable + " = '" + text + "' names " + token + " but this process has no " + name);
    text.replace(at, token.size(), std::to_string(value));
  }
  return text;
}
}  // namespace detail_security

// A ps task's settings from GRADUS_PS_CURVE_SERVER_KEY (the key pair's prefix; "{index}"
// becomes the task's index, for a key pair per server) and GRADUS_PS_CURVE_ALLOW (the
// allow-list file): nothing when neither is set; an error when only one is (CURVE without
// an allow-list would authenticate nobody, an allow-list without keys protects nothing).
inline std::optional<curve_server_config> curve_server_from_env(int index = -1, const env_reader& env = process_env) {
  const char* key = env("GRADUS_PS_CURVE_SERVER_KEY");
  const char* allow = env("GRADUS_PS_CURVE_ALLOW");
  const bool k = key && *key, a = allow && *allow;
  if (!k && !a) return std::nullopt;
  if (!k) throw error("gradus: GRADUS_PS_CURVE_ALLOW is set but GRADUS_PS_CURVE_SERVER_KEY is not: a ps task needs its key pair (gradus-keygen ps) to use CURVE");
  if (!a) throw error("gradus: GRADUS_PS_CURVE_SERVER_KEY is set but GRADUS_PS_CURVE_ALLOW is not: a ps task with CURVE needs the allow-list of worker keys");
  curve_server_config c{load_key_pair(detail_security::expand(key, "index", index, "GRADUS_PS_CURVE_SERVER_KEY")), allow_list::load(allow)};
  if (c.allowed.empty()) throw error(std::string("gradus: the allow-list '") + allow + "' (GRADUS_PS_CURVE_ALLOW) lists no key: no worker could connect");
  return c;
}

// A worker's settings from GRADUS_PS_CURVE_CLIENT_KEY (its key pair's prefix; "{rank}"
// becomes its rank) and GRADUS_PS_CURVE_SERVER_PUB (the servers' .pub file, or a
// comma-separated list with one per ps task in order): nothing when neither is set; an
// error when only one is.
inline std::optional<curve_client_config> curve_client_from_env(int rank = -1, const env_reader& env = process_env) {
  const char* key = env("GRADUS_PS_CURVE_CLIENT_KEY");
  const char* pub = env("GRADUS_PS_CURVE_SERVER_PUB");
  const bool k = key && *key, p = pub && *pub;
  if (!k && !p) return std::nullopt;
  if (!k) throw error("gradus: GRADUS_PS_CURVE_SERVER_PUB is set but GRADUS_PS_CURVE_CLIENT_KEY is not: a worker needs its own key pair (gradus-keygen w0)");
  if (!p) throw error("gradus: GRADUS_PS_CURVE_CLIENT_KEY is set but GRADUS_PS_CURVE_SERVER_PUB is not: a worker needs the servers' public key file");
  curve_client_config c;
  c.keys = load_key_pair(detail_security::expand(key, "rank", rank, "GRADUS_PS_CURVE_CLIENT_KEY"));
  const std::string list = pub;
  for (std::size_t at = 0; at <= list.size();) {
    const auto comma = list.find(',', at);
    const std::string file = detail_security::trim(std::string_view(list).substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (file.empty()) throw error("gradus: GRADUS_PS_CURVE_SERVER_PUB = '" + list + "' has an empty file name");
    c.server_public_keys.push_back(load_public_key(file));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return c;
}

}  // namespace gradus::ps
