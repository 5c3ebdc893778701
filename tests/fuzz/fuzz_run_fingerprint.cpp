// libFuzzer target for the run fingerprint's message (gradus/parallel/agree.hpp): the bytes
// that parallel::agree broadcasts from rank 0 (name NUL value NUL ...), as every other rank
// unpacks them. Unpacking never fails: an odd field or missing terminator is dropped. Every
// unpacked name and value is free of NUL, and packed again and unpacked they are the same
// list (pack turns a NUL inside a field into a space, so a list without NULs round-trips);
// first_difference of a list with itself is 0, and with the list one field shorter, that
// field's position.
#include "fuzz_check.hpp"

#include <gradus/parallel/agree.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ad = gradus::parallel::agree_detail;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto fields = ad::unpack(std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size));
  for (const auto& f : fields)
    FUZZ_CHECK(f.name.find('\0') == std::string::npos && f.value.find('\0') == std::string::npos);
  const auto packed = ad::pack(fields);
  FUZZ_CHECK(packed.size() <= size);
  FUZZ_CHECK(ad::unpack(packed) == fields);
  FUZZ_CHECK(ad::first_difference(fields, fields) == 0);
  if (!fields.empty()) {
    const std::vector<gradus::parallel::run_field> shorter(fields.begin(), fields.end() - 1);
    FUZZ_CHECK(ad::first_difference(fields, shorter) == fields.size());
  }
  return 0;
}
