// Internal to the CPU kernels: the loops over a range of elements, written once over an
// instruction set's `Ops` (vector type V, kWidth lanes, loads, stores, conversions) and
// instantiated by each instruction set's translation unit. Tails shorter than a vector go
// through zero-padded stack buffers, so every element sees the same vector arithmetic.
//
// Everything here is a template on Ops, whose types have internal linkage in each instruction
// set's file, so no function compiled with one set of -m flags can be linked into another path.
#ifndef ZEROSHARD_KERNELS_CPU_UPDATE_LOOP_H_
#define ZEROSHARD_KERNELS_CPU_UPDATE_LOOP_H_

#include <cstdint>

#include "kernels/cpu_simd.h"
#include "kernels/update_math.h"
#include "numerics/dtype.h"

namespace zeroshard::kernels {
namespace cpu_internal {

template <numerics::DType kDType>
inline constexpr int kDTypeBytes = kDType == numerics::DType::kFloat32 ? 4 : 2;

template <class Ops, numerics::DType kDType>
inline typename Ops::V LoadAs(const void* data, int64_t i) {
  if constexpr (kDType == numerics::DType::kFloat32) {
    return Ops::LoadF32(static_cast<const float*>(data) + i);
  } else if constexpr (kDType == numerics::DType::kBFloat16) {
    return Ops::LoadBF16(static_cast<const uint16_t*>(data) + i);
  } else {
    return Ops::LoadF16(static_cast<const uint16_t*>(data) + i);
  }
}

template <class Ops, int kCopy>
inline void StoreParamCopy(void* copy, int64_t i, typename Ops::V value) {
  if constexpr (kCopy == static_cast<int>(numerics::DType::kFloat32)) {
    Ops::StoreF32(static_cast<float*>(copy) + i, value);
  } else if constexpr (kCopy == static_cast<int>(numerics::DType::kBFloat16)) {
    Ops::StoreBF16(static_cast<uint16_t*>(copy) + i, value);
  } else if constexpr (kCopy == static_cast<int>(numerics::DType::kFloat16)) {
    Ops::StoreF16(static_cast<uint16_t*>(copy) + i, value);
  }
}

// Updates the kWidth elements at [i, i + kWidth). Always inlined: the loops below rely on
// constant flags in their ElementScalars folding the branches away.
template <class Ops, OptimizerKind kKind, numerics::DType kGrad, int kCopy>
__attribute__((always_inline)) inline void UpdateVector(const ElementScalars& s, bool has_momentum,
                                                        const UpdateArrays& a, int64_t i) {
  using V = typename Ops::V;
  const V g = ScaledGradient(s, LoadAs<Ops, kGrad>(a.grad, i));
  V param = Ops::LoadF32(a.master + i);
  if constexpr (kKind == OptimizerKind::kSgd) {
    if (has_momentum) {
      V buf = Ops::LoadF32(a.state[0] + i);
      SgdElement(s, g, param, buf, true);
      Ops::StoreF32(a.state[0] + i, buf);
    } else {
      V no_buffer(0.0f);
      SgdElement(s, g, param, no_buffer, false);
    }
  } else if constexpr (kKind == OptimizerKind::kAdam || kKind == OptimizerKind::kAdamW) {
    V exp_avg = Ops::LoadF32(a.state[0] + i);
    V exp_avg_sq = Ops::LoadF32(a.state[1] + i);
    V max_exp_avg_sq = s.amsgrad ? Ops::LoadF32(a.state[2] + i) : V(0.0f);
    AdamElement(s, kKind == OptimizerKind::kAdamW, g, param, exp_avg, exp_avg_sq, max_exp_avg_sq);
    Ops::StoreF32(a.state[0] + i, exp_avg);
    Ops::StoreF32(a.state[1] + i, exp_avg_sq);
    if (s.amsgrad) Ops::StoreF32(a.state[2] + i, max_exp_avg_sq);
  } else if constexpr (kKind == OptimizerKind::kAdagrad) {
    V sum = Ops::LoadF32(a.state[0] + i);
    AdagradElement(s, g, param, sum);
    Ops::StoreF32(a.state[0] + i, sum);
  } else {
    V exp_avg = Ops::LoadF32(a.state[0] + i);
    LionElement(s, g, param, exp_avg);
    Ops::StoreF32(a.state[0] + i, exp_avg);
  }
  Ops::StoreF32(a.master + i, param);
  StoreParamCopy<Ops, kCopy>(a.param_copy, i, param);
}

// Updates whole vectors from `begin` on; returns where the first partial vector starts.
template <class Ops, OptimizerKind kKind, numerics::DType kGrad, int kCopy>
__attribute__((always_inline)) inline int64_t UpdateVectors(const ElementScalars& s,
                                                            bool has_momentum,
                                                            const UpdateArrays& a, int64_t begin,
                                                            int64_t end) {
  constexpr int kWidth = Ops::kWidth;
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) {
    UpdateVector<Ops, kKind, kGrad, kCopy>(s, has_momentum, a, i);
  }
  return i;
}

template <class Ops, OptimizerKind kKind, numerics::DType kGrad, int kCopy>
void UpdateRange(const ElementScalars& s, bool has_momentum, const UpdateArrays& a, int64_t begin,
                 int64_t end) {
  constexpr int kWidth = Ops::kWidth;
  // Local copies: vector stores may alias anything (the intrinsic types are may_alias), so
  // pointers and scalars read through `a` and `s` would be reloaded for every vector.
  const UpdateArrays arrays = a;
  ElementScalars scalars = s;
  int64_t i;
  if (!s.first_step && !s.maximize && !s.amsgrad) {
    // The usual case (a later step, no maximize, no amsgrad): with these flags constant, their
    // per-vector branches fold away.
    scalars.first_step = false;
    scalars.maximize = false;
    scalars.amsgrad = false;
    i = UpdateVectors<Ops, kKind, kGrad, kCopy>(scalars, has_momentum, arrays, begin, end);
  } else {
    i = UpdateVectors<Ops, kKind, kGrad, kCopy>(scalars, has_momentum, arrays, begin, end);
  }
  if (i == end) return;
  // The tail: copy in, run one vector, copy back what the update wrote.
  const int64_t n = end - i;
  alignas(64) unsigned char grad[kWidth * 4] = {};
  alignas(64) float master[kWidth] = {};
  alignas(64) float state[kMaxStateArrays][kWidth] = {};
  alignas(64) unsigned char copy[kWidth * 4] = {};
  constexpr int kGradBytes = kDTypeBytes<kGrad>;
  constexpr int kCopyBytes = kCopy == static_cast<int>(numerics::DType::kFloat32) ? 4 : 2;
  UpdateArrays tail{grad, master, {nullptr, nullptr, nullptr}, nullptr};
  __builtin_memcpy(grad, static_cast<const unsigned char*>(a.grad) + i * kGradBytes,
                   n * kGradBytes);
  __builtin_memcpy(master, a.master + i, n * sizeof(float));
  for (int k = 0; k < kMaxStateArrays; ++k) {
    if (a.state[k] == nullptr) continue;
    __builtin_memcpy(state[k], a.state[k] + i, n * sizeof(float));
    tail.state[k] = state[k];
  }
  if (kCopy != kNoParamCopyDType) tail.param_copy = copy;
  UpdateVector<Ops, kKind, kGrad, kCopy>(s, has_momentum, tail, 0);
  __builtin_memcpy(a.master + i, master, n * sizeof(float));
  for (int k = 0; k < kMaxStateArrays; ++k) {
    if (a.state[k] != nullptr) __builtin_memcpy(a.state[k] + i, state[k], n * sizeof(float));
  }
  if (kCopy != kNoParamCopyDType) {
    __builtin_memcpy(static_cast<unsigned char*>(a.param_copy) + i * kCopyBytes, copy,
                     n * kCopyBytes);
  }
}

template <class Ops, OptimizerKind kKind, numerics::DType kGrad>
UpdateRangeFn SelectForCopy(int param_copy_dtype) {
  switch (param_copy_dtype) {
    case static_cast<int>(numerics::DType::kFloat32):
      return &UpdateRange<Ops, kKind, kGrad, static_cast<int>(numerics::DType::kFloat32)>;
    case static_cast<int>(numerics::DType::kBFloat16):
      return &UpdateRange<Ops, kKind, kGrad, static_cast<int>(numerics::DType::kBFloat16)>;
    case static_cast<int>(numerics::DType::kFloat16):
      return &UpdateRange<Ops, kKind, kGrad, static_cast<int>(numerics::DType::kFloat16)>;
    default:
      return &UpdateRange<Ops, kKind, kGrad, kNoParamCopyDType>;
  }
}

template <class Ops, OptimizerKind kKind>
UpdateRangeFn SelectForGrad(numerics::DType grad_dtype, int param_copy_dtype) {
  switch (grad_dtype) {
    case numerics::DType::kBFloat16:
      return SelectForCopy<Ops, kKind, numerics::DType::kBFloat16>(param_copy_dtype);
    case numerics::DType::kFloat16:
      return SelectForCopy<Ops, kKind, numerics::DType::kFloat16>(param_copy_dtype);
    default:
      return SelectForCopy<Ops, kKind, numerics::DType::kFloat32>(param_copy_dtype);
  }
}

template <class Ops>
UpdateRangeFn SelectUpdateRange(OptimizerKind kind, numerics::DType grad_dtype,
                                int param_copy_dtype) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return SelectForGrad<Ops, OptimizerKind::kSgd>(grad_dtype, param_copy_dtype);
    case OptimizerKind::kAdam:
      return SelectForGrad<Ops, OptimizerKind::kAdam>(grad_dtype, param_copy_dtype);
    case OptimizerKind::kAdamW:
      return SelectForGrad<Ops, OptimizerKind::kAdamW>(grad_dtype, param_copy_dtype);
    case OptimizerKind::kAdagrad:
      return SelectForGrad<Ops, OptimizerKind::kAdagrad>(grad_dtype, param_copy_dtype);
    default:
      return SelectForGrad<Ops, OptimizerKind::kLion>(grad_dtype, param_copy_dtype);
  }
}

// Adds the squares of [begin, end) into kSumLanes accumulators (see SumSquaresFn).
template <class Ops, numerics::DType kDType>
void SumSquares(const void* data, int64_t begin, int64_t end, double lanes[kSumLanes]) {
  constexpr int kWidth = Ops::kWidth;
  static_assert(kSumLanes % kWidth == 0, "a vector must fill whole lanes");
  typename Ops::Accumulator acc = Ops::ZeroAccumulator();
  int64_t i = begin;
  for (; i + kSumLanes <= end; i += kSumLanes) {
    for (int k = 0; k < kSumLanes; k += kWidth) {
      Ops::AccumulateSquares(acc, k, LoadAs<Ops, kDType>(data, i + k));
    }
  }
  if (i < end) {
    // Zero padding adds +0 to lanes that hold +0 or more: their bits do not change.
    constexpr int kBytes = kDTypeBytes<kDType>;
    alignas(64) unsigned char tail[kSumLanes * 4] = {};
    __builtin_memcpy(tail, static_cast<const unsigned char*>(data) + i * kBytes,
                     (end - i) * kBytes);
    for (int k = 0; k < kSumLanes; k += kWidth) {
      Ops::AccumulateSquares(acc, k, LoadAs<Ops, kDType>(tail, k));
    }
  }
  Ops::StoreLanes(acc, lanes);
}

template <class Ops>
SumSquaresFn SelectSumSquares(numerics::DType dtype) {
  switch (dtype) {
    case numerics::DType::kBFloat16:
      return &SumSquares<Ops, numerics::DType::kBFloat16>;
    case numerics::DType::kFloat16:
      return &SumSquares<Ops, numerics::DType::kFloat16>;
    default:
      return &SumSquares<Ops, numerics::DType::kFloat32>;
  }
}

// Converts the kWidth elements at i from kSrc in `src` to kDst in `dst`; returns the value `dst`
// now holds there, as fp32. Equal dtypes copy the bits (as a memcpy would, NaN payloads too).
template <class Ops, numerics::DType kSrc, numerics::DType kDst>
__attribute__((always_inline)) inline typename Ops::V ConvertVector(const void* src, void* dst,
                                                                    int64_t i) {
  const typename Ops::V value = LoadAs<Ops, kSrc>(src, i);
  if constexpr (kSrc == kDst) {
    constexpr int kBytes = kDTypeBytes<kSrc> * Ops::kWidth;
    __builtin_memcpy(static_cast<unsigned char*>(dst) + i * kDTypeBytes<kSrc>,
                     static_cast<const unsigned char*>(src) + i * kDTypeBytes<kSrc>, kBytes);
    return value;
  } else {
    StoreParamCopy<Ops, static_cast<int>(kDst)>(dst, i, value);
    // Widening is exact; a narrower kDst rounded, so its value is read back from what was stored.
    if constexpr (kDst == numerics::DType::kFloat32) {
      return value;
    } else {
      return LoadAs<Ops, kDst>(dst, i);
    }
  }
}

// ConvertSumSquaresFn: SumSquares<Ops, kDst> over the values as they are converted, so the lanes
// hold the bits SumSquares would give over `dst` afterwards.
template <class Ops, numerics::DType kSrc, numerics::DType kDst>
void ConvertSumSquares(const void* src, void* dst, int64_t begin, int64_t end,
                       double lanes[kSumLanes]) {
  constexpr int kWidth = Ops::kWidth;
  static_assert(kSumLanes % kWidth == 0, "a vector must fill whole lanes");
  typename Ops::Accumulator acc = Ops::ZeroAccumulator();
  int64_t i = begin;
  for (; i + kSumLanes <= end; i += kSumLanes) {
    for (int k = 0; k < kSumLanes; k += kWidth) {
      Ops::AccumulateSquares(acc, k, ConvertVector<Ops, kSrc, kDst>(src, dst, i + k));
    }
  }
  if (i < end) {
    // Zero padding converts to +0, whose square leaves the lanes' bits as they are (SumSquares).
    constexpr int kSrcBytes = kDTypeBytes<kSrc>;
    constexpr int kDstBytes = kDTypeBytes<kDst>;
    alignas(64) unsigned char src_tail[kSumLanes * 4] = {};
    alignas(64) unsigned char dst_tail[kSumLanes * 4] = {};
    __builtin_memcpy(src_tail, static_cast<const unsigned char*>(src) + i * kSrcBytes,
                     (end - i) * kSrcBytes);
    for (int k = 0; k < kSumLanes; k += kWidth) {
      Ops::AccumulateSquares(acc, k, ConvertVector<Ops, kSrc, kDst>(src_tail, dst_tail, k));
    }
    __builtin_memcpy(static_cast<unsigned char*>(dst) + i * kDstBytes, dst_tail,
                     (end - i) * kDstBytes);
  }
  Ops::StoreLanes(acc, lanes);
}

template <class Ops, numerics::DType kSrc>
ConvertSumSquaresFn SelectConvertSumSquaresTo(numerics::DType dst_dtype) {
  switch (dst_dtype) {
    case numerics::DType::kBFloat16:
      return &ConvertSumSquares<Ops, kSrc, numerics::DType::kBFloat16>;
    case numerics::DType::kFloat16:
      return &ConvertSumSquares<Ops, kSrc, numerics::DType::kFloat16>;
    default:
      return &ConvertSumSquares<Ops, kSrc, numerics::DType::kFloat32>;
  }
}

template <class Ops>
ConvertSumSquaresFn SelectConvertSumSquares(numerics::DType src_dtype, numerics::DType dst_dtype) {
  switch (src_dtype) {
    case numerics::DType::kBFloat16:
      return SelectConvertSumSquaresTo<Ops, numerics::DType::kBFloat16>(dst_dtype);
    case numerics::DType::kFloat16:
      return SelectConvertSumSquaresTo<Ops, numerics::DType::kFloat16>(dst_dtype);
    default:
      return SelectConvertSumSquaresTo<Ops, numerics::DType::kFloat32>(dst_dtype);
  }
}

}  // namespace cpu_internal
}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_UPDATE_LOOP_H_
