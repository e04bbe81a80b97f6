// What one rank's engine allocates, by category, for a plan and a mode: the same arithmetic as the
// engine's buffers (worker/engine/engine.cc), so the coordinator can refuse a job that cannot fit a
// worker's --memory_limit_bytes before it runs, and the engine can say what its mode needs in all.
#ifndef ZEROSHARD_SHARDING_RANK_MEMORY_H_
#define ZEROSHARD_SHARDING_RANK_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "numerics/dtype.h"
#include "sharding/shard_planner.h"
#include "sharding/zero_formula.h"

namespace zeroshard::sharding {

// The CPU device's statistics chunk (kernels::kCpuChunkElements; worker/engine's
// engine_memory_need_test checks that they agree).
inline constexpr int64_t kCpuGradStatsChunkElements = int64_t{1} << 16;
// Bytes of one statistics chunk table entry (kernels::GradStatsChunk: begin and length, int64).
inline constexpr int64_t kGradStatsChunkEntryBytes = 16;
// The engine's statistics all-reduce buffer: 6 doubles.
inline constexpr int64_t kStatsBufferBytes = 6 * 8;

struct RankMemoryOptions {
  ZeroStage mode = ZeroStage::kZero2;
  numerics::DType param_dtype = numerics::DType::kFloat32;
  numerics::DType grad_dtype = numerics::DType::kFloat32;
  numerics::DType reduce_dtype = numerics::DType::kFloat32;
  // fp32 optimizer-state arrays per parameter (kernels::StateArraysPerParam: Adam 2, AMSGrad 3,
  // SGD with momentum 1, Adagrad 1, Lion 1, plain SGD 0). An int, so sharding need not know
  // kernels.
  int state_arrays_per_param = 0;
  // The reduce pipeline's bucket buffers (EngineConfig::bucket_pool_size), >= 1.
  int64_t bucket_pool_size = 2;
  // zero3's gather pool in buckets (EngineConfig::gather_pool_buckets), >= 0; 0: the default
  // (gather_windows.h's DefaultGatherPoolBuckets).
  int64_t gather_pool_buckets = 0;
  // The device's statistics chunk (DeviceOps::GradStatsChunkElements()), >= 1.
  int64_t grad_stats_chunk_elements = kCpuGradStatsChunkElements;
};

// Bytes one rank's engine holds after creation, per worker/engine's MemoryCategory; `total` is
// their sum.
struct RankMemoryBytes {
  int64_t params = 0;
  int64_t grads = 0;
  int64_t master = 0;
  int64_t optimizer_state = 0;
  int64_t buckets = 0;
  int64_t gather_pool = 0;
  int64_t comm_scratch = 0;
  int64_t total = 0;

  // The non-zero categories in MiB, e.g. "params=96.0 MiB, grads=24.0 MiB, optimizer_state=...".
  std::string Breakdown() const;
};

// `bytes` in MiB with one decimal, e.g. "412.0 MiB".
std::string FormatMiB(int64_t bytes);

// zero3's gather pool in bytes: the windows a pool of `gather_pool_buckets` buckets holds (0: the
// default, DefaultGatherPoolBuckets in gather_windows.h), each the largest module's span
// (GatherWindows::window_elems) in `param_dtype`. Modules and windows are gather_windows.h's.
int64_t GatherPoolBytes(const ShardPlan& plan, int64_t gather_pool_buckets,
                        numerics::DType param_dtype);

// What Engine::Create allocates for `rank` of `plan` in `options.mode` (its AllocateBuffers, the
// bucket pipeline's pool and the statistics chunks), byte for byte:
//   params:          the full padded layout in param_dtype; zero3: the owned pieces only
//   grads:           the full layout in grad_dtype (ddp, zero1); the owned pieces (zero2, zero3)
//   master:          fp32, only for bf16/fp16 parameters: the full layout (ddp) or the owned pieces
//   optimizer_state: state_arrays_per_param fp32 arrays, sized as master
//   buckets:         min(bucket_pool_size, buckets) largest-bucket buffers in reduce_dtype (zero2,
//                    zero3, or grad_dtype != reduce_dtype), plus an fp32 largest-bucket staging
//                    buffer when backward's fp32 segments are rounded on the way
//   gather_pool:     zero3: GatherPoolBytes (the pool's windows, each the largest module's span,
//                    in param_dtype)
//   comm_scratch:    the statistics buffer, 4 bytes per tensor (the gradient mask), and per
//                    statistics chunk (each owned fragment cut every grad_stats_chunk_elements)
//                    a table entry and an fp64 partial.
// InvalidArgument naming the field for a rank outside the plan or an option out of range.
absl::StatusOr<RankMemoryBytes> RankMemoryNeed(const ShardPlan& plan, int64_t rank,
                                               const RankMemoryOptions& options);

// The most any rank of `plan` needs (ranks differ only in their statistics chunks): what a job
// needs per worker.
absl::StatusOr<RankMemoryBytes> MaxRankMemoryNeed(const ShardPlan& plan,
                                                  const RankMemoryOptions& options);

}  // namespace zeroshard::sharding

#endif  // ZEROSHARD_SHARDING_RANK_MEMORY_H_
