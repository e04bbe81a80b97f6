// The AVX-512 path of the CPU kernels (16 fp32 lanes), compiled with -mavx512f and used only
// when the processor has AVX-512F. Same arithmetic, same bits as the scalar path.
#include <immintrin.h>

#include "kernels/cpu_simd.h"
#include "kernels/cpu_update_loop.h"

namespace zeroshard::kernels {
namespace cpu_internal {
namespace {

struct F32x16 {
  __m512 v;
  F32x16() = default;
  F32x16(float x) : v(_mm512_set1_ps(x)) {}  // NOLINT: broadcasting, as float converts
  explicit F32x16(__m512 x) : v(x) {}
};

inline F32x16 operator+(F32x16 a, F32x16 b) { return F32x16(_mm512_add_ps(a.v, b.v)); }
inline F32x16 operator-(F32x16 a, F32x16 b) { return F32x16(_mm512_sub_ps(a.v, b.v)); }
inline F32x16 operator*(F32x16 a, F32x16 b) { return F32x16(_mm512_mul_ps(a.v, b.v)); }
inline F32x16 operator/(F32x16 a, F32x16 b) { return F32x16(_mm512_div_ps(a.v, b.v)); }
inline F32x16 operator-(F32x16 a) {
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  return F32x16(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a.v), sign)));
}
inline F32x16 Sqrt(F32x16 a) { return F32x16(_mm512_sqrt_ps(a.v)); }
// MAXPS returns the first operand where it is greater, else the second: a > b ? a : b.
inline F32x16 Max(F32x16 a, F32x16 b) { return F32x16(_mm512_max_ps(a.v, b.v)); }
inline F32x16 Sign(F32x16 a) {
  const __m512 zero = _mm512_setzero_ps();
  const __mmask16 positive = _mm512_cmp_ps_mask(a.v, zero, _CMP_GT_OQ);
  const __mmask16 negative = _mm512_cmp_ps_mask(a.v, zero, _CMP_LT_OQ);
  __m512 result = _mm512_mask_blend_ps(positive, zero, _mm512_set1_ps(1.0f));
  return F32x16(_mm512_mask_blend_ps(negative, result, _mm512_set1_ps(-1.0f)));
}

struct Avx512Ops {
  using V = F32x16;
  static constexpr int kWidth = 16;
  struct Accumulator {
    __m512d low;   // lanes 0..7
    __m512d high;  // lanes 8..15
  };

  static V LoadF32(const float* p) { return V(_mm512_loadu_ps(p)); }
  static void StoreF32(float* p, V x) { _mm512_storeu_ps(p, x.v); }
  static V LoadBF16(const uint16_t* p) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return V(_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
  static void StoreBF16(uint16_t* p, V x) {
    const __m512i bits = _mm512_castps_si512(x.v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounding = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, rounding), 16);
    const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q);
    const __m512i result = _mm512_mask_blend_epi32(is_nan, rounded, quiet_nan);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(result));
  }
  static V LoadF16(const uint16_t* p) {
    return V(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  }
  static void StoreF16(uint16_t* p, V x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  static Accumulator ZeroAccumulator() {
    return Accumulator{_mm512_setzero_pd(), _mm512_setzero_pd()};
  }
  static void AccumulateSquares(Accumulator& acc, int /*lane*/, V x) {
    const __m512d low = _mm512_cvtps_pd(_mm512_castps512_ps256(x.v));
    const __m512d high =
        _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x.v), 1)));
    acc.low = _mm512_add_pd(acc.low, _mm512_mul_pd(low, low));
    acc.high = _mm512_add_pd(acc.high, _mm512_mul_pd(high, high));
  }
  static void StoreLanes(const Accumulator& acc, double lanes[kSumLanes]) {
    _mm512_storeu_pd(lanes, acc.low);
    _mm512_storeu_pd(lanes + 8, acc.high);
  }
};

}  // namespace

UpdateRangeFn SelectUpdateRangeAvx512(OptimizerKind kind, numerics::DType grad_dtype,
                                      int param_copy_dtype) {
  return SelectUpdateRange<Avx512Ops>(kind, grad_dtype, param_copy_dtype);
}

SumSquaresFn SelectSumSquaresAvx512(numerics::DType dtype) {
  return SelectSumSquares<Avx512Ops>(dtype);
}

ConvertSumSquaresFn SelectConvertSumSquaresAvx512(numerics::DType src_dtype,
                                                  numerics::DType dst_dtype) {
  return SelectConvertSumSquares<Avx512Ops>(src_dtype, dst_dtype);
}

}  // namespace cpu_internal
}  // namespace zeroshard::kernels
