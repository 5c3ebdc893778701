// gradus::io .npz: bit-exact round trips of every dtype (rank 0, zero-size, rank 6), names
// with '/', the bytes written (NPY 1.0 header, 64-byte alignment, stored entries), numpy's
// own header formatting, the reader's errors on corrupt input (each built here), and the
// atomic write: a failed write leaves the previous file and no temporary file behind.
// numpy itself is checked against gradus by io_interop.py (io_npz_* tests).
#define BOOST_TEST_MODULE io_npz
#include <boost/test/unit_test.hpp>

#include <sys/resource.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <gradus/core/dtype.hpp>
#include <gradus/io/npz.hpp>

#include "io_test_files.hpp"

namespace g = gradus;
namespace gio = gradus::io;
namespace fs = std::filesystem;
using gradus::test::expect_error;
using gradus::test::floats;
using gradus::test::npy;
using gradus::test::scratch;
using gradus::test::slurp;
using gradus::test::spit;

namespace {

template <class T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A zip built with libzip from (entry name, bytes) pairs, stored uncompressed.
void raw_zip(const fs::path& p, const std::vector<std::pair<std::string, std::string>>& entries) {
  fs::remove(p);
  int code = 0;
  zip_t* z = zip_open(p.c_str(), ZIP_CREATE | ZIP_EXCL, &code);
  BOOST_REQUIRE(z);
  for (const auto& [name, bytes] : entries) {
    zip_source_t* s = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
    BOOST_REQUIRE(s);
    const zip_int64_t i = zip_file_add(z, name.c_str(), s, 0);
    BOOST_REQUIRE(i >= 0);
    BOOST_REQUIRE(zip_set_file_compression(z, static_cast<zip_uint64_t>(i), ZIP_CM_STORE, 0) == 0);
  }
  BOOST_REQUIRE(zip_close(z) == 0);
}

// The raw bytes of one entry of a zip, read with libzip.
std::string entry_bytes(const fs::path& p, const std::string& name, zip_uint16_t* method = nullptr) {
  int code = 0;
  zip_t* z = zip_open(p.c_str(), ZIP_RDONLY, &code);
  BOOST_REQUIRE(z);
  zip_stat_t st;
  BOOST_REQUIRE(zip_stat(z, name.c_str(), 0, &st) == 0);
  if (method) *method = st.comp_method;
  std::string out(st.size, '\0');
  zip_file_t* f = zip_fopen(z, name.c_str(), 0);
  BOOST_REQUIRE(f);
  BOOST_REQUIRE(zip_fread(f, out.data(), out.size()) == static_cast<zip_int64_t>(out.size()));
  zip_fclose(f);
  zip_discard(z);
  return out;
}

void check_same(const std::vector<gio::npz_array>& got, const std::vector<gio::npz_array_ref>& want,
                const std::vector<std::vector<std::byte>>& want_bytes) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    BOOST_TEST_CONTEXT("array " << want[i].name) {
      BOOST_TEST(got[i].name == want[i].name);
      BOOST_TEST(g::name_of(got[i].dtype) == want[i].dtype.name());
      BOOST_TEST(g::to_string(got[i].shape) == g::to_string(want[i].shape));
      BOOST_TEST((got[i].bytes == want_bytes[i]));
    }
  }
}

}  // namespace

// ---- round trips --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(round_trip_every_dtype_bit_exact) {
  scratch s;
  const float qnan = std::bit_cast<float>(0x7fc12345u), snan = std::bit_cast<float>(0x7f800001u);
  const std::vector<float> f32 = {0.f, -0.f, 1.5f, qnan, snan, std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()};
  const std::vector<double> f64 = {std::bit_cast<double>(0xfff8000000000abcull), -0.0, 1e308, 5e-324};
  const std::vector<std::int32_t> i32 = {std::numeric_limits<std::int32_t>::min(), -1, 0, 1, 7, 8, 9,
                                         std::numeric_limits<std::int32_t>::max()};
  const std::vector<std::int64_t> i64 = {std::numeric_limits<std::int64_t>::min()};
  const std::vector<std::uint8_t> u8 = {0, 1, 127, 128, 255};
  const std::vector<float> scalar_f = {-3.25f};
  std::vector<float> rank6(1 * 2 * 1 * 3 * 1 * 2);
  for (std::size_t i = 0; i < rank6.size(); ++i) rank6[i] = static_cast<float>(i) - 5.5f;

  const std::vector<gio::npz_array_ref> arrays = {
      {"f32", "float32", {2, 4}, f32.data()},
      {"f64", "float64", {4}, f64.data()},
      {"i32", "int32", {2, 2, 2}, i32.data()},
      {"i64_rank0", "int64", {}, i64.data()},
      {"u8", "uint8", {5}, u8.data()},
      {"f32_rank0", "float32", {}, scalar_f.data()},
      {"f64_empty", "float64", {0}, nullptr},
      {"i32_empty", "int32", {3, 0, 2}, nullptr},
      {"f32_rank6", "float32", {1, 2, 1, 3, 1, 2}, rank6.data()},
  };
  const std::vector<std::vector<std::byte>> bytes = {as_bytes(f32), as_bytes(f64), as_bytes(i32),
                                                     as_bytes(i64), as_bytes(u8),  as_bytes(scalar_f),
                                                     {},            {},            as_bytes(rank6)};
  gio::write_npz(s / "all.npz", arrays);
  check_same(gio::read_npz(s / "all.npz"), arrays, bytes);
  BOOST_TEST(s.files() == std::vector<std::string>{"all.npz"});
  // numpy's names, as the arrays above spell them, are the element types the rest of gradus uses;
  // another word is kept as given, for the writer to refuse by name.
  BOOST_TEST((gio::array_dtype("float32") == g::element_type_of<float>));
  BOOST_TEST((gio::array_dtype("float64") == g::element_type_of<double>));
  BOOST_TEST((gio::array_dtype("int32") == g::element_type_of<std::int32_t>));
  BOOST_TEST((gio::array_dtype(g::element_type::i64).name() == "int64"));
  BOOST_TEST((gio::array_dtype("bool") == g::element_type::none));
  BOOST_TEST(gio::array_dtype("bool").name() == "bool");
  BOOST_TEST(gio::array_dtype("").name() == "");
}

BOOST_AUTO_TEST_CASE(names_with_slashes_and_overwrite) {
  scratch s;
  const std::vector<float> m = {1, 2, 3}, v = {4, 5, 6};
  const std::vector<std::int64_t> step = {42};
  const std::vector<gio::npz_array_ref> arrays = {
      {"w1/adam_m", "float32", {3}, m.data()},
      {"w1/adam_v", "float32", {3}, v.data()},
      {"opt/state/step", "int64", {}, step.data()},
  };
  gio::write_npz(s / "ckpt.npz", arrays);
  check_same(gio::read_npz(s / "ckpt.npz"), arrays, {as_bytes(m), as_bytes(v), as_bytes(step)});
  zip_uint16_t method = 0;
  BOOST_TEST(entry_bytes(s / "ckpt.npz", "w1/adam_m.npy", &method).size() == 128u + 12u);
  BOOST_TEST(method == ZIP_CM_STORE);

  // Writing again replaces the file whole.
  const std::vector<float> m2 = {7, 8};
  gio::write_npz(s / "ckpt.npz", {{"w1/adam_m", "float32", {2}, m2.data()}});
  check_same(gio::read_npz(s / "ckpt.npz"), {{"w1/adam_m", "float32", {2}, m2.data()}}, {as_bytes(m2)});
  BOOST_TEST(s.files() == std::vector<std::string>{"ckpt.npz"});
}

BOOST_AUTO_TEST_CASE(empty_archive) {
  scratch s;
  gio::write_npz(s / "empty.npz", std::span<const gio::npz_array_ref>{});
  BOOST_TEST(gio::read_npz(s / "empty.npz").empty());
  BOOST_TEST(s.files() == std::vector<std::string>{"empty.npz"});
}

// ---- the bytes written ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(npy_header_bytes_and_alignment) {
  scratch s;
  const std::vector<double> d(2 * 3);
  const std::vector<std::uint8_t> u(5);
  const std::vector<std::int32_t> one = {1};
  std::vector<float> big(1 * 2 * 3 * 4 * 5 * 6);
  gio::write_npz(s / "h.npz", {{"d", "float64", {2, 3}, d.data()},
                               {"u", "uint8", {5}, u.data()},
                               {"scalar", "int32", {}, one.data()},
                               {"r6", "float32", {1, 2, 3, 4, 5, 6}, big.data()},
                               {"wide", "int64", {0, 123456789012345, 1, 1, 1, 1}, nullptr}});
  const std::vector<std::pair<std::string, std::string>> want = {
      {"d.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }"},
      {"u.npy", "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }"},
      {"scalar.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (), }"},
      {"r6.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3, 4, 5, 6), }"},
      {"wide.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 123456789012345, 1, 1, 1, 1), }"},
  };
  for (const auto& [entry, dict] : want) {
    BOOST_TEST_CONTEXT(entry) {
      zip_uint16_t method = 0;
      const std::string raw = entry_bytes(s / "h.npz", entry, &method);
      BOOST_TEST(method == ZIP_CM_STORE);
      BOOST_REQUIRE(raw.size() >= 10u);
      BOOST_TEST(raw.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
      const std::size_t hlen = static_cast<unsigned char>(raw[8]) | static_cast<unsigned char>(raw[9]) << 8;
      const std::size_t data_at = 10 + hlen;
      BOOST_TEST(data_at % 64 == 0u);
      BOOST_REQUIRE(raw.size() >= data_at);
      BOOST_TEST(raw[data_at - 1] == '\n');
      const std::string header = raw.substr(10, hlen);
      BOOST_TEST(header.substr(0, dict.size()) == dict);
      BOOST_TEST(header.find_first_not_of(' ', dict.size()) == hlen - 1);
    }
  }
  BOOST_TEST(entry_bytes(s / "h.npz", "u.npy").size() == 128u + 5u);
}

// numpy 1.24 leaves spaces after the dict for in-place growth; older numpy aligned to 16;
// version 2.0 has a 4-byte header length; Python accepts either quote and any key order.
BOOST_AUTO_TEST_CASE(reads_numpy_header_formatting) {
  scratch s;
  const std::string data = floats({1.f, -2.f, 3.5f});
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  raw_zip(s / "numpy.npz", {{"growth.npy", npy(dict, data, 1, 20)},
                            {"v2.npy", npy(dict, data, 2)},
                            {"align16.npy", npy(dict, data, 1, 0, 16)},
                            {"order.npy", npy("{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<f4\"}", data)},
                            {"tight.npy", npy("{'descr':'<f4','fortran_order':False,'shape':(1,3)}", data)},
                            {"long.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3L,), }", data)}});
  const auto got = gio::read_npz(s / "numpy.npz");
  BOOST_REQUIRE_EQUAL(got.size(), 6u);
  for (const auto& a : got) {
    BOOST_TEST_CONTEXT(a.name) {
      BOOST_TEST(g::name_of(a.dtype) == "float32");
      BOOST_TEST(g::to_string(a.shape) == (a.name == "tight" ? "(1, 3)" : "(3,)"));
      BOOST_TEST(std::string(reinterpret_cast<const char*>(a.bytes.data()), a.bytes.size()) == data);
    }
  }
}

// Entries numpy stores as other types or orders load converted, as read_npy converts them.
BOOST_AUTO_TEST_CASE(reads_converted_entries) {
  scratch s;
  // float16 1, -2, 0.5 and 65504; a Fortran-order 2x2 big-endian int32 [[1, 2], [3, 4]]
  raw_zip(s / "conv.npz", {{"h.npy", npy("{'descr': '<f2', 'fortran_order': False, 'shape': (4,), }",
                                         gradus::test::raw<std::uint16_t>({0x3c00, 0xc000, 0x3800, 0x7bff}))},
                           {"f.npy", npy("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 2), }",
                                         std::string("\0\0\0\1\0\0\0\3\0\0\0\2\0\0\0\4", 16))}});
  const auto got = gio::read_npz(s / "conv.npz");
  BOOST_REQUIRE_EQUAL(got.size(), 2u);
  BOOST_TEST(g::name_of(got[0].dtype) == "float32");
  BOOST_TEST((got[0].bytes == as_bytes(std::vector<float>{1.f, -2.f, 0.5f, 65504.f})));
  BOOST_TEST(g::name_of(got[1].dtype) == "int32");
  BOOST_TEST(g::to_string(got[1].shape) == "(2, 2)");
  BOOST_TEST((got[1].bytes == as_bytes(std::vector<std::int32_t>{1, 2, 3, 4})));
}

// ---- reader errors --------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(error_missing_file_and_not_a_zip) {
  scratch s;
  const auto missing = s / "missing.npz";
  expect_error([&] { gio::read_npz(missing); }, {missing.string(), "zip"});
  spit(s / "text.npz", "this is not a zip archive, it is some text\n");
  expect_error([&] { gio::read_npz(s / "text.npz"); }, {(s / "text.npz").string(), "Not a zip archive"});
  spit(s / "nothing.npz", "");
  expect_error([&] { gio::read_npz(s / "nothing.npz"); }, {(s / "nothing.npz").string()});
}

BOOST_AUTO_TEST_CASE(error_truncated_file) {
  scratch s;
  std::vector<double> v(1000, 0.25);
  gio::write_npz(s / "good.npz", {{"a", "float64", {1000}, v.data()}, {"b", "float64", {1000}, v.data()}});
  const std::string bytes = slurp(s / "good.npz");
  for (const std::size_t keep : {bytes.size() / 2, bytes.size() - 1, std::size_t{30}}) {
    BOOST_TEST_CONTEXT("kept " << keep << " of " << bytes.size()) {
      spit(s / "cut.npz", bytes.substr(0, keep));
      expect_error([&] { gio::read_npz(s / "cut.npz"); }, {(s / "cut.npz").string(), "truncated?"});
    }
  }
}

BOOST_AUTO_TEST_CASE(error_corrupt_data_crc) {
  scratch s;
  std::vector<float> v(64, 1.0f);
  gio::write_npz(s / "good.npz", {{"w", "float32", {64}, v.data()}});
  std::string bytes = slurp(s / "good.npz");
  const std::string one = floats({1.0f});
  const auto at = bytes.find(one + one + one);
  BOOST_REQUIRE(at != std::string::npos);
  bytes[at + 1] ^= 0x10;
  spit(s / "flipped.npz", bytes);
  expect_error([&] { gio::read_npz(s / "flipped.npz"); }, {(s / "flipped.npz").string(), "'w.npy'", "CRC"});
}

BOOST_AUTO_TEST_CASE(error_bad_entries) {
  scratch s;
  const std::string data = floats({1, 2, 3, 4});
  const auto bad = [&](const std::string& what, const std::string& entry_data, std::initializer_list<std::string> needles) {
    BOOST_TEST_CONTEXT(what) {
      const auto p = s / (what + ".npz");
      raw_zip(p, {{"ok.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", data)},
                  {"x.npy", entry_data}});
      std::vector<std::string> all = {p.string(), "'x.npy'"};
      all.insert(all.end(), needles);
      try {
        gio::read_npz(p);
        BOOST_ERROR("no error");
      } catch (const g::error& e) {
        const std::string msg = e.what();
        BOOST_TEST_MESSAGE(what << ": " << msg);
        for (const auto& n : all) BOOST_CHECK_MESSAGE(msg.find(n) != std::string::npos, "'" << msg << "' lacks '" << n << "'");
      }
    }
  };
  const auto hdr = [](const std::string& descr, const std::string& order, const std::string& shape) {
    return "{'descr': " + descr + ", 'fortran_order': " + order + ", 'shape': " + shape + ", }";
  };
  bad("bad_magic", "\x93NUMPZ\x01\x00" + std::string(100, ' '), {"magic"});
  bad("no_magic", std::string("PK\x03\x04 not numpy at all, really not"), {"magic"});
  bad("short_preamble", "\x93NUM", {"truncated"});
  bad("version", npy(hdr("'<f4'", "False", "(4,)"), data).replace(6, 1, "\x04"), {"version 4.0"});
  // (the descrs refused and the conversions are test_npy.cpp's: read_npy shares this reader)
  bad("object", npy(hdr("'|O'", "False", "(4,)"), data), {"unsupported descr '|O' (Python objects)", "astype"});
  bad("complex", npy(hdr("'<c8'", "False", "(2,)"), data), {"unsupported descr '<c8' (complex)"});
  bad("float16_short", npy(hdr("'<f2'", "False", "(9,)"), data), {"float16 needs 18 bytes, the entry holds 16"});
  bad("structured", npy(hdr("[('a', '<f4')]", "False", "(4,)"), data), {"structured"});
  bad("fortran_short", npy(hdr("'>f4'", "True", "(2, 3)"), data), {"data size mismatch", "float32 needs 24"});
  bad("short_data", npy(hdr("'<f4'", "False", "(5,)"), data), {"data size mismatch", "(5,)", "20 bytes", "holds 16"});
  bad("long_data", npy(hdr("'<f4'", "False", "(3,)"), data), {"data size mismatch", "12 bytes", "holds 16"});
  bad("rank_7", npy(hdr("'<f4'", "False", "(1, 1, 1, 1, 1, 1, 4)"), data), {"max_rank"});
  bad("not_tuple", npy(hdr("'<f4'", "False", "(4)"), data), {"not a tuple"});
  bad("negative", npy(hdr("'<f4'", "False", "(-4,)"), data), {"'shape'"});
  bad("huge", npy(hdr("'<f4'", "False", "(99999999999999999999,)"), data), {"too large"});
  bad("overflow", npy(hdr("'<f4'", "False", "(4294967296, 4294967296, 4294967296)"), data), {"too large"});
  // Found by tests/fuzz/fuzz_npy: with a 0 after the overflow the shape was refused, with the
  // 0 first it was read; numpy's rule (the extents other than 0 must not overflow) either way.
  bad("overflow_then_0", npy(hdr("'<f4'", "False", "(4294967296, 4294967296, 0)"), ""), {"too large"});
  bad("0_then_overflow", npy(hdr("'<f4'", "False", "(0, 4294967296, 4294967296)"), ""),
      {"shape (0, 4294967296, 4294967296) is too large"});
  bad("missing_key", npy("{'descr': '<f4', 'shape': (4,), }", data), {"lacks 'fortran_order'"});
  bad("extra_key", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}", data), {"unexpected key 'x'"});
  bad("repeated_key", npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}", data),
      {"repeats 'descr'"});
  bad("not_a_dict", npy("[1, 2]", data), {"not a dict"});
  bad("trailing_text", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)} x", data), {"text after"});
  // The header length runs past the end of the entry.
  std::string cut = npy(hdr("'<f4'", "False", "(4,)"), "").substr(0, 40);
  bad("truncated_header", cut, {"truncated", "NPY header"});
}

BOOST_AUTO_TEST_CASE(error_entry_names) {
  scratch s;
  const std::string a = npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", floats({1}));
  raw_zip(s / "txt.npz", {{"readme.txt", "hello"}});
  expect_error([&] { gio::read_npz(s / "txt.npz"); }, {(s / "txt.npz").string(), "'readme.txt'", ".npy"});
  // Two entries of the same name: libzip will not add them, so rename one in the bytes
  // (the name is in the local header and in the central directory; CRCs cover data only).
  raw_zip(s / "dup.npz", {{"aa.npy", a}, {"ab.npy", a}});
  std::string bytes = slurp(s / "dup.npz");
  for (std::size_t at = bytes.find("ab.npy"); at != std::string::npos; at = bytes.find("ab.npy", at)) bytes[at + 1] = 'a';
  spit(s / "dup.npz", bytes);
  expect_error([&] { gio::read_npz(s / "dup.npz"); }, {(s / "dup.npz").string(), "same name"});
}

// Every single-byte corruption of a small file either still reads (a byte libzip does not
// check, such as a timestamp) or throws gradus::error: never another exception or a crash.
BOOST_AUTO_TEST_CASE(every_byte_flipped_reads_or_throws_gradus_error) {
  scratch s;
  const std::vector<float> v = {1, 2, 3};
  const std::vector<std::int64_t> step = {7};
  gio::write_npz(s / "good.npz", {{"w/a", "float32", {3}, v.data()}, {"step", "int64", {}, step.data()}});
  const std::string good = slurp(s / "good.npz");
  int read_ok = 0, gradus_errors = 0;
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    spit(s / "bad.npz", bad);
    try {
      gio::read_npz(s / "bad.npz");
      ++read_ok;
    } catch (const g::error&) {
      ++gradus_errors;
    } catch (const std::exception& e) {
      BOOST_ERROR("byte " << i << ": not a gradus::error: " << e.what());
    }
  }
  BOOST_TEST_MESSAGE(good.size() << " corruptions: " << gradus_errors << " gradus::error, " << read_ok << " read");
  BOOST_TEST(gradus_errors > static_cast<int>(good.size()) / 2);
}

// ---- writer errors and atomicity ------------------------------------------------------------

BOOST_AUTO_TEST_CASE(write_rejects_bad_arrays_before_touching_disk) {
  scratch s;
  const std::vector<float> v = {1, 2};
  const auto p = s / "w.npz";
  expect_error([&] { gio::write_npz(p, {{"a", "bfloat16", {2}, v.data()}}); }, {p.string(), "'a'", "bfloat16"});
  expect_error([&] { gio::write_npz(p, {{"a", "float32", {2}, v.data()}, {"a", "float32", {2}, v.data()}}); },
               {p.string(), "'a'", "two arrays"});
  expect_error([&] { gio::write_npz(p, {{"", "float32", {2}, v.data()}}); }, {p.string(), "empty name"});
  expect_error([&] { gio::write_npz(p, {{"a", "float32", {2}, nullptr}}); }, {p.string(), "null"});
  expect_error([&] { gio::write_npz(p, {{"a", "float32", {g::dyn, 2}, v.data()}}); }, {p.string(), "negative"});
  const g::index_t big = g::index_t{1} << 32;
  expect_error([&] { gio::write_npz(p, {{"a", "float32", {0, big, big}, nullptr}}); },
               {p.string(), "'a'", "shape (0, 4294967296, 4294967296) has a negative extent or is too large"});
  // libzip refuses a name that is not UTF-8.
  expect_error([&] { gio::write_npz(p, {{"bad\xff", "float32", {2}, v.data()}}); }, {p.string(), "zip_file_add"});
  BOOST_TEST(s.files().empty());
}

BOOST_AUTO_TEST_CASE(write_into_missing_directory) {
  scratch s;
  const std::vector<float> v = {1, 2};
  const auto p = s / "no" / "such" / "dir" / "ckpt.npz";
  expect_error([&] { gio::write_npz(p, {{"a", "float32", {2}, v.data()}}); }, {p.string()});
  expect_error([&] { gio::write_npz(p, std::span<const gio::npz_array_ref>{}); }, {p.string()});
  BOOST_TEST(s.files().empty());
}

BOOST_AUTO_TEST_CASE(write_over_a_directory_leaves_no_temporary) {
  scratch s;
  const std::vector<float> v = {1, 2};
  fs::create_directory(s / "ckpt.npz");
  expect_error([&] { gio::write_npz(s / "ckpt.npz", {{"a", "float32", {2}, v.data()}}); },
               {(s / "ckpt.npz").string(), "rename"});
  BOOST_TEST(s.files() == std::vector<std::string>{"ckpt.npz"});
  BOOST_TEST(fs::is_directory(s / "ckpt.npz"));
}

// A write that fails half-way (the file size limit stops libzip's writes with EFBIG) leaves
// the previous checkpoint as it was and no temporary file.
BOOST_AUTO_TEST_CASE(failed_write_keeps_previous_file) {
  scratch s;
  const auto p = s / "ckpt.npz";
  const std::vector<float> small = {1, 2, 3};
  gio::write_npz(p, {{"w", "float32", {3}, small.data()}});
  const std::string before = slurp(p);

  std::vector<float> big(1 << 20, 0.5f);  // 4 MiB
  rlimit old{};
  BOOST_REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit lim = old;
  lim.rlim_cur = 64 * 1024;
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  std::string msg;
  try {
    gio::write_npz(p, {{"w", "float32", {1 << 20}, big.data()}});
  } catch (const g::error& e) {
    msg = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  BOOST_TEST_MESSAGE("error: " << msg);
  BOOST_TEST(msg.find(p.string()) != std::string::npos);
  BOOST_TEST(msg.find("zip_close") != std::string::npos);
  BOOST_TEST(slurp(p) == before);
  BOOST_TEST(s.files() == std::vector<std::string>{"ckpt.npz"});
  const auto back = gio::read_npz(p);
  BOOST_REQUIRE_EQUAL(back.size(), 1u);
  BOOST_TEST((back[0].bytes == as_bytes(small)));
}
