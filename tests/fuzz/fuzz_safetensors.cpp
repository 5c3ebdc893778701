// libFuzzer target for the .safetensors reader (gradus/io/safetensors.hpp): each input is a
// whole file, held in memory (memory_file.hpp) and read by path with read_safetensors, so
// the header length, nlohmann_json's parse of the header, gradus' checks of each tensor and
// of the offsets, and the conversions on load are fuzzed together. Every tensor read back
// has a name given once (not empty, not "__metadata__"), one of the five gradus dtypes, a
// shape within max_rank and exactly the bytes its shape and dtype need; every refusal is a
// gradus::error naming the file (anything else thrown, nlohmann's exceptions and
// std::bad_alloc included, fails the target).
#include "fuzz_check.hpp"
#include "memory_file.hpp"

#include <gradus/io/safetensors.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gradus::fuzz::memory_file file("fuzz_safetensors");
  const std::string& path = file.hold(data, size);

  std::vector<gradus::io::npz_array> tensors;
  gradus::io::safetensors_metadata metadata;
  try {
    tensors = gradus::io::read_safetensors(path, &metadata);
  } catch (const gradus::error& e) {
    FUZZ_CHECK(std::string_view(e.what()).starts_with("gradus: read_safetensors '" + path + "': "));
    return 0;
  }
  std::set<std::string> names;
  std::size_t total = 0;
  for (const auto& t : tensors) {
    FUZZ_CHECK(!t.name.empty() && t.name != "__metadata__" && names.insert(t.name).second);
    const std::size_t item = gradus::io::detail::npy_type_of(t.dtype) ? gradus::size_of(t.dtype) : 0;  // one of the five
    FUZZ_CHECK(item != 0 && t.shape.rank <= gradus::max_rank);
    std::size_t n = 0;
    FUZZ_CHECK(gradus::io::detail::byte_size(t.shape, item, n) && n == t.bytes.size());
    total += n;
  }
  // Conversions only widen (at most 4x: 1-byte BOOL/I8 to 4-byte int32), so the data loaded
  // is bounded by the file.
  FUZZ_CHECK(total <= 4 * size);
  return 0;
}
