// The model catalog: a workload spec (a preset name or explicit layer sizes of the
// teacher-student MLP) -> the model's ordered parameter tensors with their optimizer options.
#ifndef ZEROSHARD_SHARDING_MODEL_CATALOG_H_
#define ZEROSHARD_SHARDING_MODEL_CATALOG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sharding/tensor_spec.h"

namespace zeroshard::sharding {

// Bounds on an explicit workload. Sizes are features per layer boundary.
inline constexpr int64_t kMaxLayerSize = int64_t{1} << 20;
inline constexpr int64_t kMaxLinearLayers = 10000;  // so at most kMaxLinearLayers + 1 sizes
inline constexpr int64_t kMaxModelElements = int64_t{1} << 40;

// The MLP: sizes [s0, s1, ..., sn] mean Linear(s0,s1), ReLU, Linear(s1,s2), ReLU, ...,
// Linear(s(n-1),sn), with no activation after the last Linear. Exactly one of the two fields
// is set.
struct WorkloadSpec {
  std::string preset;                // a name from PresetNames(), or empty
  std::vector<int64_t> layer_sizes;  // explicit sizes, or empty
};

// The presets and their layer sizes (parameter counts are weights plus biases):
//   seed   = [10, 64, 10]                     1,354 params (the document's model)
//   small  = [512, 1024, 512]             1,050,112 params (~1M)
//   medium = [1024, 4096, 4096, 1024]    25,175,040 params (~25M)
//   large  = [8192, 12288, 12288, 8192] 352,354,304 params (~350M, for GPUs)
//   deep   = [1024, 2048 x 17, 1024]     71,339,008 params (~71M: 18 Linear layers, 16 of them
//            2048x2048, for zero3: at W = 4 its parameters are 4.25x zero3's default gather pool)
std::vector<std::string> PresetNames();

// The layer sizes of a preset, or InvalidArgument naming `workload.preset` when unknown.
absl::StatusOr<std::vector<int64_t>> PresetLayerSizes(absl::string_view preset);

// The validated layer sizes the spec stands for. Errors are InvalidArgument naming the field:
// neither or both of preset/layer_sizes set, an unknown preset, fewer than 2 sizes, more than
// kMaxLinearLayers + 1 sizes, a size outside [1, kMaxLayerSize], or a model with more than
// kMaxModelElements parameters.
absl::StatusOr<std::vector<int64_t>> ResolveLayerSizes(const WorkloadSpec& spec);

// The model's parameter tensors in gradient-ready order, i.e. the reverse of forward order, named
// as torch's nn.Sequential(Linear, ReLU, Linear, ..., Linear) names them:
//   <2(n-1)>.bias, <2(n-1)>.weight, ..., 2.bias, 2.weight, 0.bias, 0.weight
// where Linear layer i (0-based, counting Linear layers only) is module 2i, with `<2i>.weight`
// of shape [out, in] and `<2i>.bias` of shape [out]. The optimizer options (weight_decay,
// lr_scale) are left at 0 and 1: the job's parameter groups set them (jobspec::TensorsForJob).
// This is the order the shard planner lays tensors out in.
absl::StatusOr<std::vector<TensorSpec>> BuildTensorList(const WorkloadSpec& spec);

// The same for already-validated sizes (as ResolveLayerSizes returns); validates them again.
absl::StatusOr<std::vector<TensorSpec>> TensorsForLayerSizes(absl::Span<const int64_t> sizes);

// Sum of num_elements over the tensors.
int64_t TotalElements(absl::Span<const TensorSpec> tensors);

}  // namespace zeroshard::sharding

#endif  // ZEROSHARD_SHARDING_MODEL_CATALOG_H_
