// The AVX2 path of the CPU kernels (8 fp32 lanes), compiled with -mavx2 -mf16c and used only
// when the processor has AVX2 and FMA (every such processor has F16C). Same bits as scalar.
#include <immintrin.h>

#include "kernels/cpu_simd.h"
#include "kernels/cpu_update_loop.h"

namespace zeroshard::kernels {
namespace cpu_internal {
namespace {

struct F32x8 {
  __m256 v;
  F32x8() = default;
  F32x8(float x) : v(_mm256_set1_ps(x)) {}  // NOLINT: broadcasting, as float converts
  explicit F32x8(__m256 x) : v(x) {}
};

inline F32x8 operator+(F32x8 a, F32x8 b) { return F32x8(_mm256_add_ps(a.v, b.v)); }
inline F32x8 operator-(F32x8 a, F32x8 b) { return F32x8(_mm256_sub_ps(a.v, b.v)); }
inline F32x8 operator*(F32x8 a, F32x8 b) { return F32x8(_mm256_mul_ps(a.v, b.v)); }
inline F32x8 operator/(F32x8 a, F32x8 b) { return F32x8(_mm256_div_ps(a.v, b.v)); }
inline F32x8 operator-(F32x8 a) { return F32x8(_mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f))); }
inline F32x8 Sqrt(F32x8 a) { return F32x8(_mm256_sqrt_ps(a.v)); }
// MAXPS returns the first operand where it is greater, else the second: a > b ? a : b.
inline F32x8 Max(F32x8 a, F32x8 b) { return F32x8(_mm256_max_ps(a.v, b.v)); }
inline F32x8 Sign(F32x8 a) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 positive = _mm256_and_ps(_mm256_cmp_ps(a.v, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f));
  const __m256 negative =
      _mm256_and_ps(_mm256_cmp_ps(a.v, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f));
  return F32x8(_mm256_or_ps(positive, negative));
}

struct Avx2Ops {
  using V = F32x8;
  static constexpr int kWidth = 8;
  struct Accumulator {
    __m256d lanes[4];  // lanes 4k .. 4k+3
  };

  static V LoadF32(const float* p) { return V(_mm256_loadu_ps(p)); }
  static void StoreF32(float* p, V x) { _mm256_storeu_ps(p, x.v); }
  static V LoadBF16(const uint16_t* p) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return V(_mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
  }
  static void StoreBF16(uint16_t* p, V x) {
    const __m256i bits = _mm256_castps_si256(x.v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounding = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, rounding), 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q));
    const __m256i result = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static V LoadF16(const uint16_t* p) {
    return V(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void StoreF16(uint16_t* p, V x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  static Accumulator ZeroAccumulator() {
    return Accumulator{
        {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()}};
  }
  // x fills lanes [lane, lane + 8).
  static void AccumulateSquares(Accumulator& acc, int lane, V x) {
    const __m256d low = _mm256_cvtps_pd(_mm256_castps256_ps128(x.v));
    const __m256d high = _mm256_cvtps_pd(_mm256_extractf128_ps(x.v, 1));
    __m256d& acc_low = acc.lanes[lane / 4];
    __m256d& acc_high = acc.lanes[lane / 4 + 1];
    acc_low = _mm256_add_pd(acc_low, _mm256_mul_pd(low, low));
    acc_high = _mm256_add_pd(acc_high, _mm256_mul_pd(high, high));
  }
  static void StoreLanes(const Accumulator& acc, double lanes[kSumLanes]) {
    for (int k = 0; k < 4; ++k) _mm256_storeu_pd(lanes + 4 * k, acc.lanes[k]);
  }
};

}  // namespace

UpdateRangeFn SelectUpdateRangeAvx2(OptimizerKind kind, numerics::DType grad_dtype,
                                    int param_copy_dtype) {
  return SelectUpdateRange<Avx2Ops>(kind, grad_dtype, param_copy_dtype);
}

SumSquaresFn SelectSumSquaresAvx2(numerics::DType dtype) {
  return SelectSumSquares<Avx2Ops>(dtype);
}

ConvertSumSquaresFn SelectConvertSumSquaresAvx2(numerics::DType src_dtype,
                                                numerics::DType dst_dtype) {
  return SelectConvertSumSquares<Avx2Ops>(src_dtype, dst_dtype);
}

}  // namespace cpu_internal
}  // namespace zeroshard::kernels
