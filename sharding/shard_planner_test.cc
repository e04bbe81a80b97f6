// Tests for the shard planner: exact layouts of small cases, every validation error, and
// property tests over many random tensor lists and world sizes 1..64.
#include "sharding/shard_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/model_catalog.h"

namespace zeroshard::sharding {
namespace {

using ::testing::HasSubstr;

std::vector<TensorSpec> FlatTensors(const std::vector<int64_t>& sizes) {
  std::vector<TensorSpec> tensors;
  for (size_t i = 0; i < sizes.size(); ++i) {
    tensors.push_back(
        TensorSpec{absl::StrCat("t", i), {sizes[i]}, sizes[i], i % 2 == 0 ? 0.01 : 0.0, 1.0f});
  }
  return tensors;
}

std::vector<TensorSpec> SeedTensors() { return *BuildTensorList({"seed", {}}); }

ShardPlan MustPlan(std::vector<TensorSpec> tensors, int64_t world_size,
                   int64_t bucket_elems = kDefaultBucketElems) {
  absl::StatusOr<ShardPlan> plan =
      ShardPlan::Create(std::move(tensors), world_size, ShardPlanOptions{bucket_elems});
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

RankView MustView(const ShardPlan& plan, int64_t rank) {
  absl::StatusOr<RankView> view = plan.ViewForRank(rank);
  EXPECT_TRUE(view.ok()) << view.status();
  return *std::move(view);
}

void ExpectInvalid(std::vector<TensorSpec> tensors, int64_t world_size, int64_t bucket_elems,
                   const std::string& message) {
  absl::StatusOr<ShardPlan> plan =
      ShardPlan::Create(std::move(tensors), world_size, ShardPlanOptions{bucket_elems});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plan.status().message(), message);
}

TEST(ShardPlannerTest, SeedModelOnFourRanks) {
  // Tensors 10, 640, 64, 640 elements; starts aligned to 64: 0, 64, 704, 768; end 1408,
  // which is a multiple of lcm(4, 128) = 128, so one bucket of 1408 and pieces of 352.
  ShardPlan plan = MustPlan(SeedTensors(), 4);
  EXPECT_EQ(plan.bucket_alignment(), 128);
  ASSERT_EQ(plan.num_buckets(), 1);
  EXPECT_EQ(plan.tensor_elems(), 1354);
  EXPECT_EQ(plan.padded_elems(), 1408);
  EXPECT_EQ(plan.elems_per_rank(), 352);
  const std::vector<int64_t> offsets = {0, 64, 704, 768};
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_EQ(plan.placement(t).flat_offset, offsets[t]);
    EXPECT_EQ(plan.placement(t).first_bucket, 0);
    EXPECT_EQ(plan.placement(t).num_buckets, 1);
  }
  const BucketLayout& bucket = plan.buckets()[0];
  EXPECT_EQ(bucket.flat_begin, 0);
  EXPECT_EQ(bucket.padded_elems, 1408);
  EXPECT_EQ(bucket.piece_elems, 352);
  EXPECT_EQ(bucket.first_tensor, 0);
  EXPECT_EQ(bucket.num_tensors, 4);
  EXPECT_EQ(bucket.tensor_elems, 1354);

  const std::vector<std::vector<TensorFragment>> expected = {
      {{0, 0, 10, 0}, {1, 0, 288, 64}},
      {{1, 288, 640, 352}},
      {{2, 0, 64, 704}, {3, 0, 288, 768}},
      {{3, 288, 640, 1056}},
  };
  for (int64_t rank = 0; rank < 4; ++rank) {
    RankView view = MustView(plan, rank);
    EXPECT_EQ(view.rank(), rank);
    EXPECT_EQ(view.world_size(), 4);
    ASSERT_EQ(view.pieces().size(), 1u);
    EXPECT_EQ(view.pieces()[0].flat_begin, 352 * rank);
    EXPECT_EQ(view.pieces()[0].flat_end, 352 * (rank + 1));
    EXPECT_EQ(view.owned_elems(), 352);
    std::vector<TensorFragment> fragments(view.fragments().begin(), view.fragments().end());
    EXPECT_EQ(fragments, expected[rank]) << "rank " << rank;
    EXPECT_EQ(view.FragmentsOf(view.pieces()[0]).size(), expected[rank].size());
  }
}

TEST(ShardPlannerTest, BucketsAreFixedRangesAndTensorsSpanThem) {
  // bucket_elems 2048, W = 1 (alignment 128). Tensors at 64-aligned offsets, whatever the
  // buckets: t0 [0, 1000), t1 [1024, 2024), t2 [2048, 5048), t3 [5056, 5556); the flat space
  // is padded to 5632. Buckets: [0, 2048), [2048, 4096), [4096, 5632) (the last is shorter).
  // t2 spans buckets 1 and 2.
  ShardPlan plan = MustPlan(FlatTensors({1000, 1000, 3000, 500}), 1, 2048);
  EXPECT_EQ(plan.bucket_elems(), 2048);
  ASSERT_EQ(plan.num_buckets(), 3);
  EXPECT_EQ(plan.padded_elems(), 5632);
  const std::vector<int64_t> offsets = {0, 1024, 2048, 5056};
  const std::vector<int64_t> first_buckets = {0, 0, 1, 2};
  const std::vector<int64_t> bucket_counts = {1, 1, 2, 1};
  for (int64_t t = 0; t < 4; ++t) {
    EXPECT_EQ(plan.placement(t).flat_offset, offsets[t]) << t;
    EXPECT_EQ(plan.placement(t).first_bucket, first_buckets[t]) << t;
    EXPECT_EQ(plan.placement(t).num_buckets, bucket_counts[t]) << t;
  }
  struct Expected {
    int64_t flat_begin, padded_elems, first_tensor, num_tensors, tensor_elems;
  };
  const std::vector<Expected> buckets = {
      {0, 2048, 0, 2, 2000}, {2048, 2048, 2, 1, 2048}, {4096, 1536, 2, 2, 952 + 500}};
  for (int64_t b = 0; b < 3; ++b) {
    const BucketLayout& bucket = plan.buckets()[b];
    EXPECT_EQ(bucket.flat_begin, buckets[b].flat_begin) << b;
    EXPECT_EQ(bucket.padded_elems, buckets[b].padded_elems) << b;
    EXPECT_EQ(bucket.piece_elems, buckets[b].padded_elems) << b;
    EXPECT_EQ(bucket.first_tensor, buckets[b].first_tensor) << b;
    EXPECT_EQ(bucket.num_tensors, buckets[b].num_tensors) << b;
    EXPECT_EQ(bucket.tensor_elems, buckets[b].tensor_elems) << b;
  }
}

TEST(ShardPlannerTest, BucketElemsRoundDownToTheAlignment) {
  // W = 3: alignment lcm(3, 128) = 384. 2000 rounds down to 1920; below one alignment unit
  // the bucket is one unit.
  EXPECT_EQ(EffectiveBucketElems(2000, 384), 1920);
  EXPECT_EQ(EffectiveBucketElems(1920, 384), 1920);
  EXPECT_EQ(EffectiveBucketElems(1024, 2048), 2048);
  ShardPlan plan = MustPlan(FlatTensors({5000}), 3, 2000);
  EXPECT_EQ(plan.bucket_elems(), 1920);
  // 5000 padded to 5376 = 14 * 384: buckets of 1920, 1920 and 1536, pieces of a third.
  ASSERT_EQ(plan.num_buckets(), 3);
  EXPECT_EQ(plan.buckets()[2].padded_elems, 1536);
  EXPECT_EQ(plan.buckets()[2].piece_elems, 512);
  EXPECT_EQ(plan.placement(0).num_buckets, 3);
}

TEST(ShardPlannerTest, ALargeTensorDoesNotSizeItsBucket) {
  // A 4096x4096 weight (16.8M elements) at the default bucket size: buckets stay at
  // 4,194,304 elements, so the tensor spans four whole buckets plus part of a fifth.
  std::vector<TensorSpec> tensors = FlatTensors({1024, 4096 * 4096});
  ShardPlan plan = MustPlan(std::move(tensors), 2);
  for (const BucketLayout& bucket : plan.buckets()) {
    EXPECT_LE(bucket.padded_elems, kDefaultBucketElems);
  }
  EXPECT_EQ(plan.placement(1).num_buckets, 5);
}

TEST(ShardPlannerTest, OddWorldSizePadsToLcmWith128) {
  ShardPlan plan = MustPlan(SeedTensors(), 3);
  EXPECT_EQ(plan.bucket_alignment(), 384);
  EXPECT_EQ(plan.padded_elems(), 1536);  // 1408 rounded up to 384
  EXPECT_EQ(plan.buckets()[0].piece_elems, 512);
}

TEST(ShardPlannerTest, LargestWorldSizeLeavesMostRanksPadding) {
  ShardPlan plan = MustPlan(SeedTensors(), kMaxWorldSize - 1);
  EXPECT_EQ(plan.bucket_alignment(), (kMaxWorldSize - 1) * 128);
  EXPECT_EQ(plan.buckets()[0].piece_elems, 128);
  RankView first = MustView(plan, 0);
  std::vector<TensorFragment> fragments(first.fragments().begin(), first.fragments().end());
  EXPECT_EQ(fragments, (std::vector<TensorFragment>{{0, 0, 10, 0}, {1, 0, 64, 64}}));
  RankView last = MustView(plan, kMaxWorldSize - 2);
  EXPECT_TRUE(last.fragments().empty());
  EXPECT_EQ(last.owned_elems(), 128);
  EXPECT_EQ(last.owned_tensor_elems(), 0);
}

TEST(ShardPlannerTest, ValidationErrorsNameTheField) {
  ExpectInvalid(SeedTensors(), 4, 12, "bucket_elems: 12 is out of range [1024, 1073741824]");
  ExpectInvalid(SeedTensors(), 4, (int64_t{1} << 30) + 1,
                "bucket_elems: 1073741825 is out of range [1024, 1073741824]");
  ExpectInvalid(SeedTensors(), 0, kDefaultBucketElems, "world_size: 0 is out of range [1, 65536]");
  ExpectInvalid(SeedTensors(), 65537, kDefaultBucketElems,
                "world_size: 65537 is out of range [1, 65536]");
  ExpectInvalid({}, 4, kDefaultBucketElems, "tensors: empty");

  std::vector<TensorSpec> tensors = SeedTensors();
  tensors[2].name = "";
  ExpectInvalid(tensors, 4, kDefaultBucketElems, "tensors[2].name: empty");

  tensors = SeedTensors();
  tensors[3].name = tensors[1].name;
  ExpectInvalid(tensors, 4, kDefaultBucketElems, "tensors[3].name: duplicate name '2.weight'");

  tensors = SeedTensors();
  tensors[0].num_elements = 0;
  ExpectInvalid(tensors, 4, kDefaultBucketElems,
                "tensors[0].num_elements: 0 is out of range [1, 1125899906842624]");

  tensors = SeedTensors();
  tensors[1].num_elements = 641;
  ExpectInvalid(tensors, 4, kDefaultBucketElems,
                "tensors[1].shape: its product differs from num_elements 641");

  tensors = SeedTensors();
  tensors[1].shape = {-10, -64};
  ExpectInvalid(tensors, 4, kDefaultBucketElems, "tensors[1].shape[0]: -10 must be positive");

  tensors = SeedTensors();
  tensors[1].shape = {int64_t{1} << 40, int64_t{1} << 40};  // the product overflows int64
  ExpectInvalid(tensors, 4, kDefaultBucketElems,
                "tensors[1].shape: its product differs from num_elements 640");

  tensors = SeedTensors();
  tensors[2].lr_scale = std::numeric_limits<float>::quiet_NaN();
  ExpectInvalid(tensors, 4, kDefaultBucketElems,
                "tensors[2].lr_scale: nan must be finite and >= 0");

  tensors = SeedTensors();
  tensors[2].lr_scale = -1.0f;
  ExpectInvalid(tensors, 4, kDefaultBucketElems, "tensors[2].lr_scale: -1 must be finite and >= 0");
}

TEST(ShardPlannerTest, ScalarShapeCountsOneElement) {
  std::vector<TensorSpec> tensors = {{"scale", {}, 1, false, 1.0f}};
  ShardPlan plan = MustPlan(tensors, 2);
  EXPECT_EQ(plan.padded_elems(), 128);
}

TEST(ShardPlannerTest, LayoutBeyondTheLimitIsInvalid) {
  const int64_t big = int64_t{1} << 49;
  ExpectInvalid(FlatTensors({big, big, big}), 1, kDefaultBucketElems,
                "tensors: the layout needs more than the limit of 1125899906842624 elements");
}

TEST(ShardPlannerTest, RankOutOfRangeIsInvalid) {
  ShardPlan plan = MustPlan(SeedTensors(), 4);
  for (int64_t rank : {int64_t{-1}, int64_t{4}}) {
    absl::StatusOr<RankView> view = plan.ViewForRank(rank);
    ASSERT_FALSE(view.ok());
    EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(view.status().message(), absl::StrCat("rank: ", rank, " is out of range [0, 4)"));
  }
}

TEST(ShardPlannerTest, FragmentsInRangeClipsAndSkipsPadding) {
  ShardPlan plan = MustPlan(SeedTensors(), 4);
  // [5, 70) covers the end of tensor 0, the padding 10..63 and the start of tensor 1.
  EXPECT_EQ(plan.FragmentsInRange(5, 70),
            (std::vector<TensorFragment>{{0, 5, 10, 5}, {1, 0, 6, 64}}));
  EXPECT_TRUE(plan.FragmentsInRange(10, 64).empty());
  EXPECT_TRUE(plan.FragmentsInRange(1408, 5000).empty());
  EXPECT_TRUE(plan.FragmentsInRange(100, 100).empty());
  EXPECT_EQ(plan.FragmentsInRange(-50, 3), (std::vector<TensorFragment>{{0, 0, 3, 0}}));
  EXPECT_EQ(plan.FragmentsInRange(1400, 9999), (std::vector<TensorFragment>{{3, 632, 640, 1400}}));
}

TEST(ShardPlannerTest, OwnerOfFollowsPieces) {
  ShardPlan plan = MustPlan(SeedTensors(), 4);
  EXPECT_EQ(plan.OwnerOf(0), 0);
  EXPECT_EQ(plan.OwnerOf(351), 0);
  EXPECT_EQ(plan.OwnerOf(352), 1);
  EXPECT_EQ(plan.OwnerOf(1407), 3);
  EXPECT_EQ(plan.OwnerOf(1408), -1);
  EXPECT_EQ(plan.OwnerOf(-1), -1);
}

TEST(ShardPlannerTest, LayoutHashIsPinnedAndStableAcrossCalls) {
  const uint64_t hash = MustPlan(SeedTensors(), 4).layout_hash();
  EXPECT_EQ(MustPlan(SeedTensors(), 4).layout_hash(), hash);
  // Pinned: the hash must be the same in every process and build. The value was computed
  // independently by tools/reference/plan_hash.py (the byte stream that shard_planner.h
  // documents, fed to FNV-1a).
  // Changing the layout or the hash input format is a protocol change (workers compare
  // hashes) and must update this.
  EXPECT_EQ(hash, uint64_t{0x3dc431284c6c6f76});
}

TEST(ShardPlannerTest, ModelHashIsPinnedAndIgnoresWorldAndBucketSize) {
  const uint64_t hash = MustPlan(SeedTensors(), 4).model_hash();
  // Pinned as the layout hash is (tools/reference/plan_hash.py, its second line): checkpoints
  // store it and refuse another model's.
  EXPECT_EQ(hash, uint64_t{0x987a6af0db161783});
  EXPECT_EQ(MustPlan(SeedTensors(), 1).model_hash(), hash);
  EXPECT_EQ(MustPlan(SeedTensors(), 3, 1024).model_hash(), hash);
  std::vector<TensorSpec> renamed = SeedTensors();
  renamed[0].name = "2.bias_renamed";
  EXPECT_NE(MustPlan(renamed, 4).model_hash(), hash);
  std::vector<TensorSpec> reshaped = SeedTensors();
  std::swap(reshaped[1].shape[0], reshaped[1].shape[1]);
  EXPECT_NE(MustPlan(reshaped, 4).model_hash(), hash);
}

TEST(ShardPlannerTest, LayoutHashChangesWithEveryInput) {
  const uint64_t base = MustPlan(SeedTensors(), 4).layout_hash();
  EXPECT_NE(MustPlan(SeedTensors(), 8).layout_hash(), base);
  // A different bucket size that leaves the layout unchanged still changes the hash.
  EXPECT_NE(MustPlan(SeedTensors(), 4, kDefaultBucketElems / 2).layout_hash(), base);
  // A different bucket size that changes the layout.
  EXPECT_NE(MustPlan(SeedTensors(), 4, 1024).layout_hash(), base);

  std::vector<TensorSpec> tensors = SeedTensors();
  tensors[1].shape = {64, 10};  // same element count, transposed
  EXPECT_NE(MustPlan(tensors, 4).layout_hash(), base);
  tensors = SeedTensors();
  tensors[0].name = "2.b";
  EXPECT_NE(MustPlan(tensors, 4).layout_hash(), base);
  tensors = SeedTensors();
  tensors[0].weight_decay = 0.5;
  EXPECT_NE(MustPlan(tensors, 4).layout_hash(), base);
  tensors = SeedTensors();
  tensors[0].lr_scale = 0.5f;
  EXPECT_NE(MustPlan(tensors, 4).layout_hash(), base);
  tensors = SeedTensors();
  std::swap(tensors[0], tensors[2]);
  EXPECT_NE(MustPlan(tensors, 4).layout_hash(), base);
}

TEST(ShardPlannerTest, DescribeSummarisesThePlan) {
  const std::string text = MustPlan(SeedTensors(), 4).Describe(2);
  EXPECT_THAT(text, HasSubstr("4 tensors, 1354 elements, world size 4"));
  EXPECT_THAT(text, HasSubstr("buckets: 1"));
  EXPECT_THAT(text, HasSubstr("per rank 352 elements = 704 bytes at 2 bytes/element"));
}

TEST(ShardPlannerTest, PresetsPlanOnTypicalWorldSizes) {
  for (const std::string& preset : PresetNames()) {
    for (int64_t world_size : {1, 2, 4, 8, 6}) {
      ShardPlan plan = MustPlan(*BuildTensorList({preset, {}}), world_size);
      int64_t owned = 0;
      for (int64_t rank = 0; rank < world_size; ++rank) {
        owned += MustView(plan, rank).owned_tensor_elems();
      }
      EXPECT_EQ(owned, plan.tensor_elems()) << preset << " W=" << world_size;
    }
  }
}

// zero3's default gather pool, computed here from the plan alone (as issue 38 defines it): twice
// the most distinct buckets one module's tensors overlap (module = the tensor name up to the last
// '.', so "4.weight" and "4.bias" are one), each buffer the largest bucket's padded size.
struct GatherPoolFigures {
  int64_t max_module_buckets = 0;
  int64_t pool_buckets = 0;
  int64_t largest_bucket_elems = 0;
  int64_t pool_elems() const { return pool_buckets * largest_bucket_elems; }
};

GatherPoolFigures DefaultGatherPool(const ShardPlan& plan) {
  std::map<std::string, std::set<int64_t>> module_buckets;
  for (int64_t tensor = 0; tensor < plan.num_tensors(); ++tensor) {
    const std::string& name = plan.tensors()[tensor].name;
    const size_t dot = name.rfind('.');
    std::set<int64_t>& buckets =
        module_buckets[dot == std::string::npos ? name : name.substr(0, dot)];
    const TensorPlacement& placement = plan.placement(tensor);
    for (int64_t b = 0; b < placement.num_buckets; ++b) buckets.insert(placement.first_bucket + b);
  }
  GatherPoolFigures figures;
  for (const auto& [module, buckets] : module_buckets) {
    figures.max_module_buckets =
        std::max(figures.max_module_buckets, static_cast<int64_t>(buckets.size()));
  }
  figures.pool_buckets = 2 * figures.max_module_buckets;
  for (const BucketLayout& bucket : plan.buckets()) {
    figures.largest_bucket_elems = std::max(figures.largest_bucket_elems, bucket.padded_elems);
  }
  return figures;
}

// Issue 38: the `deep` preset's parameters are at least 4x zero3's default gather pool at W = 4
// with the default bucket_elems, where `medium`'s pool is larger than its parameters. Fails before
// the fix: there was no `deep` preset.
TEST(ShardPlannerTest, DeepPresetIsFourTimesItsDefaultGatherPoolAtFourRanks) {
  ShardPlan deep = MustPlan(*BuildTensorList({"deep", {}}), 4);
  EXPECT_EQ(deep.tensor_elems(), 71'339'008);
  EXPECT_EQ(deep.num_buckets(), 18);
  const GatherPoolFigures pool = DefaultGatherPool(deep);
  // Each 2048x2048 layer (4,196,352 elements with its bias) is a little over one bucket.
  EXPECT_EQ(pool.max_module_buckets, 2);
  EXPECT_EQ(pool.pool_buckets, 4);
  EXPECT_EQ(pool.largest_bucket_elems, kDefaultBucketElems);
  EXPECT_EQ(pool.pool_elems(), 16'777'216);  // 64 MiB of fp32 against 272 MiB of parameters
  EXPECT_GE(deep.tensor_elems(), 4 * pool.pool_elems());

  ShardPlan medium = MustPlan(*BuildTensorList({"medium", {}}), 4);
  const GatherPoolFigures medium_pool = DefaultGatherPool(medium);
  EXPECT_EQ(medium_pool.max_module_buckets, 5);  // the 4096x4096 layer
  EXPECT_GT(medium_pool.pool_elems(), medium.tensor_elems());
}

// Checks every structural property of a plan, and every rank's view against a per-element
// coverage count.
void CheckPlanProperties(const ShardPlan& plan, const std::vector<int64_t>& sizes,
                         std::mt19937_64& rng) {
  const int64_t world_size = plan.world_size();
  const int64_t alignment = std::lcm(world_size, int64_t{128});
  ASSERT_EQ(plan.bucket_alignment(), alignment);

  // Buckets tile the padded flat space in fixed ranges of bucket_elems (the last shorter), each
  // listing the tensors that overlap it and how many of their elements it holds.
  ASSERT_EQ(plan.bucket_elems() % alignment, 0);
  ASSERT_GE(plan.bucket_elems(), alignment);
  int64_t next_begin = 0;
  for (int64_t b = 0; b < plan.num_buckets(); ++b) {
    const BucketLayout& bucket = plan.buckets()[b];
    ASSERT_EQ(bucket.flat_begin, next_begin);
    ASSERT_GT(bucket.padded_elems, 0);
    ASSERT_EQ(bucket.padded_elems % alignment, 0);
    ASSERT_EQ(bucket.piece_elems * world_size, bucket.padded_elems);
    if (b + 1 < plan.num_buckets()) {
      ASSERT_EQ(bucket.padded_elems, plan.bucket_elems());
    } else {
      ASSERT_LE(bucket.padded_elems, plan.bucket_elems());
    }
    int64_t overlapping = 0;
    int64_t first = -1;
    int64_t elems = 0;
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      const TensorPlacement& placement = plan.placement(t);
      const int64_t lo = std::max(placement.flat_offset, bucket.flat_begin);
      const int64_t hi = std::min(placement.flat_end(), bucket.flat_end());
      if (lo >= hi) continue;
      if (first < 0) first = t;
      ++overlapping;
      elems += hi - lo;
    }
    ASSERT_GE(overlapping, 1) << "a bucket of padding only";
    ASSERT_EQ(bucket.first_tensor, first);
    ASSERT_EQ(bucket.num_tensors, overlapping);
    ASSERT_EQ(bucket.tensor_elems, elems);
    next_begin = bucket.flat_end();
  }
  ASSERT_EQ(next_begin, plan.padded_elems());
  // No more tail padding than the alignment needs.
  ASSERT_GT(plan.placement(plan.num_tensors() - 1).flat_end() + alignment, plan.padded_elems());

  // Tensors: 64-aligned, in order, not overlapping, each in the buckets it says it spans.
  int64_t prev_end = 0;
  int64_t total = 0;
  std::vector<int64_t> first_element(sizes.size() + 1, 0);
  for (int64_t t = 0; t < plan.num_tensors(); ++t) {
    const TensorPlacement& placement = plan.placement(t);
    ASSERT_EQ(placement.num_elements, sizes[t]);
    ASSERT_EQ(placement.flat_offset % kTensorAlignElems, 0);
    ASSERT_GE(placement.flat_offset, prev_end);
    ASSERT_LT(placement.flat_offset, prev_end + kTensorAlignElems);
    ASSERT_GE(placement.num_buckets, 1);
    const BucketLayout& first = plan.buckets()[placement.first_bucket];
    const BucketLayout& last = plan.buckets()[placement.first_bucket + placement.num_buckets - 1];
    ASSERT_GE(placement.flat_offset, first.flat_begin);
    ASSERT_LT(placement.flat_offset, first.flat_end());
    ASSERT_GT(placement.flat_end(), last.flat_begin);
    ASSERT_LE(placement.flat_end(), last.flat_end());
    prev_end = placement.flat_end();
    total += sizes[t];
    first_element[t + 1] = total;
  }
  ASSERT_EQ(plan.tensor_elems(), total);

  // Every rank: one piece per bucket, piece r of it, equal sizes; fragments inside the piece
  // and inside their tensor (so never in padding); every tensor element covered exactly once.
  std::vector<uint8_t> coverage(total, 0);
  std::vector<uint8_t> flat_owner_seen(plan.padded_elems(), 0);
  for (int64_t rank = 0; rank < world_size; ++rank) {
    RankView view = MustView(plan, rank);
    ASSERT_EQ(view.owned_elems(), plan.elems_per_rank());
    ASSERT_EQ(static_cast<int64_t>(view.pieces().size()), plan.num_buckets());
    int64_t fragment_cursor = 0;
    for (int64_t b = 0; b < plan.num_buckets(); ++b) {
      const OwnedPiece& piece = view.pieces()[b];
      const BucketLayout& bucket = plan.buckets()[b];
      ASSERT_EQ(piece.bucket, b);
      ASSERT_EQ(piece.flat_begin, bucket.flat_begin + rank * bucket.piece_elems);
      ASSERT_EQ(piece.size(), bucket.piece_elems);
      ASSERT_EQ(piece.first_fragment, fragment_cursor);
      fragment_cursor += piece.num_fragments;
      for (int64_t e = piece.flat_begin; e < piece.flat_end; ++e) {
        ASSERT_EQ(flat_owner_seen[e]++, 0) << "pieces overlap at " << e;
      }
      int64_t prev_fragment_end = piece.flat_begin;
      for (const TensorFragment& fragment : view.FragmentsOf(piece)) {
        const TensorPlacement& placement = plan.placement(fragment.tensor);
        ASSERT_GE(fragment.flat_begin, prev_fragment_end);
        ASSERT_LE(fragment.flat_end(), piece.flat_end);
        ASSERT_GT(fragment.size(), 0);
        ASSERT_GE(fragment.tensor_begin, 0);
        ASSERT_LE(fragment.tensor_end, placement.num_elements);
        ASSERT_EQ(fragment.flat_begin, placement.flat_offset + fragment.tensor_begin);
        for (int64_t i = fragment.tensor_begin; i < fragment.tensor_end; ++i) {
          ++coverage[first_element[fragment.tensor] + i];
        }
        prev_fragment_end = fragment.flat_end();
      }
    }
    ASSERT_EQ(fragment_cursor, static_cast<int64_t>(view.fragments().size()));
  }
  for (int64_t e = 0; e < total; ++e) ASSERT_EQ(coverage[e], 1) << "tensor element " << e;
  for (int64_t e = 0; e < plan.padded_elems(); ++e) ASSERT_EQ(flat_owner_seen[e], 1);

  // Random ranges and points against brute force.
  std::uniform_int_distribution<int64_t> position(-10, plan.padded_elems() + 10);
  for (int trial = 0; trial < 20; ++trial) {
    int64_t begin = position(rng);
    int64_t end = position(rng);
    if (begin > end) std::swap(begin, end);
    std::vector<TensorFragment> expected;
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      const TensorPlacement& placement = plan.placement(t);
      const int64_t lo = std::max(begin, placement.flat_offset);
      const int64_t hi = std::min(end, placement.flat_end());
      if (lo < hi) {
        expected.push_back({t, lo - placement.flat_offset, hi - placement.flat_offset, lo});
      }
    }
    ASSERT_EQ(plan.FragmentsInRange(begin, end), expected) << begin << ".." << end;

    const int64_t point = position(rng);
    int64_t expected_owner = -1;
    if (point >= 0 && point < plan.padded_elems()) {
      for (const BucketLayout& bucket : plan.buckets()) {
        if (point >= bucket.flat_begin && point < bucket.flat_end()) {
          expected_owner = (point - bucket.flat_begin) / bucket.piece_elems;
        }
      }
    }
    ASSERT_EQ(plan.OwnerOf(point), expected_owner) << point;
  }
}

TEST(ShardPlannerPropertyTest, RandomTensorListsAndWorldSizes) {
  std::mt19937_64 rng(20241129);
  std::uniform_int_distribution<int> tensor_count(1, 200);
  std::uniform_int_distribution<int64_t> world_size(1, 64);
  std::uniform_int_distribution<int64_t> bucket_elems(kMinBucketElems, 40000);
  // Mostly small tensors with some larger ones, like biases and weights.
  std::uniform_int_distribution<int64_t> small_size(1, 300);
  std::uniform_int_distribution<int64_t> large_size(1, 4000);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> sizes(tensor_count(rng));
    for (int64_t& size : sizes) size = (rng() % 3 == 0) ? small_size(rng) : large_size(rng);
    const int64_t w = world_size(rng);
    const int64_t bucket = bucket_elems(rng);
    SCOPED_TRACE(absl::StrCat("trial ", trial, ": ", sizes.size(), " tensors, W=", w,
                              ", bucket_elems=", bucket));
    ShardPlan plan = MustPlan(FlatTensors(sizes), w, bucket);
    CheckPlanProperties(plan, sizes, rng);
    if (HasFatalFailure()) return;

    // The same inputs give the same plan and the same views.
    ShardPlan again = MustPlan(FlatTensors(sizes), w, bucket);
    ASSERT_EQ(again.layout_hash(), plan.layout_hash());
    ASSERT_EQ(again.padded_elems(), plan.padded_elems());
    ASSERT_EQ(again.num_buckets(), plan.num_buckets());
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      ASSERT_EQ(again.placement(t).flat_offset, plan.placement(t).flat_offset);
      ASSERT_EQ(again.placement(t).first_bucket, plan.placement(t).first_bucket);
      ASSERT_EQ(again.placement(t).num_buckets, plan.placement(t).num_buckets);
    }
    const int64_t rank = static_cast<int64_t>(rng() % w);
    RankView view = MustView(plan, rank);
    RankView view_again = MustView(again, rank);
    ASSERT_TRUE(std::equal(view.fragments().begin(), view.fragments().end(),
                           view_again.fragments().begin(), view_again.fragments().end()));

    // Changing W, the bucket size or one shape changes the hash.
    ASSERT_NE(MustPlan(FlatTensors(sizes), w % 64 + 1, bucket).layout_hash(), plan.layout_hash());
    const int64_t next_bucket_size = plan.bucket_elems() + plan.bucket_alignment();
    ASSERT_NE(MustPlan(FlatTensors(sizes), w, next_bucket_size).layout_hash(), plan.layout_hash());
    std::vector<int64_t> changed = sizes;
    changed[rng() % changed.size()] += 1;
    ASSERT_NE(MustPlan(FlatTensors(changed), w, bucket).layout_hash(), plan.layout_hash());
  }
}

TEST(ShardPlannerScaleTest, HundredThousandTensorsOfATrillionElements) {
  // 100,000 tensors of 10^7 elements each (multiples of 64, so no gaps): 10^12 elements, a
  // multiple of lcm(1024, 128), cut into ceil(10^12 / 4,194,304) = 238,419 buckets, the last
  // one 2,428,928 elements; offsets pass 2^32 and 2^39 without overflow.
  std::vector<TensorSpec> tensors;
  tensors.reserve(100000);
  for (int i = 0; i < 100000; ++i) {
    tensors.push_back(TensorSpec{absl::StrCat("t", i), {10000000}, 10000000, 0.01, 1.0f});
  }
  ShardPlan plan = MustPlan(std::move(tensors), 1024);
  EXPECT_EQ(plan.tensor_elems(), 1000000000000);
  EXPECT_EQ(plan.padded_elems(), 1000000000000);
  ASSERT_EQ(plan.num_buckets(), 238419);
  EXPECT_EQ(plan.buckets().back().padded_elems, 2428928);
  // Tensor 1 starts at 10^7 = 2 * 4,194,304 + 1,611,392, so it begins in bucket 2.
  EXPECT_EQ(plan.placement(1).first_bucket, 2);
  EXPECT_EQ(plan.placement(1).num_buckets, 3);
  RankView view = MustView(plan, 1023);
  EXPECT_EQ(view.owned_elems(), plan.elems_per_rank());
  EXPECT_EQ(view.pieces().size(), 238419u);
  // No padding anywhere: rank 1023 owns 10^12 / 1024 tensor elements.
  EXPECT_EQ(view.owned_tensor_elems(), 976562500);
}

}  // namespace
}  // namespace zeroshard::sharding
