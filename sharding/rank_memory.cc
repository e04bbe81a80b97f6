// Per-rank memory need (rank_memory.h): the engine's buffer sizes as arithmetic.
#include "sharding/rank_memory.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sharding/gather_windows.h"

namespace zeroshard::sharding {
namespace {

absl::Status ValidateOptions(const RankMemoryOptions& options) {
  for (const auto& [field, dtype] :
       {std::pair<const char*, numerics::DType>{"param_dtype", options.param_dtype},
        {"grad_dtype", options.grad_dtype},
        {"reduce_dtype", options.reduce_dtype}}) {
    if (!numerics::IsValidDType(dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": invalid dtype ", static_cast<int>(dtype)));
    }
  }
  if (options.state_arrays_per_param < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("state_arrays_per_param: must be >= 0, got ", options.state_arrays_per_param));
  }
  if (options.bucket_pool_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket_pool_size: must be >= 1, got ", options.bucket_pool_size));
  }
  if (options.gather_pool_buckets < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather_pool_buckets: must be >= 0, got ", options.gather_pool_buckets));
  }
  if (options.grad_stats_chunk_elements < 1) {
    return absl::InvalidArgumentError(absl::StrCat("grad_stats_chunk_elements: must be >= 1, got ",
                                                   options.grad_stats_chunk_elements));
  }
  return absl::OkStatus();
}

int64_t LargestBucket(const ShardPlan& plan) {
  int64_t largest = 0;
  for (const BucketLayout& bucket : plan.buckets()) {
    largest = std::max(largest, bucket.padded_elems);
  }
  return largest;
}

}  // namespace

std::string FormatMiB(int64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / 1048576.0);
}

std::string RankMemoryBytes::Breakdown() const {
  std::vector<std::string> parts;
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"params", params},
                                    {"grads", grads},
                                    {"master", master},
                                    {"optimizer_state", optimizer_state},
                                    {"buckets", buckets},
                                    {"gather_pool", gather_pool},
                                    {"comm_scratch", comm_scratch}}) {
    if (value != 0) parts.push_back(absl::StrCat(name, "=", FormatMiB(value)));
  }
  return absl::StrJoin(parts, ", ");
}

int64_t GatherPoolBytes(const ShardPlan& plan, int64_t gather_pool_buckets,
                        numerics::DType param_dtype) {
  const GatherWindows windows = GatherWindowsFor(plan);
  const int64_t pool_buckets =
      gather_pool_buckets == 0 ? DefaultGatherPoolBuckets(plan) : gather_pool_buckets;
  return GatherPoolWindows(windows, pool_buckets) * windows.window_elems *
         numerics::DTypeSize(param_dtype);
}

absl::StatusOr<RankMemoryBytes> RankMemoryNeed(const ShardPlan& plan, int64_t rank,
                                               const RankMemoryOptions& options) {
  if (absl::Status valid = ValidateOptions(options); !valid.ok()) return valid;
  absl::StatusOr<RankView> view = plan.ViewForRank(rank);
  if (!view.ok()) return view.status();
  const ZeroStage mode = options.mode;
  const bool ddp = mode == ZeroStage::kDdp;
  const bool zero3 = mode == ZeroStage::kZero3;
  // zero3 reduces, updates and keeps gradients and state exactly as zero2 does.
  const bool shards_grads = mode == ZeroStage::kZero2 || zero3;
  const int64_t padded = plan.padded_elems();
  const int64_t owned = view->owned_elems();
  const int64_t largest = LargestBucket(plan);
  const int64_t param_size = numerics::DTypeSize(options.param_dtype);
  const int64_t grad_size = numerics::DTypeSize(options.grad_dtype);
  const int64_t reduce_size = numerics::DTypeSize(options.reduce_dtype);
  const bool fp32_params = options.param_dtype == numerics::DType::kFloat32;

  RankMemoryBytes need;
  need.params = (zero3 ? owned : padded) * param_size;
  need.grads = (shards_grads ? owned : padded) * grad_size;
  const int64_t state_elems = ddp ? padded : owned;
  // fp32 parameters are their own master.
  need.master = fp32_params ? 0 : state_elems * 4;
  need.optimizer_state = options.state_arrays_per_param * state_elems * 4;
  // The reduce pipeline's pool (BucketPipeline::AllocatePool).
  if (shards_grads || options.grad_dtype != options.reduce_dtype) {
    need.buckets += std::min(options.bucket_pool_size, plan.num_buckets()) * largest * reduce_size;
  }
  // Backward writes fp32 segments; they are staged (and rounded) unless both the gradient dtype
  // and the segment's destination are fp32 (Engine::StagesGradients).
  const numerics::DType destination = shards_grads ? options.reduce_dtype : options.grad_dtype;
  if (options.grad_dtype != numerics::DType::kFloat32 || destination != numerics::DType::kFloat32) {
    need.buckets += largest * 4;
  }
  if (zero3) {
    need.gather_pool = GatherPoolBytes(plan, options.gather_pool_buckets, options.param_dtype);
  }
  int64_t chunks = 0;
  for (const TensorFragment& fragment : view->fragments()) {
    chunks += (fragment.size() + options.grad_stats_chunk_elements - 1) /
              options.grad_stats_chunk_elements;
  }
  need.comm_scratch = kStatsBufferBytes + plan.num_tensors() * 4 +
                      chunks * (kGradStatsChunkEntryBytes + int64_t{sizeof(double)});
  need.total = need.params + need.grads + need.master + need.optimizer_state + need.buckets +
               need.gather_pool + need.comm_scratch;
  return need;
}

absl::StatusOr<RankMemoryBytes> MaxRankMemoryNeed(const ShardPlan& plan,
                                                  const RankMemoryOptions& options) {
  RankMemoryBytes most;
  for (int64_t rank = 0; rank < plan.world_size(); ++rank) {
    absl::StatusOr<RankMemoryBytes> need = RankMemoryNeed(plan, rank, options);
    if (!need.ok()) return need.status();
    if (rank == 0 || need->total > most.total) most = *need;
  }
  return most;
}

}  // namespace zeroshard::sharding
