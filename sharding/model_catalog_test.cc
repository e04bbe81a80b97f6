// Tests for the model catalog: preset sizes, tensor order and options, and every error path.
#include "sharding/model_catalog.h"

#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zeroshard::sharding {
namespace {

using ::testing::HasSubstr;

int64_t ParameterCount(const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) total += sizes[i] * sizes[i + 1] + sizes[i + 1];
  return total;
}

void ExpectInvalid(const WorkloadSpec& spec, const std::string& message) {
  absl::StatusOr<std::vector<TensorSpec>> tensors = BuildTensorList(spec);
  ASSERT_FALSE(tensors.ok());
  EXPECT_EQ(tensors.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(tensors.status().message(), message);
}

TEST(ModelCatalogTest, PresetNamesInOrder) {
  EXPECT_EQ(PresetNames(), (std::vector<std::string>{"seed", "small", "medium", "large", "deep"}));
}

TEST(ModelCatalogTest, PresetLayerSizesAndParameterCounts) {
  EXPECT_EQ(*PresetLayerSizes("seed"), (std::vector<int64_t>{10, 64, 10}));
  EXPECT_EQ(*PresetLayerSizes("small"), (std::vector<int64_t>{512, 1024, 512}));
  EXPECT_EQ(*PresetLayerSizes("medium"), (std::vector<int64_t>{1024, 4096, 4096, 1024}));
  EXPECT_EQ(*PresetLayerSizes("large"), (std::vector<int64_t>{8192, 12288, 12288, 8192}));
  EXPECT_EQ(ParameterCount(*PresetLayerSizes("seed")), 1354);
  EXPECT_EQ(ParameterCount(*PresetLayerSizes("small")), 1050112);
  EXPECT_EQ(ParameterCount(*PresetLayerSizes("medium")), 25175040);
  EXPECT_EQ(ParameterCount(*PresetLayerSizes("large")), 352354304);
  EXPECT_EQ(ParameterCount(*PresetLayerSizes("deep")), 71339008);
}

// Issue 38: zero3 needs a preset of at least 12 equal layers (its gather pool is counted in the
// buckets one layer spans). Fails before the fix: there was no `deep` preset.
TEST(ModelCatalogTest, DeepPresetHasSixteenEqualHiddenLayers) {
  std::vector<int64_t> expected = {1024};
  expected.insert(expected.end(), 17, 2048);
  expected.push_back(1024);
  EXPECT_EQ(*PresetLayerSizes("deep"), expected);
  absl::StatusOr<std::vector<TensorSpec>> tensors = BuildTensorList({"deep", {}});
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 36u);  // 18 Linear layers, a weight and a bias each
  int equal_layers = 0;
  for (const TensorSpec& tensor : *tensors) {
    if (tensor.shape == std::vector<int64_t>{2048, 2048}) ++equal_layers;
  }
  EXPECT_EQ(equal_layers, 16);
  EXPECT_EQ(tensors->front().name, "34.bias");
  EXPECT_EQ(tensors->back().name, "0.weight");
  EXPECT_EQ(tensors->back().shape, (std::vector<int64_t>{2048, 1024}));
}

TEST(ModelCatalogTest, PresetTensorTotalsMatchTheirTargets) {
  for (const auto& [preset, low, high] :
       std::vector<std::tuple<std::string, int64_t, int64_t>>{{"small", 900'000, 1'100'000},
                                                              {"medium", 23'000'000, 27'000'000},
                                                              {"large", 330'000'000, 370'000'000},
                                                              {"deep", 70'000'000, 72'000'000}}) {
    absl::StatusOr<std::vector<TensorSpec>> tensors = BuildTensorList({preset, {}});
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    EXPECT_GE(TotalElements(*tensors), low) << preset;
    EXPECT_LE(TotalElements(*tensors), high) << preset;
    EXPECT_EQ(TotalElements(*tensors), ParameterCount(*PresetLayerSizes(preset))) << preset;
  }
}

TEST(ModelCatalogTest, SeedTensorsAreInGradientReadyOrder) {
  absl::StatusOr<std::vector<TensorSpec>> tensors = BuildTensorList({"seed", {}});
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::vector<TensorSpec> expected = {
      {"2.bias", {10}, 10, 0.0, 1.0f},
      {"2.weight", {10, 64}, 640, 0.0, 1.0f},
      {"0.bias", {64}, 64, 0.0, 1.0f},
      {"0.weight", {64, 10}, 640, 0.0, 1.0f},
  };
  EXPECT_EQ(*tensors, expected);
  EXPECT_EQ(TotalElements(*tensors), 1354);
}

TEST(ModelCatalogTest, ExplicitSizesGiveReverseOrderWithOptions) {
  absl::StatusOr<std::vector<TensorSpec>> tensors = BuildTensorList({"", {3, 5, 7, 2}});
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 6u);
  const std::vector<std::string> names = {"4.bias",   "4.weight", "2.bias",
                                          "2.weight", "0.bias",   "0.weight"};
  const std::vector<std::vector<int64_t>> shapes = {{2}, {2, 7}, {7}, {7, 5}, {5}, {5, 3}};
  for (size_t i = 0; i < tensors->size(); ++i) {
    const TensorSpec& tensor = (*tensors)[i];
    EXPECT_EQ(tensor.name, names[i]);
    EXPECT_EQ(tensor.shape, shapes[i]);
    int64_t product = 1;
    for (int64_t dim : tensor.shape) product *= dim;
    EXPECT_EQ(tensor.num_elements, product) << tensor.name;
    EXPECT_EQ(tensor.weight_decay, 0.0) << tensor.name;  // groups set it (jobspec)
    EXPECT_EQ(tensor.lr_scale, 1.0f) << tensor.name;
  }
}

TEST(ModelCatalogTest, SizesAtTheBoundsAreAccepted) {
  EXPECT_TRUE(BuildTensorList({"", {1, 1}}).ok());
  EXPECT_TRUE(BuildTensorList({"", {kMaxLayerSize, 1}}).ok());
  std::vector<int64_t> deepest(kMaxLinearLayers + 1, 1);
  absl::StatusOr<std::vector<TensorSpec>> tensors = BuildTensorList({"", deepest});
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  EXPECT_EQ(tensors->size(), static_cast<size_t>(2 * kMaxLinearLayers));
}

TEST(ModelCatalogTest, ResolveLayerSizesReturnsPresetOrExplicitSizes) {
  EXPECT_EQ(*ResolveLayerSizes({"medium", {}}), *PresetLayerSizes("medium"));
  EXPECT_EQ(*ResolveLayerSizes({"", {4, 8}}), (std::vector<int64_t>{4, 8}));
}

TEST(ModelCatalogTest, UnknownPresetNamesTheFieldAndKnownPresets) {
  ExpectInvalid({"x", {}},
                "workload.preset: unknown preset 'x'; known: seed, small, medium, large, deep");
  EXPECT_EQ(PresetLayerSizes("Seed").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelCatalogTest, NeitherOrBothFieldsSetIsInvalid) {
  ExpectInvalid({"", {}}, "workload: set preset or layer_sizes");
  ExpectInvalid({"seed", {10, 10}}, "workload: set either preset or layer_sizes, not both");
}

TEST(ModelCatalogTest, TooFewSizesIsInvalid) {
  ExpectInvalid({"", {10}},
                "workload.layer_sizes: needs at least 2 sizes (input and output), got 1");
  EXPECT_EQ(TensorsForLayerSizes({}).status().message(),
            "workload.layer_sizes: needs at least 2 sizes (input and output), got 0");
}

TEST(ModelCatalogTest, SizeOutOfRangeNamesItsIndex) {
  ExpectInvalid({"", {10, 0, 10}}, "workload.layer_sizes[1]: 0 is out of range [1, 1048576]");
  ExpectInvalid({"", {-3, 10}}, "workload.layer_sizes[0]: -3 is out of range [1, 1048576]");
  ExpectInvalid({"", {10, 10, kMaxLayerSize + 1}},
                "workload.layer_sizes[2]: 1048577 is out of range [1, 1048576]");
}

TEST(ModelCatalogTest, TooManyLayersIsInvalid) {
  std::vector<int64_t> sizes(kMaxLinearLayers + 2, 1);
  ExpectInvalid({"", sizes}, "workload.layer_sizes: 10002 sizes is more than the limit of 10001");
}

TEST(ModelCatalogTest, TooManyParametersIsInvalid) {
  // Each layer is 2^40 + 2^20 elements: one already exceeds the 2^40 limit.
  ExpectInvalid({"", {kMaxLayerSize, kMaxLayerSize}},
                "workload.layer_sizes: the model has more than the limit of 1099511627776 "
                "parameters");
  // Many layers, each within bounds, that only together pass the limit.
  std::vector<int64_t> sizes(kMaxLinearLayers + 1, kMaxLayerSize / 16);
  absl::StatusOr<std::vector<TensorSpec>> tensors = BuildTensorList({"", sizes});
  ASSERT_FALSE(tensors.ok());
  EXPECT_THAT(std::string(tensors.status().message()), HasSubstr("more than the limit"));
}

}  // namespace
}  // namespace zeroshard::sharding
