#pragma once
// cpu_simd, section by section (cpu_simd.hpp lists them): each section is a struct of
// static functions that derives from the one before it, so a kernel calls what an earlier
// section provides unqualified, and the umbrella's cpu_simd derives from the last. This
// first one holds the name and alignment, the sizes that decide when a pass goes parallel,
// the thread controls (threads.hpp) and the index check that rows and index share.
#include <omp.h>
#include <unistd.h>  // sysconf: the last-level cache's size

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <string>
#include <vector>
#include <xsimd/xsimd.hpp>

#include "gradus/backends/cpu_simd/threads.hpp"
#include "gradus/exec/backend.hpp"
#include "gradus/gradus.hpp"

namespace gradus::cpu_simd_sections {

struct base_section {
  static constexpr const char* name = "cpu_simd";
  static constexpr std::size_t alignment = 64;
  /// Below this many elements a pass runs on the calling thread: a parallel region
  /// costs more than it saves.
  static constexpr index_t parallel_threshold = 1 << 15;
  static constexpr index_t chunk = 1 << 14;  ///< elements of one row piece handed to a thread

  /// ---- threads (cpu_simd/threads.hpp) --------------------------------------------------------
  /// threads(): the thread count of this calling thread's passes, which defines their results
  /// (set_threads, else OMP_NUM_THREADS); team(): the threads a pass starts now, fewer while
  /// other processes keep cores busy. set_threads sets both, for fused passes (OpenMP) and
  /// GEMM (OpenBLAS).
  static int threads() { return cpu_threads::threads(); }
  static int team() { return cpu_threads::team(); }
  static void set_threads(int n) { cpu_threads::set_threads(n); }
  /// The team follows the free cores (the default; GRADUS_ADAPTIVE_THREADS=0 or
  /// set_adaptive_threads(false) keeps it at threads()) or is pinned (pin_team(n); 0
  /// unpins). It never changes the results' bits (threads.hpp, gemm).
  static void set_adaptive_threads(bool on) { cpu_threads::governor::instance().set_adaptive(on); }
  static void pin_team(int n) { cpu_threads::governor::instance().pin(n); }
  /// session::run calls it before every run: one clock read, a sample of /proc every 250 ms.
  static void before_run() { cpu_threads::before_run(); }

 protected:
  static void check_indices(const char* op, const char* what, const std::int32_t* idx, index_t n, index_t bound) {
    for (index_t i = 0; i < n; ++i)
      if (idx[i] < 0 || idx[i] >= bound)
        throw index_error(std::string("gradus: ") + op + ": " + what + " " + std::to_string(idx[i]) + " at position " +
                          std::to_string(i) + " is outside [0, " + std::to_string(bound) + ")");
  }
};

}  // namespace gradus::cpu_simd_sections
