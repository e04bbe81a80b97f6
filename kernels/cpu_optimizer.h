// The CPU implementation of the optimizer API: fused updates and gradient statistics over many
// flat pieces, vectorised (AVX-512, AVX2 or scalar, chosen at run time) and threaded over
// fixed-size chunks. Results are bit-identical whatever the thread count or instruction set.
#ifndef ZEROSHARD_KERNELS_CPU_OPTIMIZER_H_
#define ZEROSHARD_KERNELS_CPU_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/optimizer.h"
#include "kernels/thread_pool.h"

namespace zeroshard::kernels {

// The instruction set a CPU kernel uses. kAuto picks the best this processor has.
enum class SimdLevel : int32_t {
  kAuto = 0,
  kScalar = 1,
  kAvx2 = 2,
  kAvx512 = 3,
};

const char* SimdLevelName(SimdLevel level);
// The best level this processor supports (never kAuto).
SimdLevel BestSimdLevel();
bool SimdLevelSupported(SimdLevel level);

// Pieces are cut into chunks of this many elements; chunks are the unit of threading, and
// gradient statistics are summed per chunk and then over chunks in order.
inline constexpr int64_t kCpuChunkElements = int64_t{1} << 16;

// One optimizer step over every piece (docs/kernels.md has the formulas): each gradient element
// is multiplied by `grad_scale` (e.g. clip_coef / (world_size * loss_scale)) first. `step` counts
// from 1 and is the same for all pieces. `pool` may be null (runs on the calling thread).
// InvalidArgument for a bad config or piece (nothing is written then); Unavailable when `simd`
// names an instruction set the processor lacks.
// REQUIRES: the arrays of each piece do not overlap (UpdatePiece, kernels/optimizer.h).
absl::Status ApplyUpdateCpu(const OptimizerConfig& config, int64_t step, float grad_scale,
                            absl::Span<const UpdatePiece> pieces, ThreadPool* pool,
                            SimdLevel simd = SimdLevel::kAuto);

// The sum of squares (fp64) of every element of every piece and whether any is NaN or Inf, in
// one pass. The same bits whatever `pool` and `simd`: each chunk sums into 16 fp64 lanes in
// element order, lanes combine in a fixed tree, and chunks combine in piece and chunk order.
absl::StatusOr<GradStats> ComputeGradStatsCpu(absl::Span<const GradPiece> pieces, ThreadPool* pool,
                                              SimdLevel simd = SimdLevel::kAuto);

// The statistics of a conversion, in the conversion's pass: for each chunk k, converts elements
// [begin, begin + length) of `src` (src_dtype) into the same elements of `dst` (dst_dtype, each
// rounded to nearest even as numerics/dtype.h does; equal dtypes copy the bits) and sets
// partials[k] to the fp64 sum of squares of the converted values, summed as ComputeGradStatsCpu
// sums one chunk. So a piece cut into chunks of kCpuChunkElements from its start, whose partials
// CombineGradStatsCpu then adds in order, gets ComputeGradStatsCpu's bits over the converted
// piece. With src == dst and equal dtypes nothing is written but the partials (the statistics
// of values already in place). The same bits whatever `pool` and `simd`.
// InvalidArgument for an invalid dtype, a chunk with begin < 0 or a length outside
// [0, kCpuChunkElements], a null pointer that some chunk needs, or src == dst with different
// dtypes; Unavailable when `simd` names an instruction set the processor lacks.
// REQUIRES: the source and destination elements of the chunks do not overlap, unless src == dst
// with equal dtypes.
absl::Status ConvertWithGradStatsCpu(const void* src, numerics::DType src_dtype, void* dst,
                                     numerics::DType dst_dtype,
                                     absl::Span<const GradStatsChunk> chunks, double* partials,
                                     ThreadPool* pool, SimdLevel simd = SimdLevel::kAuto);

// The statistics whose chunk partials are `partials`: their sum in index order, from 0, as
// ComputeGradStatsCpu adds its chunks' sums, and whether that sum is NaN or +-Inf.
GradStats CombineGradStatsCpu(absl::Span<const double> partials);

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_CPU_OPTIMIZER_H_
