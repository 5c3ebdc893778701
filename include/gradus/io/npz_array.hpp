#pragma once
// The arrays gradus::io reads and writes, whatever the file (.npz, .npy, .safetensors): an
// array to write (npz_array_ref, pointing at the caller's data), an array read back
// (npz_array, owning its bytes), the five dtypes they hold, and the checks every writer makes
// of an array before touching the disk. Named after .npz, their first format.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/io/npy_format.hpp"

namespace gradus::io {

/// One array to write: `data` points at shape.numel() elements of `dtype` in C order, and
/// must stay valid until the write returns.
struct npz_array_ref {
  std::string name;        ///< the key numpy.load gives it; may contain '/'
  std::string_view dtype;  ///< "float32", "float64", "int32", "int64" or "uint8"
  dims shape;              ///< rank 0 is a scalar
  const void* data = nullptr;  ///< the elements (may be null when shape.numel() is 0)
};

/// One array read back: bytes holds shape.numel() elements of dtype, C order, little-endian.
/// Arrays stored as other types (float16, bool, big-endian, Fortran order, ...) are converted
/// on load into these (io/stored_type.hpp): dtype is what bytes holds, never the file's type.
struct npz_array {
  std::string name;   ///< the array's key in the file ("w", "dnn/logits/w", "global_step")
  std::string dtype;  ///< "float32", "float64", "int32", "int64" or "uint8"
  dims shape;         ///< rank 0 is a scalar
  std::vector<std::byte> bytes;  ///< shape.numel() * npz_itemsize(dtype) bytes
};

/// Bytes per element of a dtype name, 0 for a name gradus::io does not store.
inline std::size_t npz_itemsize(std::string_view dtype) {
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "uint8") return 1;
  return 0;
}

namespace detail {

/// The byte size of an array to write, after checking its dtype, rank, shape and data
/// pointer; `what` (the writer, the file, the array) starts every error.
inline std::size_t checked_byte_size(const npz_array_ref& a, const std::string& what) {
  const auto* t = npy_type_by_name(a.dtype);
  if (!t)
    throw error(what + "unsupported dtype '" + std::string(a.dtype) + "' (float32, float64, int32, int64, uint8)");
  if (a.shape.rank > max_rank) throw error(what + "rank above gradus::max_rank");
  std::size_t n = 0;
  if (!byte_size(a.shape, t->size, n))
    throw error(what + "shape " + to_string(a.shape) + " has a negative extent or is too large");
  if (n && !a.data) throw error(what + "data is null for shape " + to_string(a.shape));
  return n;
}

}  // namespace detail
}  // namespace gradus::io
