#pragma once
// IDX files (the MNIST format): a big-endian header — two zero bytes, a type code, the
// rank — then one big-endian uint32 extent per axis, then the data in C order. gradus
// reads type 0x08 (uint8), which is what MNIST uses.
//
//   auto f = g::data::read_idx("data/mnist/train-images-idx3-ubyte");   // dims {60000, 28, 28}
//   auto x = g::data::load_mnist_images(path);   // float32 [N, 784] in [0, 1]
//   auto y = g::data::load_mnist_labels(path);   // int32 [N]
//
// Every error is a data_error naming the file, the byte offset and what was expected
// there (bad magic, another type code, a rank that does not fit, a truncated file,
// trailing bytes).
#include <sys/stat.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/error.hpp"  // data_error
#include "gradus/core/shape.hpp"

namespace gradus::data {

/// An IDX file's contents: its uint8 values and their shape.
struct idx_file {
  std::string path;  ///< the file read
  dims shape;        ///< the extents from the header (MNIST images: {N, 28, 28}; labels: {N})
  std::vector<std::uint8_t> bytes;  ///< shape.numel() values, C order
};

/// Reads an IDX file of type 0x08 (uint8). Throws data_error where it cannot be opened, or
/// naming the byte offset where it departs from the format: bad magic, another type code,
/// a rank outside 1 to max_rank, more than 2^40 values, a truncated file, trailing bytes.
/// rank (0: any) is the rank the caller expects, axes what its axes are ("images: count,
/// rows, columns"): a file of another rank is refused at its magic number, where the rank
/// is, rather than at its extents or its data, which a wrong rank reads as something else.
inline idx_file read_idx(const std::string& path, std::size_t rank = 0, std::string_view axes = {}) {
  auto fail = [&](std::uint64_t offset, const std::string& what) -> data_error {
    return data_error("gradus: IDX file '" + path + "', byte " + std::to_string(offset) + ": " + what);
  };
  // A directory opens as a stream (Linux) whose size is 2^63 - 1 and whose reads fail.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw data_error("gradus: IDX file '" + path + "': cannot open it: it is a directory, not a file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw data_error("gradus: IDX file '" + path + "': cannot open it");
  const auto size = static_cast<std::uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char head[4] = {};
  if (size < 4 || !in.read(reinterpret_cast<char*>(head), 4))
    throw fail(0, "expected a 4-byte magic number, the file has " + std::to_string(size) + " bytes");
  if (head[0] != 0 || head[1] != 0)
    throw fail(0, "expected the magic number to start with two zero bytes (is this an IDX file? gzipped?)");
  if (head[2] != 0x08)
    throw fail(2, "expected type code 0x08 (uint8), got 0x" + [&] {
      const char* hex = "0123456789abcdef";
      return std::string{hex[head[2] >> 4], hex[head[2] & 15]};
    }());
  const std::string magic = [&] {
    const char* hex = "0123456789abcdef";
    std::string m = "0x";
    for (unsigned char b : head) m += {hex[b >> 4], hex[b & 15]};
    return m;
  }();
  const std::size_t file_rank = head[3];
  if (rank != 0 && file_rank != rank)
    throw fail(3, "magic " + magic + " says rank " + std::to_string(file_rank) + ", expected rank " +
                      std::to_string(rank) + (axes.empty() ? std::string() : " (" + std::string(axes) + ")"));
  if (file_rank == 0 || file_rank > max_rank)
    throw fail(3, "expected a rank from 1 to " + std::to_string(max_rank) + ", got " + std::to_string(file_rank));
  idx_file f;
  f.path = path;
  f.shape.rank = file_rank;
  // The extents' product, and that of the extents other than 0: both at most 2^40, so that
  // neither a count nor a product of some extents (load_mnist_images' H * W, when N is 0)
  // overflows, and a count is never a product that wrapped around.
  constexpr std::uint64_t most = std::uint64_t{1} << 40;
  std::uint64_t count = 1, nonzero = 1;
  for (std::size_t k = 0; k < file_rank; ++k) {
    unsigned char b[4] = {};
    if (!in.read(reinterpret_cast<char*>(b), 4))
      throw fail(4 + 4 * k, "expected the extent of axis " + std::to_string(k) + ", the file ends at byte " +
                                std::to_string(size));
    const std::uint64_t e = (std::uint64_t{b[0]} << 24) | (std::uint64_t{b[1]} << 16) | (std::uint64_t{b[2]} << 8) | b[3];
    f.shape.d[k] = static_cast<index_t>(e);
    if (e != 0 && nonzero > most / e)
      throw fail(4 + 4 * k, std::string("the extents multiply to more than 2^40 values") +
                                (count == 0 ? " (leaving out the extents of 0)" : ""));
    if (e != 0) nonzero *= e;
    count *= e;
  }
  const std::uint64_t header = 4 + 4 * file_rank;
  if (size - header < count)
    throw fail(header, "expected " + std::to_string(count) + " data bytes for shape " + to_string(f.shape) +
                           " (" + std::to_string(header + count) + " bytes in all), the file has " +
                           std::to_string(size) + ": truncated");
  if (size - header > count)
    throw fail(header + count, "expected the end of the file after " + std::to_string(count) +
                                   " data bytes for shape " + to_string(f.shape) + ", found " +
                                   std::to_string(size - header - count) + " trailing bytes (magic " + magic +
                                   " says rank " + std::to_string(file_rank) + ": is that the data's rank?)");
  f.bytes.resize(count);
  if (count && !in.read(reinterpret_cast<char*>(f.bytes.data()), static_cast<std::streamsize>(count)))
    throw fail(header, "reading the data failed");
  return f;
}

namespace detail {
// An IDX file of images [N, H, W]; rows and cols (0: any) the H and W expected.
inline idx_file read_idx_images(const std::string& path, index_t rows, index_t cols) {
  idx_file f = read_idx(path, 3, "images: count, rows, columns");
  const index_t h = f.shape.d[1], w = f.shape.d[2];
  if ((rows && h != rows) || (cols && w != cols))
    throw data_error("gradus: IDX file '" + path + "': images are " + std::to_string(h) + "x" + std::to_string(w) +
                     ", not " + (rows ? std::to_string(rows) : std::string("H")) + "x" +
                     (cols ? std::to_string(cols) : std::string("W")));
  return f;
}
}  // namespace detail

/// Images [N, H, W] as float32 [N, H*W], scaled to [0, 1]. rows, cols: the H and W expected
/// (0: any; MNIST's are 28 and 28), else a data_error giving both sizes.
inline std::vector<float> load_mnist_images(const std::string& path, dims* shape = nullptr, index_t rows = 0,
                                            index_t cols = 0) {
  const idx_file f = detail::read_idx_images(path, rows, cols);
  std::vector<float> x(f.bytes.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(f.bytes[i]) * (1.0f / 255.0f);
  if (shape) *shape = dims{f.shape.d[0], f.shape.d[1] * f.shape.d[2]};
  return x;
}

/// Images [N, H, W] as their raw bytes [N, H*W] (a quarter of the float32 memory; a
/// data::dataset made from bytes scales each batch as it copies it). rows, cols: as
/// load_mnist_images.
inline std::vector<std::uint8_t> load_mnist_image_bytes(const std::string& path, dims* shape = nullptr,
                                                        index_t rows = 0, index_t cols = 0) {
  idx_file f = detail::read_idx_images(path, rows, cols);
  if (shape) *shape = dims{f.shape.d[0], f.shape.d[1] * f.shape.d[2]};
  return std::move(f.bytes);
}

/// Labels [N] as int32.
inline std::vector<std::int32_t> load_mnist_labels(const std::string& path, index_t classes = 10) {
  const idx_file f = read_idx(path, 1, "labels: count");
  std::vector<std::int32_t> y(f.bytes.begin(), f.bytes.end());
  for (std::size_t i = 0; i < y.size(); ++i)
    if (y[i] >= classes)
      throw data_error("gradus: IDX file '" + path + "', byte " + std::to_string(8 + i) + ": expected a label below " +
                       std::to_string(classes) + ", got " + std::to_string(y[i]));
  return y;
}

}  // namespace gradus::data
