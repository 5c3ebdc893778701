// gradus::io .npy: round trips of every dtype and the bytes written (numpy's header), the
// atomic write; and, on hand-made files, what read_npy (and read_npz through the same
// reader) converts on load, value by value: Fortran order, big-endian, float16 (subnormals,
// infinities, NaN payloads), bool, int8/int16/uint16/uint32/uint64; the descrs it refuses
// and the errors naming the file. numpy itself writes and reads .npy files for
// io_interop.py (io_npy_* tests).
#define BOOST_TEST_MODULE io_npy
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <gradus/io/npy.hpp>

#include "io_test_files.hpp"

namespace g = gradus;
namespace gio = gradus::io;
using gradus::test::expect_error;
using gradus::test::npy;
using gradus::test::raw;
using gradus::test::scratch;
using gradus::test::slurp;
using gradus::test::spit;

namespace {

std::string hdr(const std::string& descr, bool fortran, const std::string& shape) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': " + shape + ", }";
}

// The values of an array read back, as T.
template <class T>
std::vector<T> values(const gio::npz_array& a) {
  BOOST_REQUIRE_EQUAL(a.bytes.size() % sizeof(T), 0u);
  std::vector<T> v(a.bytes.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), a.bytes.data(), a.bytes.size());
  return v;
}

// Reads an .npy file made of `dict` and `data`, checks its dtype and shape.
gio::npz_array load(const scratch& s, const std::string& dict, const std::string& data, const std::string& dtype,
                    const std::string& shape) {
  spit(s / "x.npy", npy(dict, data));
  auto a = gio::read_npy(s / "x.npy");
  BOOST_TEST(g::name_of(a.dtype) == dtype);
  BOOST_TEST(g::to_string(a.shape) == shape);
  return a;
}

// A big-endian copy of each value's bytes.
template <class T>
std::string big_endian(std::initializer_list<T> v) {
  std::string s;
  for (const T x : v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &x, sizeof(T));
    for (std::size_t k = sizeof(T); k-- > 0;) s += static_cast<char>(b[k]);
  }
  return s;
}

// write_npy writes `ref` (n bytes of data) as numpy would: the header `dict`, spaces, '\n',
// the data on a 64-byte boundary; read_npy reads it back.
void round_trip(const scratch& s, const gio::npz_array_ref& ref, std::size_t n, const std::string& dict) {
  BOOST_TEST_CONTEXT(ref.dtype.name() << " " << g::to_string(ref.shape)) {
    gio::write_npy(s / "w.npy", ref);
    const std::string data = n ? std::string(static_cast<const char*>(ref.data), n) : std::string();
    BOOST_TEST(slurp(s / "w.npy") == npy(dict, data));
    const auto a = gio::read_npy(s / "w.npy");
    BOOST_TEST(a.name == "w");
    BOOST_TEST(g::name_of(a.dtype) == ref.dtype.name());
    BOOST_TEST(g::to_string(a.shape) == g::to_string(ref.shape));
    BOOST_TEST(std::string(reinterpret_cast<const char*>(a.bytes.data()), a.bytes.size()) == data);
    BOOST_TEST(s.files() == std::vector<std::string>{"w.npy"});
  }
}

}  // namespace

// ---- writing --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(round_trip_every_dtype_and_the_bytes_written) {
  scratch s;
  const std::vector<float> f32 = {0.f, -0.f, std::bit_cast<float>(0x7fc12345u), 1e-45f, 3.5f, -1.f};
  const std::vector<double> f64 = {std::bit_cast<double>(0xfff8000000000abcull), 5e-324};
  const std::vector<std::int32_t> i32 = {std::numeric_limits<std::int32_t>::min(), 7};
  const std::vector<std::int64_t> i64 = {std::numeric_limits<std::int64_t>::max()};
  const std::vector<std::uint8_t> u8 = {0, 255, 1};
  round_trip(s, {"w", "float32", {2, 3}, f32.data()}, 24, hdr("<f4", false, "(2, 3)"));
  round_trip(s, {"w", "float64", {2}, f64.data()}, 16, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }");
  round_trip(s, {"w", "int32", {1, 2, 1}, i32.data()}, 8, hdr("<i4", false, "(1, 2, 1)"));
  round_trip(s, {"w", "int64", {}, i64.data()}, 8, hdr("<i8", false, "()"));
  round_trip(s, {"w", "uint8", {3}, u8.data()}, 3, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }");
  round_trip(s, {"w", "float32", {0, 4}, nullptr}, 0, hdr("<f4", false, "(0, 4)"));
}

BOOST_AUTO_TEST_CASE(write_errors_leave_the_previous_file) {
  scratch s;
  const std::vector<float> v = {1, 2};
  const auto p = s / "w.npy";
  gio::write_npy(p, {"w", "float32", {2}, v.data()});
  const std::string before = slurp(p);
  expect_error([&] { gio::write_npy(p, {"w", "float16", {2}, v.data()}); }, {p.string(), "'float16'", "float32"});
  expect_error([&] { gio::write_npy(p, {"w", "float32", {2}, nullptr}); }, {p.string(), "null"});
  expect_error([&] { gio::write_npy(p, {"w", "float32", {g::dyn}, v.data()}); }, {p.string(), "negative"});
  BOOST_TEST(slurp(p) == before);
  std::filesystem::create_directory(s / "dir.npy");
  expect_error([&] { gio::write_npy(s / "dir.npy", {"w", "float32", {2}, v.data()}); }, {"dir.npy", "rename"});
  expect_error([&] { gio::write_npy(s / "no" / "w.npy", {"w", "float32", {2}, v.data()}); },
               {(s / "no" / "w.npy").string(), "create temporary file"});
  BOOST_TEST((s.files() == std::vector<std::string>{"dir.npy", "w.npy"}));
}

// ---- converted on load ----------------------------------------------------------------------

// np.save of a Fortran-order 2x3 array (W.T of a C-order 3x2 W): a[i][j] = 10 i + j is
// stored column by column (0, 10, 1, 11, 2, 12) and loads in C order.
BOOST_AUTO_TEST_CASE(fortran_order_is_reordered_into_c_order) {
  scratch s;
  auto a = load(s, hdr("<f4", true, "(2, 3)"), raw<float>({0, 10, 1, 11, 2, 12}), "float32", "(2, 3)");
  BOOST_TEST((values<float>(a) == std::vector<float>{0, 1, 2, 10, 11, 12}));
  // rank 3, big-endian int16 (2, 3, 4): element (i, j, k) = 100 i + 10 j + k, Fortran order
  // (i fastest); together with a conversion.
  std::string data;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) data += big_endian<std::int16_t>({static_cast<std::int16_t>(100 * i + 10 * j + k)});
  a = load(s, hdr(">i2", true, "(2, 3, 4)"), data, "int32", "(2, 3, 4)");
  std::vector<std::int32_t> want;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) want.push_back(100 * i + 10 * j + k);
  BOOST_TEST(values<std::int32_t>(a) == want, boost::test_tools::per_element());
  // rank 0 and 1 are the same in either order; an empty one stays empty
  a = load(s, hdr("<i8", true, "(3,)"), raw<std::int64_t>({5, 6, 7}), "int64", "(3,)");
  BOOST_TEST((values<std::int64_t>(a) == std::vector<std::int64_t>{5, 6, 7}));
  a = load(s, hdr("<f8", true, "(0, 5)"), "", "float64", "(0, 5)");
  BOOST_TEST(a.bytes.empty());
}

BOOST_AUTO_TEST_CASE(big_endian_is_byte_swapped) {
  scratch s;
  const float inf = std::numeric_limits<float>::infinity();
  auto a = load(s, hdr(">f4", false, "(3,)"), big_endian<float>({1.5f, -2.f, inf}), "float32", "(3,)");
  BOOST_TEST((values<float>(a) == std::vector<float>{1.5f, -2.f, inf}));
  a = load(s, hdr(">f8", false, "(2,)"), big_endian<double>({-0.1, 1e300}), "float64", "(2,)");
  BOOST_TEST((values<double>(a) == std::vector<double>{-0.1, 1e300}));
  a = load(s, hdr(">i4", false, "(2,)"), big_endian<std::int32_t>({-1, 0x01020304}), "int32", "(2,)");
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{-1, 0x01020304}));
  a = load(s, hdr(">i8", false, "()"), big_endian<std::int64_t>({-0x0102030405060708}), "int64", "()");
  BOOST_TEST((values<std::int64_t>(a) == std::vector<std::int64_t>{-0x0102030405060708}));
  a = load(s, hdr(">u2", false, "(2,)"), big_endian<std::uint16_t>({65535, 258}), "int32", "(2,)");
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{65535, 258}));
}

// float16 -> float32 is exact: each half's float, bit for bit, NaN payloads kept.
BOOST_AUTO_TEST_CASE(float16_loads_as_float32_exactly) {
  scratch s;
  const std::vector<std::pair<std::uint16_t, std::uint32_t>> cases = {
      {0x0000, 0x00000000},  // 0
      {0x8000, 0x80000000},  // -0
      {0x0001, 0x33800000},  // smallest subnormal, 2^-24
      {0x8003, 0xb4400000},  // -3 * 2^-24
      {0x03ff, 0x387fc000},  // largest subnormal
      {0x0400, 0x38800000},  // smallest normal, 2^-14
      {0x3c00, 0x3f800000},  // 1
      {0x3555, 0x3eaaa000},  // 0.333251953125
      {0xc000, 0xc0000000},  // -2
      {0x7bff, 0x477fe000},  // 65504, the largest
      {0x7c00, 0x7f800000},  // inf
      {0xfc00, 0xff800000},  // -inf
      {0x7e00, 0x7fc00000},  // quiet NaN
      {0x7d01, 0x7fa02000},  // signalling NaN with a payload
      {0xfe01, 0xffc02000},  // negative NaN with a payload
  };
  std::string le, be;
  std::vector<std::uint32_t> want;
  for (const auto& [h, f] : cases) {
    le += raw<std::uint16_t>({h});
    be += big_endian<std::uint16_t>({h});
    want.push_back(f);
  }
  const std::string shape = "(" + std::to_string(cases.size()) + ",)";
  auto a = load(s, hdr("<f2", false, shape), le, "float32", shape);
  BOOST_TEST(values<std::uint32_t>(a) == want, boost::test_tools::per_element());
  a = load(s, hdr(">f2", false, shape), be, "float32", shape);
  BOOST_TEST(values<std::uint32_t>(a) == want, boost::test_tools::per_element());
  // 1/3 in float16 is 0.333251953125: exactly that float
  BOOST_TEST(std::bit_cast<float>(0x3eaaa000u) == 0.333251953125f);
}

BOOST_AUTO_TEST_CASE(bool_and_narrow_integers_widen) {
  scratch s;
  auto a = load(s, hdr("|b1", false, "(2, 2)"), std::string("\1\0\0\1", 4), "uint8", "(2, 2)");
  BOOST_TEST((values<std::uint8_t>(a) == std::vector<std::uint8_t>{1, 0, 0, 1}));
  a = load(s, hdr("|i1", false, "(3,)"), raw<std::int8_t>({-128, 127, -1}), "int32", "(3,)");
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{-128, 127, -1}));
  a = load(s, hdr("<i2", false, "(2,)"), raw<std::int16_t>({-32768, 32767}), "int32", "(2,)");
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{-32768, 32767}));
  a = load(s, hdr("<u2", false, "(2,)"), raw<std::uint16_t>({0, 65535}), "int32", "(2,)");
  BOOST_TEST((values<std::int32_t>(a) == std::vector<std::int32_t>{0, 65535}));
  a = load(s, hdr("<u4", false, "(2,)"), raw<std::uint32_t>({4294967295u, 1}), "int64", "(2,)");
  BOOST_TEST((values<std::int64_t>(a) == std::vector<std::int64_t>{4294967295, 1}));
  a = load(s, hdr("|u1", false, "(1,)"), "\xff", "uint8", "(1,)");
  BOOST_TEST((values<std::uint8_t>(a) == std::vector<std::uint8_t>{255}));
  const std::uint64_t top = std::numeric_limits<std::int64_t>::max();
  a = load(s, hdr("<u8", false, "(2,)"), raw<std::uint64_t>({0, top}), "int64", "(2,)");
  BOOST_TEST((values<std::int64_t>(a) == std::vector<std::int64_t>{0, std::numeric_limits<std::int64_t>::max()}));
}

BOOST_AUTO_TEST_CASE(values_that_do_not_convert_are_refused_by_index) {
  scratch s;
  const auto p = s / "x.npy";
  spit(p, npy(hdr("<u8", false, "(3,)"), raw<std::uint64_t>({5, std::uint64_t{1} << 63, ~std::uint64_t{0}})));
  expect_error([&] { gio::read_npy(p); },
               {"gradus: read_npy '" + p.string() + "': ",
                "uint64 value 9223372036854775808 at index 1 does not fit int64", "convert the array in numpy"});
  spit(p, npy(hdr(">u8", true, "(2, 2)"), big_endian<std::uint64_t>({1, 2, 3, ~std::uint64_t{0}})));
  expect_error([&] { gio::read_npy(p); },
               {p.string(), "uint64 value 18446744073709551615 at index 3", "Fortran order"});
  spit(p, npy(hdr("|b1", false, "(3,)"), std::string("\1\0\2", 3)));
  expect_error([&] { gio::read_npy(p); }, {p.string(), "bool byte 2 at index 2 is neither 0 nor 1"});
}

// ---- refused --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(unsupported_descrs_are_refused_by_name) {
  scratch s;
  const auto p = s / "x.npy";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"'<c8'", "complex"},          {"'<c16'", "complex"},        {"'|S4'", "byte strings"},
      {"'<U3'", "unicode strings"},  {"'|O'", "Python objects"},   {"'<f16'", "float128"},
      {"'<M8[ns]'", "datetime64"},   {"'<m8[s]'", "timedelta64"},  {"'|V2'", "bfloat16"},
      {"'<f3'", "an unknown size"},  {"'|i4'", "no byte order"},   {"'f4'", "no byte order"},
  };
  for (const auto& [descr, why] : refused) {
    BOOST_TEST_CONTEXT(descr) {
      spit(p, npy("{'descr': " + descr + ", 'fortran_order': False, 'shape': (2,), }", std::string(32, '\0')));
      expect_error([&] { gio::read_npy(p); },
                   {"gradus: read_npy '" + p.string() + "': unsupported descr " + descr + " (", why, "astype"});
    }
  }
  spit(p, npy("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,), }", std::string(16, '\0')));
  expect_error([&] { gio::read_npy(p); }, {p.string(), "structured dtypes are not supported", "astype"});
}

BOOST_AUTO_TEST_CASE(read_errors_name_the_file) {
  scratch s;
  const auto p = s / "x.npy";
  expect_error([&] { gio::read_npy(s / "missing.npy"); }, {(s / "missing.npy").string(), "open"});
  expect_error([&] { gio::read_npy(s.dir); }, {s.dir.string(), "not a regular file"});
  spit(p, "");
  expect_error([&] { gio::read_npy(p); }, {p.string(), "shorter than an NPY preamble"});
  spit(p, "PK\x03\x04 an npz is a zip, not an npy file");
  expect_error([&] { gio::read_npy(p); }, {p.string(), "magic"});
  spit(p, npy(hdr("<f2", false, "(3,)"), raw<std::uint16_t>({1, 2})));
  expect_error([&] { gio::read_npy(p); }, {p.string(), "shape (3,) of float16 needs 6 bytes, the file holds 4"});
  spit(p, npy(hdr("<f4", false, "(1,)"), raw<float>({1, 2})));
  expect_error([&] { gio::read_npy(p); }, {p.string(), "needs 4 bytes, the file holds 8"});
  spit(p, npy(hdr("<f4", false, "(1,)"), "").substr(0, 30));
  expect_error([&] { gio::read_npy(p); }, {p.string(), "truncated", "NPY header"});
  // versions 2.0 and 3.0 (a 4-byte header length) read as 1.0
  spit(p, npy(hdr("<f4", false, "(2,)"), raw<float>({1, 2}), 3));
  BOOST_TEST((values<float>(gio::read_npy(p)) == std::vector<float>{1, 2}));
}
