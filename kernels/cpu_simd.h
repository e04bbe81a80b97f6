// Internal to the CPU kernels: the per-instruction-set entry points (scalar, AVX2, AVX-512),
// each compiled in its own translation unit with its own -m flags.
#ifndef ZEROSHARD_KERNELS_CPU_SIMD_H_
#define ZEROSHARD_KERNELS_CPU_SIMD_H_

#include <cstdint>

#include "kernels/optimizer.h"
#include "kernels/update_math.h"
#include "numerics/dtype.h"

namespace zeroshard::kernels {
namespace cpu_internal {

// The arrays of one piece (UpdatePiece without its options).
struct UpdateArrays {
  const void* grad;
  float* master;
  float* state[kMaxStateArrays];
  void* param_copy;  // null: no copy is written
};

// Updates elements [begin, end) of `arrays`.
using UpdateRangeFn = void (*)(const ElementScalars& scalars, bool has_momentum,
                               const UpdateArrays& arrays, int64_t begin, int64_t end);

// The sum of squares is accumulated in kSumLanes fp64 lanes: element begin + i goes to lane
// i % kSumLanes, in increasing i. Every instruction set fills the lanes with the same bits.
inline constexpr int kSumLanes = 16;
using SumSquaresFn = void (*)(const void* data, int64_t begin, int64_t end,
                              double lanes[kSumLanes]);
// Converts elements [begin, end) of `src` into `dst` (each in its dtype) and fills the lanes as
// SumSquaresFn over the converted values in `dst` would, in the same pass.
// REQUIRES: src and dst do not overlap.
using ConvertSumSquaresFn = void (*)(const void* src, void* dst, int64_t begin, int64_t end,
                                     double lanes[kSumLanes]);

// The param_copy_dtype of a piece without a parameter copy; otherwise the DType's value.
inline constexpr int kNoParamCopyDType = -1;

UpdateRangeFn SelectUpdateRangeScalar(OptimizerKind kind, numerics::DType grad_dtype,
                                      int param_copy_dtype);
UpdateRangeFn SelectUpdateRangeAvx2(OptimizerKind kind, numerics::DType grad_dtype,
                                    int param_copy_dtype);
UpdateRangeFn SelectUpdateRangeAvx512(OptimizerKind kind, numerics::DType grad_dtype,
                                      int param_copy_dtype);

SumSquaresFn SelectSumSquaresScalar(numerics::DType dtype);
SumSquaresFn SelectSumSquaresAvx2(numerics::DType dtype);
SumSquaresFn SelectSumSquaresAvx512(numerics::DType dtype);

ConvertSumSquaresFn SelectConvertSumSquaresScalar(numerics::DType src_dtype,
                                                  numerics::DType dst_dtype);
ConvertSumSquaresFn SelectConvertSumSquaresAvx2(numerics::DType src_dtype,
                                                numerics::DType dst_dtype);
ConvertSumSquaresFn SelectConvertSumSquaresAvx512(numerics::DType src_dtype,
                                                  numerics::DType dst_dtype);

}  // namespace cpu_internal
}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_SIMD_H_
