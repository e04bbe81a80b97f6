// The model catalog: presets, validation of explicit layer sizes, and the tensor list in
// gradient-ready order.
#include "sharding/model_catalog.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace zeroshard::sharding {
namespace {

struct Preset {
  const char* name;
  std::vector<int64_t> layer_sizes;
};

const std::vector<Preset>& Presets() {
  static const auto* presets = new std::vector<Preset>{
      {"seed", {10, 64, 10}},
      {"small", {512, 1024, 512}},
      {"medium", {1024, 4096, 4096, 1024}},
      {"large", {8192, 12288, 12288, 8192}},
      // 16 equal hidden layers, so that zero3's gather pool (a few buckets) is small against the
      // parameters: `medium`'s 4096x4096 layers make the pool about as large as the model.
      {"deep",
       {1024, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048, 2048,
        2048, 2048, 2048, 1024}},
  };
  return *presets;
}

absl::Status ValidateLayerSizes(absl::Span<const int64_t> sizes) {
  if (sizes.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "workload.layer_sizes: needs at least 2 sizes (input and output), got ", sizes.size()));
  }
  if (static_cast<int64_t>(sizes.size()) > kMaxLinearLayers + 1) {
    return absl::InvalidArgumentError(absl::StrCat("workload.layer_sizes: ", sizes.size(),
                                                   " sizes is more than the limit of ",
                                                   kMaxLinearLayers + 1));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 1 || sizes[i] > kMaxLayerSize) {
      return absl::InvalidArgumentError(absl::StrCat("workload.layer_sizes[", i, "]: ", sizes[i],
                                                     " is out of range [1, ", kMaxLayerSize, "]"));
    }
  }
  // Each layer adds at most kMaxLayerSize^2 + kMaxLayerSize = 2^40 + 2^20 elements, and the
  // running total is checked before every addition, so it never overflows int64.
  int64_t total = 0;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    total += sizes[i] * sizes[i + 1] + sizes[i + 1];
    if (total > kMaxModelElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("workload.layer_sizes: the model has more than the limit of ",
                       kMaxModelElements, " parameters"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& preset : Presets()) names.emplace_back(preset.name);
  return names;
}

absl::StatusOr<std::vector<int64_t>> PresetLayerSizes(absl::string_view preset) {
  for (const Preset& known : Presets()) {
    if (preset == known.name) return known.layer_sizes;
  }
  return absl::InvalidArgumentError(absl::StrCat("workload.preset: unknown preset '", preset,
                                                 "'; known: ", absl::StrJoin(PresetNames(), ", ")));
}

absl::StatusOr<std::vector<int64_t>> ResolveLayerSizes(const WorkloadSpec& spec) {
  const bool has_preset = !spec.preset.empty();
  const bool has_sizes = !spec.layer_sizes.empty();
  if (has_preset && has_sizes) {
    return absl::InvalidArgumentError("workload: set either preset or layer_sizes, not both");
  }
  if (!has_preset && !has_sizes) {
    return absl::InvalidArgumentError("workload: set preset or layer_sizes");
  }
  if (has_preset) return PresetLayerSizes(spec.preset);
  ZS_RETURN_IF_ERROR(ValidateLayerSizes(spec.layer_sizes));
  return spec.layer_sizes;
}

absl::StatusOr<std::vector<TensorSpec>> TensorsForLayerSizes(absl::Span<const int64_t> sizes) {
  ZS_RETURN_IF_ERROR(ValidateLayerSizes(sizes));
  const int64_t num_layers = static_cast<int64_t>(sizes.size()) - 1;
  std::vector<TensorSpec> tensors;
  tensors.reserve(2 * num_layers);
  for (int64_t layer = num_layers - 1; layer >= 0; --layer) {
    const int64_t in = sizes[layer];
    const int64_t out = sizes[layer + 1];
    // torch's nn.Sequential names: Linear layer `layer` is module 2 * layer (ReLUs between).
    const std::string prefix = absl::StrCat(2 * layer, ".");
    tensors.push_back(TensorSpec{absl::StrCat(prefix, "bias"), {out}, out});
    tensors.push_back(TensorSpec{absl::StrCat(prefix, "weight"), {out, in}, out * in});
  }
  return tensors;
}

absl::StatusOr<std::vector<TensorSpec>> BuildTensorList(const WorkloadSpec& spec) {
  ZS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, ResolveLayerSizes(spec));
  return TensorsForLayerSizes(sizes);
}

int64_t TotalElements(absl::Span<const TensorSpec> tensors) {
  int64_t total = 0;
  for (const TensorSpec& tensor : tensors) total += tensor.num_elements;
  return total;
}

}  // namespace zeroshard::sharding
