// Conversions of flat element buffers between the engine's dtypes (fp32, bf16, fp16): gradients
// into buckets, reduced buckets into gradient storage, parameter copies to fp32 on the host.
#ifndef ZEROSHARD_WORKER_ENGINE_ELEMENT_CONVERT_H_
#define ZEROSHARD_WORKER_ENGINE_ELEMENT_CONVERT_H_

#include <cstdint>

#include "numerics/dtype.h"
#include "worker/comm/communicator.h"

namespace zeroshard::engine {

// The communicator's name for a kernel dtype.
comm::ElementType ToElementType(numerics::DType dtype);

// dst[i] = round_to(dst_dtype, round_to(storage_dtype, grad[i] * scale)) for i < count: the
// gradient as backward would have stored it in `storage_dtype` (loss scale applied), then held in
// `dst_dtype` (e.g. the reduce buffer's). Every rounding is to nearest even; overflow gives Inf.
void StoreScaledGradient(const float* grad, float scale, int64_t count,
                         numerics::DType storage_dtype, void* dst, numerics::DType dst_dtype);

// dst[i] = round_to(dst_dtype, src[i]) for i < count; exact when dst_dtype is at least as wide.
// REQUIRES: `src` and `dst` do not overlap, unless they are the same pointer and the same dtype.
void ConvertElements(const void* src, numerics::DType src_dtype, void* dst,
                     numerics::DType dst_dtype, int64_t count);

// dst[i] = round_to(dst_dtype, dst[i] + src[i]) for i < count, the sum taken in fp32 (gradient
// accumulation across micro-batches). REQUIRES: `src` and `dst` do not overlap.
void AddElements(const void* src, numerics::DType src_dtype, void* dst, numerics::DType dst_dtype,
                 int64_t count);

// Sets `count` elements of `dtype` at `dst` to zero.
void ZeroElements(void* dst, numerics::DType dtype, int64_t count);

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_ELEMENT_CONVERT_H_
