// The defaults of a JobSpec, applied in one place: the values job.proto's comments document (a
// test checks the two agree). The default bucket size is the planner's kDefaultBucketElems.
#ifndef ZEROSHARD_JOBSPEC_JOB_SPEC_DEFAULTS_H_
#define ZEROSHARD_JOBSPEC_JOB_SPEC_DEFAULTS_H_

#include <cstdint>

#include "sharding/shard_planner.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::jobspec {

inline constexpr int64_t kDefaultDatasetSize = 1024;
inline constexpr int64_t kDefaultSteps = 100;
inline constexpr int64_t kDefaultGlobalBatch = 128;
inline constexpr int32_t kDefaultMaxAttempts = 3;
inline constexpr int32_t kDefaultCheckpointKeep = 2;
inline constexpr double kDefaultFp16LossScale = 65536.0;
inline constexpr int64_t kDefaultLossScaleGrowthInterval = 2000;
inline constexpr double kDefaultLossScaleBackoffFactor = 0.5;
inline constexpr double kDefaultLossScaleGrowthFactor = 2.0;
// An attached zero3 job's default bucket is its model's elements / this (within the planner's
// bounds): zero3's gather pool holds two windows of the largest module's buckets, and one
// default bucket (4M elements) would hold a model of up to 4M elements whole, twice over in the
// pool: more than zero2 keeps.
inline constexpr int64_t kAttachedZero3BucketsPerModel = 32;
// ... and at least this many elements (256 KiB of fp32): below it a bucket costs more in calls
// than it saves, and tiny models stay in one bucket.
inline constexpr int64_t kAttachedZero3MinBucketElems = 65536;

// The bucket_elems `spec` gets when it sets none (its mode and workload set): the planner's
// kDefaultBucketElems, but for an attached zero3 job its model's elements /
// kAttachedZero3BucketsPerModel, at least kAttachedZero3MinBucketElems and at most
// kDefaultBucketElems.
int64_t DefaultBucketElems(const zeroshard::v1::JobSpec& spec);

// Returns `spec` with every unset field that has a default set to it. Fields already set are
// kept as given (validation judges them). Some defaults depend on other fields (the optimizer
// kind, the grad dtype, the job id, workload.attached), so this runs on the whole spec. `job_id`
// names the default checkpoint directory. An attached spec gets no dataset_size and no
// global_batch, steps 0 (no fixed count), and min_workers and max_workers equal to the number of
// its pinned workers; in zero3 its bucket_elems is DefaultBucketElems'.
zeroshard::v1::JobSpec WithDefaults(zeroshard::v1::JobSpec spec, const std::string& job_id = "");

}  // namespace zeroshard::jobspec

#endif  // ZEROSHARD_JOBSPEC_JOB_SPEC_DEFAULTS_H_
