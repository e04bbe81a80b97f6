// zero3's gather geometry (gather_windows.h).
#include "sharding/gather_windows.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace zeroshard::sharding {

absl::string_view ModuleOfTensorName(absl::string_view tensor_name) {
  const size_t dot = tensor_name.rfind('.');
  return dot == absl::string_view::npos ? tensor_name : tensor_name.substr(0, dot);
}

GatherWindows GatherWindowsFor(const ShardPlan& plan) {
  GatherWindows windows;
  absl::flat_hash_map<std::string, int64_t> module_index;
  windows.tensor_module.reserve(plan.num_tensors());
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    const std::string module(ModuleOfTensorName(plan.tensors()[t].name));
    const TensorPlacement& placement = plan.placement(t);
    const int64_t last_bucket = placement.first_bucket + placement.num_buckets - 1;
    auto [it, inserted] = module_index.try_emplace(module, windows.modules.size());
    if (inserted) {
      windows.modules.push_back({module, placement.first_bucket, last_bucket, 0, 0,
                                 placement.flat_offset, placement.flat_end()});
    } else {
      ModuleRange& range = windows.modules[it->second];
      range.first_bucket = std::min(range.first_bucket, placement.first_bucket);
      range.last_bucket = std::max(range.last_bucket, last_bucket);
      range.tensors_begin = std::min(range.tensors_begin, placement.flat_offset);
      range.tensors_end = std::max(range.tensors_end, placement.flat_end());
    }
    windows.tensor_module.push_back(it->second);
  }
  for (ModuleRange& range : windows.modules) {
    range.flat_begin = plan.buckets()[range.first_bucket].flat_begin;
    range.flat_end = plan.buckets()[range.last_bucket].flat_end();
    windows.max_span_buckets = std::max(windows.max_span_buckets, range.span_buckets());
    windows.window_elems = std::max(windows.window_elems, range.span_elems());
  }
  return windows;
}

int64_t DefaultGatherPoolBuckets(const ShardPlan& plan) {
  return 2 * GatherWindowsFor(plan).max_span_buckets;
}

int64_t GatherPoolWindows(const GatherWindows& windows, int64_t pool_buckets) {
  return std::max<int64_t>(1, pool_buckets / windows.max_span_buckets);
}

}  // namespace zeroshard::sharding
