#pragma once
// The arrays gradus::io reads and writes, whatever the file (.npz, .npy, .safetensors): an
// array to write (npz_array_ref, pointing at the caller's data), an array read back
// (npz_array, owning its bytes), the five element types they hold, and the checks every
// writer makes of an array before touching the disk. Named after .npz, their first format.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/io/npy_format.hpp"

namespace gradus::io {

/// The element type of an array to write: an element_type, or numpy's name for one, so that
/// `{"w", "float32", shape, data}` reads as numpy would write it. A name that is no element
/// type's is kept as given (a view: like data, it must outlive the write), for the writer to
/// refuse by name.
struct array_dtype {
  element_type type = element_type::none;  ///< the element type; none where the name names none
  std::string_view unknown_name;  ///< the name given, where it names no element type (else data() is null)

  constexpr array_dtype() = default;
  /// t itself.
  constexpr array_dtype(element_type t) : type(t) {}
  /// The element type numpy calls `name` ("float32"), or none keeping the name.
  constexpr array_dtype(std::string_view name) {
    if (const auto t = element_type_named(name)) type = *t;
    else unknown_name = name.data() ? name : std::string_view("");
  }
  /// As the string_view overload: so that a literal converts in a braced list.
  constexpr array_dtype(const char* name) : array_dtype(std::string_view(name)) {}
  /// As the string_view overload.
  array_dtype(const std::string& name) : array_dtype(std::string_view(name)) {}
  /// The element type (none for an unknown name).
  constexpr operator element_type() const { return type; }
  /// name_of(type), or the unknown name as given.
  constexpr std::string_view name() const { return unknown_name.data() ? unknown_name : name_of(type); }
};

/// One array to write: `data` points at shape.numel() elements of `dtype` in C order, and
/// must stay valid until the write returns.
struct npz_array_ref {
  std::string name;   ///< the key numpy.load gives it; may contain '/'
  array_dtype dtype;  ///< f32, f64, i32, i64 or u8 ("float32", "float64", "int32", "int64", "uint8")
  dims shape;         ///< rank 0 is a scalar
  const void* data = nullptr;  ///< the elements (may be null when shape.numel() is 0)
};

/// One array read back: bytes holds shape.numel() elements of dtype, C order, little-endian.
/// Arrays stored as other types (float16, bool, big-endian, Fortran order, ...) are converted
/// on load into these (io/stored_type.hpp): dtype is what bytes holds, never the file's type.
struct npz_array {
  std::string name;    ///< the array's key in the file ("w", "dnn/logits/w", "global_step")
  element_type dtype = element_type::none;  ///< f32, f64, i32, i64 or u8 (name_of: "float32", ...)
  dims shape;          ///< rank 0 is a scalar
  std::vector<std::byte> bytes;  ///< shape.numel() * size_of(dtype) bytes
};

namespace detail {

/// The byte size of an array to write, after checking its dtype, rank, shape and data
/// pointer; `what` (the writer, the file, the array) starts every error.
inline std::size_t checked_byte_size(const npz_array_ref& a, const std::string& what) {
  if (!npy_type_of(a.dtype))
    throw error(what + "unsupported dtype '" + std::string(a.dtype.name()) + "' (float32, float64, int32, int64, uint8)");
  if (a.shape.rank > max_rank) throw error(what + "rank above gradus::max_rank");
  std::size_t n = 0;
  if (!byte_size(a.shape, size_of(a.dtype), n))
    throw error(what + "shape " + to_string(a.shape) + " has a negative extent or is too large");
  if (n && !a.data) throw error(what + "data is null for shape " + to_string(a.shape));
  return n;
}

}  // namespace detail
}  // namespace gradus::io
