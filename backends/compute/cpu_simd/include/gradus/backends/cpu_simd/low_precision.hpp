#pragma once
// cpu_simd: the low-precision GEMM an op of compute precision runs on under a mixed policy
// (exec/compute_kernels.hpp): float operands, rounded to the compute type, summed in fp32 into
// a float result.
//   bf16 on a CPU with AVX512_BF16 (or AMX): both operands converted once per call to bf16,
//        then oneDNN bf16 matmuls, one per slice of threads() slices, on the team
//        (cpu_simd/dnnl_matmul.hpp);
//   bf16 elsewhere: fp32 GEMM, after one warning naming the missing instruction (oneDNN's
//        emulation of bf16 is 3-4x slower than fp32: never taken silently);
//   f16: no x86 CPU before AVX512_FP16 multiplies fp16, so the operands are rounded to fp16
//        and multiplied in fp32 (fp16's numbers for the loss scaler to act on, not its speed),
//        after one warning.
// A region held (core/held_operand.hpp: a run's variables, a pipeline stage's over its step's
// micro-batches, the RNN cells' W_h over their time loops) is converted once, at the first GEMM
// that reads it, and the GEMMs in its scope read those bits: a weight matrix is converted once
// per step rather than once per product (forward, backward data, every micro-batch).
// And the three convolution passes the same way: bf16 through oneDNN's bf16 convolutions
// (cpu_simd/dnnl.hpp: the reorders into its layouts round the inputs), else the inputs
// rounded into scratch and the fp32 convolution, after the same warnings.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>

#include "gradus/backends/cpu_simd/dnnl_matmul.hpp"
#include "gradus/backends/cpu_simd/random.hpp"
#include "gradus/core/dtype.hpp"
#include "gradus/exec/compute_kernels.hpp"

namespace gradus::cpu_simd_sections {

struct low_precision_section : random_section {
  /// ---- low-precision GEMM ----------------------------------------------------------------
  /// gemm()'s contract in float, with A and B rounded to `compute` (bf16 or f16) first and
  /// the products summed in fp32.
  static void gemm_low(element_type compute, bool ta, bool tb, index_t m, index_t n, index_t k, float alpha,
                       const float* a, index_t lda, index_t stride_a, const float* b, index_t ldb, index_t stride_b,
                       float beta, float* c, index_t ldc, index_t stride_c, index_t batch) {
    if (m == 0 || n == 0 || batch == 0) return;
    if (k == 0 || compute == element_type::f32)
      return gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
    const std::size_t a_span = gradus::detail::span_of(batch, stride_a, ta ? k : m, ta ? m : k, lda);
    const std::size_t b_span = gradus::detail::span_of(batch, stride_b, tb ? n : k, tb ? k : n, ldb);
    if (compute == element_type::bf16) {
      if (!cpu_dnnl::bf16_native()) {
        warn_once(0, no_bf16_text);
        return gemm(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch);
      }
      thread_local std::vector<std::uint16_t> ab, bb;
      const std::uint16_t* a16 = held_bits_of(a, a_span);
      const std::uint16_t* b16 = held_bits_of(b, b_span);
      if (!a16) {
        ab.resize(a_span);
        convert(a, ab.data(), a_span);
        a16 = ab.data();
      }
      if (!b16) {
        bb.resize(b_span);
        convert(b, bb.data(), b_span);
        b16 = bb.data();
      }
      gemm_bf16(ta, tb, m, n, k, alpha, a16, lda, stride_a, b16, ldb, stride_b, beta, c, ldc, stride_c, batch);
      return;
    }
    warn_once(1, no_f16_text);
    thread_local std::vector<float> ar, br;
    ar.resize(a_span);
    br.resize(b_span);
    round_to_f16(a, ar.data(), a_span);
    round_to_f16(b, br.data(), b_span);
    gemm(ta, tb, m, n, k, alpha, ar.data(), lda, stride_a, br.data(), ldb, stride_b, beta, c, ldc, stride_c, batch);
  }

  /// ---- held operands (core/held_operand.hpp) -------------------------------------------
  /// While a bf16_hold lives, gemm_low reads the bf16 bits of its regions, each converted at
  /// the first GEMM that reads it, instead of converting them again at every call. Holds nest
  /// (a region already held by an enclosing hold is not held again) and are the thread's: each
  /// ends by releasing what it added, so they must end in the reverse order they began (scoped
  /// objects do). A hold for anything but bf16 on a CPU with bf16 instructions does nothing.
  class bf16_hold {
   public:
    /// A hold of nothing yet (add() holds regions).
    explicit bf16_hold(element_type compute)
        : base_(held().count), on_(compute == element_type::bf16 && cpu_dnnl::bf16_native()) {}
    /// A hold of the n floats at p.
    bf16_hold(element_type compute, const float* p, std::size_t n) : bf16_hold(compute) { add(p, n); }
    bf16_hold(bf16_hold&& o) noexcept : base_(o.base_), on_(std::exchange(o.on_, false)) {}
    bf16_hold(const bf16_hold&) = delete;
    bf16_hold& operator=(const bf16_hold&) = delete;
    bf16_hold& operator=(bf16_hold&&) = delete;
    ~bf16_hold() {
      if (on_) held().count = base_;
    }
    /// Holds the n floats at p as well, unless an active hold already covers them. The
    /// region's buffer is reused from an earlier hold at the same depth: a step that holds the
    /// same variables every time allocates nothing after the first.
    void add(const float* p, std::size_t n) {
      if (!on_ || n == 0 || held_region_of(p, n)) return;
      held_bits& h = held();
      if (h.count == h.regions.size()) h.regions.emplace_back();
      region& r = h.regions[h.count++];
      r.p = p, r.n = n, r.converted = false;
    }

   private:
    std::size_t base_;  ///< how many regions were held before this hold
    bool on_;
  };
  /// A token keeping the n floats at p converted to `compute` for gemm_low while it lives
  /// (bf16 on a CPU with bf16 instructions; otherwise it does nothing).
  static bf16_hold hold_low(element_type compute, const float* p, std::size_t n) { return bf16_hold(compute, p, n); }
  /// A token holding nothing yet, whose add(p, n) holds regions as hold_low(compute, p, n) does.
  static bf16_hold hold_low(element_type compute) { return bf16_hold(compute); }
  /// How many held regions this thread has converted so far (each once per hold): what a
  /// test or a profile reads to see that a step converts each weight matrix once.
  static std::size_t held_conversions() { return held().conversions; }

  /// ---- low-precision convolutions --------------------------------------------------------
  /// conv2d's, conv2d_backward_data's or conv2d_backward_weights' contract (pass) in float,
  /// with the inputs a and b rounded to `compute` and the products summed in fp32.
  static void conv2d_low(element_type compute, conv_pass_kind pass, const float* a, const float* b,
                         const conv_geometry& g, float* out) {
    const auto fp32 = [&](const float* x, const float* y) {
      if (pass == conv_pass_kind::forward) conv2d(x, y, g, out);
      else if (pass == conv_pass_kind::data) conv2d_backward_data(x, y, g, out);
      else conv2d_backward_weights(x, y, g, out);
    };
    if (compute == element_type::f32) return fp32(a, b);
    if (compute == element_type::bf16) {
      if (!cpu_dnnl::bf16_native()) {
        warn_once(0, no_bf16_text);
        return fp32(a, b);
      }
      if (cpu_dnnl::conv(dnnl_pass(pass), g, a, b, out, true)) return;
    } else {
      warn_once(1, no_f16_text);
    }
    // a shape oneDNN has no bf16 primitive for, or f16: rounded inputs, the fp32 convolution
    const auto [a_size, b_size] = conv_operand_sizes(pass, g);
    thread_local std::vector<float> ar, br;
    ar.resize(static_cast<std::size_t>(a_size));
    br.resize(static_cast<std::size_t>(b_size));
    round_to(compute, a, ar.data(), ar.size());
    round_to(compute, b, br.data(), br.size());
    fp32(ar.data(), br.data());
  }

 private:
  static constexpr const char* no_bf16_text =
      "gradus: precision bf16: this CPU has no AVX512_BF16 (nor AMX) instructions, or gradus was built without "
      "oneDNN; matmuls and convolutions run in fp32 instead (oneDNN's bf16 emulation is 3-4x slower than fp32)";
  static constexpr const char* no_f16_text =
      "gradus: precision fp16: x86 CPUs before AVX512_FP16 have no fp16 multiply; matmuls and convolutions round "
      "their operands to fp16 and multiply in fp32 (fp16's numbers, fp32's speed)";
  static cpu_dnnl::conv_pass dnnl_pass(conv_pass_kind pass) {
    return pass == conv_pass_kind::forward ? cpu_dnnl::conv_pass::forward
           : pass == conv_pass_kind::data  ? cpu_dnnl::conv_pass::data
                                           : cpu_dnnl::conv_pass::weights;
  }
  /// dst[i] = float(compute(src[i])), compute bf16 or f16: bf16 through cpu_dnnl::to_bf16's
  /// vector conversion, widened back (a bf16 is a float's top 16 bits).
  static void round_to(element_type compute, const float* src, float* dst, std::size_t n) {
    if (compute == element_type::f16) return round_to_f16(src, dst, n);
    std::uint16_t part[256];
    for (std::size_t i = 0; i < n; i += 256) {
      const std::size_t m = std::min<std::size_t>(256, n - i);
      cpu_dnnl::to_bf16(src + i, part, m);
      for (std::size_t j = 0; j < m; ++j) dst[i + j] = std::bit_cast<float>(static_cast<std::uint32_t>(part[j]) << 16);
    }
  }
  /// dst[i] = float(f16(src[i])): F16C's conversions, 8 per instruction, where compiled for them
  /// (the same bits as half_bits': both round to nearest even).
  static void round_to_f16(const float* src, float* dst, std::size_t n) {
    std::size_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT)));
#endif
    for (; i < n; ++i) dst[i] = static_cast<float>(f16(src[i]));
  }
  /// A held region: its first float, its length, its bf16 bits once a GEMM has read it.
  struct region {
    const float* p = nullptr;
    std::size_t n = 0;
    bool converted = false;
    std::vector<std::uint16_t> bits;
  };
  /// The thread's held regions: the first `count` of `regions` (the rest keep their buffers).
  struct held_bits {
    std::vector<region> regions;
    std::size_t count = 0;
    std::size_t conversions = 0;  ///< regions converted, ever
  };
  static held_bits& held() {
    thread_local held_bits h;
    return h;
  }
  /// The held region holding all `span` floats from q, or null.
  static region* held_region_of(const float* q, std::size_t span) {
    held_bits& h = held();
    const auto at = reinterpret_cast<std::uintptr_t>(q);
    for (std::size_t i = 0; i < h.count; ++i) {
      region& r = h.regions[i];
      const auto from = reinterpret_cast<std::uintptr_t>(r.p);
      if (at < from || (at - from) % sizeof(float) != 0) continue;
      const std::size_t offset = (at - from) / sizeof(float);
      if (offset <= r.n && span <= r.n - offset) return &r;
    }
    return nullptr;
  }
  /// The held bf16 bits of the `span` floats from q (their region converted now if no GEMM
  /// has read it yet), or null where they are not all held.
  static const std::uint16_t* held_bits_of(const float* q, std::size_t span) {
    region* r = held_region_of(q, span);
    if (!r) return nullptr;
    if (!r->converted) {
      r->bits.resize(r->n);
      convert(r->p, r->bits.data(), r->n);
      r->converted = true;
      ++held().conversions;
    }
    return r->bits.data() + (q - r->p);
  }
  static void warn_once(int which, const char* text) {
    static std::atomic<bool> said[2] = {false, false};
    if (!said[which].exchange(true)) std::fprintf(stderr, "%s\n", text);
  }
  /// bf16 bits of n floats, on the team where there are many.
  static void convert(const float* src, std::uint16_t* dst, std::size_t n) {
    const auto len = static_cast<index_t>(n);
    if (len < 4 * parallel_threshold || omp_in_parallel() || team() <= 1) return cpu_dnnl::to_bf16(src, dst, n);
    const index_t parts = team();
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(parts))
    for (index_t p = 0; p < parts; ++p) {
      const index_t i0 = len * p / parts / 32 * 32, i1 = p + 1 == parts ? len : len * (p + 1) / parts / 32 * 32;
      cpu_dnnl::to_bf16(src + i0, dst + i0, static_cast<std::size_t>(i1 - i0));
    }
  }
  /// The product of bf16 operands, item by item (items sharing an output in order), each cut
  /// into threads() slices along its larger operand (rows of A, or columns of B; whole blocks of
  /// 16) and run as one-thread oneDNN calls on the team (cpu_dnnl::on_team): the bits follow
  /// threads() and the shape alone. One slice inside a parallel region.
  static void gemm_bf16(bool ta, bool tb, index_t m, index_t n, index_t k, float alpha, const std::uint16_t* a,
                        index_t lda, index_t stride_a, const std::uint16_t* b, index_t ldb, index_t stride_b, float beta,
                        float* c, index_t ldc, index_t stride_c, index_t batch) {
    const bool by_rows = m * k >= k * n;
    const index_t len = by_rows ? m : n, blocks = std::max<index_t>(1, len / 16);
    const int slices = omp_in_parallel() ? 1 : static_cast<int>(std::min<index_t>(threads(), blocks));
    const auto lo = [&](int i) { return i == slices ? len : blocks * i / slices * 16; };
    for (index_t item = 0; item < batch; ++item) {
      const std::uint16_t *ai = a + item * stride_a, *bi = b + item * stride_b;
      float* ci = c + item * stride_c;
      cpu_dnnl::on_team(slices, [&](int i) {
        const index_t from = lo(i), size = lo(i + 1) - from;
        if (by_rows)
          cpu_dnnl::matmul_bf16({size, n, k, lda, ldb, ldc, ta, tb, alpha, beta}, ai + (ta ? from : from * lda), bi,
                                ci + from * ldc);
        else
          cpu_dnnl::matmul_bf16({m, size, k, lda, ldb, ldc, ta, tb, alpha, beta}, ai, bi + (tb ? from * ldb : from),
                                ci + from);
      });
    }
  }
};

}  // namespace gradus::cpu_simd_sections
