#pragma once
// .npz files (NumPy's zip of .npy arrays), the format of session checkpoints:
//   write_npz(file, arrays)  every array as "<name>.npy" (NPY 1.0, little-endian, C order),
//                            stored uncompressed, so that numpy.load(file)[name] is the array;
//                            atomic: the destination is replaced whole or left as it was
//   read_npz(file)           the arrays back, in archive order, bit for bit; a strict reader
//                            whose errors name the file, the entry and what is wrong
// Entries stored as other types or orders than gradus writes (float16, bool, big-endian,
// Fortran order, ...) are converted on load as read_npy converts them (io/npy.hpp).
// Needs libzip (link gradus::io). The NPY header is written and parsed by gradus
// (io/npy_format.hpp, io/npy.hpp); xtensor's xnpy is not used because it loads into an
// xarray only (no dtype-erased buffer for a checkpoint of mixed dtypes) and throws messages
// without the file or entry they concern. The zip container is libzip's: only the empty archive (22
// constant bytes, which libzip will not write) is written by hand. The temporaries and
// fsyncs of the atomic replacement are io/atomic_file.hpp's.
//
// POSIX (open, read, write, rename); host byte order must be little-endian.
#include <zip.h>

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/io/atomic_file.hpp"
#include "gradus/io/npy.hpp"
#include "gradus/io/npy_format.hpp"
#include "gradus/io/npz_array.hpp"

namespace gradus::io {

namespace detail {

inline std::string zip_error_text(int code) {
  zip_error_t e;
  zip_error_init_with_code(&e, code);
  std::string s = zip_error_strerror(&e);
  zip_error_fini(&e);
  return s;
}

/// Owns a zip_t*: discarded (nothing written) unless closed.
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

/// Does the file start with a zip local file header ("PK\3\4")?
inline bool starts_like_zip(const std::filesystem::path& p) {
  fd_handle fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  char head[4] = {};
  return fd.fd >= 0 && ::read(fd.fd, head, 4) == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0;
}

/// Writes the archive to `tmp` (which must not exist). Throws on failure; `tmp` may then
/// exist and is the caller's to remove.
inline void write_zip(const std::filesystem::path& tmp, std::span<const npz_array_ref> arrays,
                      const std::vector<std::size_t>& sizes, const std::string& ctx) {
  if (arrays.empty()) {
    // libzip deletes an archive with no entries instead of writing it; an empty .npz (what
    // numpy.savez writes for no arrays) is just the end-of-central-directory record.
    static constexpr std::array<std::byte, 22> eocd = {std::byte{'P'}, std::byte{'K'}, std::byte{5}, std::byte{6}};
    write_new_file(tmp, {eocd}, ctx);
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
    headers.push_back(npy_header(npy_type_of(a.dtype)->descr, a.shape));
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

}  // namespace detail

/// Writes `arrays` to `file` atomically: the archive goes to "<file>.tmp.<pid>.<n>.<host>" in
/// the same directory, which is fsynced and renamed over `file`, then the directory is
/// fsynced. On any failure the temporary file is removed, `file` is left as it was, and a
/// gradus::error names the file and the failing step. Temporaries of `file` left by writers
/// that were killed mid-save are removed first (detail::remove_stale_temporaries).
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
    sizes.push_back(detail::checked_byte_size(a, what));
  }

  detail::replace_atomically(file, ctx,
                             [&](const std::filesystem::path& tmp) { detail::write_zip(tmp, arrays, sizes, ctx); });
}

/// write_npz of a braced list: `write_npz(file, {{"w", "float32", shape, data}, ...})`.
inline void write_npz(const std::filesystem::path& file, std::initializer_list<npz_array_ref> arrays) {
  write_npz(file, std::span<const npz_array_ref>(arrays.begin(), arrays.size()));
}

/// Reads every array of an .npz file (entries "<name>.npy", stored or deflated), in archive
/// order, each converted on load as read_npy converts (io/npy.hpp). Throws gradus::error
/// naming the file, the entry and the problem: not a zip, an entry that is not .npy, a
/// missing or garbled NPY magic, an unsupported version or descr, a value that does not
/// convert, a rank above max_rank, data not matching the shape, a truncated or corrupt (CRC)
/// entry, a name given twice.
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

    npz_array a = detail::read_npy_stream(read, st.size, at, "entry");
    a.name = std::move(name);
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
