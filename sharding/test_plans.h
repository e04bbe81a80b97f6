// Test support: shard plans of one-dimensional tensors of given sizes ("t0", "t1", ...), the
// shape most engine tests need.
#ifndef ZEROSHARD_SHARDING_TEST_PLANS_H_
#define ZEROSHARD_SHARDING_TEST_PLANS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sharding/shard_planner.h"
#include "sharding/tensor_spec.h"

namespace zeroshard::sharding {

// Tensors "t<i>" of shape {sizes[i]} (weight decay 0, lr scale 1), planned for `world_size`
// ranks in buckets of `bucket_elems`.
inline absl::StatusOr<ShardPlan> PlanOfSizes(const std::vector<int64_t>& sizes, int64_t world_size,
                                             int64_t bucket_elems) {
  std::vector<TensorSpec> tensors;
  tensors.reserve(sizes.size());
  for (int64_t size : sizes) {
    TensorSpec spec;
    spec.name = absl::StrCat("t", tensors.size());
    spec.shape = {size};
    spec.num_elements = size;
    tensors.push_back(spec);
  }
  ShardPlanOptions options;
  options.bucket_elems = bucket_elems;
  return ShardPlan::Create(std::move(tensors), world_size, options);
}

}  // namespace zeroshard::sharding

#endif  // ZEROSHARD_SHARDING_TEST_PLANS_H_
