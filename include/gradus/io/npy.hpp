#pragma once
// .npy files (one NumPy array), as numpy.save writes and numpy.load reads them:
//   write_npy(file, array)  NPY 1.0, little-endian, C order, the header numpy writes;
//                           atomic: the destination is replaced whole or left as it was
//   read_npy(file)          the array, converted on load where numpy stored another type or
//                           order (io/stored_type.hpp: float16 -> float32, bool -> uint8,
//                           big-endian, Fortran order, ...; values exact); a strict reader
//                           whose errors name the file and what is wrong
// and the reading of one NPY array from any byte source, which read_npz (io/npz.hpp) uses for
// its entries. The header is io/npy_format.hpp's; the atomic replacement io/atomic_file.hpp's.
//
// POSIX; host byte order must be little-endian.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/io/atomic_file.hpp"
#include "gradus/io/input_file.hpp"
#include "gradus/io/npy_format.hpp"
#include "gradus/io/npz_array.hpp"
#include "gradus/io/stored_type.hpp"

namespace gradus::io {

static_assert(std::endian::native == std::endian::little,
              "gradus::io writes and reads array bytes as they are in memory: little-endian hosts only");

namespace detail {

/// Reads one NPY array of `size` bytes (preamble, header, data, nothing after) through
/// read(void* dst, std::size_t n, const char* what), which reads exactly n bytes or throws.
/// Every error starts with `at` (the reader, the file, the entry); `holder` is what holds the
/// bytes ("file", "entry"). The name is left empty.
template <class Read>
npz_array read_npy_stream(Read&& read, std::uint64_t size, const std::string& at, const char* holder) {
  // Magic, version, header length.
  if (size < 10) throw error(at + "truncated: " + std::to_string(size) + " bytes, shorter than an NPY preamble");
  unsigned char pre[12];
  read(pre, 8, "NPY preamble");
  if (std::memcmp(pre, npy_magic.data(), npy_magic.size()) != 0)
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
  if (header_total > size)
    throw error(at + "truncated: the NPY header claims " + std::to_string(hlen) + " bytes, the " + holder + " holds " +
                std::to_string(size - 8 - len_bytes));
  std::string header(hlen, '\0');
  read(header.data(), hlen, "NPY header");
  if (header.find('\0') != std::string::npos) throw error(at + "the NPY header contains a NUL byte");

  npy_header_info info;
  if (auto why = parse_npy_dict(header, info); !why.empty()) throw error(at + why);
  const std::string type = stored_type_name(info.stored);
  std::size_t want = 0, loaded = 0;
  if (!byte_size(info.shape, info.stored.size, want) || !byte_size(info.shape, loaded_size(info.stored), loaded))
    throw error(at + "shape " + to_string(info.shape) + " is too large");
  const std::uint64_t have = size - header_total;
  if (have != want)
    throw error(at + "data size mismatch: shape " + to_string(info.shape) + " of " + type + " needs " +
                std::to_string(want) + " bytes, the " + holder + " holds " + std::to_string(have));

  npz_array a;
  a.dtype = loads_as(info.stored);
  a.shape = info.shape;
  a.bytes.resize(loaded);
  const bool reorder = info.fortran_order && info.shape.rank > 1;
  if (loads_unchanged(info.stored) && !reorder) {
    read(a.bytes.data(), want, "array data");
    return a;
  }
  std::vector<std::byte> raw(want);
  read(raw.data(), want, "array data");
  const std::size_t n = want / info.stored.size;
  std::vector<std::byte> converted;
  std::byte* to = a.bytes.data();
  if (reorder) {
    converted.resize(loaded);
    to = converted.data();
  }
  if (auto why = convert_elements(info.stored, raw.data(), n, to); !why.empty())
    throw error(at + why + (info.fortran_order ? " (the index counts in the file's Fortran order)" : "") +
                "; convert the array in numpy (e.g. to float64, or to int64 after checking the values) and load that");
  if (reorder) fortran_to_c(converted.data(), a.bytes.data(), info.shape, loaded_size(info.stored));
  return a;
}

}  // namespace detail

/// Writes one array to `file` as NPY 1.0 (numpy.load(file) is the array) atomically: through
/// a temporary in the same directory, fsynced and renamed over `file` (io/atomic_file.hpp).
/// array.name is not stored. Throws gradus::error naming the file and what is wrong; on any
/// failure `file` is left as it was.
inline void write_npy(const std::filesystem::path& file, const npz_array_ref& array) {
  const std::string ctx = "gradus: write_npy " + detail::quoted(file) + ": ";
  const std::size_t n = detail::checked_byte_size(array, ctx);
  const std::string header = detail::npy_header(detail::npy_type_of(array.dtype)->descr, array.shape);
  detail::replace_atomically(file, ctx, [&](const std::filesystem::path& tmp) {
    detail::write_new_file(tmp, {std::as_bytes(std::span(header)), {static_cast<const std::byte*>(array.data), n}},
                           ctx);
  });
}

/// Reads the array of an .npy file (NPY versions 1.0 to 3.0), converted on load where numpy
/// stored another type or order (io/stored_type.hpp). name is the file's stem ("w" for
/// "dir/w.npy"). Throws gradus::error naming the file and the problem: a missing or garbled
/// magic, an unsupported version, a descr gradus does not read (complex, strings, objects,
/// structured, float128: named, with what to do), a uint64 value above 2^63 - 1 or a bool
/// byte other than 0 and 1 (its index named), a rank above max_rank, a file whose size is
/// not the header's plus the shape's data.
inline npz_array read_npy(const std::filesystem::path& file) {
  const std::string ctx = "gradus: read_npy " + detail::quoted(file) + ": ";
  detail::input_file in(file, ctx);
  npz_array a = detail::read_npy_stream([&](void* dst, std::size_t n, const char* what) { in.read(dst, n, what); },
                                        in.size(), ctx, "file");
  a.name = file.stem().string();
  return a;
}

}  // namespace gradus::io
