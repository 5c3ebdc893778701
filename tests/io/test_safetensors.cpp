// gradus::io .safetensors: round trips of every dtype with metadata, the bytes written (the
// spec's layout, byte for byte), the atomic write and its refusals; on hand-made files, what
// read_safetensors converts on load value by value (F16, BF16, BOOL, I8, I16, U16, U32, U64)
// and every malformed header it refuses, each error naming the file and the tensor. A
// Python writer and reader of the spec check gradus against both ways (io_interop.py,
// io_safetensors_* tests).
#define BOOST_TEST_MODULE io_safetensors
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <gradus/io/safetensors.hpp>

#include "io_test_files.hpp"

namespace g = gradus;
namespace gio = gradus::io;
using gradus::test::expect_error;
using gradus::test::raw;
using gradus::test::scratch;
using gradus::test::slurp;
using gradus::test::spit;

namespace {

// A safetensors file: the header's length (8 bytes, little-endian), the header, the data.
std::string st(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((std::uint64_t{header.size()} >> (8 * i)) & 0xff);
  return out + header + data;
}

template <class T>
std::vector<T> values(const gio::npz_array& a) {
  BOOST_REQUIRE_EQUAL(a.bytes.size() % sizeof(T), 0u);
  std::vector<T> v(a.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), a.bytes.data(), a.bytes.size());
  return v;
}

// Reads a file holding one tensor "t" of `dtype` and `shape` (JSON) over `data`.
gio::npz_array load_one(const scratch& s, const std::string& dtype, const std::string& shape, const std::string& data) {
  spit(s / "x.safetensors", st(R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":[0,)" +
                                   std::to_string(data.size()) + "]}}",
                               data));
  const auto got = gio::read_safetensors(s / "x.safetensors");
  BOOST_REQUIRE_EQUAL(got.size(), 1u);
  BOOST_TEST(got[0].name == "t");
  return got[0];
}

}  // namespace

// ---- writing --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(round_trip_every_dtype_with_metadata) {
  scratch s;
  const std::vector<float> f32 = {1.5f, std::bit_cast<float>(0x7fc12345u), -0.f, 1e-45f, 2, 3};
  const std::vector<double> f64 = {-1e300};
  const std::vector<std::int32_t> i32 = {std::numeric_limits<std::int32_t>::min(), 1, 2};
  const std::vector<std::int64_t> i64 = {std::numeric_limits<std::int64_t>::max(), -1};
  const std::vector<std::uint8_t> u8 = {0, 1, 255};
  const std::vector<gio::npz_array_ref> arrays = {
      {"layer.0/weight", "float32", {2, 3}, f32.data()},
      {"scalar", "float64", {}, f64.data()},
      {"ids", "int32", {3}, i32.data()},
      {"empty", "float32", {0, 4}, nullptr},
      {"step", "int64", {2, 1}, i64.data()},
      {"gr\xc3\xb6\xc3\x9f" "e", "uint8", {1, 1, 3}, u8.data()},
  };
  const gio::safetensors_metadata meta = {{"format", "pt"}, {"note", "\xc3\xa4 \"quoted\""}};
  gio::write_safetensors(s / "m.safetensors", arrays, meta);
  BOOST_TEST(s.files() == std::vector<std::string>{"m.safetensors"});
  gio::safetensors_metadata back_meta = {{"stale", "x"}};
  const auto back = gio::read_safetensors(s / "m.safetensors", &back_meta);
  BOOST_TEST((back_meta == meta));
  BOOST_REQUIRE_EQUAL(back.size(), arrays.size());
  const std::vector<std::size_t> sizes = {24, 8, 12, 0, 16, 3};
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    BOOST_TEST_CONTEXT(arrays[i].name) {
      BOOST_TEST(back[i].name == arrays[i].name);  // the order of the data is the order written
      BOOST_TEST(g::name_of(back[i].dtype) == arrays[i].dtype.name());
      BOOST_TEST(g::to_string(back[i].shape) == g::to_string(arrays[i].shape));
      BOOST_REQUIRE_EQUAL(back[i].bytes.size(), sizes[i]);
      if (sizes[i]) BOOST_TEST(std::memcmp(back[i].bytes.data(), arrays[i].data, sizes[i]) == 0);
    }
  }
  BOOST_TEST(gio::read_safetensors(s / "m.safetensors").size() == arrays.size());  // no metadata wanted
}

// The layout of the spec, byte for byte: u64 length, the JSON (metadata first here) padded
// with spaces to 8 bytes, the data in the order given.
BOOST_AUTO_TEST_CASE(bytes_written) {
  scratch s;
  const std::vector<float> a = {1, 2};
  const std::vector<std::int64_t> b = {-1};
  gio::write_safetensors(s / "b.safetensors", {{"b", "int64", {}, b.data()}, {"a", "float32", {2}, a.data()}},
                         {{"format", "pt"}});
  std::string header = R"({"__metadata__":{"format":"pt"},"b":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                       R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  BOOST_TEST(slurp(s / "b.safetensors") == st(header, raw<std::int64_t>({-1}) + raw<float>({1, 2})));
  gio::write_safetensors(s / "e.safetensors", std::span<const gio::npz_array_ref>{});
  BOOST_TEST(slurp(s / "e.safetensors") == st("{}      ", ""));
  BOOST_TEST(gio::read_safetensors(s / "e.safetensors").empty());
}

BOOST_AUTO_TEST_CASE(write_refusals_leave_the_previous_file) {
  scratch s;
  const auto p = s / "w.safetensors";
  const std::vector<float> v = {1, 2};
  gio::write_safetensors(p, {{"w", "float32", {2}, v.data()}});
  const std::string before = slurp(p);
  expect_error([&] { gio::write_safetensors(p, {{"__metadata__", "float32", {2}, v.data()}}); },
               {p.string(), "'__metadata__'", "metadata key"});
  expect_error([&] { gio::write_safetensors(p, {{"a", "float32", {2}, v.data()}, {"a", "float32", {2}, v.data()}}); },
               {p.string(), "'a'", "two arrays"});
  expect_error([&] { gio::write_safetensors(p, {{"", "float32", {2}, v.data()}}); }, {p.string(), "empty name"});
  expect_error([&] { gio::write_safetensors(p, {{"a", "bfloat16", {2}, v.data()}}); }, {p.string(), "'bfloat16'"});
  expect_error([&] { gio::write_safetensors(p, {{"bad\xff", "float32", {2}, v.data()}}); }, {p.string(), "UTF-8"});
  expect_error([&] { gio::write_safetensors(p, {{"a", "float32", {2}, v.data()}}, {{"k", "\xfe"}}); },
               {p.string(), "UTF-8"});
  BOOST_TEST(slurp(p) == before);
  BOOST_TEST(s.files() == std::vector<std::string>{"w.safetensors"});
}

// ---- converted on load ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(half_floats_load_as_float32_exactly) {
  scratch s;
  // F16: 0, -0, 2^-24 (subnormal), the largest subnormal, 1, 65504, inf, -inf, NaN with a payload
  auto a = load_one(s, "F16", "[3,3]", raw<std::uint16_t>({0x0000, 0x8000, 0x0001, 0x03ff, 0x3c00, 0x7bff, 0x7c00, 0xfc00, 0x7d01}));
  BOOST_TEST(g::name_of(a.dtype) == "float32");
  BOOST_TEST(g::to_string(a.shape) == "(3, 3)");
  BOOST_TEST(values<std::uint32_t>(a) ==
                 (std::vector<std::uint32_t>{0x00000000, 0x80000000, 0x33800000, 0x387fc000, 0x3f800000, 0x477fe000,
                                             0x7f800000, 0xff800000, 0x7fa02000}),
             boost::test_tools::per_element());
  // BF16: the top half of a float32: 1, -3.140625, inf, the smallest subnormal, NaN
  a = load_one(s, "BF16", "[5]", raw<std::uint16_t>({0x3f80, 0xc049, 0x7f80, 0x0001, 0x7fc1}));
  BOOST_TEST(g::name_of(a.dtype) == "float32");
  BOOST_TEST(values<std::uint32_t>(a) == (std::vector<std::uint32_t>{0x3f800000, 0xc0490000, 0x7f800000, 0x00010000, 0x7fc10000}),
             boost::test_tools::per_element());
  BOOST_TEST(values<float>(a)[1] == -3.140625f);
}

BOOST_AUTO_TEST_CASE(bool_and_integers_widen) {
  scratch s;
  auto a = load_one(s, "BOOL", "[4]", std::string("\1\0\1\1", 4));
  BOOST_TEST(g::name_of(a.dtype) == "uint8");
  BOOST_TEST((values<std::uint8_t>(a) == std::vector<std::uint8_t>{1, 0, 1, 1}));
  a = load_one(s, "I8", "[3]", raw<std::int8_t>({-128, 127, -1}));
  BOOST_TEST(g::name_of(a.dtype) == "int32");
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{-128, 127, -1}));
  a = load_one(s, "I16", "[2]", raw<std::int16_t>({-32768, 32767}));
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{-32768, 32767}));
  a = load_one(s, "U16", "[2]", raw<std::uint16_t>({65535, 7}));
  BOOST_TEST(g::name_of(a.dtype) == "int32");
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{65535, 7}));
  a = load_one(s, "U32", "[1]", raw<std::uint32_t>({4294967295u}));
  BOOST_TEST(g::name_of(a.dtype) == "int64");
  BOOST_TEST((values<std::int64_t>(a) == std::vector<std::int64_t>{4294967295}));
  a = load_one(s, "U64", "[2]", raw<std::uint64_t>({0, 9223372036854775807u}));
  BOOST_TEST(g::name_of(a.dtype) == "int64");
  BOOST_TEST((values<std::int64_t>(a) == std::vector<std::int64_t>{0, 9223372036854775807}));
  a = load_one(s, "U8", "[]", "\xff");
  BOOST_TEST(g::name_of(a.dtype) == "uint8");
  BOOST_TEST((values<std::uint8_t>(a) == std::vector<std::uint8_t>{255}));

  const auto p = s / "x.safetensors";
  spit(p, st(R"({"big":{"dtype":"U64","shape":[3],"data_offsets":[0,24]}})",
             raw<std::uint64_t>({1, 2, std::uint64_t{1} << 63})));
  expect_error([&] { gio::read_safetensors(p); },
               {"gradus: read_safetensors '" + p.string() + "': tensor 'big': ",
                "uint64 value 9223372036854775808 at index 2 does not fit int64", "PyTorch"});
  spit(p, st(R"({"m":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\0\7", 2)));
  expect_error([&] { gio::read_safetensors(p); }, {p.string(), "tensor 'm'", "bool byte 7 at index 1"});
}

// The tensors come back in the order of their data, whatever the JSON's order; the header
// may be padded with spaces; metadata may come anywhere.
BOOST_AUTO_TEST_CASE(reads_in_data_order_with_padding) {
  scratch s;
  const std::string header = R"({"z":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},"__metadata__":{"a":"b"},)"
                             R"( "y" : {"shape":[1],"data_offsets":[0,4],"dtype":"I32"}}        )";
  spit(s / "o.safetensors", st(header, raw<std::int32_t>({-7}) + raw<float>({0.25f})));
  gio::safetensors_metadata meta;
  const auto got = gio::read_safetensors(s / "o.safetensors", &meta);
  BOOST_REQUIRE_EQUAL(got.size(), 2u);
  BOOST_TEST(got[0].name == "y");
  BOOST_TEST((values<std::int32_t>(got[0]) == std::vector<std::int32_t>{-7}));
  BOOST_TEST(got[1].name == "z");
  BOOST_TEST((values<float>(got[1]) == std::vector<float>{0.25f}));
  BOOST_TEST((meta == gio::safetensors_metadata{{"a", "b"}}));
}

// ---- refused --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(malformed_files_are_refused_naming_file_and_tensor) {
  scratch s;
  const auto p = s / "bad.safetensors";
  const std::string ctx = "gradus: read_safetensors '" + p.string() + "': ";
  const auto bad = [&](const std::string& what, const std::string& bytes, std::initializer_list<std::string> needles) {
    BOOST_TEST_CONTEXT(what) {
      spit(p, bytes);
      std::vector<std::string> all = {ctx};
      all.insert(all.end(), needles);
      try {
        gio::read_safetensors(p);
        BOOST_ERROR("no error");
      } catch (const g::error& e) {
        const std::string msg = e.what();
        BOOST_TEST_MESSAGE(what << ": " << msg);
        for (const auto& n : all) BOOST_CHECK_MESSAGE(msg.find(n) != std::string::npos, "'" << msg << "' lacks '" << n << "'");
      }
    }
  };
  const std::string f8 = raw<float>({1, 2});
  const auto one = [](const std::string& fields) { return R"({"t":{)" + fields + "}}"; };
  const std::string ok_fields = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  bad("short", "\x08\0\0", {"truncated", "no header length"});
  bad("length_past_file", st(one(ok_fields), f8).substr(0, 20), {"runs past the end of the file"});
  std::string huge = st(one(ok_fields), f8);
  huge[3] = '\x10';  // 0x10000000 + ...: above 100 MB
  bad("length_above_100MB", huge, {"above the 100 MB limit"});
  bad("not_json", st("{\"t\": nope}", ""), {"not valid JSON"});
  bad("not_object", st("[1, 2]", ""), {"does not start with '{'"});
  bad("bad_utf8", st("{\"t\xff\": 1}", ""), {"not valid JSON"});
  bad("tensor_not_object", st(R"({"t": 5})", ""), {"tensor 't'", "not an object"});
  bad("missing_dtype", st(one(R"("shape":[2],"data_offsets":[0,8])"), f8), {"tensor 't'", "missing field 'dtype'"});
  bad("missing_shape", st(one(R"("dtype":"F32","data_offsets":[0,8])"), f8), {"tensor 't'", "missing field 'shape'"});
  bad("missing_offsets", st(one(R"("dtype":"F32","shape":[2])"), f8), {"tensor 't'", "missing field 'data_offsets'"});
  bad("extra_field", st(one(ok_fields + R"(,"x":1)"), f8), {"tensor 't'", "unexpected field 'x'"});
  bad("f8", st(one(R"("dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2])"), "ab"),
      {"tensor 't'", "unsupported dtype 'F8_E4M3' (an 8-bit float)", "torch.float32"});
  bad("complex", st(one(R"("dtype":"C64","shape":[1],"data_offsets":[0,8])"), f8), {"'C64' (complex)"});
  bad("unknown_dtype", st(one(R"("dtype":"f32","shape":[2],"data_offsets":[0,8])"), f8), {"unsupported dtype 'f32'"});
  bad("negative_shape", st(one(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), f8), {"'shape' [-2]"});
  bad("float_shape", st(one(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"), f8), {"'shape' [2.0]"});
  bad("rank_7", st(one(R"("dtype":"F32","shape":[1,1,1,1,1,1,2],"data_offsets":[0,8])"), f8), {"rank 7 above"});
  bad("offsets_not_pair", st(one(R"("dtype":"F32","shape":[2],"data_offsets":[0])"), f8), {"'data_offsets' [0]"});
  bad("offsets_backwards", st(one(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"), f8), {"ends before it begins"});
  bad("shape_offsets_mismatch", st(one(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), f8),
      {"tensor 't'", "hold 8 bytes, shape (3,) of F32 needs 12"});
  bad("f16_odd_bytes", st(one(R"("dtype":"F16","shape":[2],"data_offsets":[0,3])"), "abc"), {"needs 4"});
  bad("duplicate", st(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8),
      {"tensor 't': the header names it twice"});
  bad("gap", st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[1],"data_offsets":[5,6]}})",
                f8.substr(0, 6)),
      {"tensor 'b'", "leave a gap after tensor 'a'"});
  bad("gap_at_start", st(one(R"("dtype":"F32","shape":[1],"data_offsets":[4,8])"), f8), {"the start of the data"});
  bad("overlap", st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f8),
      {"tensor 'b'", "overlap tensor 'a'"});
  bad("data_short", st(one(ok_fields), f8.substr(0, 6)), {"end at 8, the data holds 6", "truncated?"});
  bad("data_long", st(one(ok_fields), f8 + "xy"), {"end at 8, the data holds 10", "after the last tensor"});
  bad("metadata_not_strings", st(R"({"__metadata__":{"epoch":3}})", ""), {"'__metadata__' key 'epoch'", "not a string"});
  bad("metadata_not_object", st(R"({"__metadata__":"x"})", ""), {"'__metadata__' is not an object"});
  bad("empty_name", st(R"({"":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})", ""), {"an empty name"});
  expect_error([&] { gio::read_safetensors(s / "missing.safetensors"); }, {(s / "missing.safetensors").string(), "open"});
}
