// libFuzzer target for the IDX reader (gradus/data/idx.hpp, MNIST's format). Each input is
// a whole file, held in memory (memory_file.hpp) and read by path, as read_idx and the
// load_mnist_* helpers read one. An accepted file is checked against its bytes: the rank
// and the extents are the header's, the extents multiply to the payload's size, and the
// payload is the rest of the file; load_mnist_images, load_mnist_image_bytes and
// load_mnist_labels agree with read_idx. Every refusal is a data_error naming the file.
#include "fuzz_check.hpp"
#include "memory_file.hpp"

#include <gradus/data/idx.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace data = gradus::data;

std::uint64_t sink;

bool refused(const std::string& path, const auto& read) {
  try {
    read();
    return false;
  } catch (const gradus::data_error& e) {
    FUZZ_CHECK(std::string_view(e.what()).starts_with("gradus: IDX file '" + path + "'"));
    return true;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gradus::fuzz::memory_file file("fuzz_idx");
  const std::string& path = file.hold(data, size);

  data::idx_file f;
  if (refused(path, [&] { f = data::read_idx(path); })) return 0;

  // The header: 0, 0, 0x08, the rank, then one big-endian u32 per axis.
  FUZZ_CHECK(f.path == path);
  FUZZ_CHECK(size >= 4 && data[0] == 0 && data[1] == 0 && data[2] == 0x08 && data[3] == f.shape.rank);
  FUZZ_CHECK(f.shape.rank >= 1 && f.shape.rank <= gradus::max_rank);
  const std::size_t header = 4 + 4 * f.shape.rank;
  FUZZ_CHECK(size >= header);
  std::uint64_t count = 1;
  for (std::size_t k = 0; k < f.shape.rank; ++k) {
    const std::uint8_t* b = data + 4 + 4 * k;
    const std::uint64_t e = (std::uint64_t{b[0]} << 24) | (std::uint64_t{b[1]} << 16) | (std::uint64_t{b[2]} << 8) | b[3];
    FUZZ_CHECK(f.shape.d[k] >= 0 && static_cast<std::uint64_t>(f.shape.d[k]) == e);
    FUZZ_CHECK(!__builtin_mul_overflow(count, e, &count));  // the extents' true product
  }
  // The extents multiply to the payload's size, and the payload is the rest of the file.
  FUZZ_CHECK(count == f.bytes.size() && header + f.bytes.size() == size);
  FUZZ_CHECK(f.bytes.empty() || std::memcmp(f.bytes.data(), data + header, f.bytes.size()) == 0);

  // The helpers: same bytes, a shape whose extents multiply to them.
  if (f.shape.rank == 3) {
    gradus::dims sx, sb;
    const auto x = data::load_mnist_images(path, &sx);
    const auto b = data::load_mnist_image_bytes(path, &sb);
    FUZZ_CHECK(x.size() == f.bytes.size() && b == f.bytes);
    FUZZ_CHECK(sx.rank == 2 && sx.d[0] == sb.d[0] && sx.d[1] == sb.d[1] && sx.d[0] == f.shape.d[0]);
    std::uint64_t n = 0;
    FUZZ_CHECK(!__builtin_mul_overflow(static_cast<std::uint64_t>(sx.d[0]), static_cast<std::uint64_t>(sx.d[1]), &n) &&
               n == x.size());
    for (std::size_t i = 0; i < x.size(); ++i) FUZZ_CHECK(x[i] >= 0.0f && x[i] <= 1.0f && std::fabs(x[i] * 255.0f - f.bytes[i]) < 0.01f);
  } else {
    FUZZ_CHECK(refused(path, [&] { data::load_mnist_images(path); }));
  }
  if (f.shape.rank == 1) {
    std::vector<std::int32_t> y;
    if (!refused(path, [&] { y = data::load_mnist_labels(path); })) {
      FUZZ_CHECK(y.size() == f.bytes.size());
      for (std::size_t i = 0; i < y.size(); ++i) FUZZ_CHECK(y[i] == f.bytes[i] && y[i] < 10);
    } else {
      FUZZ_CHECK(std::any_of(f.bytes.begin(), f.bytes.end(), [](std::uint8_t v) { return v >= 10; }));
    }
    sink += y.size();
  } else {
    FUZZ_CHECK(refused(path, [&] { data::load_mnist_labels(path); }));
  }
  return 0;
}
