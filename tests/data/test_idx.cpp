#define BOOST_TEST_MODULE data_idx
// IDX reading: files the test writes (a round trip of images and labels) and every kind of
// bad file, by message: the file, the byte offset and what was expected there. With the
// real MNIST present (tools/fetch-mnist.sh), its counts and test-set label histogram.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gradus/gradus.hpp>

namespace g = gradus;
namespace fs = std::filesystem;

namespace {
struct temp_dir {
  fs::path p = fs::temp_directory_path() / ("gradus_idx_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(p); }
  ~temp_dir() { fs::remove_all(p); }
  std::string write(const std::string& name, const std::vector<unsigned char>& bytes) const {
    const auto f = (p / name).string();
    std::ofstream o(f, std::ios::binary);
    o.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return f;
  }
};
std::vector<unsigned char> idx(unsigned char type, std::vector<std::uint32_t> extents, std::size_t data_bytes) {
  std::vector<unsigned char> b{0, 0, type, static_cast<unsigned char>(extents.size())};
  for (auto e : extents)
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(e >> s));
  for (std::size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<unsigned char>(i * 37));
  return b;
}
std::string error_of(auto&& f) {
  try {
    f();
  } catch (const g::data_error& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

BOOST_AUTO_TEST_CASE(round_trip) {
  temp_dir d;
  const auto imgs = d.write("imgs", idx(0x08, {3, 2, 2}, 12));
  const auto f = g::data::read_idx(imgs);
  BOOST_TEST(f.shape.rank == 3u);
  BOOST_TEST(f.shape.d[0] == 3);
  BOOST_TEST(f.bytes.size() == 12u);
  BOOST_TEST(f.bytes[5] == static_cast<std::uint8_t>(5 * 37));
  g::dims sh;
  const auto x = g::data::load_mnist_images(imgs, &sh);
  BOOST_TEST(sh.d[0] == 3);
  BOOST_TEST(sh.d[1] == 4);
  BOOST_TEST(x[5] == static_cast<float>(static_cast<std::uint8_t>(5 * 37)) / 255.0f);
  auto lab = idx(0x08, {4}, 0);
  for (unsigned char v : {3, 0, 9, 1}) lab.push_back(v);
  const auto y = g::data::load_mnist_labels(d.write("labs", lab));
  BOOST_TEST(y == (std::vector<std::int32_t>{3, 0, 9, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(bad_files_name_file_offset_and_expectation) {
  temp_dir d;
  auto has = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << p << "' in: " << msg);
  };
  has(error_of([&] { g::data::read_idx((d.p / "absent").string()); }), {"absent'", "cannot open"});
  has(error_of([&] { g::data::read_idx(d.write("short", {0, 0})); }), {"short'", "byte 0", "4-byte magic", "has 2 bytes"});
  has(error_of([&] { g::data::read_idx(d.write("gz", {0x1f, 0x8b, 8, 0, 1, 2, 3, 4})); }),
      {"gz'", "byte 0", "two zero bytes", "gzipped"});
  has(error_of([&] { g::data::read_idx(d.write("type", idx(0x0D, {2}, 8))); }),
      {"type'", "byte 2", "expected type code 0x08 (uint8), got 0x0d"});
  has(error_of([&] { g::data::read_idx(d.write("rank", idx(0x08, {1, 1, 1, 1, 1, 1, 1}, 1))); }),
      {"byte 3", "rank from 1 to 6, got 7"});
  auto cut_header = idx(0x08, {60000, 28, 28}, 0);
  cut_header.resize(10);
  has(error_of([&] { g::data::read_idx(d.write("hdr", cut_header)); }), {"byte 8", "extent of axis 1"});
  has(error_of([&] { g::data::read_idx(d.write("trunc", idx(0x08, {10, 28, 28}, 1000))); }),
      {"trunc'", "byte 16", "expected 7840 data bytes for shape (10, 28, 28) (7856 bytes in all)", "has 1016",
       "truncated"});
  has(error_of([&] { g::data::read_idx(d.write("tail", idx(0x08, {2, 2}, 7))); }),
      {"tail'", "byte 16", "3 trailing bytes (magic 0x00000802 says rank 2: is that the data's rank?)"});
  has(error_of([&] { g::data::load_mnist_images(d.write("rank1", idx(0x08, {5}, 5))); }),
      {"rank1'", "byte 3", "magic 0x00000801 says rank 1, expected rank 3 (images: count, rows, columns)"});
  auto lab = idx(0x08, {3}, 0);
  for (unsigned char v : {1, 12, 2}) lab.push_back(v);
  has(error_of([&] { g::data::load_mnist_labels(d.write("labs", lab)); }), {"labs'", "byte 9", "below 10, got 12"});
}

// A wrong rank byte shifts every extent after it: the images of a file whose magic says rank
// 1 read as 60000 values followed by trailing bytes, and labels that say rank 3 as a header
// running into their data. A reader that knows the rank refuses the magic number itself.
BOOST_AUTO_TEST_CASE(a_wrong_rank_byte_is_named_at_the_magic_number) {
  temp_dir d;
  auto has = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << p << "' in: " << msg);
  };
  auto imgs = idx(0x08, {4, 3, 3}, 36);
  imgs[3] = 1;  // images whose magic says rank 1
  const auto bad_imgs = d.write("imgs", imgs);
  for (const auto& msg : {error_of([&] { g::data::load_mnist_images(bad_imgs); }),
                          error_of([&] { g::data::load_mnist_image_bytes(bad_imgs); }),
                          error_of([&] { g::data::read_idx(bad_imgs, 3, "images: count, rows, columns"); })})
    has(msg, {"imgs'", "byte 3", "magic 0x00000801 says rank 1, expected rank 3 (images: count, rows, columns)"});
  auto labs = idx(0x08, {6}, 0);
  for (unsigned char v : {1, 2, 3, 4, 5, 6}) labs.push_back(v);
  labs[3] = 3;  // labels whose magic says rank 3
  has(error_of([&] { g::data::load_mnist_labels(d.write("labs", labs)); }),
      {"labs'", "byte 3", "magic 0x00000803 says rank 3, expected rank 1 (labels: count)"});
  // without an expected rank, the trailing bytes name the magic number and its rank
  has(error_of([&] { g::data::read_idx(bad_imgs); }),
      {"imgs'", "trailing bytes (magic 0x00000801 says rank 1: is that the data's rank?)"});
  // the expected rank, given, reads as before
  BOOST_TEST(g::data::read_idx(d.write("ok", idx(0x08, {4, 3, 3}, 36)), 3).shape.d[2] == 3);
}

// Images of another size than the caller expects are refused with both sizes; a directory in
// place of the file is named as one (it opens as a stream of 2^63 - 1 bytes that fail to read).
BOOST_AUTO_TEST_CASE(image_size_and_directory_are_named) {
  temp_dir d;
  auto has = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << p << "' in: " << msg);
  };
  const auto big = d.write("big", idx(0x08, {2, 32, 32}, 2 * 32 * 32));
  has(error_of([&] { g::data::load_mnist_images(big, nullptr, 28, 28); }), {"big'", "images are 32x32, not 28x28"});
  has(error_of([&] { g::data::load_mnist_image_bytes(big, nullptr, 28, 28); }),
      {"big'", "images are 32x32, not 28x28"});
  g::dims sh;
  BOOST_TEST(g::data::load_mnist_images(big, &sh).size() == 2u * 32 * 32);  // any size by default
  BOOST_TEST(sh.d[1] == 32 * 32);
  BOOST_TEST(g::data::load_mnist_image_bytes(d.write("fit", idx(0x08, {2, 28, 28}, 2 * 784)), &sh, 28, 28).size() ==
             2u * 784);
  fs::create_directories(d.p / "dir");
  has(error_of([&] { g::data::read_idx((d.p / "dir").string()); }),
      {"dir'", "cannot open it: it is a directory, not a file"});
  has(error_of([&] { g::data::load_mnist_labels((d.p / "dir").string()); }), {"dir'", "is a directory"});
}

// Found by tests/fuzz/fuzz_idx: extents whose product overflows. 2^16 * 2^24 * 2^24 wrapped
// around to 0 in the count, so a 16-byte file was accepted as an array of 2^64 values with
// no data; with an extent of 0, H * W of two extents near 2^32 overflowed index_t in
// load_mnist_images (undefined behaviour). Both are refused at the extent that goes over.
BOOST_AUTO_TEST_CASE(extents_multiplying_past_2_to_the_40_are_refused) {
  temp_dir d;
  auto has = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (const char* p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << p << "' in: " << msg);
  };
  has(error_of([&] { g::data::read_idx(d.write("wrap", idx(0x08, {1u << 16, 1u << 24, 1u << 24}, 0))); }),
      {"wrap'", "byte 12", "the extents multiply to more than 2^40 values"});
  const auto zero = d.write("zero", idx(0x08, {0, 0xfd000000u, 0xfd000000u}, 0));
  has(error_of([&] { g::data::load_mnist_images(zero); }),
      {"zero'", "byte 12", "the extents multiply to more than 2^40 values (leaving out the extents of 0)"});
  // at the limit, and an empty array of sane extents, still read
  BOOST_TEST(g::data::read_idx(d.write("empty", idx(0x08, {0, 1u << 20, 1u << 20}, 0))).bytes.empty());
  g::dims sh;
  BOOST_TEST(g::data::load_mnist_images(d.write("none", idx(0x08, {0, 28, 28}, 0)), &sh).empty());
  BOOST_TEST(sh.d[1] == 784);
}

BOOST_AUTO_TEST_CASE(real_mnist_when_present) {
  const fs::path dir = fs::path(GRADUS_SOURCE_DIR) / "data" / "mnist";
  if (!fs::exists(dir / "t10k-labels-idx1-ubyte")) {
    BOOST_TEST_MESSAGE("data/mnist absent (tools/fetch-mnist.sh): real-data checks skipped");
    return;
  }
  const auto y = g::data::load_mnist_labels((dir / "t10k-labels-idx1-ubyte").string());
  std::array<int, 10> h{};
  for (auto v : y) ++h[static_cast<std::size_t>(v)];
  BOOST_TEST(h == (std::array<int, 10>{980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009}),
             boost::test_tools::per_element());
  g::dims sh;
  const auto x = g::data::load_mnist_images((dir / "train-images-idx3-ubyte").string(), &sh);
  BOOST_TEST(sh.d[0] == 60000);
  BOOST_TEST(sh.d[1] == 784);
  BOOST_TEST(*std::max_element(x.begin(), x.end()) == 1.0f);
  BOOST_TEST(*std::min_element(x.begin(), x.end()) == 0.0f);
}
