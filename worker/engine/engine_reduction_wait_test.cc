// How the engine waits for bucket reductions: during backward it only orders the device after a
// reduction (Work::WaitOnComputeStream, so a device communicator never blocks the host there),
// and Step() waits for every reduction on the host before the statistics, failing on any failure.
// How long the host waited is reported bucket by bucket, in backward or in the step.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"
#include "sharding/test_plans.h"
#include "worker/comm/communicator.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/engine/engine.h"

namespace zeroshard::engine {
namespace {

// Every wait the engine made, in order: "device <reduction>" or "host <reduction>".
using WaitLog = std::vector<std::string>;

// A bucket reduction at W = 1 (the buffer already holds the sum) that records how it is waited
// for. The engine calls it from its owner thread only.
class RecordedReduction : public comm::Work {
 public:
  RecordedReduction(int id, WaitLog* log, absl::Status device_wait, absl::Status outcome)
      : id_(id), log_(log), device_wait_(std::move(device_wait)), outcome_(std::move(outcome)) {}

  absl::Status Wait(absl::Duration /*timeout*/) override {
    log_->push_back(absl::StrCat("host ", id_));
    finished_ = true;
    return outcome_;
  }
  absl::Status WaitOnComputeStream() override {
    log_->push_back(absl::StrCat("device ", id_));
    return device_wait_;
  }
  bool Done() const override { return finished_; }
  std::optional<absl::Duration> RunTime() const override {
    if (!finished_) return std::nullopt;
    return absl::ZeroDuration();
  }

 private:
  const int id_;
  WaitLog* const log_;
  const absl::Status device_wait_;
  const absl::Status outcome_;
  bool finished_ = false;
};

// One rank whose bucket reductions are RecordedReductions (numbered in launch order); the other
// collectives finish at once. `device_waits` and `outcomes` give reduction i's results (OK
// beyond their ends).
class RecordingCommunicator : public comm::testing::IdentityCommunicator {
 public:
  RecordingCommunicator(std::vector<absl::Status> device_waits, std::vector<absl::Status> outcomes)
      : device_waits_(std::move(device_waits)), outcomes_(std::move(outcomes)) {}

  const WaitLog& log() const { return log_; }

  std::unique_ptr<comm::Work> ReduceScatterInPlace(void*, size_t, comm::ElementType, comm::ReduceOp,
                                                   const comm::CollectiveOptions&) override {
    const int id = reductions_++;
    return std::make_unique<RecordedReduction>(id, &log_, StatusOf(device_waits_, id),
                                               StatusOf(outcomes_, id));
  }

 private:
  static absl::Status StatusOf(const std::vector<absl::Status>& statuses, int id) {
    return id < static_cast<int>(statuses.size()) ? statuses[id] : absl::OkStatus();
  }

  const std::vector<absl::Status> device_waits_;
  const std::vector<absl::Status> outcomes_;
  WaitLog log_;
  int reductions_ = 0;
};

constexpr int64_t kTensors = 4;
constexpr int64_t kTensorElems = 1000;

// kTensors tensors of kTensorElems elements in buckets of kMinBucketElems: one bucket each.
sharding::ShardPlan FourBucketPlan() {
  auto plan = sharding::PlanOfSizes(std::vector<int64_t>(kTensors, kTensorElems), /*world_size=*/1,
                                    sharding::kMinBucketElems);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// zero2 with one bucket buffer: each bucket after the first needs the previous one retired.
std::unique_ptr<Engine> CreateEngine(const sharding::ShardPlan& plan,
                                     RecordingCommunicator* communicator) {
  EngineConfig config;
  config.mode = EngineMode::kZero2;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 0.1;
  config.bucket_pool_size = 1;
  auto engine = Engine::Create(plan, /*rank=*/0, config, communicator);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  const absl::Status initialized =
      (*engine)->InitializeParameters([](int64_t, absl::Span<float> out) {
        for (float& value : out) value = 1.0f;
        return absl::OkStatus();
      });
  EXPECT_TRUE(initialized.ok()) << initialized;
  return *std::move(engine);
}

const std::vector<float>& Gradient() {
  static const std::vector<float>* gradient = new std::vector<float>(kTensorElems, 0.25f);
  return *gradient;
}

TEST(EngineReductionWaitTest, BackwardOrdersTheDeviceAndStepWaitsOnTheHost) {
  const sharding::ShardPlan plan = FourBucketPlan();
  ASSERT_EQ(plan.num_buckets(), kTensors);
  RecordingCommunicator communicator({}, {});
  std::unique_ptr<Engine> engine = CreateEngine(plan, &communicator);
  ASSERT_NE(engine, nullptr);

  for (int64_t t = 0; t < kTensors; ++t)
    ASSERT_TRUE(workloads::CopyGradientToSink(*engine, t, Gradient()).ok());
  // Buckets 1-3 each took the one buffer after the device was ordered after the reduction
  // before; the host has not waited for any reduction yet.
  EXPECT_EQ(communicator.log(), (WaitLog{"device 0", "device 1", "device 2"}));

  absl::StatusOr<StepResult> result = engine->Step(/*local_loss=*/1.0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->skipped);
  EXPECT_EQ(communicator.log(), (WaitLog{"device 0", "device 1", "device 2", "device 3", "host 0",
                                         "host 1", "host 2", "host 3"}));
  std::vector<float> updated;
  for (int64_t t = 0; t < kTensors; ++t) {
    absl::StatusOr<std::vector<float>> values = engine->ParametersOnHost(t);
    ASSERT_TRUE(values.ok()) << values.status();
    updated.insert(updated.end(), values->begin(), values->end());
  }
  // SGD from 1 with gradient 0.25 and lr 0.1: the step used the reduced gradients.
  for (float value : updated) ASSERT_NEAR(value, 1.0 - 0.1 * 0.25, 1e-6);
}

TEST(EngineReductionWaitTest, AReductionFailingAfterTheDeviceWaitFailsTheStep) {
  const sharding::ShardPlan plan = FourBucketPlan();
  RecordingCommunicator communicator(
      {}, {absl::OkStatus(), absl::UnavailableError("peer lost during reduction 1")});
  std::unique_ptr<Engine> engine = CreateEngine(plan, &communicator);
  ASSERT_NE(engine, nullptr);

  for (int64_t t = 0; t < kTensors; ++t)
    ASSERT_TRUE(workloads::CopyGradientToSink(*engine, t, Gradient()).ok());
  EXPECT_EQ(engine->Step(/*local_loss=*/1.0).status().code(), absl::StatusCode::kUnavailable);
  // No update was applied, and the engine stays failed.
  EXPECT_EQ(engine->optimizer_step(), 0);
  EXPECT_EQ(workloads::CopyGradientToSink(*engine, 0, Gradient()).code(),
            absl::StatusCode::kUnavailable);
}

TEST(EngineReductionWaitTest, AFailureKnownWhenOrderingTheDeviceFailsTheNextSegment) {
  const sharding::ShardPlan plan = FourBucketPlan();
  RecordingCommunicator communicator({absl::AbortedError("communicator aborted")}, {});
  std::unique_ptr<Engine> engine = CreateEngine(plan, &communicator);
  ASSERT_NE(engine, nullptr);

  ASSERT_TRUE(workloads::CopyGradientToSink(*engine, 0, Gradient()).ok());
  // Tensor 1's bucket needs the buffer of bucket 0, whose reduction already failed.
  EXPECT_EQ(workloads::CopyGradientToSink(*engine, 1, Gradient()).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(communicator.log(), (WaitLog{"device 0"}));
}

// Counts the bucket reductions launched (reduce-scatters, and all-reduces in ddp); they finish
// at once. Thread contract: the engine's owner thread.
class LaunchCountingCommunicator : public comm::testing::IdentityCommunicator {
 public:
  int launches() const { return launches_; }

  std::unique_ptr<comm::Work> ReduceScatterInPlace(
      void* buffer, size_t count, comm::ElementType type, comm::ReduceOp op,
      const comm::CollectiveOptions& options) override {
    ++launches_;
    return IdentityCommunicator::ReduceScatterInPlace(buffer, count, type, op, options);
  }
  std::unique_ptr<comm::Work> AllReduce(void* buffer, size_t count, comm::ElementType type,
                                        comm::ReduceOp op,
                                        const comm::CollectiveOptions& options) override {
    ++launches_;
    return IdentityCommunicator::AllReduce(buffer, count, type, op, options);
  }

 private:
  int launches_ = 0;
};

class LaunchOrderTest : public ::testing::TestWithParam<EngineMode> {};

// Backward hands gradients over in tensor-list order (the order it produces them), so the flat
// layout fills from its start: a bucket's reduction must start right when the segment that
// completes it is written, not later, and so in the order backward completes the buckets.
TEST_P(LaunchOrderTest, EachBucketIsLaunchedWhenBackwardCompletesIt) {
  // Tensors spanning buckets, and buckets holding several tensors and alignment gaps.
  auto plan = sharding::PlanOfSizes({1500, 3000, 700, 90, 2500}, /*world_size=*/1,
                                    sharding::kMinBucketElems);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Flat position after which bucket b has all of its tensor elements.
  std::vector<int64_t> completed_at;
  for (const sharding::BucketLayout& bucket : plan->buckets()) {
    const sharding::TensorPlacement& last =
        plan->placement(bucket.first_tensor + bucket.num_tensors - 1);
    completed_at.push_back(std::min(last.flat_end(), bucket.flat_end()));
  }
  LaunchCountingCommunicator communicator;
  EngineConfig config;
  config.mode = GetParam();
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 0.1;
  config.bucket_pool_size = static_cast<int>(plan->num_buckets());
  auto engine = Engine::Create(*plan, /*rank=*/0, config, &communicator);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)
                  ->InitializeParameters([](int64_t, absl::Span<float> out) {
                    for (float& value : out) value = 1.0f;
                    return absl::OkStatus();
                  })
                  .ok());
  int segments = 0;
  for (int64_t t = 0; t < plan->num_tensors(); ++t) {
    const sharding::TensorPlacement& placement = plan->placement(t);
    for (int64_t begin = 0; begin < placement.num_elements;) {
      const int64_t end = (*engine)->GradSegmentEnd(t, begin);
      absl::StatusOr<absl::Span<float>> out = (*engine)->GradBuffer(t, begin, end);
      ASSERT_TRUE(out.ok()) << out.status();
      for (float& value : *out) value = 0.5f;
      ASSERT_TRUE((*engine)->GradWritten(t, begin, end).ok());
      // The buckets completed so far, and no other, are launched.
      const int64_t written_to = placement.flat_offset + end;
      const int expected = static_cast<int>(std::count_if(
          completed_at.begin(), completed_at.end(), [&](int64_t at) { return at <= written_to; }));
      EXPECT_EQ(communicator.launches(), expected)
          << "after tensor " << t << " [" << begin << ", " << end << ")";
      begin = end;
      ++segments;
    }
  }
  // Segments end at bucket boundaries: more segments than tensors.
  EXPECT_GT(segments, plan->num_tensors());
  EXPECT_EQ(communicator.launches(), plan->num_buckets());
  EXPECT_TRUE((*engine)->Step(/*local_loss=*/1.0).ok());
}

INSTANTIATE_TEST_SUITE_P(Modes, LaunchOrderTest,
                         ::testing::Values(EngineMode::kDdp, EngineMode::kZero1,
                                           EngineMode::kZero2),
                         [](const ::testing::TestParamInfo<EngineMode>& info) {
                           return std::string(EngineModeName(info.param));
                         });

// A bucket reduction at W = 1 that takes `duration` from its launch to finish, as a slow
// collective would: waiting for it blocks until then. Thread-compatible (the engine's owner).
class SlowReduction : public comm::Work {
 public:
  explicit SlowReduction(absl::Duration duration) : finish_(absl::Now() + duration) {}

  absl::Status Wait(absl::Duration /*timeout*/) override {
    absl::SleepFor(finish_ - absl::Now());
    return absl::OkStatus();
  }
  bool Done() const override { return absl::Now() >= finish_; }
  std::optional<absl::Duration> RunTime() const override {
    if (!Done()) return std::nullopt;
    return absl::ZeroDuration();
  }

 private:
  const absl::Time finish_;
};

// One rank whose reduction of bucket `slow_bucket` (counted in launch order, which is bucket
// order, within each step) takes `duration` in the first step; every other collective finishes
// at once. Thread contract: the engine's owner thread.
class SlowBucketCommunicator : public comm::testing::IdentityCommunicator {
 public:
  SlowBucketCommunicator(int64_t slow_bucket, absl::Duration duration)
      : slow_bucket_(slow_bucket), duration_(duration) {}

  std::unique_ptr<comm::Work> ReduceScatterInPlace(void*, size_t, comm::ElementType, comm::ReduceOp,
                                                   const comm::CollectiveOptions&) override {
    const int64_t launch = launches_++;
    const bool slow = launch == slow_bucket_;  // the first step's launches only
    return std::make_unique<SlowReduction>(slow ? duration_ : absl::ZeroDuration());
  }

 private:
  const int64_t slow_bucket_;
  const absl::Duration duration_;
  int64_t launches_ = 0;
};

struct SlowBucketCase {
  const char* name;
  int pool_size;
  int64_t slow_bucket;
  bool waited_in_backward;  // else in Step()
};

class BucketWaitTest : public ::testing::TestWithParam<SlowBucketCase> {};

// A reduction 100 ms slow is exposed on its own bucket: the host waits for it while the next
// bucket needs its buffer (backward) or in Step(), and the other buckets' waits stay small.
TEST_P(BucketWaitTest, TheSlowBucketCarriesTheExposedWaitWhereItWasWaitedFor) {
  const SlowBucketCase& c = GetParam();
  constexpr absl::Duration kSlow = absl::Milliseconds(100);
  const sharding::ShardPlan plan = FourBucketPlan();
  SlowBucketCommunicator communicator(c.slow_bucket, kSlow);
  EngineConfig config;
  config.mode = EngineMode::kZero2;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 0.1;
  config.bucket_pool_size = c.pool_size;
  auto engine = Engine::Create(plan, /*rank=*/0, config, &communicator);
  ASSERT_TRUE(engine.ok()) << engine.status();

  for (int64_t t = 0; t < kTensors; ++t)
    ASSERT_TRUE(workloads::CopyGradientToSink(**engine, t, Gradient()).ok());
  absl::StatusOr<StepResult> result = (*engine)->Step(/*local_loss=*/1.0);
  ASSERT_TRUE(result.ok()) << result.status();
  const absl::Span<const BucketWait> waits = result->timings.bucket_waits;
  ASSERT_EQ(static_cast<int64_t>(waits.size()), plan.num_buckets());
  double sum = 0.0;
  for (int64_t b = 0; b < plan.num_buckets(); ++b) {
    sum += waits[b].backward_ms + waits[b].step_ms;
    if (b == c.slow_bucket) continue;
    // The others finished at once; a loaded machine may still preempt the waiting thread.
    EXPECT_LT(waits[b].backward_ms + waits[b].step_ms, 0.5 * absl::ToDoubleMilliseconds(kSlow))
        << "bucket " << b;
  }
  const BucketWait& slow = waits[c.slow_bucket];
  const double where = c.waited_in_backward ? slow.backward_ms : slow.step_ms;
  const double elsewhere = c.waited_in_backward ? slow.step_ms : slow.backward_ms;
  // Only the moments between its launch and the wait were not waited for.
  EXPECT_GT(where, 0.5 * absl::ToDoubleMilliseconds(kSlow));
  EXPECT_LT(elsewhere, 0.5 * absl::ToDoubleMilliseconds(kSlow));
  EXPECT_NEAR(sum, result->timings.exposed_comm_ms, 1e-6 * sum + 1e-9);

  // The next step starts from zero: nothing is slow any more.
  for (int64_t t = 0; t < kTensors; ++t)
    ASSERT_TRUE(workloads::CopyGradientToSink(**engine, t, Gradient()).ok());
  result = (*engine)->Step(/*local_loss=*/1.0);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(static_cast<int64_t>(result->timings.bucket_waits.size()), plan.num_buckets());
  EXPECT_LT(result->timings.bucket_waits[c.slow_bucket].backward_ms +
                result->timings.bucket_waits[c.slow_bucket].step_ms,
            0.5 * absl::ToDoubleMilliseconds(kSlow));
}

INSTANTIATE_TEST_SUITE_P(
    PoolsAndBuckets, BucketWaitTest,
    ::testing::Values(
        // One buffer: bucket 2 is retired when bucket 3 needs the buffer, during backward.
        SlowBucketCase{"OneBufferMiddleBucket", 1, 2, true},
        // The last bucket has no successor to wait for it: Step() does.
        SlowBucketCase{"OneBufferLastBucket", 1, 3, false},
        // A buffer per bucket: backward never waits, Step() waits for all.
        SlowBucketCase{"BufferPerBucketFirstBucket", 4, 0, false}),
    [](const ::testing::TestParamInfo<SlowBucketCase>& info) { return info.param.name; });

}  // namespace
}  // namespace zeroshard::engine
