// The parameter all-gather overlapped with the next forward: Step() issues every bucket's
// all-gather (the last bucket first) and returns without waiting; Parameters(tensor) waits for
// exactly the buckets the tensor overlaps, so forward never reads half-gathered parameters;
// failures, ddp, ParametersOnHost, InitializeParameters and the destructor.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "sharding/model_catalog.h"
#include "sharding/shard_planner.h"
#include "sharding/test_plans.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/engine/engine.h"
#include "worker/workloads/teacher_student_mlp.h"
#include "worker/workloads/workload.h"

namespace zeroshard::engine {
namespace {

using ::zeroshard::comm::testing::RunOnRankThreads;

// The bucket whose parameters start at `buffer`, given where the engine's parameter copy starts
// (fp32: 4 bytes per element); -1 when no bucket starts there.
int64_t BucketAt(const sharding::ShardPlan& plan, const void* params_base, const void* buffer) {
  const int64_t flat = (static_cast<const char*>(buffer) - static_cast<const char*>(params_base)) /
                       static_cast<int64_t>(sizeof(float));
  for (int64_t b = 0; b < plan.num_buckets(); ++b) {
    if (plan.buckets()[b].flat_begin == flat) return b;
  }
  return -1;
}

// Where `engine`'s parameter copy starts (tensor 0 is at flat offset 0).
const void* ParamsBase(Engine& engine) {
  absl::StatusOr<workloads::StoredParameters> first = engine.Parameters(0);
  EXPECT_TRUE(first.ok()) << first.status();
  return first.ok() ? first->data : nullptr;
}

// ---- One rank, all-gathers that record how they are waited for ----

// Every event, in order: "issue <bucket>", "device <bucket>" (WaitOnComputeStream), "host
// <bucket>" (Wait).
using GatherLog = std::vector<std::string>;

// An all-gather at W = 1 (nothing to move) as a device backend runs it: WaitOnComputeStream only
// orders the device and returns at once; the operation is done once the host has waited for it.
// With `host_backend`, WaitOnComputeStream waits as a host backend's does. The engine calls it
// from its owner thread only.
class RecordedGather : public comm::Work {
 public:
  RecordedGather(int64_t bucket, GatherLog* log, bool host_backend, absl::Status outcome)
      : bucket_(bucket), log_(log), host_backend_(host_backend), outcome_(std::move(outcome)) {}

  absl::Status Wait(absl::Duration /*timeout*/) override {
    log_->push_back(absl::StrCat("host ", bucket_));
    done_ = true;
    return outcome_;
  }
  absl::Status WaitOnComputeStream() override {
    log_->push_back(absl::StrCat("device ", bucket_));
    if (host_backend_) {
      done_ = true;
      return outcome_;
    }
    return absl::OkStatus();
  }
  bool Done() const override { return done_; }
  std::optional<absl::Duration> RunTime() const override {
    if (!done_) return std::nullopt;
    return absl::Milliseconds(2);
  }

 private:
  const int64_t bucket_;
  GatherLog* const log_;
  const bool host_backend_;
  const absl::Status outcome_;
  bool done_ = false;
};

// One rank whose parameter all-gathers are RecordedGathers; the rest finish at once (W = 1).
// `failing_bucket`'s all-gather fails with `failure`. Thread contract: the engine's owner thread
// only (the log is not synchronised).
class RecordingCommunicator : public comm::testing::IdentityCommunicator {
 public:
  RecordingCommunicator(const sharding::ShardPlan& plan, bool host_backend,
                        int64_t failing_bucket = -1, absl::Status failure = absl::OkStatus())
      : plan_(plan),
        host_backend_(host_backend),
        failing_bucket_(failing_bucket),
        failure_(std::move(failure)) {}

  void set_params_base(const void* base) { params_base_ = base; }
  GatherLog& log() { return log_; }

  std::unique_ptr<comm::Work> AllGatherInPlace(void* buffer, size_t, comm::ElementType,
                                               const comm::CollectiveOptions&) override {
    const int64_t bucket = BucketAt(plan_, params_base_, buffer);
    EXPECT_GE(bucket, 0) << "an all-gather that starts at no bucket";
    log_.push_back(absl::StrCat("issue ", bucket));
    return std::make_unique<RecordedGather>(
        bucket, &log_, host_backend_, bucket == failing_bucket_ ? failure_ : absl::OkStatus());
  }

 private:
  const sharding::ShardPlan& plan_;
  const bool host_backend_;
  const int64_t failing_bucket_;
  const absl::Status failure_;
  const void* params_base_ = nullptr;
  GatherLog log_;
};

// Tensors of 1000, 1500, 500 and 1000 elements in 1024-element buckets (64-element alignment):
// tensor 1 spans buckets 1 and 2, which it shares with tensor 2.
sharding::ShardPlan SpanningPlan() {
  auto plan =
      sharding::PlanOfSizes({1000, 1500, 500, 1000}, /*world_size=*/1, sharding::kMinBucketElems);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

std::unique_ptr<Engine> CreateEngine(const sharding::ShardPlan& plan, EngineMode mode,
                                     RecordingCommunicator* communicator) {
  EngineConfig config;
  config.mode = mode;
  config.optimizer.kind = kernels::OptimizerKind::kSgd;
  config.optimizer.lr = 0.1;
  auto engine = Engine::Create(plan, /*rank=*/0, config, communicator);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  const absl::Status initialized =
      (*engine)->InitializeParameters([](int64_t, absl::Span<float> out) {
        for (float& value : out) value = 1.0f;
        return absl::OkStatus();
      });
  EXPECT_TRUE(initialized.ok()) << initialized;
  communicator->set_params_base(ParamsBase(**engine));
  return *std::move(engine);
}

// Hands every tensor's gradient (0.25 everywhere, or `value` in element 0 of tensor 0) over and
// steps.
absl::StatusOr<StepResult> BackwardAndStep(Engine& engine, float value = 0.25f) {
  for (int64_t t = 0; t < engine.plan().num_tensors(); ++t) {
    std::vector<float> gradient(engine.plan().placement(t).num_elements, 0.25f);
    if (t == 0) gradient[0] = value;
    ZS_RETURN_IF_ERROR(workloads::CopyGradientToSink(engine, t, gradient));
  }
  return engine.Step(/*local_loss=*/1.0);
}

TEST(EngineParamGatherTest, StepIssuesEveryGatherLastBucketFirstAndWaitsForNone) {
  const sharding::ShardPlan plan = SpanningPlan();
  ASSERT_EQ(plan.num_buckets(), 4);
  ASSERT_EQ(plan.placement(1).first_bucket, 1);
  ASSERT_EQ(plan.placement(1).num_buckets, 2);
  ASSERT_EQ(plan.placement(2).first_bucket, 2);
  for (EngineMode mode : {EngineMode::kZero1, EngineMode::kZero2}) {
    SCOPED_TRACE(EngineModeName(mode));
    RecordingCommunicator communicator(plan, /*host_backend=*/false);
    std::unique_ptr<Engine> engine = CreateEngine(plan, mode, &communicator);
    ASSERT_NE(engine, nullptr);
    absl::StatusOr<StepResult> first = BackwardAndStep(*engine);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(communicator.log(), (GatherLog{"issue 3", "issue 2", "issue 1", "issue 0"}));
    EXPECT_EQ(first->timings.allgather_run_ms, 0.0);  // step 0 read no gathered parameters

    // Forward, the tensor list backwards: each tensor orders the device after its own
    // buckets' all-gathers, once each, and after no others.
    communicator.log().clear();
    for (int64_t t = plan.num_tensors() - 1; t >= 0; --t) {
      ASSERT_TRUE(engine->Parameters(t).ok());
      ASSERT_TRUE(engine->Parameters(t).ok());  // asking again waits for nothing more
    }
    EXPECT_EQ(communicator.log(), (GatherLog{"device 3", "device 2", "device 1", "device 0"}));

    // The next step waits on the host for their outcome first, then issues its own.
    communicator.log().clear();
    absl::StatusOr<StepResult> second = BackwardAndStep(*engine);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(communicator.log(), (GatherLog{"host 3", "host 2", "host 1", "host 0", "issue 3",
                                             "issue 2", "issue 1", "issue 0"}));
    EXPECT_EQ(second->timings.allgather_run_ms, 4 * 2.0);  // the recorded run times
    EXPECT_GE(second->timings.param_wait_ms, 0.0);
  }
}

TEST(EngineParamGatherTest, WithAHostBackendForwardWaitsOnlyForTheBucketsItReads) {
  const sharding::ShardPlan plan = SpanningPlan();
  RecordingCommunicator communicator(plan, /*host_backend=*/true);
  std::unique_ptr<Engine> engine = CreateEngine(plan, EngineMode::kZero2, &communicator);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(BackwardAndStep(*engine).ok());
  communicator.log().clear();
  // Tensor 1 spans buckets 1 and 2: both are waited for (and retired, the host having waited),
  // bucket 3's and bucket 0's are not.
  ASSERT_TRUE(engine->Parameters(1).ok());
  EXPECT_EQ(communicator.log(), (GatherLog{"device 2", "host 2", "device 1", "host 1"}));
  // Tensor 2 lies in bucket 2, already gathered.
  ASSERT_TRUE(engine->Parameters(2).ok());
  EXPECT_EQ(communicator.log().size(), 4u);
  communicator.log().clear();
  ASSERT_TRUE(BackwardAndStep(*engine).ok());
  // Step() waits for the two that forward did not read, then issues the next ones.
  EXPECT_EQ(communicator.log(),
            (GatherLog{"host 3", "host 0", "issue 3", "issue 2", "issue 1", "issue 0"}));
}

TEST(EngineParamGatherTest, ParametersOnHostAndInitializeParametersWaitOnTheHost) {
  const sharding::ShardPlan plan = SpanningPlan();
  RecordingCommunicator communicator(plan, /*host_backend=*/false);
  std::unique_ptr<Engine> engine = CreateEngine(plan, EngineMode::kZero2, &communicator);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(BackwardAndStep(*engine).ok());
  communicator.log().clear();
  // Host values need the outcome, not only the device's order: tensor 1's two buckets.
  absl::StatusOr<std::vector<float>> values = engine->ParametersOnHost(1);
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(communicator.log(), (GatherLog{"device 2", "device 1", "host 2", "host 1"}));
  // SGD from 1 with gradient 0.25 and lr 0.1.
  for (float value : *values) ASSERT_NEAR(value, 1.0 - 0.1 * 0.25, 1e-6);
  communicator.log().clear();
  // Overwriting the parameters waits for every all-gather still writing into them.
  ASSERT_TRUE(engine
                  ->InitializeParameters([](int64_t, absl::Span<float> out) {
                    for (float& value : out) value = 2.0f;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(communicator.log(), (GatherLog{"host 3", "host 0"}));
}

TEST(EngineParamGatherTest, TheDestructorWaitsForOutstandingGathers) {
  const sharding::ShardPlan plan = SpanningPlan();
  RecordingCommunicator communicator(plan, /*host_backend=*/false);
  std::unique_ptr<Engine> engine = CreateEngine(plan, EngineMode::kZero1, &communicator);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(BackwardAndStep(*engine).ok());
  ASSERT_TRUE(engine->Parameters(3).ok());  // ordered on the device only
  communicator.log().clear();
  engine.reset();
  std::vector<std::string> waits = communicator.log();
  std::sort(waits.begin(), waits.end());
  EXPECT_EQ(waits, (GatherLog{"host 0", "host 1", "host 2", "host 3"}));
}

TEST(EngineParamGatherTest, AFailedGatherFailsTheNextWaitAndTheEngineStaysFailed) {
  const sharding::ShardPlan plan = SpanningPlan();
  RecordingCommunicator communicator(plan, /*host_backend=*/true, /*failing_bucket=*/2,
                                     absl::UnavailableError("peer lost during all-gather"));
  std::unique_ptr<Engine> engine = CreateEngine(plan, EngineMode::kZero2, &communicator);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(BackwardAndStep(*engine).ok());  // Step() itself waits for no all-gather
  EXPECT_TRUE(engine->Parameters(3).ok());     // bucket 3's succeeded
  EXPECT_EQ(engine->Parameters(2).status().code(), absl::StatusCode::kUnavailable);
  // Unusable from then on, including for tensors whose buckets were gathered.
  EXPECT_EQ(engine->Parameters(3).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine->ParametersOnHost(3).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(workloads::CopyGradientToSink(*engine, 0, std::vector<float>(1000, 0.25f)).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine->Step(1.0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(engine->optimizer_step(), 1);
}

TEST(EngineParamGatherTest, AFailedGatherNobodyReadFailsTheNextStep) {
  const sharding::ShardPlan plan = SpanningPlan();
  RecordingCommunicator communicator(plan, /*host_backend=*/false, /*failing_bucket=*/0,
                                     absl::DeadlineExceededError("all-gather timed out"));
  std::unique_ptr<Engine> engine = CreateEngine(plan, EngineMode::kZero1, &communicator);
  ASSERT_NE(engine, nullptr);
  ASSERT_TRUE(BackwardAndStep(*engine).ok());
  EXPECT_EQ(BackwardAndStep(*engine).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(engine->optimizer_step(), 1);  // no update on parameters of unknown state
  EXPECT_EQ(engine->Parameters(3).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(EngineParamGatherTest, DdpAndSkippedStepsIssueNoGathers) {
  const sharding::ShardPlan plan = SpanningPlan();
  {
    RecordingCommunicator communicator(plan, /*host_backend=*/false);
    std::unique_ptr<Engine> engine = CreateEngine(plan, EngineMode::kDdp, &communicator);
    ASSERT_NE(engine, nullptr);
    for (int step = 0; step < 2; ++step) {
      absl::StatusOr<StepResult> result = BackwardAndStep(*engine);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_EQ(result->timings.allgather_ms, 0.0);
      EXPECT_EQ(result->timings.allgather_run_ms, 0.0);
      EXPECT_EQ(result->timings.param_wait_ms, 0.0);
      for (int64_t t = 0; t < plan.num_tensors(); ++t) ASSERT_TRUE(engine->Parameters(t).ok());
    }
    EXPECT_TRUE(communicator.log().empty());
  }
  RecordingCommunicator communicator(plan, /*host_backend=*/false);
  std::unique_ptr<Engine> engine = CreateEngine(plan, EngineMode::kZero2, &communicator);
  ASSERT_NE(engine, nullptr);
  absl::StatusOr<StepResult> overflow = BackwardAndStep(*engine, INFINITY);
  ASSERT_TRUE(overflow.ok()) << overflow.status();
  EXPECT_TRUE(overflow->skipped);
  EXPECT_TRUE(communicator.log().empty());
}

// ---- Two ranks over Gloo: forward reads while the all-gathers are held back ----

// Forwards every collective to `inner`. On rank 0 it keeps each bucket's latest all-gather
// (shared with the engine's handle) so that the test can ask whether it is done; on rank 1 it
// holds back the first all-gather of each step until rank 0's forward has asked for its first
// tensor (`peer_asked`), so rank 0's forward provably starts while its all-gathers cannot
// complete.
//
// Thread contract: the collectives are called from the rank's owner thread; GatherOf from that
// thread too.
class HeldBackGatherCommunicator : public comm::Communicator {
 public:
  HeldBackGatherCommunicator(comm::Communicator* inner, const sharding::ShardPlan& plan,
                             std::vector<absl::Notification>* peer_asked)
      : inner_(inner), plan_(plan), peer_asked_(peer_asked) {}

  void set_params_base(const void* base) { params_base_ = base; }
  // The latest all-gather issued for `bucket`, or null.
  comm::Work* GatherOf(int64_t bucket) const {
    auto found = gathers_.find(bucket);
    return found == gathers_.end() ? nullptr : found->second.get();
  }

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::unique_ptr<comm::Work> ReduceScatter(const void* input, void* output, size_t piece_count,
                                            comm::ElementType type, comm::ReduceOp op,
                                            const comm::CollectiveOptions& options) override {
    return inner_->ReduceScatter(input, output, piece_count, type, op, options);
  }
  std::unique_ptr<comm::Work> ReduceScatterInPlace(
      void* buffer, size_t piece_count, comm::ElementType type, comm::ReduceOp op,
      const comm::CollectiveOptions& options) override {
    return inner_->ReduceScatterInPlace(buffer, piece_count, type, op, options);
  }
  std::unique_ptr<comm::Work> AllGather(const void* input, void* output, size_t piece_count,
                                        comm::ElementType type,
                                        const comm::CollectiveOptions& options) override {
    return inner_->AllGather(input, output, piece_count, type, options);
  }
  std::unique_ptr<comm::Work> AllGatherInPlace(void* buffer, size_t piece_count,
                                               comm::ElementType type,
                                               const comm::CollectiveOptions& options) override {
    const int64_t bucket = BucketAt(plan_, params_base_, buffer);
    EXPECT_GE(bucket, 0) << "an all-gather that starts at no bucket";
    const int64_t step = gathers_issued_++ / plan_.num_buckets();
    if (rank() == 1 && gathers_issued_ % plan_.num_buckets() == 1 &&
        step + 1 < static_cast<int64_t>(peer_asked_->size())) {
      EXPECT_TRUE((*peer_asked_)[step + 1].WaitForNotificationWithTimeout(absl::Seconds(60)))
          << "rank 0's forward of step " << step + 1 << " never asked for parameters";
    }
    std::shared_ptr<comm::Work> gather =
        inner_->AllGatherInPlace(buffer, piece_count, type, options);
    if (rank() == 0) gathers_[bucket] = gather;
    return std::make_unique<SharedWork>(std::move(gather));
  }
  std::unique_ptr<comm::Work> AllReduce(void* buffer, size_t count, comm::ElementType type,
                                        comm::ReduceOp op,
                                        const comm::CollectiveOptions& options) override {
    return inner_->AllReduce(buffer, count, type, op, options);
  }
  std::unique_ptr<comm::Work> Broadcast(void* buffer, size_t count, comm::ElementType type,
                                        int root, const comm::CollectiveOptions& options) override {
    return inner_->Broadcast(buffer, count, type, root, options);
  }
  std::unique_ptr<comm::Work> Barrier(const comm::CollectiveOptions& options) override {
    return inner_->Barrier(options);
  }
  void Abort() override { inner_->Abort(); }
  comm::CommunicatorStats stats() const override { return inner_->stats(); }

 private:
  // The engine's handle on an operation the test also watches. Thread-safe, as the Work it
  // shares.
  class SharedWork : public comm::Work {
   public:
    explicit SharedWork(std::shared_ptr<comm::Work> work) : work_(std::move(work)) {}
    absl::Status Wait(absl::Duration timeout) override { return work_->Wait(timeout); }
    bool Done() const override { return work_->Done(); }
    absl::Status WaitOnComputeStream() override { return work_->WaitOnComputeStream(); }
    std::optional<absl::Duration> RunTime() const override { return work_->RunTime(); }

   private:
    const std::shared_ptr<comm::Work> work_;
  };

  comm::Communicator* const inner_;
  const sharding::ShardPlan& plan_;
  std::vector<absl::Notification>* const peer_asked_;
  const void* params_base_ = nullptr;
  int64_t gathers_issued_ = 0;
  std::map<int64_t, std::shared_ptr<comm::Work>> gathers_;
};

// Rank 0's view of the engine for the workload: on the first call of each step it tells rank 1
// (`asked`) and checks that the all-gather of the tensor's last bucket is still running; every
// call returns only after each bucket of the tensor was gathered, and keeps a copy of what the
// workload was given.
//
// Thread contract: rank 0's owner thread.
class CheckingParameterSource : public workloads::ParameterSource {
 public:
  CheckingParameterSource(Engine& engine, const HeldBackGatherCommunicator& communicator)
      : engine_(engine), communicator_(communicator) {}

  // Starts a step's forward; `asked` is notified on its first call.
  void StartStep(absl::Notification* asked) {
    asked_ = asked;
    reads_.clear();
  }

  absl::StatusOr<workloads::StoredParameters> Parameters(int64_t tensor) override {
    const sharding::TensorPlacement& placement = engine_.plan().placement(tensor);
    const int64_t last_bucket = placement.first_bucket + placement.num_buckets - 1;
    if (asked_ != nullptr) {
      // Rank 1 has not issued this all-gather yet, so it cannot have completed.
      const comm::Work* gather = communicator_.GatherOf(last_bucket);
      EXPECT_NE(gather, nullptr);
      if (gather != nullptr) {
        EXPECT_FALSE(gather->Done()) << "bucket " << last_bucket << " was gathered too early";
      }
      asked_->Notify();
      asked_ = nullptr;
    }
    ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters stored, engine_.Parameters(tensor));
    for (int64_t b = placement.first_bucket; b <= last_bucket; ++b) {
      const comm::Work* gather = communicator_.GatherOf(b);
      if (gather == nullptr) continue;  // step 0 reads the initial parameters
      EXPECT_TRUE(gather->Done()) << "tensor " << tensor << " returned before bucket " << b
                                  << "'s all-gather completed";
      ++checked_buckets_;
    }
    const float* values = static_cast<const float*>(stored.data);
    reads_.push_back({tensor, std::vector<float>(values, values + stored.size)});
    return stored;
  }

  // What each Parameters() call of the step handed out: (tensor, values).
  const std::vector<std::pair<int64_t, std::vector<float>>>& reads() const { return reads_; }
  int64_t checked_buckets() const { return checked_buckets_; }

 private:
  Engine& engine_;
  const HeldBackGatherCommunicator& communicator_;
  absl::Notification* asked_ = nullptr;
  std::vector<std::pair<int64_t, std::vector<float>>> reads_;
  int64_t checked_buckets_ = 0;
};

constexpr int64_t kSteps = 4;

// Every tensor's final parameters on each rank, concatenated.
using FinalParameters = std::vector<std::vector<float>>;

// kSteps steps of a small MLP (several buckets per layer) on two ranks in `mode`; rank 0's
// forward reads through a CheckingParameterSource while rank 1 holds its all-gathers back.
FinalParameters TrainWithHeldBackGathers(EngineMode mode) {
  constexpr int kWorldSize = 2;
  const std::vector<int64_t> sizes = {48, 80, 64, 16};
  auto tensors = sharding::TensorsForLayerSizes(sizes);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  sharding::ShardPlanOptions plan_options;
  plan_options.bucket_elems = sharding::kMinBucketElems;
  auto plan = sharding::ShardPlan::Create(*tensors, kWorldSize, plan_options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  // The 64 x 80 weight alone spans five buckets or more.
  EXPECT_GE(plan->num_buckets(), 8);
  comm::InMemoryStore store;
  std::vector<absl::Notification> peer_asked(kSteps);
  FinalParameters final_params(kWorldSize);
  const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
    comm::GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = kWorldSize;
    options.store = &store;
    options.rendezvous_timeout = absl::Seconds(30);
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> gloo,
                        comm::GlooCommunicator::Create(options));
    HeldBackGatherCommunicator communicator(gloo.get(), *plan, &peer_asked);
    workloads::TeacherStudentMlpOptions mlp_options;
    mlp_options.layer_sizes = sizes;
    mlp_options.seed = 3;
    mlp_options.global_batch = 8;
    mlp_options.world_size = kWorldSize;
    mlp_options.rank = rank;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<workloads::TeacherStudentMlp> workload,
                        workloads::TeacherStudentMlp::Create(mlp_options));
    EngineConfig config;
    config.mode = mode;
    config.optimizer.kind = kernels::OptimizerKind::kAdamW;
    config.optimizer.lr = 1e-2;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(*plan, rank, config, &communicator));
    ZS_RETURN_IF_ERROR(engine->InitializeParameters(
        [&](int64_t t, absl::Span<float> out) { return workload->InitialParameters(t, out); }));
    communicator.set_params_base(ParamsBase(*engine));
    CheckingParameterSource checking(*engine, communicator);
    for (int64_t step = 0; step < kSteps; ++step) {
      double loss = 0.0;
      if (rank == 0) {
        checking.StartStep(step > 0 && mode != EngineMode::kDdp ? &peer_asked[step] : nullptr);
        ZS_ASSIGN_OR_RETURN(loss, workload->ForwardBackward(step, checking, *engine));
        // What forward read is what the completed all-gathers left, bit for bit.
        // Every tensor in forward, and again each weight but the first layer's in backward.
        EXPECT_EQ(checking.reads().size(), tensors->size() + sizes.size() - 2);
        for (const auto& [tensor, values] : checking.reads()) {
          ZS_ASSIGN_OR_RETURN(const std::vector<float> gathered, engine->ParametersOnHost(tensor));
          EXPECT_TRUE(gathered.size() == values.size() &&
                      std::memcmp(gathered.data(), values.data(), values.size() * 4) == 0)
              << "step " << step << " tensor " << tensor << " was read half-gathered";
        }
      } else {
        ZS_ASSIGN_OR_RETURN(loss, workload->ForwardBackward(step, *engine, *engine));
      }
      ZS_RETURN_IF_ERROR(engine->Step(loss).status());
    }
    if (rank == 0 && mode != EngineMode::kDdp) {
      // Every bucket of every tensor was checked in each step after the first.
      int64_t overlaps = 0;
      for (int64_t t = 0; t < plan->num_tensors(); ++t) overlaps += plan->placement(t).num_buckets;
      // Backward reads the weights again (odd tensors: "<2l>.weight"), all but the first layer's
      // (the last tensor).
      for (int64_t t = 1; t + 1 < plan->num_tensors(); t += 2) {
        overlaps += plan->placement(t).num_buckets;
      }
      EXPECT_EQ(checking.checked_buckets(), (kSteps - 1) * overlaps);
    }
    for (int64_t t = 0; t < plan->num_tensors(); ++t) {
      ZS_ASSIGN_OR_RETURN(const std::vector<float> values, engine->ParametersOnHost(t));
      final_params[rank].insert(final_params[rank].end(), values.begin(), values.end());
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return final_params;
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(EngineParamGatherTest, ForwardNeverReadsHalfGatheredParameters) {
  const FinalParameters ddp = TrainWithHeldBackGathers(EngineMode::kDdp);
  ASSERT_FALSE(ddp[0].empty());
  EXPECT_TRUE(BitwiseEqual(ddp[0], ddp[1]));
  for (EngineMode mode : {EngineMode::kZero1, EngineMode::kZero2}) {
    SCOPED_TRACE(EngineModeName(mode));
    const FinalParameters zero = TrainWithHeldBackGathers(mode);
    EXPECT_TRUE(BitwiseEqual(zero[0], zero[1])) << "the ranks disagree";
    EXPECT_TRUE(BitwiseEqual(zero[0], ddp[0])) << "not bitwise equal to ddp";
  }
}

}  // namespace
}  // namespace zeroshard::engine
