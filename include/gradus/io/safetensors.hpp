#pragma once
// .safetensors files (Hugging Face's format, what PyTorch models are shared as):
//   write_safetensors(file, arrays, metadata)  the arrays in the order given, contiguous,
//                                              the header padded to 8 bytes; atomic: the
//                                              destination is replaced whole or left as it was
//   read_safetensors(file, &metadata)          the tensors in the order of their data, each
//                                              converted on load (io/stored_type.hpp) where
//                                              the file stores a type gradus does not keep;
//                                              a strict reader whose errors name the file,
//                                              the tensor and what is wrong
// The format (github.com/huggingface/safetensors): an unsigned 64-bit little-endian N, N
// bytes of UTF-8 JSON {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin,
// end]}, ..., "__metadata__": {"<key>": "<value>"}} (padded with trailing spaces), then the
// data: every tensor's bytes, little-endian, C order, at offsets relative to the data's
// start that tile it exactly. The JSON is nlohmann_json's (gradus::io links it).
//
// Dtypes read: F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL (F16 and BF16
// load as float32, I8/I16/U16 as int32, U32 and U64 as int64 (U64 only where every value is at
// most 2^63 - 1), BOOL as uint8); refused by name: the F8 types, complex and anything else.
// Written: the five element types gradus keeps (F32, F64, I32, I64, U8).
//
// POSIX; host byte order must be little-endian (io/npy.hpp asserts it).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/io/atomic_file.hpp"
#include "gradus/io/input_file.hpp"
#include "gradus/io/npy.hpp"
#include "gradus/io/npz_array.hpp"
#include "gradus/io/stored_type.hpp"

namespace gradus::io {

/// The "__metadata__" of a safetensors file: string keys to string values.
using safetensors_metadata = std::map<std::string, std::string>;

namespace detail {

/// Header lengths above this are refused (the reference implementation's limit).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

struct safetensors_dtype {
  std::string_view name;
  stored_type type;
};
inline constexpr std::array<safetensors_dtype, 13> safetensors_dtypes{{
    {"F64", {stored_kind::ieee_float, 8, false}},
    {"F32", {stored_kind::ieee_float, 4, false}},
    {"F16", {stored_kind::ieee_float, 2, false}},
    {"BF16", {stored_kind::bfloat, 2, false}},
    {"I64", {stored_kind::signed_int, 8, false}},
    {"I32", {stored_kind::signed_int, 4, false}},
    {"I16", {stored_kind::signed_int, 2, false}},
    {"I8", {stored_kind::signed_int, 1, false}},
    {"U64", {stored_kind::unsigned_int, 8, false}},
    {"U32", {stored_kind::unsigned_int, 4, false}},
    {"U16", {stored_kind::unsigned_int, 2, false}},
    {"U8", {stored_kind::unsigned_int, 1, false}},
    {"BOOL", {stored_kind::boolean, 1, false}},
}};

/// The safetensors dtype an element type is written as ("" for one gradus does not write).
inline std::string_view safetensors_dtype_of(element_type t) {
  switch (t) {
    case element_type::f32: return "F32";
    case element_type::f64: return "F64";
    case element_type::i32: return "I32";
    case element_type::i64: return "I64";
    case element_type::u8: return "U8";
    default: return {};
  }
}

/// One tensor of the header, checked.
struct safetensors_entry {
  std::string name;
  stored_type type;
  dims shape;
  std::uint64_t begin = 0, end = 0;
};

/// Checks one tensor's header object; `at` names the file and the tensor.
inline safetensors_entry safetensors_parse_entry(const std::string& name, const nlohmann::json& j,
                                                 const std::string& at) {
  if (!j.is_object()) throw error(at + "not an object with dtype, shape and data_offsets");
  for (const auto& [key, value] : j.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      throw error(at + "unexpected field '" + key + "' (a tensor has dtype, shape and data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) throw error(at + "missing field '" + key + "'");
  safetensors_entry e;
  e.name = name;

  const auto& dt = j["dtype"];
  if (!dt.is_string()) throw error(at + "'dtype' is not a string");
  const auto& d = dt.get_ref<const std::string&>();
  const auto* found = std::find_if(safetensors_dtypes.begin(), safetensors_dtypes.end(),
                                   [&](const safetensors_dtype& t) { return t.name == d; });
  if (found == safetensors_dtypes.end()) {
    const std::string what = d.starts_with("F8") ? " (an 8-bit float)" : d.starts_with("C") ? " (complex)" : "";
    throw error(at + "unsupported dtype '" + d + "'" + what +
                "; gradus reads F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8 and BOOL: convert the "
                "tensor in PyTorch (e.g. t.to(torch.float32)) and save it again");
  }
  e.type = found->type;

  const auto& sh = j["shape"];
  if (!sh.is_array()) throw error(at + "'shape' is not an array");
  if (sh.size() > max_rank)
    throw error(at + "rank " + std::to_string(sh.size()) + " above gradus::max_rank (" + std::to_string(max_rank) + ")");
  for (const auto& v : sh) {
    if (!v.is_number_unsigned() || v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<index_t>::max()))
      throw error(at + "'shape' " + sh.dump() + " is not a list of non-negative integers");
    e.shape.d[e.shape.rank++] = static_cast<index_t>(v.get<std::uint64_t>());
  }

  const auto& off = j["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
    throw error(at + "'data_offsets' " + off.dump() + " is not [begin, end] of non-negative integers");
  e.begin = off[0].get<std::uint64_t>();
  e.end = off[1].get<std::uint64_t>();
  if (e.end < e.begin) throw error(at + "'data_offsets' " + off.dump() + " ends before it begins");
  std::size_t n = 0, loaded = 0;
  if (!byte_size(e.shape, loaded_size(e.type), loaded) || !byte_size(e.shape, e.type.size, n))
    throw error(at + "shape " + to_string(e.shape) + " is too large");
  if (e.end - e.begin != n)
    throw error(at + "'data_offsets' " + off.dump() + " hold " + std::to_string(e.end - e.begin) + " bytes, shape " +
                to_string(e.shape) + " of " + d + " needs " + std::to_string(n));
  return e;
}

}  // namespace detail

/// Writes `arrays` to `file` as safetensors, in the order given, with `metadata` as its
/// "__metadata__" (left out when empty), atomically (io/atomic_file.hpp). Throws gradus::error
/// naming the file, the array and what is wrong (an empty, repeated or "__metadata__" name, a
/// name that is not UTF-8, a dtype gradus does not store, a bad shape); on any failure `file`
/// is left as it was.
inline void write_safetensors(const std::filesystem::path& file, std::span<const npz_array_ref> arrays,
                              const safetensors_metadata& metadata = {}) {
  const std::string ctx = "gradus: write_safetensors " + detail::quoted(file) + ": ";
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  std::vector<std::size_t> sizes;
  std::uint64_t at = 0;
  for (const auto& a : arrays) {
    const std::string what = ctx + "array '" + a.name + "': ";
    if (a.name.empty()) throw error(ctx + "an array has an empty name");
    if (a.name == "__metadata__") throw error(what + "the name is the header's metadata key");
    if (!names.insert(a.name).second) throw error(what + "two arrays have this name");
    const std::size_t n = detail::checked_byte_size(a, what);
    std::vector<index_t> shape(a.shape.d.begin(), a.shape.d.begin() + static_cast<std::ptrdiff_t>(a.shape.rank));
    header[a.name] = {{"dtype", std::string(detail::safetensors_dtype_of(a.dtype))}, {"shape", shape}, {"data_offsets", {at, at + n}}};
    at += n;
    sizes.push_back(n);
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw error(ctx + "a name or metadata string is not UTF-8 (" + e.what() + ")");
  }
  json.resize((json.size() + 7) / 8 * 8, ' ');  // the data starts on an 8-byte boundary
  std::array<std::byte, 8> length{};
  for (std::size_t i = 0; i < 8; ++i) length[i] = static_cast<std::byte>(std::uint64_t{json.size()} >> (8 * i));

  detail::replace_atomically(file, ctx, [&](const std::filesystem::path& tmp) {
    std::vector<std::span<const std::byte>> parts = {length, std::as_bytes(std::span(json))};
    for (std::size_t i = 0; i < arrays.size(); ++i)
      parts.emplace_back(static_cast<const std::byte*>(arrays[i].data), sizes[i]);
    detail::write_new_file(tmp, parts, ctx);
  });
}

/// write_safetensors of a braced list of arrays, as write_npz takes one.
inline void write_safetensors(const std::filesystem::path& file, std::initializer_list<npz_array_ref> arrays,
                              const safetensors_metadata& metadata = {}) {
  write_safetensors(file, std::span<const npz_array_ref>(arrays.begin(), arrays.size()), metadata);
}

/// Reads every tensor of a .safetensors file, in the order of their data, converted on load
/// (io/stored_type.hpp); its "__metadata__" goes to *metadata where given (cleared first).
/// Throws gradus::error naming the file, the tensor and the problem: a header length beyond
/// the file or above 100 MB, a header that is not a JSON object, a missing or unexpected
/// field, an unsupported dtype (F8, complex: named, with what to do), a rank above max_rank,
/// offsets that do not match the shape or do not tile the data exactly, a name given twice,
/// metadata values that are not strings, a value that does not convert (a U64 above 2^63 - 1,
/// a BOOL byte other than 0 and 1).
inline std::vector<npz_array> read_safetensors(const std::filesystem::path& file,
                                               safetensors_metadata* metadata = nullptr) {
  const std::string ctx = "gradus: read_safetensors " + detail::quoted(file) + ": ";
  detail::input_file in(file, ctx);
  if (in.size() < 8) throw error(ctx + "truncated: " + std::to_string(in.size()) + " bytes, no header length");
  std::array<unsigned char, 8> len{};
  in.read(len.data(), 8, "header length");
  std::uint64_t n = 0;
  for (std::size_t i = 8; i-- > 0;) n = n << 8 | len[i];
  if (n > detail::safetensors_max_header)
    throw error(ctx + "header length " + std::to_string(n) + " is above the 100 MB limit (not a safetensors file?)");
  if (n > in.size() - 8)
    throw error(ctx + "header length " + std::to_string(n) + " runs past the end of the file (" +
                std::to_string(in.size()) + " bytes): truncated, or not a safetensors file");
  std::string text(n, '\0');
  in.read(text.data(), n, "header");
  if (!text.starts_with('{')) throw error(ctx + "the header does not start with '{': not a safetensors file?");

  // nlohmann keeps the last of repeated keys: the parser callback sees each top-level key.
  std::set<std::string> keys;
  std::string repeated;
  const auto seen = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key && repeated.empty() &&
        !keys.insert(parsed.get<std::string>()).second)
      repeated = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, seen);
  } catch (const nlohmann::json::exception& e) {
    throw error(ctx + "the header is not valid JSON: " + e.what());
  }
  if (!repeated.empty()) throw error(ctx + "tensor '" + repeated + "': the header names it twice");
  if (!header.is_object()) throw error(ctx + "the header is not a JSON object");

  if (metadata) metadata->clear();
  std::vector<detail::safetensors_entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) throw error(ctx + "'__metadata__' is not an object of strings");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string()) throw error(ctx + "'__metadata__' key '" + k + "': the value is not a string");
        if (metadata) (*metadata)[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string at = ctx + "tensor '" + name + "': ";
    if (name.empty()) throw error(at + "an empty name");
    entries.push_back(detail::safetensors_parse_entry(name, value, at));
  }

  // The offsets tile the data exactly: sorted by begin, each starts where the last ended.
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const std::uint64_t data_size = in.size() - 8 - n;
  std::uint64_t expect = 0;
  std::string previous;
  for (const auto& e : entries) {
    if (e.begin != expect)
      throw error(ctx + "tensor '" + e.name + "': data_offsets [" + std::to_string(e.begin) + ", " +
                  std::to_string(e.end) + "] " + (e.begin < expect ? "overlap" : "leave a gap after") +
                  (previous.empty() ? std::string(" the start of the data") : " tensor '" + previous + "'") +
                  " (the data must be tiled exactly, in order)");
    expect = e.end;
    previous = e.name;
  }
  if (expect != data_size)
    throw error(ctx + "the tensors' data_offsets end at " + std::to_string(expect) + ", the data holds " +
                std::to_string(data_size) + " bytes (" +
                (expect > data_size ? std::string("truncated?") : std::string("bytes after the last tensor")) + ")");

  std::vector<npz_array> out;
  out.reserve(entries.size());
  std::vector<std::byte> raw;
  for (auto& e : entries) {
    npz_array a;
    a.name = std::move(e.name);
    a.dtype = detail::loads_as(e.type);
    a.shape = e.shape;
    const std::size_t bytes = static_cast<std::size_t>(e.end - e.begin);
    a.bytes.resize(bytes / e.type.size * detail::loaded_size(e.type));
    if (detail::loads_unchanged(e.type)) {
      in.read(a.bytes.data(), bytes, "tensor data");
    } else {
      raw.resize(bytes);
      in.read(raw.data(), bytes, "tensor data");
      if (auto why = detail::convert_elements(e.type, raw.data(), bytes / e.type.size, a.bytes.data()); !why.empty())
        throw error(ctx + "tensor '" + a.name + "': " + why +
                    "; convert the tensor in PyTorch (e.g. to torch.int64 after checking the values) and save it again");
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace gradus::io
