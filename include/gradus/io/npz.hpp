#pragma once
// .npz files (NumPy's zip of .npy arrays), the format of session checkpoints:
//   write_npz(file, arrays)  every array as "<name>.npy" (NPY 1.0, little-endian, C order),
//                            stored uncompressed, so that numpy.load(file)[name] is the array;
//                            atomic: the destination is replaced whole or left as it was
//   read_npz(file)           the arrays back, in archive order, bit for bit; a strict reader
//                            whose errors name the file, the entry and what is wrong
// Needs libzip (link gradus::io). The NPY header is written and parsed here; xtensor's xnpy
// is not used because it loads into an xarray only (no dtype-erased buffer for a
// checkpoint of mixed dtypes) and throws messages without the file or entry they concern.
// The zip container is libzip's: only the empty archive (22 constant bytes, which libzip
// will not write) is written by hand.
//
// POSIX (open, fsync, getpid, kill, gethostname) for the durable rename and the cleanup of
// temporaries; host byte order must be little-endian.
#include <zip.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"

namespace gradus::io {

static_assert(std::endian::native == std::endian::little,
              "gradus::io writes and reads array bytes as they are in memory: little-endian hosts only");

// One array to write: `data` points at shape.numel() elements of `dtype` in C order, and
// must stay valid until write_npz returns.
struct npz_array_ref {
  std::string name;        // the key numpy.load gives it; may contain '/'
  std::string_view dtype;  // "float32", "float64", "int32", "int64" or "uint8"
  dims shape;              // rank 0 is a scalar
  const void* data = nullptr;
};

// One array read back: bytes holds shape.numel() elements of dtype, C order, little-endian.
struct npz_array {
  std::string name;
  std::string dtype;  // "float32", "float64", "int32", "int64" or "uint8"
  dims shape;
  std::vector<std::byte> bytes;
};

// Bytes per element of a dtype name, 0 for a name gradus::io does not store.
inline std::size_t npz_itemsize(std::string_view dtype) {
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "uint8") return 1;
  return 0;
}

namespace detail {

// dtype name <-> NPY descr, the only five either side accepts.
struct npy_type {
  std::string_view name, descr;
  std::size_t size;
};
inline constexpr std::array<npy_type, 5> npy_types{{{"float32", "<f4", 4},
                                                    {"float64", "<f8", 8},
                                                    {"int32", "<i4", 4},
                                                    {"int64", "<i8", 8},
                                                    {"uint8", "|u1", 1}}};
inline constexpr std::string_view npy_magic{"\x93NUMPY", 6};
inline constexpr std::size_t npy_align = 64;

inline const npy_type* npy_type_by_name(std::string_view name) {
  for (const auto& t : npy_types)
    if (t.name == name) return &t;
  return nullptr;
}
inline const npy_type* npy_type_by_descr(std::string_view descr) {
  for (const auto& t : npy_types)
    if (t.descr == descr) return &t;
  return nullptr;
}

// numel * itemsize, or false when a dim is negative or the product overflows size_t.
inline bool byte_size(const dims& shape, std::size_t itemsize, std::size_t& out) {
  std::size_t n = itemsize;
  for (std::size_t i = 0; i < shape.rank; ++i) {
    if (shape.d[i] < 0) return false;
    const auto e = static_cast<std::size_t>(shape.d[i]);
    if (e != 0 && n > std::numeric_limits<std::size_t>::max() / e) return false;
    n *= e;
  }
  out = n;
  return true;
}

// (appended, not "'" + s: g++ 12's -Wrestrict misfires on operator+(const char*, string&&))
inline std::string quoted(const std::filesystem::path& p) {
  std::string r(1, '\'');
  r += p.string();
  r += '\'';
  return r;
}

inline std::string zip_error_text(int code) {
  zip_error_t e;
  zip_error_init_with_code(&e, code);
  std::string s = zip_error_strerror(&e);
  zip_error_fini(&e);
  return s;
}

// The NPY 1.0 header as numpy writes it: magic, version 1.0, uint16 length, then the dict
// literal padded with spaces and one '\n' so that the data starts on a 64-byte boundary.
inline std::string npy_header(std::string_view descr, const dims& shape) {
  std::string dict = "{'descr': '";
  dict += descr;
  dict += "', 'fortran_order': False, 'shape': (";
  for (std::size_t i = 0; i < shape.rank; ++i) {
    if (i) dict += ", ";
    dict += std::to_string(shape.d[i]);
  }
  dict += shape.rank == 1 ? ",), }" : "), }";
  const std::size_t prefix = npy_magic.size() + 2 + 2;    // magic, version, uint16 length
  const std::size_t unpadded = prefix + dict.size() + 1;  // + the closing '\n'
  const std::size_t total = (unpadded + npy_align - 1) / npy_align * npy_align;
  const std::size_t hlen = total - prefix;  // < 256 for rank <= 6: fits version 1.0's uint16
  std::string h(npy_magic);
  h += '\x01';
  h += '\x00';
  h += static_cast<char>(hlen & 0xff);
  h += static_cast<char>(hlen >> 8);
  h += dict;
  h.resize(total - 1, ' ');
  h += '\n';
  return h;
}

// The parsed NPY header dict.
struct npy_header_info {
  const npy_type* type = nullptr;
  dims shape;
};

// Parses the dict literal of an NPY header: exactly the keys 'descr' (a supported type
// string), 'fortran_order' (False) and 'shape' (a tuple of non-negative ints, at most
// max_rank), in any order, an optional trailing comma, then only whitespace. Returns an
// empty string on success, else what is wrong.
inline std::string parse_npy_dict(std::string_view s, npy_header_info& out) {
  std::size_t p = 0;
  const auto ws = [&] {
    while (p < s.size() && (s[p] == ' ' || s[p] == '\t' || s[p] == '\n' || s[p] == '\r')) ++p;
  };
  const auto eat = [&](char c) {
    ws();
    if (p < s.size() && s[p] == c) {
      ++p;
      return true;
    }
    return false;
  };
  const auto str = [&](std::string& v) {
    ws();
    if (p >= s.size() || (s[p] != '\'' && s[p] != '"')) return false;
    const char q = s[p++];
    const std::size_t e = s.find(q, p);
    if (e == std::string_view::npos) return false;
    v.assign(s.substr(p, e - p));
    p = e + 1;
    return v.find('\\') == std::string::npos;
  };
  const auto shown = [&] { return "header " + std::string(s.substr(0, s.find_last_not_of(" \n") + 1)); };

  if (!eat('{')) return "NPY header is not a dict literal: " + shown();
  bool have_descr = false, have_order = false, have_shape = false;
  while (!eat('}')) {
    std::string key;
    if (!str(key) || !eat(':')) return "NPY header dict is malformed: " + shown();
    if (key == "descr") {
      std::string d;
      if (have_descr) return "NPY header repeats 'descr'";
      if (!str(d)) return "NPY header 'descr' is not a type string (structured dtypes are not supported): " + shown();
      out.type = npy_type_by_descr(d);
      if (!out.type)
        return "unsupported descr '" + d + "'" + (d.starts_with('>') ? " (big-endian)" : "") +
               "; gradus reads '<f4', '<f8', '<i4', '<i8', '|u1'";
      have_descr = true;
    } else if (key == "fortran_order") {
      if (have_order) return "NPY header repeats 'fortran_order'";
      ws();
      if (s.substr(p).starts_with("False")) {
        p += 5;
      } else if (s.substr(p).starts_with("True")) {
        return "fortran_order True (column-major) arrays are not supported";
      } else {
        return "NPY header 'fortran_order' is not True or False: " + shown();
      }
      have_order = true;
    } else if (key == "shape") {
      if (have_shape) return "NPY header repeats 'shape'";
      if (!eat('(')) return "NPY header 'shape' is not a tuple: " + shown();
      dims d;
      bool trailing_comma = false;
      while (!eat(')')) {
        ws();
        if (p >= s.size() || s[p] < '0' || s[p] > '9') return "NPY header 'shape' is not a tuple of ints: " + shown();
        index_t v = 0;
        while (p < s.size() && s[p] >= '0' && s[p] <= '9') {
          const index_t digit = s[p++] - '0';
          if (v > (std::numeric_limits<index_t>::max() - digit) / 10)
            return "NPY header 'shape' has an extent too large: " + shown();
          v = v * 10 + digit;
        }
        if (p < s.size() && s[p] == 'L') ++p;  // Python 2 long
        if (d.rank == max_rank)
          return "rank above gradus::max_rank (" + std::to_string(max_rank) + "): " + shown();
        d.d[d.rank++] = v;
        trailing_comma = eat(',');
        if (!trailing_comma) {
          if (!eat(')')) return "NPY header 'shape' is malformed: " + shown();
          break;
        }
      }
      if (d.rank == 1 && !trailing_comma) return "NPY header 'shape' (n) is not a tuple: " + shown();
      out.shape = d;
      have_shape = true;
    } else {
      return "NPY header has an unexpected key '" + key + "'";
    }
    if (!eat(',')) {
      if (!eat('}')) return "NPY header dict is malformed: " + shown();
      break;
    }
  }
  ws();
  if (p != s.size()) return "NPY header has text after the dict: " + shown();
  if (!have_descr || !have_order || !have_shape)
    return std::string("NPY header lacks '") + (!have_descr ? "descr" : !have_order ? "fortran_order" : "shape") + "'";
  return {};
}

// Owns a zip_t*: discarded (nothing written) unless closed.
struct zip_handle {
  zip_t* z = nullptr;
  zip_handle() = default;
  zip_handle(const zip_handle&) = delete;
  zip_handle& operator=(const zip_handle&) = delete;
  ~zip_handle() {
    if (z) zip_discard(z);
  }
};

struct zip_file_handle {
  zip_file_t* f = nullptr;
  zip_file_handle() = default;
  zip_file_handle(const zip_file_handle&) = delete;
  zip_file_handle& operator=(const zip_file_handle&) = delete;
  ~zip_file_handle() {
    if (f) zip_fclose(f);
  }
};

struct fd_handle {
  int fd = -1;
  fd_handle() = default;
  explicit fd_handle(int f) : fd(f) {}
  fd_handle(const fd_handle&) = delete;
  fd_handle& operator=(const fd_handle&) = delete;
  ~fd_handle() {
    if (fd >= 0) ::close(fd);
  }
};

inline std::string errno_text(int e) { return std::generic_category().message(e); }

// fsync the file or directory at `p`.
inline void fsync_path(const std::filesystem::path& p, bool directory, const std::string& ctx, const char* step) {
  fd_handle fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0)));
  if (fd.fd < 0) throw error(ctx + step + ": open " + quoted(p) + ": " + errno_text(errno));
  if (::fsync(fd.fd) != 0) throw error(ctx + step + ": " + errno_text(errno));
  const int r = ::close(fd.fd);
  fd.fd = -1;
  if (r != 0) throw error(ctx + step + ": close: " + errno_text(errno));
}

// Does the file start with a zip local file header ("PK\3\4")?
inline bool starts_like_zip(const std::filesystem::path& p) {
  fd_handle fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  char head[4] = {};
  return fd.fd >= 0 && ::read(fd.fd, head, 4) == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0;
}

// Writes the archive to `tmp` (which must not exist). Throws on failure; `tmp` may then
// exist and is the caller's to remove.
inline void write_zip(const std::filesystem::path& tmp, std::span<const npz_array_ref> arrays,
                      const std::vector<std::size_t>& sizes, const std::string& ctx) {
  if (arrays.empty()) {
    // libzip deletes an archive with no entries instead of writing it; an empty .npz (what
    // numpy.savez writes for no arrays) is just the end-of-central-directory record.
    static constexpr unsigned char eocd[22] = {'P', 'K', 5, 6};
    fd_handle fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    if (fd.fd < 0) throw error(ctx + "create temporary file " + quoted(tmp) + ": " + errno_text(errno));
    if (::write(fd.fd, eocd, sizeof eocd) != static_cast<ssize_t>(sizeof eocd))
      throw error(ctx + "write temporary file " + quoted(tmp) + ": " + errno_text(errno));
    return;
  }
  int code = 0;
  zip_handle za;
  za.z = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_EXCL, &code);
  if (!za.z) throw error(ctx + "zip_open " + quoted(tmp) + ": " + zip_error_text(code));
  // libzip reads the sources at zip_close: headers and fragment lists live until then.
  std::vector<std::string> headers;  // > 15 chars: moves keep their buffers
  std::vector<std::array<zip_buffer_fragment_t, 2>> fragments;
  headers.reserve(arrays.size());
  fragments.reserve(arrays.size());
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const auto& a = arrays[i];
    const std::string entry = a.name + ".npy";
    headers.push_back(npy_header(npy_type_by_name(a.dtype)->descr, a.shape));
    auto& f = fragments.emplace_back();
    f[0] = {reinterpret_cast<zip_uint8_t*>(headers.back().data()), headers.back().size()};
    // libzip never writes through a buffer source that an archive only reads.
    f[1] = {static_cast<zip_uint8_t*>(const_cast<void*>(a.data)), sizes[i]};
    zip_source_t* src = zip_source_buffer_fragment(za.z, f.data(), sizes[i] ? 2 : 1, 0);
    if (!src) throw error(ctx + "entry '" + entry + "': zip_source_buffer_fragment: " + zip_strerror(za.z));
    const zip_int64_t idx = zip_file_add(za.z, entry.c_str(), src, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
      zip_source_free(src);
      throw error(ctx + "entry '" + entry + "': zip_file_add: " + zip_strerror(za.z));
    }
    if (zip_set_file_compression(za.z, static_cast<zip_uint64_t>(idx), ZIP_CM_STORE, 0) != 0)
      throw error(ctx + "entry '" + entry + "': zip_set_file_compression: " + zip_strerror(za.z));
  }
  if (zip_close(za.z) != 0) throw error(ctx + "zip_close (writing " + quoted(tmp) + "): " + zip_strerror(za.z));
  za.z = nullptr;
}

// ---- temporaries ---------------------------------------------------------------------------
// A save writes "<file>.tmp.<pid>.<n>.<host>" (n counts this process's saves; libzip itself
// writes that through its own "<that>.XXXXXX" and renames it). A writer killed mid-save leaves
// one of the two behind, as large as the checkpoint; the next save of the same file removes
// those whose writer is gone:
//   - written on another host (by name): never touched, its pid means nothing here;
//   - another pid: removed when kill(pid, 0) fails with ESRCH. A live process that has
//     reused a dead writer's pid keeps that temporary until it too is gone: a stale file
//     may outlive its writer, a live writer's file is never removed;
//   - this process's pid: removed unless this process is writing it now (any thread; the
//     registry below). A container's trainer is often pid 1 at every start, so a stale
//     temporary with our own pid is the common case there, not a curiosity.

// This host in a temporary's name: the hostname, every byte outside [A-Za-z0-9-] as '_'.
inline std::string host_tag() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string s = name;
  for (char& c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-')) c = '_';
  return s;
}

// The temporaries (file names) this process is writing now, from any thread.
struct writing_registry {
  std::mutex m;
  std::set<std::string, std::less<>> names;
};
inline writing_registry& writing_now() {
  static writing_registry r;
  return r;
}

// Is `name` a temporary of the file named `target` written on `host`? Then `pid` is its
// writer and `base` the name without libzip's suffix.
inline bool parse_temporary(std::string_view name, std::string_view target, std::string_view host, pid_t& pid,
                            std::string_view& base) {
  const auto number = [&](std::string_view& s, long long& v) {
    std::size_t k = 0;
    v = 0;
    while (k < s.size() && k < 18 && s[k] >= '0' && s[k] <= '9') v = v * 10 + (s[k++] - '0');
    if (k == 0 || k == 18) return false;
    s.remove_prefix(k);
    return true;
  };
  std::string_view rest = name;
  if (!rest.starts_with(target) || !rest.substr(target.size()).starts_with(".tmp.")) return false;
  rest.remove_prefix(target.size() + 5);
  long long p = 0, n = 0;
  if (!number(rest, p) || !rest.starts_with('.')) return false;
  rest.remove_prefix(1);
  if (!number(rest, n) || !rest.starts_with('.')) return false;
  rest.remove_prefix(1);
  if (!rest.starts_with(host)) return false;
  rest.remove_prefix(host.size());
  if (!rest.empty()) {  // libzip's ".XXXXXX"
    if (rest.size() < 2 || rest.size() > 17 || rest[0] != '.') return false;
    for (const char c : rest.substr(1))
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  }
  if (p <= 0 || p > std::numeric_limits<pid_t>::max()) return false;
  pid = static_cast<pid_t>(p);
  base = name.substr(0, name.size() - rest.size());
  return true;
}

// Removes the stale temporaries of `file` (above). Best effort: a directory that cannot be
// listed or a file that cannot be removed is left as it is, and the save goes on.
inline void remove_stale_temporaries(const std::filesystem::path& file, std::string_view host) {
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  const std::string target = file.filename().string();
  const pid_t self = ::getpid();
  std::vector<std::filesystem::path> stale;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    pid_t pid = 0;
    std::string_view base;
    if (!parse_temporary(name, target, host, pid, base)) continue;
    bool dead = false;
    if (pid == self) {
      auto& r = writing_now();
      const std::lock_guard lock(r.m);
      dead = !r.names.contains(base);
    } else {
      dead = ::kill(pid, 0) == -1 && errno == ESRCH;
    }
    if (dead) stale.push_back(it->path());
  }
  for (const auto& p : stale) std::filesystem::remove(p, ec);
}

// Registers a temporary as being written by this process for its lifetime.
struct writing_temporary {
  std::string name;
  explicit writing_temporary(std::string n) : name(std::move(n)) {
    auto& r = writing_now();
    const std::lock_guard lock(r.m);
    r.names.insert(name);
  }
  writing_temporary(const writing_temporary&) = delete;
  writing_temporary& operator=(const writing_temporary&) = delete;
  ~writing_temporary() {
    auto& r = writing_now();
    const std::lock_guard lock(r.m);
    r.names.erase(name);
  }
};

}  // namespace detail

// Writes `arrays` to `file` atomically: the archive goes to "<file>.tmp.<pid>.<n>.<host>" in
// the same directory, which is fsynced and renamed over `file`, then the directory is
// fsynced. On any failure the temporary file is removed, `file` is left as it was, and a
// gradus::error names the file and the failing step. Temporaries of `file` left by writers
// that were killed mid-save are removed first (detail::remove_stale_temporaries).
inline void write_npz(const std::filesystem::path& file, std::span<const npz_array_ref> arrays) {
  const std::string ctx = "gradus: write_npz " + detail::quoted(file) + ": ";
  // Validate everything before touching the disk.
  std::vector<std::size_t> sizes;
  sizes.reserve(arrays.size());
  std::set<std::string_view> names;
  for (const auto& a : arrays) {
    const std::string what = ctx + "array '" + a.name + "': ";
    if (a.name.empty()) throw error(ctx + "an array has an empty name");
    if (a.name.find('\0') != std::string::npos) throw error(what + "the name contains a NUL byte");
    if (!names.insert(a.name).second) throw error(what + "two arrays have this name");
    const auto* t = detail::npy_type_by_name(a.dtype);
    if (!t)
      throw error(what + "unsupported dtype '" + std::string(a.dtype) +
                  "' (float32, float64, int32, int64, uint8)");
    if (a.shape.rank > max_rank) throw error(what + "rank above gradus::max_rank");
    std::size_t n = 0;
    if (!detail::byte_size(a.shape, t->size, n))
      throw error(what + "shape " + to_string(a.shape) + " has a negative extent or is too large");
    if (n && !a.data) throw error(what + "data is null for shape " + to_string(a.shape));
    sizes.push_back(n);
  }

  static std::atomic<unsigned long> counter{0};
  const std::string host = detail::host_tag();
  std::filesystem::path tmp = file;
  tmp += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++) + "." + host;
  std::filesystem::path dir = file.parent_path();
  if (dir.empty()) dir = ".";
  // Clean up before registering: a stale file of this very name (an earlier process with our
  // pid) must go, and nothing of ours exists on disk before it is registered.
  detail::remove_stale_temporaries(file, host);
  const detail::writing_temporary writing(tmp.filename().string());
  try {
    detail::write_zip(tmp, arrays, sizes, ctx);
    detail::fsync_path(tmp, false, ctx, "fsync temporary file");
    if (::rename(tmp.c_str(), file.c_str()) != 0)
      throw error(ctx + "rename " + detail::quoted(tmp) + " over it: " + detail::errno_text(errno));
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  // The new file is in place; without this the rename itself may not survive a crash.
  detail::fsync_path(dir, true, ctx, "fsync directory");
}

inline void write_npz(const std::filesystem::path& file, std::initializer_list<npz_array_ref> arrays) {
  write_npz(file, std::span<const npz_array_ref>(arrays.begin(), arrays.size()));
}

// Reads every array of an .npz file (entries "<name>.npy", stored or deflated), in archive
// order. Throws gradus::error naming the file, the entry and the problem: not a zip, an
// entry that is not .npy, a missing or garbled NPY magic, an unsupported version or descr,
// fortran_order True, a rank above max_rank, data not matching the shape, a truncated or
// corrupt (CRC) entry, a name given twice.
inline std::vector<npz_array> read_npz(const std::filesystem::path& file) {
  const std::string ctx = "gradus: read_npz " + detail::quoted(file) + ": ";
  int code = 0;
  detail::zip_handle za;
  za.z = zip_open(file.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code);
  if (!za.z) {
    std::string hint;
    if (code == ZIP_ER_EXISTS) hint = " (two entries have the same name)";
    if (code == ZIP_ER_NOZIP && detail::starts_like_zip(file)) hint = " (it starts like one: truncated?)";
    throw error(ctx + "cannot open as a zip archive: " + detail::zip_error_text(code) + hint);
  }
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(file, ec);
  if (ec) throw error(ctx + "file_size: " + ec.message());

  const zip_int64_t count = zip_get_num_entries(za.z, 0);
  std::vector<npz_array> out;
  out.reserve(static_cast<std::size_t>(count));
  std::set<std::string> seen;
  for (zip_int64_t i = 0; i < count; ++i) {
    const auto idx = static_cast<zip_uint64_t>(i);
    const char* raw_name = zip_get_name(za.z, idx, ZIP_FL_ENC_GUESS);
    if (!raw_name) throw error(ctx + "entry " + std::to_string(i) + ": zip_get_name: " + zip_strerror(za.z));
    const std::string entry = raw_name;
    const std::string at = ctx + "entry '" + entry + "': ";
    if (!entry.ends_with(".npy") || entry.size() == 4) throw error(at + "not a <name>.npy entry");
    std::string name = entry.substr(0, entry.size() - 4);
    if (!seen.insert(name).second) throw error(at + "the archive holds this name twice");

    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(za.z, idx, 0, &st) != 0) throw error(at + "zip_stat: " + zip_strerror(za.z));
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) || !(st.valid & ZIP_STAT_COMP_METHOD))
      throw error(at + "zip_stat gives no sizes");
    // Bound what the entry claims before allocating for it (deflate expands at most ~1032x).
    if (st.comp_size > file_size ||
        (st.comp_method == ZIP_CM_STORE ? st.size != st.comp_size : st.size / 1032 > st.comp_size + 1))
      throw error(at + "sizes in the zip directory are inconsistent (" + std::to_string(st.size) + " bytes from " +
                  std::to_string(st.comp_size) + " stored, in a file of " + std::to_string(file_size) + ")");

    detail::zip_file_handle zf;
    zf.f = zip_fopen_index(za.z, idx, 0);
    if (!zf.f) throw error(at + "zip_fopen: " + zip_strerror(za.z));
    const auto read = [&](void* dst, std::size_t n, const char* what) {
      auto* d = static_cast<unsigned char*>(dst);
      std::size_t got = 0;
      while (got < n) {
        const zip_int64_t r = zip_fread(zf.f, d + got, n - got);
        if (r < 0) throw error(at + "reading the " + what + ": " + zip_file_strerror(zf.f));
        if (r == 0)
          throw error(at + "truncated: the " + what + " ends after " + std::to_string(got) + " of " +
                      std::to_string(n) + " bytes");
        got += static_cast<std::size_t>(r);
      }
    };

    // Magic, version, header length.
    if (st.size < 10) throw error(at + "truncated: " + std::to_string(st.size) + " bytes, shorter than an NPY preamble");
    unsigned char pre[12];
    read(pre, 8, "NPY preamble");
    if (std::memcmp(pre, detail::npy_magic.data(), detail::npy_magic.size()) != 0)
      throw error(at + "not an NPY array (the magic \"\\x93NUMPY\" is missing)");
    const unsigned major = pre[6], minor = pre[7];
    if (minor != 0 || major < 1 || major > 3)
      throw error(at + "unsupported NPY version " + std::to_string(major) + "." + std::to_string(minor));
    const std::size_t len_bytes = major == 1 ? 2 : 4;
    read(pre + 8, len_bytes, "NPY preamble");
    std::size_t hlen = pre[8] | std::size_t{pre[9]} << 8;
    if (len_bytes == 4) hlen |= std::size_t{pre[10]} << 16 | std::size_t{pre[11]} << 24;
    const std::size_t header_total = 8 + len_bytes + hlen;
    if (hlen > (1u << 20)) throw error(at + "NPY header of " + std::to_string(hlen) + " bytes is implausibly long");
    if (header_total > st.size)
      throw error(at + "truncated: the NPY header claims " + std::to_string(hlen) + " bytes, the entry holds " +
                  std::to_string(st.size - 8 - len_bytes));
    std::string header(hlen, '\0');
    read(header.data(), hlen, "NPY header");
    if (header.find('\0') != std::string::npos) throw error(at + "the NPY header contains a NUL byte");

    detail::npy_header_info info;
    if (auto why = detail::parse_npy_dict(header, info); !why.empty()) throw error(at + why);
    std::size_t want = 0;
    if (!detail::byte_size(info.shape, info.type->size, want))
      throw error(at + "shape " + to_string(info.shape) + " is too large");
    const std::size_t have = static_cast<std::size_t>(st.size) - header_total;
    if (have != want)
      throw error(at + "data size mismatch: shape " + to_string(info.shape) + " of " + std::string(info.type->name) +
                  " needs " + std::to_string(want) + " bytes, the entry holds " + std::to_string(have));

    npz_array a;
    a.name = std::move(name);
    a.dtype = info.type->name;
    a.shape = info.shape;
    a.bytes.resize(want);
    read(a.bytes.data(), want, "array data");
    // Read to the end: libzip checks the CRC there.
    unsigned char extra;
    const zip_int64_t r = zip_fread(zf.f, &extra, 1);
    if (r < 0) throw error(at + "reading the array data: " + zip_file_strerror(zf.f));
    if (r > 0) throw error(at + "the entry holds more bytes than its zip directory size");
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace gradus::io
