// libFuzzer target for the NPY header parser (gradus/io/npy_format.hpp), the part of a
// .npz entry that is text: the input is the header's dict literal, as read_npz hands it to
// parse_npy_dict after the magic, the version and the length. An accepted dict names a type
// gradus reads (bool, int8-64, uint8-64, float16/32/64, either byte order, either order of
// axes) that loads as one of the five gradus dtypes, and a shape within max_rank of
// non-negative extents; byte_size is the shape times the item size, or refuses exactly when
// the extents other than 0 overflow size_t, wherever the 0 is; and the header npy_header
// writes for the loaded dtype and the shape is 64-byte aligned and parses back to them, as
// a little-endian C-order array that loads unchanged.
#include "fuzz_check.hpp"

#include <gradus/io/npy_format.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace {

namespace io = gradus::io::detail;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view dict(reinterpret_cast<const char*>(data), size);
  io::npy_header_info info;
  if (const auto why = io::parse_npy_dict(dict, info); !why.empty()) return 0;

  const auto& t = info.stored;
  FUZZ_CHECK(t.size == 1 || t.size == 2 || t.size == 4 || t.size == 8);
  FUZZ_CHECK(t.size == 1 || t.kind != io::stored_kind::boolean);
  FUZZ_CHECK(t.size != 1 || !t.big_endian);
  const auto* loaded = io::npy_type_of(io::loads_as(t));
  FUZZ_CHECK(loaded != nullptr && gradus::size_of(loaded->type) == io::loaded_size(t) && io::loaded_size(t) >= t.size);
  FUZZ_CHECK(info.shape.rank <= gradus::max_rank);
  // numpy's rule: the item size times the extents other than 0 fits size_t; a 0 anywhere
  // makes the byte count 0.
  std::size_t product = t.size;
  bool overflows = false, empty = false;
  for (std::size_t i = 0; i < info.shape.rank; ++i) {
    FUZZ_CHECK(info.shape.d[i] >= 0);
    if (info.shape.d[i] == 0) empty = true;
    else overflows = overflows || __builtin_mul_overflow(product, static_cast<std::size_t>(info.shape.d[i]), &product);
  }
  if (empty) product = 0;
  std::size_t n = 0;
  FUZZ_CHECK(io::byte_size(info.shape, t.size, n) == !overflows);
  FUZZ_CHECK(overflows || n == product);

  // Written as numpy writes it, it parses back to the loaded type and the same shape.
  const std::string h = io::npy_header(loaded->descr, info.shape);
  FUZZ_CHECK(h.size() % io::npy_align == 0 && h.size() >= 11 && h.back() == '\n');
  FUZZ_CHECK(std::string_view(h).starts_with(io::npy_magic) && h[6] == 1 && h[7] == 0);
  const std::size_t hlen = static_cast<unsigned char>(h[8]) | std::size_t{static_cast<unsigned char>(h[9])} << 8;
  FUZZ_CHECK(hlen + 10 == h.size());
  io::npy_header_info back;
  const auto why = io::parse_npy_dict(std::string_view(h).substr(10), back);
  if (!why.empty()) std::fprintf(stderr, "fuzz_npy: npy_header's own header is refused: %s\n", why.c_str());
  FUZZ_CHECK(why.empty() && back.shape == info.shape && !back.fortran_order && io::loads_unchanged(back.stored) &&
             io::loads_as(back.stored) == loaded->type);
  return 0;
}
