// The portable scalar path of the CPU kernels: one element per "vector", baseline x86-64 (or any
// architecture). The reference the SIMD paths must match bit for bit.
#include "kernels/cpu_simd.h"
#include "kernels/cpu_update_loop.h"
#include "numerics/dtype.h"

namespace zeroshard::kernels {
namespace cpu_internal {
namespace {

struct ScalarOps {
  using V = float;
  static constexpr int kWidth = 1;
  struct Accumulator {
    double lane[kSumLanes];
  };

  static float LoadF32(const float* p) { return *p; }
  static void StoreF32(float* p, float v) { *p = v; }
  static float LoadBF16(const uint16_t* p) { return numerics::BFloat16ToFloat(*p); }
  static void StoreBF16(uint16_t* p, float v) { *p = numerics::FloatToBFloat16(v); }
  static float LoadF16(const uint16_t* p) { return numerics::HalfToFloat(*p); }
  static void StoreF16(uint16_t* p, float v) { *p = numerics::FloatToHalf(v); }

  static Accumulator ZeroAccumulator() { return Accumulator{}; }
  static void AccumulateSquares(Accumulator& acc, int lane, float x) {
    const double wide = x;
    acc.lane[lane] = acc.lane[lane] + wide * wide;
  }
  static void StoreLanes(const Accumulator& acc, double lanes[kSumLanes]) {
    for (int k = 0; k < kSumLanes; ++k) lanes[k] = acc.lane[k];
  }
};

}  // namespace

UpdateRangeFn SelectUpdateRangeScalar(OptimizerKind kind, numerics::DType grad_dtype,
                                      int param_copy_dtype) {
  return SelectUpdateRange<ScalarOps>(kind, grad_dtype, param_copy_dtype);
}

SumSquaresFn SelectSumSquaresScalar(numerics::DType dtype) {
  return SelectSumSquares<ScalarOps>(dtype);
}

ConvertSumSquaresFn SelectConvertSumSquaresScalar(numerics::DType src_dtype,
                                                  numerics::DType dst_dtype) {
  return SelectConvertSumSquares<ScalarOps>(src_dtype, dst_dtype);
}

}  // namespace cpu_internal
}  // namespace zeroshard::kernels
