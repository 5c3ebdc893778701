// libFuzzer target for the .npz reader (gradus/io/npz.hpp): each input is a whole file,
// held in memory (memory_file.hpp) and read by path with read_npz, so libzip's parsing of
// the archive and gradus' of each entry's NPY preamble, header and data are fuzzed
// together. Every array read back has a dtype gradus stores, a name given once, and
// exactly the bytes its shape and dtype need; every refusal is a gradus::error naming the
// file (anything else thrown, std::bad_alloc included, fails the target).
#include "fuzz_check.hpp"
#include "memory_file.hpp"

#include <gradus/io/npz.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gradus::fuzz::memory_file file("fuzz_npz");
  const std::string& path = file.hold(data, size);

  std::vector<gradus::io::npz_array> arrays;
  try {
    arrays = gradus::io::read_npz(path);
  } catch (const gradus::error& e) {
    FUZZ_CHECK(std::string_view(e.what()).starts_with("gradus: read_npz '" + path + "': "));
    return 0;
  }
  std::set<std::string> names;
  for (const auto& a : arrays) {
    FUZZ_CHECK(!a.name.empty() && names.insert(a.name).second);
    const std::size_t item = gradus::io::detail::npy_type_of(a.dtype) ? gradus::size_of(a.dtype) : 0;  // one of the five
    FUZZ_CHECK(item != 0 && a.shape.rank <= gradus::max_rank);
    std::size_t n = 0;
    FUZZ_CHECK(gradus::io::detail::byte_size(a.shape, item, n) && n == a.bytes.size());
  }
  return 0;
}
