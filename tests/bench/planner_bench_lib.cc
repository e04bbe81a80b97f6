// Planner benchmark: the global layout of 100,000 tensors totalling 10^12 elements at the
// default bucket size, plus one rank's view at W = 1024, as one JSON line (medians).
#include "tests/bench/planner_bench_lib.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sharding/shard_planner.h"

namespace zeroshard::bench {
namespace {

constexpr int64_t kTensors = 100000;
constexpr int64_t kElements = 1000000000000;  // 10^12
constexpr int64_t kWorldSize = 1024;
constexpr int64_t kRank = 517;
constexpr int kRepetitions = 7;

// A fixed mix of small and large tensors (log-uniform sizes, scaled so they sum to exactly
// kElements), named like a transformer's: many tensors share a bucket, big ones get their own.
std::vector<sharding::TensorSpec> MakeTensors() {
  std::mt19937_64 rng(1234);
  std::uniform_real_distribution<double> log_size(std::log(64.0), std::log(64.0e6));
  std::vector<double> raw(kTensors);
  double raw_total = 0;
  for (double& size : raw) {
    size = std::exp(log_size(rng));
    raw_total += size;
  }
  std::vector<sharding::TensorSpec> tensors(kTensors);
  int64_t total = 0;
  for (int64_t i = 0; i < kTensors; ++i) {
    const int64_t count =
        std::max<int64_t>(1, static_cast<int64_t>(raw[i] / raw_total * kElements));
    const bool is_bias = count < 100000;
    tensors[i] = sharding::TensorSpec{
        absl::StrCat("blocks.", kTensors - 1 - i, is_bias ? ".bias" : ".weight"),
        {count},
        count,
        /*weight_decay=*/is_bias ? 0.0 : 0.01,
        1.0f};
    total += count;
  }
  // Rounding left a small remainder: give it to the largest tensor.
  auto largest = std::max_element(tensors.begin(), tensors.end(),
                                  [](const sharding::TensorSpec& a, const sharding::TensorSpec& b) {
                                    return a.num_elements < b.num_elements;
                                  });
  largest->num_elements += kElements - total;
  largest->shape = {largest->num_elements};
  return tensors;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

absl::StatusOr<std::string> RunPlannerBench() {
  const std::vector<sharding::TensorSpec> tensors = MakeTensors();
  std::vector<double> plan_ms, view_ms, total_ms;
  int64_t buckets = 0;
  int64_t fragments = 0;
  uint64_t hash = 0;
  for (int rep = 0; rep < kRepetitions; ++rep) {
    // The coordinator moves the catalog's list into the planner; the copy is not timed.
    std::vector<sharding::TensorSpec> input = tensors;
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<sharding::ShardPlan> plan = sharding::ShardPlan::Create(
        std::move(input), kWorldSize, sharding::ShardPlanOptions{sharding::kDefaultBucketElems});
    const double plan_time = MillisSince(start);
    if (!plan.ok()) return plan.status();
    const auto view_start = std::chrono::steady_clock::now();
    absl::StatusOr<sharding::RankView> view = plan->ViewForRank(kRank);
    const double view_time = MillisSince(view_start);
    if (!view.ok()) return view.status();
    plan_ms.push_back(plan_time);
    view_ms.push_back(view_time);
    total_ms.push_back(plan_time + view_time);
    buckets = plan->num_buckets();
    fragments = static_cast<int64_t>(view->fragments().size());
    if (rep > 0 && plan->layout_hash() != hash) {
      return absl::InternalError("planner_bench: layout hash differs between repetitions");
    }
    hash = plan->layout_hash();
  }
  return absl::StrFormat(
      "{\"bench\":\"planner\",\"tensors\":%lld,\"elements\":%lld,\"world_size\":%lld,"
      "\"bucket_elems\":%lld,\"buckets\":%lld,\"rank\":%lld,\"rank_fragments\":%lld,"
      "\"repetitions\":%d,\"plan_ms\":%.2f,\"rank_view_ms\":%.2f,\"total_ms\":%.2f}",
      static_cast<long long>(kTensors), static_cast<long long>(kElements),
      static_cast<long long>(kWorldSize), static_cast<long long>(sharding::kDefaultBucketElems),
      static_cast<long long>(buckets), static_cast<long long>(kRank),
      static_cast<long long>(fragments), kRepetitions, Median(plan_ms), Median(view_ms),
      Median(total_ms));
}

}  // namespace zeroshard::bench
