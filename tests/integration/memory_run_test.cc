// Issue 10, "Everything big is counted": on real worker processes training `medium` (25.2M
// parameters, AdamW, fp32, W = 2), the memory the worker counts by category explains at least
// 90% of the process's peak RSS growth over the job, in ddp and in zero2. Issue 38, row 3: a
// zero3 job's StepMetrics report its owned parameter pieces (1/W of zero2's parameters) and its
// gather pool apart.
#include "tests/integration/memory_run.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "gtest/gtest.h"

namespace zeroshard::testing {
namespace {

constexpr int kWorkers = 2;
constexpr int64_t kSteps = 2;
// sharding/model_catalog.cc's `medium`: 1024-4096-4096-1024.
constexpr int64_t kMediumParams = 25'175'040;
constexpr int64_t kMiB = 1024 * 1024;

v1::JobSpec MediumSpec(v1::Mode mode) {
  v1::JobSpec spec;
  spec.set_name(absl::StrCat("memory-", absl::AsciiStrToLower(v1::Mode_Name(mode))));
  spec.mutable_workload()->set_preset("medium");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_optimizer()->set_lr(0.001);
  spec.set_mode(mode);
  spec.set_min_workers(kWorkers);
  spec.set_max_workers(kWorkers);
  spec.set_global_batch(64);
  spec.set_steps(kSteps);
  spec.set_seed(0);
  return spec;
}

// One measured run per mode (fresh workers each), shared by the tests below.
const absl::StatusOr<MeasuredJob>& MeasuredRun(v1::Mode mode) {
  static auto& runs = *new std::map<v1::Mode, absl::StatusOr<MeasuredJob>>();
  auto found = runs.find(mode);
  if (found == runs.end()) {
    found = runs.emplace(mode, RunJobMeasuringMemory(MediumSpec(mode), LocalClusterOptions(),
                                                     absl::Seconds(240)))
                .first;
  }
  return found->second;
}

class MemoryAccountingTest : public ::testing::TestWithParam<v1::Mode> {};

TEST_P(MemoryAccountingTest, CountedCategoriesExplainTheWorkersPeakRssGrowth) {
  if (!common::RssFollowsAllocations()) GTEST_SKIP() << "RSS is the sanitizer's here";
  const absl::StatusOr<MeasuredJob>& run = MeasuredRun(GetParam());
  ASSERT_TRUE(run.ok()) << run.status();
  const v1::StepMetrics& progress = run->job.progress();
  const v1::MemoryBreakdown& memory = progress.memory();
  ASSERT_EQ(progress.step(), kSteps);
  ASSERT_EQ(run->ranks.size(), static_cast<size_t>(kWorkers));
  const int64_t counted = memory.total_bytes();
  SCOPED_TRACE(absl::StrCat(v1::Mode_Name(GetParam()), ": ", memory.ShortDebugString()));

  // The categories outside the engine are there: a full fp32 teacher, Gloo's ring staging.
  EXPECT_GT(memory.workload_bytes(), 4 * kMediumParams);
  EXPECT_GT(memory.comm_staging_bytes(), 0);
  EXPECT_EQ(counted, memory.params_bytes() + memory.grads_bytes() + memory.master_bytes() +
                         memory.optimizer_state_bytes() + memory.bucket_bytes() +
                         memory.comm_scratch_bytes() + memory.gather_pool_bytes() +
                         memory.comm_staging_bytes() + memory.workload_bytes() +
                         memory.kernel_tables_bytes());

  // Rank 0's own figures: its peak growth since the run started.
  const int64_t reported_growth = progress.vmhwm_bytes() - progress.vmrss_at_start_bytes();
  EXPECT_GT(progress.vmrss_at_start_bytes(), 0);
  EXPECT_GE(progress.vmhwm_bytes(), progress.vmrss_bytes());
  EXPECT_GE(10 * counted, 9 * reported_growth)
      << "counted " << counted << " bytes, rank 0's peak RSS grew " << reported_growth;

  // Every worker, as /proc saw it from outside: ranks hold the same bytes (equal owned pieces,
  // equal micro-batches), so rank 0's count stands for each.
  for (size_t rank = 0; rank < run->ranks.size(); ++rank) {
    const WorkerMemory& worker = run->ranks[rank];
    SCOPED_TRACE(absl::StrCat("rank ", rank, " (", worker.worker_id, ")"));
    std::cout << v1::Mode_Name(GetParam()) << " rank " << rank << ": counted " << counted
              << " bytes, peak RSS growth " << worker.growth_bytes() << " bytes, counted/growth "
              << static_cast<double>(counted) / worker.growth_bytes() << "\n";
    EXPECT_GE(10 * counted, 9 * worker.growth_bytes())
        << "counted " << counted << " bytes, the peak RSS grew " << worker.growth_bytes();
    // Not inflated either: what is counted was resident at the peak.
    EXPECT_LE(counted, worker.growth_bytes() + 8 * kMiB);
  }
  // What rank 0 reports is what /proc shows for it.
  EXPECT_LE(std::abs(progress.vmhwm_bytes() - run->ranks[0].vmhwm_bytes), 4 * kMiB);

  // The whole iteration is timed, not the engine's step alone.
  EXPECT_GT(progress.compute_ms(), 0.0);
  EXPECT_GE(progress.iteration_ms(), progress.compute_ms() + progress.step_ms() - 1.0);
}

// zero3 stages its initial values in a gather window (counted); before that fix its peak RSS
// growth was only about 85% counted on `medium`, W = 2 (a 64 MB tensor staged on the heap).
INSTANTIATE_TEST_SUITE_P(Modes, MemoryAccountingTest,
                         ::testing::Values(v1::DDP, v1::ZERO2, v1::ZERO3),
                         [](const ::testing::TestParamInfo<v1::Mode>& info) {
                           return absl::AsciiStrToLower(v1::Mode_Name(info.param));
                         });

// Issue 38, row 3: zero3's params_bytes is the owned pieces, 1/W of zero2's full parameters, and
// the gathered full parameters are reported apart as gather_pool_bytes (0 in zero2); gradients
// and optimizer state are zero2's. Fails before the fix: mode ZERO3 was refused at submission;
// with zero3 running but the pool counted as parameters, params_bytes exceeds 1/W.
TEST(Zero3MemoryTest, ParamsAreTheOwnedPiecesAndThePoolIsReportedApart) {
  const absl::StatusOr<MeasuredJob>& zero2 = MeasuredRun(v1::ZERO2);
  ASSERT_TRUE(zero2.ok()) << zero2.status();
  const absl::StatusOr<MeasuredJob>& zero3 = MeasuredRun(v1::ZERO3);
  ASSERT_TRUE(zero3.ok()) << zero3.status();
  const v1::MemoryBreakdown& sharded = zero3->job.progress().memory();
  const v1::MemoryBreakdown& full = zero2->job.progress().memory();
  SCOPED_TRACE(
      absl::StrCat("zero2: ", full.ShortDebugString(), "; zero3: ", sharded.ShortDebugString()));
  ASSERT_EQ(zero3->job.progress().step(), kSteps);
  EXPECT_GE(full.params_bytes(), 4 * kMediumParams);
  // The plan pads the model to W equal pieces, so the owned piece is exactly 1/W.
  EXPECT_EQ(sharded.params_bytes() * kWorkers, full.params_bytes());
  EXPECT_EQ(full.gather_pool_bytes(), 0);
  EXPECT_GT(sharded.gather_pool_bytes(), 0);
  EXPECT_EQ(sharded.grads_bytes(), full.grads_bytes());
  EXPECT_EQ(sharded.optimizer_state_bytes(), full.optimizer_state_bytes());
  std::cout << "zero3 at W = " << kWorkers << ": params " << sharded.params_bytes()
            << " bytes (zero2 " << full.params_bytes() << "), gather pool "
            << sharded.gather_pool_bytes() << " bytes\n";
}

}  // namespace
}  // namespace zeroshard::testing
