#pragma once
// How one fuzz input becomes a ZeroMQ multi-part message for wire::decode(): shared by the
// target (fuzz_ps_wire.cpp) and the seed generator (make_ps_wire_corpus.cpp), so a seed
// means to the target what the generator meant it to.
//
//   byte 0, the shape:  bits 0-1  the number of frames, 0 to 3 (bits 3-7 are ignored)
//                       bit 2     clear: frame 0 is the next 64 bytes (a header's size; fewer
//                                 when the input is shorter), the rest is frame 1, or frames 1
//                                 and 2 half and half; a single frame is all the rest;
//                                 set: the next (frames - 1) bytes are the sizes of the frames
//                                 but the last (cut to what is left), the last takes the rest
//   then the frames' bytes, one after another.
//
// Each frame is copied into a heap block of exactly its size, so AddressSanitizer reports a
// read past any frame (in the input itself it would land in the next frame, unnoticed).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradus::fuzz {

inline constexpr std::uint8_t shape_explicit_sizes = 4;

class message {
 public:
  explicit message(std::span<const std::uint8_t> in) {
    if (in.empty()) return;
    const std::uint8_t shape = in[0];
    in = in.subspan(1);
    const std::size_t n = shape & 3u;
    if (n == 0) return;
    std::vector<std::size_t> sizes;  // of the frames but the last
    if (shape & shape_explicit_sizes) {
      const std::size_t given = std::min(n - 1, in.size());
      for (std::size_t k = 0; k < given; ++k) sizes.push_back(in[k]);
      in = in.subspan(given);
      sizes.resize(n - 1, 0);
    } else if (n >= 2) {
      sizes.push_back(64);
      if (n == 3) sizes.push_back(in.size() > 64 ? (in.size() - 64) / 2 : 0);
    }
    for (const std::size_t want : sizes) {
      const std::size_t take = std::min(want, in.size());
      add(in.first(take));
      in = in.subspan(take);
    }
    add(in);
  }
  message(const message&) = delete;
  message& operator=(const message&) = delete;

  std::span<const std::span<const std::byte>> frames() const { return views_; }

 private:
  void add(std::span<const std::uint8_t> bytes) {
    auto block = std::make_unique_for_overwrite<std::byte[]>(bytes.size());
    std::copy(bytes.begin(), bytes.end(), reinterpret_cast<std::uint8_t*>(block.get()));
    views_.emplace_back(block.get(), bytes.size());
    blocks_.push_back(std::move(block));
  }

  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::vector<std::span<const std::byte>> views_;
};

// The input that message() reads back as `frames`: the header-first shape for up to 2
// frames of which the first is 64 bytes (or 1 frame of any size), explicit sizes otherwise.
inline std::vector<std::uint8_t> encode(const std::vector<std::vector<std::uint8_t>>& frames) {
  std::vector<std::uint8_t> out;
  const std::size_t n = frames.size();
  if (n > 3) throw std::invalid_argument("fuzz::encode: " + std::to_string(n) + " frames (at most 3)");
  const bool header_first = n <= 1 || (n == 2 && frames[0].size() == 64);
  for (std::size_t k = 0; !header_first && k + 1 < n; ++k)
    if (frames[k].size() > 255)
      throw std::invalid_argument("fuzz::encode: frame " + std::to_string(k) + " of " + std::to_string(frames[k].size()) +
                                  " bytes (explicit sizes are one byte)");
  out.push_back(static_cast<std::uint8_t>(n | (header_first ? 0u : shape_explicit_sizes)));
  if (!header_first)
    for (std::size_t k = 0; k + 1 < n; ++k) out.push_back(static_cast<std::uint8_t>(frames[k].size()));
  for (const auto& f : frames) out.insert(out.end(), f.begin(), f.end());
  return out;
}

}  // namespace gradus::fuzz
