#pragma once
// The NPY array format, of .npy files and the entries of an .npz file (io/npy.hpp,
// io/npz.hpp): the five element types gradus writes and their NPY descrs, the version 1.0
// header numpy writes (magic, version, length, then a dict literal padded so that the data
// starts on a 64-byte boundary), a strict parser of that dict whose errors say what is
// wrong, the descrs it reads (io/stored_type.hpp: bool, int8-64, uint8-64, float16/32/64,
// either byte order) and the reordering of a Fortran-order array into C order. Apart from
// npy.hpp because the format is NumPy's and knows nothing of files or zip archives.
#include <array>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>

#include "gradus/core/shape.hpp"
#include "gradus/io/stored_type.hpp"

namespace gradus::io::detail {

/// element_type <-> NPY descr: the five gradus writes (and reads without conversion).
struct npy_type {
  element_type type;
  std::string_view descr;
};
inline constexpr std::array<npy_type, 5> npy_types{{{element_type::f32, "<f4"},
                                                    {element_type::f64, "<f8"},
                                                    {element_type::i32, "<i4"},
                                                    {element_type::i64, "<i8"},
                                                    {element_type::u8, "|u1"}}};
inline constexpr std::string_view npy_magic{"\x93NUMPY", 6};
inline constexpr std::size_t npy_align = 64;

/// The NPY type of t, or null for an element type gradus does not write.
inline const npy_type* npy_type_of(element_type t) {
  for (const auto& n : npy_types)
    if (n.type == t) return &n;
  return nullptr;
}

/// numel * itemsize, or false when a dim is negative or the product of itemsize and the
/// dims other than 0 overflows size_t (numpy's rule: a 0 does not make (2^40, 2^40, 2^40, 0)
/// a shape, and the answer does not depend on where the 0 is).
inline bool byte_size(const dims& shape, std::size_t itemsize, std::size_t& out) {
  std::size_t n = itemsize;
  bool empty = false;
  for (std::size_t i = 0; i < shape.rank; ++i) {
    if (shape.d[i] < 0) return false;
    const auto e = static_cast<std::size_t>(shape.d[i]);
    if (e == 0) {
      empty = true;
      continue;
    }
    if (n > std::numeric_limits<std::size_t>::max() / e) return false;
    n *= e;
  }
  out = empty ? 0 : n;
  return true;
}

/// The NPY 1.0 header as numpy writes it: magic, version 1.0, uint16 length, then the dict
/// literal padded with spaces and one '\n' so that the data starts on a 64-byte boundary.
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

/// What to do with an array gradus does not read.
inline constexpr std::string_view npy_refusal_advice =
    "; gradus reads bool, int8-64, uint8-64 and float16/32/64 in either byte order: convert the array in "
    "numpy (e.g. np.save(path, a.astype(np.float32))) and load that";

/// Parses an NPY type string such as '<f4', '>i8', '|b1': byte order '<', '>' or '|' (one-byte
/// types), '=' (native, little-endian here); kind b, i, u or f; size. Returns an empty string
/// on success, else why the descr is refused, naming the type and what to do.
inline std::string parse_npy_descr(std::string_view d, stored_type& t) {
  const auto refuse = [&](std::string_view what) {
    std::string r = "unsupported descr '";
    r += d;
    r += "' (";
    r += what;
    r += ")";
    r += npy_refusal_advice;
    return r;
  };
  if (d.size() < 2) return refuse("not a type string");
  const char order = d[0], kind = d[1];
  if (order != '<' && order != '>' && order != '|' && order != '=') return refuse("no byte order");
  switch (kind) {
    case 'b': t.kind = stored_kind::boolean; break;
    case 'i': t.kind = stored_kind::signed_int; break;
    case 'u': t.kind = stored_kind::unsigned_int; break;
    case 'f': t.kind = stored_kind::ieee_float; break;
    case 'c': return refuse("complex");
    case 'S': case 'a': return refuse("byte strings");
    case 'U': return refuse("unicode strings");
    case 'O': return refuse("Python objects");
    case 'V': return refuse("raw void bytes; ml_dtypes' bfloat16 is saved so: save it as float32");
    case 'M': return refuse("datetime64");
    case 'm': return refuse("timedelta64");
    default: return refuse("an unknown kind");
  }
  std::size_t size = 0;
  for (std::size_t i = 2; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9' || size > 1000) return refuse("not a plain type");
    size = size * 10 + static_cast<std::size_t>(d[i] - '0');
  }
  if (kind == 'f' && (size == 16 || size == 12)) return refuse("float128 / long double");
  const bool ok = t.kind == stored_kind::boolean      ? size == 1
                  : t.kind == stored_kind::ieee_float ? size == 2 || size == 4 || size == 8
                                                      : size == 1 || size == 2 || size == 4 || size == 8;
  if (!ok) return refuse("an unknown size");
  if (order == '|' && size != 1) return refuse("no byte order for a multi-byte type");
  t.size = size;
  t.big_endian = order == '>' && size > 1;
  return {};
}

/// The parsed NPY header dict: the type as stored, the array's order and shape.
struct npy_header_info {
  stored_type stored;
  bool fortran_order = false;
  dims shape;
};

/// Reorders a Fortran-order (column-major) array of `shape` and `itemsize`-byte elements at
/// src into C order at dst (the same number of bytes, not overlapping src).
inline void fortran_to_c(const std::byte* src, std::byte* dst, const dims& shape, std::size_t itemsize) {
  std::size_t n = 1;
  std::array<std::size_t, max_rank> stride{}, idx{};  // stride[i]: element i's step in src
  for (std::size_t i = 0; i < shape.rank; ++i) {
    stride[i] = n;
    n *= static_cast<std::size_t>(shape.d[i]);
  }
  if (n == 0) return;
  std::size_t from = 0;  // src element of the C-order index idx
  for (std::size_t k = 0; k < n; ++k) {
    std::memcpy(dst + k * itemsize, src + from * itemsize, itemsize);
    for (std::size_t i = shape.rank; i-- > 0;) {  // the last axis varies fastest in C order
      from += stride[i];
      if (++idx[i] < static_cast<std::size_t>(shape.d[i])) break;
      from -= stride[i] * idx[i];
      idx[i] = 0;
    }
  }
}

/// Parses the dict literal of an NPY header: exactly the keys 'descr' (a type string
/// parse_npy_descr reads), 'fortran_order' (True or False) and 'shape' (a tuple of
/// non-negative ints, at most max_rank), in any order, an optional trailing comma, then only
/// whitespace. Returns an empty string on success, else what is wrong.
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
      if (!str(d))
        return "NPY header 'descr' is not a type string (structured dtypes are not supported): " + shown() +
               std::string(npy_refusal_advice);
      if (auto why = parse_npy_descr(d, out.stored); !why.empty()) return why;
      have_descr = true;
    } else if (key == "fortran_order") {
      if (have_order) return "NPY header repeats 'fortran_order'";
      ws();
      if (s.substr(p).starts_with("False")) {
        p += 5;
        out.fortran_order = false;
      } else if (s.substr(p).starts_with("True")) {
        p += 4;
        out.fortran_order = true;
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

}  // namespace gradus::io::detail
