#pragma once
// cpu_simd: memory. Device buffers are host memory, 64-byte aligned; a copy is memcpy.
#include "gradus/backends/cpu_simd/base.hpp"

namespace gradus::cpu_simd_sections {

struct memory_section : base_section {
  /// ---- memory --------------------------------------------------------------------------
  static void* allocate(std::size_t bytes) {
    const std::size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    return ::operator new(rounded, std::align_val_t{alignment});
  }
  static void deallocate(void* p) noexcept { ::operator delete(p, std::align_val_t{alignment}); }
  static void copy_to_device(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  static void copy_to_host(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  static void copy(void* dst, const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(dst, src, bytes);
  }
};

}  // namespace gradus::cpu_simd_sections
