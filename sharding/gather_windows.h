// zero3's gather geometry: which module each tensor belongs to, the bucket range each module's
// tensors overlap, and the window (a contiguous stretch of the flat layout) a module's buckets are
// gathered into, so that every tensor's full values are contiguous while its module is in use.
#ifndef ZEROSHARD_SHARDING_GATHER_WINDOWS_H_
#define ZEROSHARD_SHARDING_GATHER_WINDOWS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "sharding/shard_planner.h"

namespace zeroshard::sharding {

// A tensor's module: its name up to the last '.' ("4.weight" -> "4",
// "blocks.0.attn.qkv.weight" -> "blocks.0.attn.qkv"); a name without '.' is its own module.
absl::string_view ModuleOfTensorName(absl::string_view tensor_name);

// The buckets [first_bucket, last_bucket] that one module's tensors overlap, and the flat range
// they cover, [flat_begin, flat_end): the first bucket's start to the last bucket's end.
struct ModuleRange {
  std::string name;
  int64_t first_bucket = 0;
  int64_t last_bucket = 0;
  int64_t flat_begin = 0;
  int64_t flat_end = 0;
  // The part of [flat_begin, flat_end) the module's own tensors cover (the rest of its first and
  // last buckets belongs to neighbours or padding).
  int64_t tensors_begin = 0;
  int64_t tensors_end = 0;
  int64_t span_buckets() const { return last_bucket - first_bucket + 1; }
  int64_t span_elems() const { return flat_end - flat_begin; }
};

// The gather geometry of one plan. A pool of `windows` windows, each `window_elems` elements of
// the parameter dtype, holds the full values of up to `windows` modules at once: a module's
// buckets lie in one window exactly as in the flat layout, so its tensors are contiguous there.
// The windows form one arena; adjacent modules that share a boundary bucket can lie in it side
// by side at the same shift, so that the shared bucket is one piece of memory (GatherPool).
struct GatherWindows {
  std::vector<int64_t> tensor_module;  // per plan tensor: an index into `modules`
  std::vector<ModuleRange> modules;    // in order of each module's first tensor
  int64_t max_span_buckets = 1;        // the most buckets one module spans
  int64_t window_elems = 0;            // the largest module's span_elems()
};
GatherWindows GatherWindowsFor(const ShardPlan& plan);

// The pool zero3 uses without an explicit gather_pool_buckets: twice the most buckets one module
// spans (one module in use, the next prefetched).
int64_t DefaultGatherPoolBuckets(const ShardPlan& plan);

// How many windows a pool of `pool_buckets` buckets holds: whole windows of max_span_buckets
// each (at least one; the job's validation refuses pools smaller than one window).
int64_t GatherPoolWindows(const GatherWindows& windows, int64_t pool_buckets);

}  // namespace zeroshard::sharding

#endif  // ZEROSHARD_SHARDING_GATHER_WINDOWS_H_
