#pragma once
// CurveZMQ key pairs and their files: a key pair in Z85 text, making and checking one,
// reading and writing the .key and .pub files gradus-keygen writes (atomically, refusing a
// secret key that group or others may read), and the file helpers the allow-list shares.
// Requires libzmq >= 4.3.1 built with CURVE (require_curve).
//
// Key files (gradus-keygen writes them). Z85 keys may hold '#' and '=', so a comment is a
// line that is a lone '#' or begins with '# ' (a hash and a blank), and a comment after a
// value is ' # ...' (blank, hash, blank).
//   <name>.pub  the public key: comment lines and one line holding the 40-character Z85
//               text. Give it out freely (the allow-list, the workers).
//   <name>.key  the key pair: "public-key = <z85>" and "secret-key = <z85>" lines; mode
//               0600, refused when group or others may read it (as ssh does).
#include <zmq.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gradus/comm/net/fd.hpp"
#include "gradus/core/error.hpp"

namespace gradus::net {

/// A CURVE key pair, each key as 40 characters of Z85 text.
struct key_pair {
  /// \var public_key
  /// The public key: 40 characters of Z85, safe to give out (allow-lists, .pub files).
  /// \var secret_key
  /// The secret key: 40 characters of Z85; keep it private (.key files are mode 0600).
  std::string public_key, secret_key;
};

namespace detail_security {

inline std::string errno_text(int e) { return net::errno_message(e); }

inline std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

/// Whether a (trimmed) line is a comment: a lone '#', or '#' and a blank (never a key:
/// those hold no blanks).
inline bool is_comment(std::string_view t) { return t == "#" || t.starts_with("# ") || t.starts_with("#\t"); }

/// The blank-separated words of a line, up to a comment word ("#" or "# ...").
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

/// The lines of a text that are neither blank nor comments, trimmed, each with its 1-based
/// line number.
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

/// A key file line: `"public-key = <key>"`, `"secret-key = <key>"`, or a bare key (name "").
/// Fails (nullopt) when it is none of these.
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

/// What to add to a key problem found on a line that begins with '#'.
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

/// Writes `content` to `path` atomically (a temporary file in the same directory, synced,
/// then renamed; or linked, which fails if `path` exists, when overwriting is not allowed).
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


}  // namespace detail_security


/// Throws gradus::error unless this libzmq can do CURVE and is 4.3.1 or newer.
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

/// Empty when `text` is a valid Z85 CURVE key; otherwise what is wrong with it.
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

/// The 32 bytes of a key as Z85 text.
inline std::string z85_encode_key(const std::uint8_t (&key)[32]) {
  char text[41];
  if (!zmq_z85_encode(text, key, 32)) throw error("gradus: zmq_z85_encode failed");
  return std::string(text, 40);
}

/// The public key of a secret key (both Z85).
inline std::string public_key_of(const std::string& secret_key) {
  if (const auto p = z85_key_problem(secret_key); !p.empty()) throw error("gradus: CURVE secret key " + p);
  char pub[41];
  if (zmq_curve_public(pub, secret_key.c_str()) != 0) throw error("gradus: zmq_curve_public: " + detail_security::errno_text(errno));
  return std::string(pub, 40);
}

/// A fresh key pair (libsodium's random generator).
inline key_pair generate_key_pair() {
  require_curve();
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) throw error("gradus: zmq_curve_keypair failed: " + detail_security::errno_text(errno));
  key_pair kp{std::string(pub, 40), std::string(sec, 40)};
  std::memset(sec, 0, sizeof sec);
  return kp;
}

/// Throws unless both keys are Z85 and the public key belongs to the secret key.
inline void check_key_pair(const key_pair& kp, const std::string& origin) {
  if (const auto p = z85_key_problem(kp.public_key); !p.empty()) throw error("gradus: " + origin + ": the public key " + p);
  if (const auto p = z85_key_problem(kp.secret_key); !p.empty()) throw error("gradus: " + origin + ": the secret key " + p);
  if (public_key_of(kp.secret_key) != kp.public_key)
    throw error("gradus: " + origin + ": the public key does not belong to the secret key (a file edited or mixed up with another's?)");
}

/// The file names of a key pair: `"<prefix>.key"` and `"<prefix>.pub"`. A path that already
/// ends in ".key" or ".pub" names the pair by its prefix.
inline std::string key_prefix(const std::string& path) {
  if (path.size() > 4 && (path.ends_with(".key") || path.ends_with(".pub"))) return path.substr(0, path.size() - 4);
  return path;
}

/// The text of a .pub file for `public_key`: two comment lines naming `name`, then the key.
inline std::string public_key_file_text(const std::string& public_key, std::string_view name) {
  return "# gradus CURVE public key of '" + std::string(name) +
         "' (gradus-keygen). Share it: servers list workers' keys in their allow-list,\n"
         "# workers are given the servers' keys.\n" +
         public_key + "\n";
}
/// The text of a .key file for `kp`: a comment line naming `name`, then
/// `"public-key = ..."` and `"secret-key = ..."` lines.
inline std::string secret_key_file_text(const key_pair& kp, std::string_view name) {
  return "# gradus CURVE key pair of '" + std::string(name) +
         "' (gradus-keygen). SECRET: keep it on the host that uses it, mode 0600.\n"
         "public-key = " + kp.public_key + "\n" +
         "secret-key = " + kp.secret_key + "\n";
}

/// Writes `<prefix>.key` (mode 0600) and `<prefix>.pub` (0644), each atomically. Refuses to
/// replace either file unless `overwrite`.
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

/// The public key in a .pub file (a bare key line, or `"public-key = <key>"`), or the public
/// key of a .key file.
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

/// The key pair in `<prefix>.key` (`path` is the prefix or the .key file itself). Refused
/// when group or others may access the file, when a key is not Z85, or when the public key
/// does not belong to the secret key.
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

}  // namespace gradus::net
