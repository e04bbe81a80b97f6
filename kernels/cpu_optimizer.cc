// The CPU implementation of the optimizer API: validation, dispatch to an instruction set, and
// threading over fixed-size chunks.
#include "kernels/cpu_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dcheck.h"
#include "common/status_macros.h"
#include "kernels/cpu_simd.h"

namespace zeroshard::kernels {
namespace {

using cpu_internal::ConvertSumSquaresFn;
using cpu_internal::kSumLanes;
using cpu_internal::SumSquaresFn;
using cpu_internal::UpdateArrays;
using cpu_internal::UpdateRangeFn;

// A chunk of one piece: elements [begin, end).
struct Chunk {
  int64_t piece;
  int64_t begin;
  int64_t end;
};

template <class Piece>
std::vector<Chunk> CutIntoChunks(absl::Span<const Piece> pieces) {
  std::vector<Chunk> chunks;
  for (size_t p = 0; p < pieces.size(); ++p) {
    for (int64_t begin = 0; begin < pieces[p].length; begin += kCpuChunkElements) {
      const int64_t end = std::min(pieces[p].length, begin + kCpuChunkElements);
      chunks.push_back(Chunk{static_cast<int64_t>(p), begin, end});
    }
  }
  return chunks;
}

void RunChunks(ThreadPool* pool, int64_t num_chunks, absl::FunctionRef<void(int64_t)> task) {
  if (pool == nullptr) {
    for (int64_t i = 0; i < num_chunks; ++i) task(i);
  } else {
    pool->ParallelFor(num_chunks, task);
  }
}

absl::StatusOr<SimdLevel> ResolveSimd(SimdLevel simd) {
  if (simd == SimdLevel::kAuto) return BestSimdLevel();
  if (!SimdLevelSupported(simd)) {
    return absl::UnavailableError(
        absl::StrCat("this processor does not support ", SimdLevelName(simd)));
  }
  return simd;
}

UpdateRangeFn SelectUpdateRange(SimdLevel simd, OptimizerKind kind, numerics::DType grad_dtype,
                                int param_copy_dtype) {
  switch (simd) {
    case SimdLevel::kAvx512:
      return cpu_internal::SelectUpdateRangeAvx512(kind, grad_dtype, param_copy_dtype);
    case SimdLevel::kAvx2:
      return cpu_internal::SelectUpdateRangeAvx2(kind, grad_dtype, param_copy_dtype);
    default:
      return cpu_internal::SelectUpdateRangeScalar(kind, grad_dtype, param_copy_dtype);
  }
}

SumSquaresFn SelectSumSquares(SimdLevel simd, numerics::DType dtype) {
  switch (simd) {
    case SimdLevel::kAvx512:
      return cpu_internal::SelectSumSquaresAvx512(dtype);
    case SimdLevel::kAvx2:
      return cpu_internal::SelectSumSquaresAvx2(dtype);
    default:
      return cpu_internal::SelectSumSquaresScalar(dtype);
  }
}

ConvertSumSquaresFn SelectConvertSumSquares(SimdLevel simd, numerics::DType src_dtype,
                                            numerics::DType dst_dtype) {
  switch (simd) {
    case SimdLevel::kAvx512:
      return cpu_internal::SelectConvertSumSquaresAvx512(src_dtype, dst_dtype);
    case SimdLevel::kAvx2:
      return cpu_internal::SelectConvertSumSquaresAvx2(src_dtype, dst_dtype);
    default:
      return cpu_internal::SelectConvertSumSquaresScalar(src_dtype, dst_dtype);
  }
}

absl::Status ValidateStatsChunks(const void* src, numerics::DType src_dtype, const void* dst,
                                 numerics::DType dst_dtype, absl::Span<const GradStatsChunk> chunks,
                                 const double* partials) {
  if (!numerics::IsValidDType(src_dtype)) return absl::InvalidArgumentError("src_dtype is invalid");
  if (!numerics::IsValidDType(dst_dtype)) return absl::InvalidArgumentError("dst_dtype is invalid");
  if (!chunks.empty() && partials == nullptr) {
    return absl::InvalidArgumentError("partials is null");
  }
  if (src == dst && src != nullptr && src_dtype != dst_dtype) {
    return absl::InvalidArgumentError(absl::StrCat("src == dst but the dtypes differ (",
                                                   numerics::DTypeName(src_dtype), " to ",
                                                   numerics::DTypeName(dst_dtype), ")"));
  }
  for (size_t k = 0; k < chunks.size(); ++k) {
    const GradStatsChunk& chunk = chunks[k];
    if (chunk.begin < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks[", k, "].begin must be >= 0, got ", chunk.begin));
    }
    if (chunk.length < 0 || chunk.length > kCpuChunkElements) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", k, "].length must be in [0, ",
                                                     kCpuChunkElements, "], got ", chunk.length));
    }
    if (chunk.length > 0 && (src == nullptr || dst == nullptr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks[", k, "] has elements but src or dst is null"));
    }
  }
  return absl::OkStatus();
}

// Whether the arrays the update of `piece` touches are pairwise disjoint, as UpdatePiece
// requires. O(arrays^2) per piece; for ZS_DCHECK.
bool ArraysAreDisjoint(const UpdatePiece& piece, int state_arrays) {
  struct ByteRange {
    uintptr_t begin;
    uintptr_t end;
  };
  ByteRange ranges[3 + kMaxStateArrays];
  int count = 0;
  auto add = [&](const void* data, int64_t bytes) {
    if (data == nullptr || bytes <= 0) return;
    const auto begin = reinterpret_cast<uintptr_t>(data);
    ranges[count++] = ByteRange{begin, begin + static_cast<uintptr_t>(bytes)};
  };
  add(piece.grad, piece.length * numerics::DTypeSize(piece.grad_dtype));
  add(piece.master, piece.length * int64_t{4});
  for (int s = 0; s < state_arrays; ++s) add(piece.state[s], piece.length * int64_t{4});
  add(piece.param_copy, piece.length * numerics::DTypeSize(piece.param_dtype));
  for (int i = 0; i < count; ++i) {
    for (int j = i + 1; j < count; ++j) {
      if (ranges[i].begin < ranges[j].end && ranges[j].begin < ranges[i].end) return false;
    }
  }
  return true;
}

// Lane k + half joins lane k, halving until one is left: a fixed tree.
double CombineLanes(double lanes[kSumLanes]) {
  for (int half = kSumLanes / 2; half >= 1; half /= 2) {
    for (int k = 0; k < half; ++k) lanes[k] = lanes[k] + lanes[k + half];
  }
  return lanes[0];
}

}  // namespace

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAuto:
      return "auto";
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "invalid";
}

bool SimdLevelSupported(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAuto:
    case SimdLevel::kScalar:
      return true;
#if defined(__x86_64__)
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f");
#endif
    default:
      return false;
  }
}

SimdLevel BestSimdLevel() {
  static const SimdLevel best = SimdLevelSupported(SimdLevel::kAvx512) ? SimdLevel::kAvx512
                                : SimdLevelSupported(SimdLevel::kAvx2) ? SimdLevel::kAvx2
                                                                       : SimdLevel::kScalar;
  return best;
}

absl::Status ApplyUpdateCpu(const OptimizerConfig& config, int64_t step, float grad_scale,
                            absl::Span<const UpdatePiece> pieces, ThreadPool* pool,
                            SimdLevel simd) {
  ZS_RETURN_IF_ERROR(ValidateUpdate(config, step, grad_scale, pieces));
  ZS_ASSIGN_OR_RETURN(const SimdLevel level, ResolveSimd(simd));

  const int state_arrays = StateArraysPerParam(config);
  const bool has_momentum = config.kind == OptimizerKind::kSgd && config.momentum != 0.0;
  std::vector<ElementScalars> scalars;
  std::vector<UpdateArrays> arrays;
  std::vector<UpdateRangeFn> kernels;
  scalars.reserve(pieces.size());
  arrays.reserve(pieces.size());
  kernels.reserve(pieces.size());
  for (const UpdatePiece& piece : pieces) {
    ZS_DCHECK(ArraysAreDisjoint(piece, state_arrays))
        << "pieces[" << &piece - pieces.data() << "]: its arrays overlap";
    scalars.push_back(MakeElementScalars(config, step, grad_scale, piece));
    UpdateArrays a{piece.grad, piece.master, {nullptr, nullptr, nullptr}, piece.param_copy};
    for (int s = 0; s < state_arrays; ++s) a.state[s] = piece.state[s];
    arrays.push_back(a);
    const int copy_dtype = piece.param_copy == nullptr ? cpu_internal::kNoParamCopyDType
                                                       : static_cast<int>(piece.param_dtype);
    kernels.push_back(SelectUpdateRange(level, config.kind, piece.grad_dtype, copy_dtype));
  }
  const std::vector<Chunk> chunks = CutIntoChunks(pieces);
  RunChunks(pool, static_cast<int64_t>(chunks.size()), [&](int64_t i) {
    const Chunk& c = chunks[i];
    kernels[c.piece](scalars[c.piece], has_momentum, arrays[c.piece], c.begin, c.end);
  });
  return absl::OkStatus();
}

absl::StatusOr<GradStats> ComputeGradStatsCpu(absl::Span<const GradPiece> pieces, ThreadPool* pool,
                                              SimdLevel simd) {
  ZS_RETURN_IF_ERROR(ValidateGradPieces(pieces));
  ZS_ASSIGN_OR_RETURN(const SimdLevel level, ResolveSimd(simd));

  const std::vector<Chunk> chunks = CutIntoChunks(pieces);
  std::vector<double> chunk_sums(chunks.size());
  RunChunks(pool, static_cast<int64_t>(chunks.size()), [&](int64_t i) {
    const Chunk& c = chunks[i];
    const GradPiece& piece = pieces[c.piece];
    double lanes[kSumLanes];
    SelectSumSquares(level, piece.dtype)(piece.data, c.begin, c.end, lanes);
    chunk_sums[i] = CombineLanes(lanes);
  });
  return CombineGradStatsCpu(chunk_sums);
}

absl::Status ConvertWithGradStatsCpu(const void* src, numerics::DType src_dtype, void* dst,
                                     numerics::DType dst_dtype,
                                     absl::Span<const GradStatsChunk> chunks, double* partials,
                                     ThreadPool* pool, SimdLevel simd) {
  ZS_RETURN_IF_ERROR(ValidateStatsChunks(src, src_dtype, dst, dst_dtype, chunks, partials));
  ZS_ASSIGN_OR_RETURN(const SimdLevel level, ResolveSimd(simd));
  const int64_t num_chunks = static_cast<int64_t>(chunks.size());
  if (src == dst) {
    // The values are already in place: only their statistics.
    const SumSquaresFn sum_squares = SelectSumSquares(level, src_dtype);
    RunChunks(pool, num_chunks, [&](int64_t k) {
      double lanes[kSumLanes];
      sum_squares(src, chunks[k].begin, chunks[k].begin + chunks[k].length, lanes);
      partials[k] = CombineLanes(lanes);
    });
    return absl::OkStatus();
  }
  const ConvertSumSquaresFn convert = SelectConvertSumSquares(level, src_dtype, dst_dtype);
  RunChunks(pool, num_chunks, [&](int64_t k) {
    double lanes[kSumLanes];
    convert(src, dst, chunks[k].begin, chunks[k].begin + chunks[k].length, lanes);
    partials[k] = CombineLanes(lanes);
  });
  return absl::OkStatus();
}

GradStats CombineGradStatsCpu(absl::Span<const double> partials) {
  GradStats stats;
  for (double sum : partials) stats.sum_squares += sum;
  // A finite fp32 square is below 2^256, so a sum of fewer than 2^700 of them stays finite:
  // the sum is non-finite exactly when some element is NaN or +-Inf.
  stats.non_finite = !std::isfinite(stats.sum_squares);
  return stats;
}

}  // namespace zeroshard::kernels
