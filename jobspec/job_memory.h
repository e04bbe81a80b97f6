// From a job spec to what one rank's engine needs in memory (sharding/rank_memory.h): the
// coordinator compares it with the workers' --memory_limit_bytes at submission and when it places
// the job.
#ifndef ZEROSHARD_JOBSPEC_JOB_MEMORY_H_
#define ZEROSHARD_JOBSPEC_JOB_MEMORY_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "sharding/rank_memory.h"
#include "zeroshard/v1/job.pb.h"  // with types.proto (DeviceKind)

namespace zeroshard::jobspec {

// The CUDA device's statistics chunk (worker/engine's cuda_internal::kGradStatsChunkElements).
inline constexpr int64_t kCudaGradStatsChunkElements = int64_t{1} << 14;

// `spec`'s engine options (defaults applied) as if it ran in `mode` on a `device_kind` worker with
// the default --bucket_pool_size: dtypes, the optimizer's state arrays, the gather pool (zero3)
// and the device's statistics chunk. InvalidArgument naming the precision field for a dtype the
// engine does not hold (FLOAT64).
absl::StatusOr<sharding::RankMemoryOptions> RankMemoryOptionsForJob(const v1::JobSpec& spec,
                                                                    v1::Mode mode,
                                                                    v1::DeviceKind device_kind);

// The most any rank of `spec`'s plan at `world_size` ranks needs in `mode`
// (sharding::MaxRankMemoryNeed), on spec.device_kind() workers. Planning errors as PlanForJob's.
absl::StatusOr<sharding::RankMemoryBytes> JobMemoryNeed(const v1::JobSpec& spec, v1::Mode mode,
                                                        int64_t world_size);

}  // namespace zeroshard::jobspec

#endif  // ZEROSHARD_JOBSPEC_JOB_MEMORY_H_
