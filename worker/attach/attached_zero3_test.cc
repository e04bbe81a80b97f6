// Attached zero3 (issue 39), the worker's side end to end in one process: two ranks, each a real
// zero3 Engine over Gloo with its memory in memfd blocks (SharedMemoryBacking) and an
// AttachedTrainer on a real unix socket, and per rank a trainer thread that speaks the protocol
// as zeroshard.torch does: the initial values one tensor at a time, then per step a gather and a
// release around each module's forward and backward, gradient segments, and step.
//
// It checks what the trainer sees: no parameter block in the welcome, rank 0's initial values
// on both ranks (the broadcast), gathered values inside the gather pool's block, the SGD update
// after a step, a clear error for a release of a tensor not held, and that a module's gather is
// answered while a peer still holds back the all-gather of another module's bucket.
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "sharding/shard_planner.h"
#include "worker/attach/attached_trainer.h"
#include "worker/attach/frame_socket.h"
#include "worker/attach/shared_memory_backing.h"
#include "worker/attach/testing/abstract_listener.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/engine.h"

namespace zeroshard::attach {
namespace {

using testing::Listener;

constexpr int kWorldSize = 2;
constexpr double kLr = 0.5;

// Plan order (the reverse of a torch model's parameters()): two Linear layers, "1" after "0".
std::vector<sharding::TensorSpec> Tensors() {
  std::vector<sharding::TensorSpec> tensors(4);
  tensors[0] = {"1.weight", {2, 4}, 8};
  tensors[1] = {"1.bias", {2}, 2};
  tensors[2] = {"0.weight", {4, 3}, 12};
  tensors[3] = {"0.bias", {4}, 4};
  return tensors;
}

sharding::ShardPlanOptions PlanOptions() {
  sharding::ShardPlanOptions options;
  options.bucket_elems = sharding::kMinBucketElems;
  return options;
}

// The same two layers, each in a 1024-element bucket of its own: "1" (plan order first) fills
// bucket 0 (960 + 30 elements), "0" (480 + 32) lies in bucket 1, a shorter one.
std::vector<sharding::TensorSpec> TensorsInTwoBuckets() {
  std::vector<sharding::TensorSpec> tensors(4);
  tensors[0] = {"1.weight", {30, 32}, 960};
  tensors[1] = {"1.bias", {30}, 30};
  tensors[2] = {"0.weight", {32, 15}, 480};
  tensors[3] = {"0.bias", {32}, 32};
  return tensors;
}

sharding::ShardPlan Plan(const std::vector<sharding::TensorSpec>& tensors) {
  absl::StatusOr<sharding::ShardPlan> plan =
      sharding::ShardPlan::Create(tensors, kWorldSize, PlanOptions());
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// Rank r's trainer's initial value of element i of tensor t (the ranks differ: rank 0's win).
float InitialValue(int rank, int tensor, int64_t i) {
  return static_cast<float>(rank * 100 + tensor * 10) + 0.25f * static_cast<float>(i);
}
// Rank r's gradient of element i of tensor t at every step.
float Gradient(int rank, int tensor, int64_t i) {
  return static_cast<float>((rank + 1) * (tensor + 1)) * 0.125f + 0.0625f * static_cast<float>(i);
}

// What one rank's trainer saw.
struct TrainerView {
  absl::Status status;
  v1::AttachWelcome welcome;
  // values[s][t]: tensor t as gathered in step s's forward (s = steps: after the last step).
  std::vector<std::vector<std::vector<float>>> values;
  std::string release_error;
};

// What a test does on a trainer's thread (either may be empty): in each step's forward between
// the gather of module "0" (its values already copied) and that of module "1", and before each
// step request.
struct TrainerHooks {
  std::function<void(int rank, int step)> between_forward_gathers;
  std::function<void(int rank, int step)> before_step;
};

// The trainer of `rank`: `steps` steps of forward (module "0" then "1") and backward ("1" then
// "0"), each module gathered before and released after, then one more gather of everything,
// and finish. With `release_twice`, the first step releases module "0" twice (an error).
class FakeTrainer {
 public:
  FakeTrainer(const Listener& listener, SharedMemoryBacking& blocks, int rank, int steps,
              const TrainerHooks& hooks)
      : listener_(listener), blocks_(blocks), rank_(rank), steps_(steps), hooks_(hooks) {}

  TrainerView Run(bool release_twice) {
    TrainerView view;
    view.status = RunSteps(view, release_twice);
    return view;
  }

 private:
  absl::Status Send(const v1::AttachRequest& request) { return socket_->Write(request); }
  // A worker that failed answered its error and may have closed the socket since: a write that
  // fails still reads the answer that came before.
  absl::StatusOr<v1::AttachResponse> Call(const v1::AttachRequest& request) {
    const absl::Status written = socket_->Write(request);
    v1::AttachResponse response;
    if (absl::Status read = socket_->Read(response); !read.ok()) {
      return written.ok() ? read : written;
    }
    if (!response.error().empty()) return absl::InternalError(response.error());
    return response;
  }
  char* At(int32_t block, int64_t offset) {
    const std::optional<SharedBlock> found = blocks_.FindById(block);
    return found.has_value() ? found->data + offset : nullptr;
  }

  // Gathers `tensors`, checks where they are, and (with `keep`) copies their values.
  absl::Status Gather(const std::vector<int32_t>& tensors,
                      std::vector<std::vector<float>>* keep = nullptr) {
    v1::AttachRequest request;
    for (int32_t t : tensors) request.mutable_gather()->add_tensors(t);
    ZS_ASSIGN_OR_RETURN(const v1::AttachResponse response, Call(request));
    if (!response.has_gathered() ||
        response.gathered().offsets_size() != static_cast<int>(tensors.size())) {
      return absl::InternalError(absl::StrCat("gather answered ", response.DebugString()));
    }
    for (size_t k = 0; k < tensors.size(); ++k) {
      const int64_t offset = response.gathered().offsets(static_cast<int>(k));
      const int64_t elements = welcome_.tensors(tensors[k]).elements();
      if (offset < 0 || offset + elements * 4 > welcome_.gather_pool_bytes()) {
        return absl::InternalError(
            absl::StrCat("tensor ", tensors[k], " at ", offset, " is outside the gather pool"));
      }
      if (keep != nullptr) {
        const float* values = reinterpret_cast<const float*>(At(pool_block_, offset));
        (*keep)[tensors[k]].assign(values, values + elements);
      }
    }
    return absl::OkStatus();
  }
  absl::Status Release(const std::vector<int32_t>& tensors) {
    v1::AttachRequest request;
    for (int32_t t : tensors) request.mutable_release()->add_tensors(t);
    return Send(request);
  }

  absl::Status RunSteps(TrainerView& view, bool release_twice) {
    socket_ = listener_.Connect();
    if (socket_ == nullptr) return absl::InternalError("connect failed");
    v1::AttachRequest hello;
    hello.mutable_hello()->set_job_id("job-000001");
    hello.mutable_hello()->set_rank(rank_);
    hello.mutable_hello()->set_world_size(kWorldSize);
    ZS_ASSIGN_OR_RETURN(const v1::AttachResponse welcomed, Call(hello));
    welcome_ = welcomed.welcome();
    view.welcome = welcome_;
    pool_block_ = welcome_.gather_pool_block();
    // The initial values, one tensor at a time, in plan order.
    for (int t = 0; t < welcome_.tensors_size(); ++t) {
      v1::AttachRequest where;
      where.mutable_initial_tensor()->set_tensor(t);
      ZS_ASSIGN_OR_RETURN(const v1::AttachResponse place, Call(where));
      if (!place.has_place()) return absl::InternalError(place.DebugString());
      float* values = reinterpret_cast<float*>(At(place.place().block(), place.place().offset()));
      if (values == nullptr) return absl::InternalError("no such block");
      for (int64_t i = 0; i < welcome_.tensors(t).elements(); ++i) {
        values[i] = InitialValue(rank_, t, i);
      }
      v1::AttachRequest written;
      written.mutable_initial_parameters();
      ZS_ASSIGN_OR_RETURN(const v1::AttachResponse ack, Call(written));
      if (!ack.has_ack()) return absl::InternalError(ack.DebugString());
    }
    view.values.assign(steps_ + 1, std::vector<std::vector<float>>(4));
    for (int step = 0; step < steps_; ++step) {
      // Forward: module "0" (tensors 2, 3), then "1" (0, 1).
      ZS_RETURN_IF_ERROR(Gather({2, 3}, &view.values[step]));
      ZS_RETURN_IF_ERROR(Release({2, 3}));
      if (release_twice && step == 0) {
        ZS_RETURN_IF_ERROR(Release({2}));
        v1::AttachRequest next;
        next.mutable_gather()->add_tensors(0);
        absl::StatusOr<v1::AttachResponse> refused = Call(next);
        view.release_error = std::string(refused.status().message());
        return absl::OkStatus();
      }
      if (hooks_.between_forward_gathers) hooks_.between_forward_gathers(rank_, step);
      ZS_RETURN_IF_ERROR(Gather({0, 1}, &view.values[step]));
      ZS_RETURN_IF_ERROR(Release({0, 1}));
      // Backward: "1" then "0", each gathered again; gradients by segment in plan order.
      ZS_RETURN_IF_ERROR(Gather({0, 1}));
      ZS_RETURN_IF_ERROR(HandOver({0, 1}));
      ZS_RETURN_IF_ERROR(Release({0, 1}));
      ZS_RETURN_IF_ERROR(Gather({2, 3}));
      ZS_RETURN_IF_ERROR(HandOver({2, 3}));
      ZS_RETURN_IF_ERROR(Release({2, 3}));
      if (hooks_.before_step) hooks_.before_step(rank_, step);
      v1::AttachRequest step_request;
      step_request.mutable_step()->set_lr(kLr);
      step_request.mutable_step()->set_loss(1.0);
      ZS_ASSIGN_OR_RETURN(const v1::AttachResponse result, Call(step_request));
      if (!result.has_step_result() || result.step_result().parameters_pending()) {
        return absl::InternalError(result.DebugString());
      }
    }
    ZS_RETURN_IF_ERROR(Gather({0, 1, 2, 3}, &view.values[steps_]));
    ZS_RETURN_IF_ERROR(Release({0, 1, 2, 3}));
    v1::AttachRequest finish;
    finish.mutable_finish();
    return Call(finish).status();
  }

  absl::Status HandOver(const std::vector<int32_t>& tensors) {
    for (int32_t t : tensors) {
      int64_t begin = 0;
      for (const int64_t end : welcome_.tensors(t).segment_ends()) {
        v1::AttachRequest segment;
        segment.mutable_segment()->set_tensor(t);
        segment.mutable_segment()->set_begin(begin);
        segment.mutable_segment()->set_end(end);
        segment.mutable_segment()->set_wait(true);
        ZS_ASSIGN_OR_RETURN(const v1::AttachResponse place, Call(segment));
        if (!place.has_place()) return absl::InternalError(place.DebugString());
        float* into = reinterpret_cast<float*>(At(place.place().block(), place.place().offset()));
        for (int64_t i = begin; i < end; ++i) into[i - begin] = Gradient(rank_, t, i);
        v1::AttachRequest written;
        *written.mutable_written() = segment.segment();
        written.mutable_written()->set_wait(false);
        ZS_RETURN_IF_ERROR(Send(written));
        begin = end;
      }
    }
    return absl::OkStatus();
  }

  const Listener& listener_;
  SharedMemoryBacking& blocks_;
  const int rank_;
  const int steps_;
  const TrainerHooks& hooks_;
  std::unique_ptr<FrameSocket> socket_;
  v1::AttachWelcome welcome_;
  int32_t pool_block_ = -1;
};

struct RankOutcome {
  absl::Status worker;
  TrainerView trainer;
};

// What a test changes in RunRanks: the tensors, the trainers' hooks, and the communicator each
// rank's engine uses (given the rank's Gloo communicator; by default that one).
struct RunOptions {
  std::vector<sharding::TensorSpec> tensors = Tensors();
  TrainerHooks hooks;
  std::function<comm::Communicator*(int rank, comm::Communicator* gloo)> communicator;
};

// Runs both ranks: the worker's side as the daemon's run loop does (engine_training_run.cc),
// each rank's trainer on its own thread.
std::vector<RankOutcome> RunRanks(engine::EngineMode mode, int steps, bool release_twice,
                                  const RunOptions& run = {}) {
  const sharding::ShardPlan plan = Plan(run.tensors);
  comm::InMemoryStore store;
  std::vector<RankOutcome> outcomes(kWorldSize);
  const absl::Status status =
      comm::testing::RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
        RankOutcome& outcome = outcomes[rank];
        Listener listener(absl::StrCat("zeroshard-attached-zero3-test-", ::getpid(), "-", rank));
        if (!listener.bound()) return absl::InternalError("listen failed");
        SharedMemoryBacking blocks;
        engine::HostDeviceOps device(1, &blocks);
        comm::GlooCommunicatorOptions comm_options;
        comm_options.rank = rank;
        comm_options.world_size = kWorldSize;
        comm_options.store = &store;
        comm_options.rendezvous_timeout = absl::Seconds(30);
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                            comm::GlooCommunicator::Create(comm_options));
        engine::EngineConfig config;
        config.mode = mode;
        config.optimizer.kind = kernels::OptimizerKind::kSgd;
        config.optimizer.lr = kLr;
        config.device = &device;
        comm::Communicator* const engine_communicator =
            run.communicator ? run.communicator(rank, communicator.get()) : communicator.get();
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                            engine::Engine::Create(plan, rank, config, engine_communicator));
        AttachedTrainerOptions options;
        options.listen_fd = listener.fd();
        options.job_id = "job-000001";
        options.rank = rank;
        options.world_size = kWorldSize;
        options.attach_deadline = absl::Now() + absl::Seconds(30);
        AttachedTrainer trainer(options, &blocks);
        FakeTrainer fake(listener, blocks, rank, steps, run.hooks);
        std::thread trainer_thread([&] { outcome.trainer = fake.Run(release_twice); });
        outcome.worker = [&]() -> absl::Status {
          ZS_RETURN_IF_ERROR(trainer.Accept());
          ZS_RETURN_IF_ERROR(trainer.Welcome(
              *engine, 0, /*needs_initial_parameters=*/true, [&](float* values, int64_t elements) {
                return communicator
                    ->Broadcast(values, static_cast<size_t>(elements), comm::ElementType::kFloat32,
                                0)
                    ->Wait();
              }));
          if (!trainer.initialized_parameters()) {
            return absl::InternalError("zero3's Welcome did not initialize the parameters");
          }
          for (int64_t step = 0;; ++step) {
            ZS_ASSIGN_OR_RETURN(const bool more, trainer.AwaitNextStep());
            if (!more) return absl::OkStatus();
            ZS_ASSIGN_OR_RETURN(const double loss, trainer.ForwardBackward(step, *engine, *engine));
            ZS_RETURN_IF_ERROR(engine->SetLearningRate(*trainer.LearningRate()));
            ZS_ASSIGN_OR_RETURN(const engine::StepResult result, engine->Step(loss));
            ZS_RETURN_IF_ERROR(trainer.StepApplied(
                workloads::StepOutcome{result.skipped, result.optimizer_step, result.global_loss,
                                       result.grad_norm, result.clip_coef, result.next_loss_scale},
                *engine));
          }
        }();
        if (!outcome.worker.ok()) {
          trainer.Abort();
          communicator->Abort();
        }
        trainer_thread.join();
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return outcomes;
}

TEST(AttachedZero3Test, GatherReleaseAndStepThroughTheProtocol) {
  constexpr int kSteps = 2;
  const std::vector<RankOutcome> ranks = RunRanks(engine::EngineMode::kZero3, kSteps, false);
  const std::vector<sharding::TensorSpec> tensors = Tensors();
  // Expected: rank 0's initial values, then per step p -= lr * (mean over ranks of the grads).
  std::vector<std::vector<float>> expected(4);
  for (int t = 0; t < 4; ++t) {
    for (int64_t i = 0; i < tensors[t].num_elements; ++i)
      expected[t].push_back(InitialValue(0, t, i));
  }
  for (int rank = 0; rank < kWorldSize; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_TRUE(ranks[rank].worker.ok()) << ranks[rank].worker;
    ASSERT_TRUE(ranks[rank].trainer.status.ok()) << ranks[rank].trainer.status;
    const v1::AttachWelcome& welcome = ranks[rank].trainer.welcome;
    EXPECT_EQ(welcome.mode(), "zero3");
    EXPECT_GE(welcome.gather_pool_block(), 0);
    EXPECT_GT(welcome.gather_pool_bytes(), 0);
    for (const v1::AttachedTensorLayout& layout : welcome.tensors()) {
      EXPECT_EQ(layout.param_block(), -1) << layout.name() << ": zero3 has no full parameters";
      EXPECT_EQ(layout.grad_block(), -1) << layout.name();
      EXPECT_FALSE(layout.segment_ends().empty()) << layout.name();
    }
  }
  for (int step = 0; step <= kSteps; ++step) {
    for (int rank = 0; rank < kWorldSize; ++rank) {
      for (int t = 0; t < 4; ++t) {
        const std::vector<float>& got = ranks[rank].trainer.values[step][t];
        ASSERT_EQ(got.size(), expected[t].size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], expected[t][i], 1e-4)
              << "step " << step << " rank " << rank << " tensor " << tensors[t].name << "[" << i
              << "]";
        }
      }
    }
    for (int t = 0; t < 4; ++t) {
      for (size_t i = 0; i < expected[t].size(); ++i) {
        const int64_t element = static_cast<int64_t>(i);
        const float mean = (Gradient(0, t, element) + Gradient(1, t, element)) / 2;
        expected[t][i] -= static_cast<float>(kLr) * mean;
      }
    }
  }
}

// Both ranks' trainers release module "0" twice. The rank that gets there first fails naming
// the tensor (its trainer reads the error as the answer to its next request) and aborts its
// communicator, which may reach the other rank first: every rank fails, and one names it.
TEST(AttachedZero3Test, ReleasingATensorNotHeldFailsTheRunNamingIt) {
  const std::vector<RankOutcome> ranks = RunRanks(engine::EngineMode::kZero3, 1, true);
  int named = 0;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    EXPECT_FALSE(ranks[rank].worker.ok());
    if (absl::IsFailedPrecondition(ranks[rank].worker) &&
        absl::StrContains(ranks[rank].worker.message(), "tensor 0.weight is not held")) {
      ++named;
      EXPECT_TRUE(absl::StrContains(ranks[rank].trainer.release_error, "0.weight is not held"))
          << ranks[rank].trainer.release_error;
    }
  }
  EXPECT_GE(named, 1);
}

// ---- A peer holds back one bucket's all-gather ----

// How long a held all-gather waits for its gate before it goes ahead anyway (then the test
// fails, naming it, instead of hanging).
constexpr absl::Duration kGateTimeout = absl::Seconds(20);

// Forwards every collective to the rank's Gloo communicator and watches the all-gathers of one
// bucket, told apart by their piece size: it keeps the latest one's Work, and once Arm()ed it
// holds the next one back, before issuing it, until `gate` is notified (or kGateTimeout passes:
// then timed_out()).
//
// Thread contract: the collectives on the rank's worker thread; set_inner before them; the
// rest from any thread.
class BucketGateCommunicator : public comm::Communicator {
 public:
  BucketGateCommunicator(size_t piece_elems, absl::Notification* gate)
      : piece_elems_(piece_elems), gate_(gate) {}

  void set_inner(comm::Communicator* inner) { inner_ = inner; }
  // The next all-gather of the bucket waits for the gate.
  void Arm() {
    absl::MutexLock lock(&mu_);
    armed_ = true;
  }
  // All-gathers of the bucket issued so far, and whether the latest one is done.
  int64_t issued() const {
    absl::MutexLock lock(&mu_);
    return issued_;
  }
  bool latest_done() const {
    absl::MutexLock lock(&mu_);
    return latest_ != nullptr && latest_->Done();
  }
  // How many all-gathers waited at the gate, and whether one gave up waiting.
  int64_t held() const {
    absl::MutexLock lock(&mu_);
    return held_;
  }
  bool timed_out() const {
    absl::MutexLock lock(&mu_);
    return timed_out_;
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
    if (piece_count != piece_elems_) {
      return inner_->AllGatherInPlace(buffer, piece_count, type, options);
    }
    bool hold = false;
    {
      absl::MutexLock lock(&mu_);
      std::swap(hold, armed_);
      if (hold) ++held_;
    }
    if (hold && !gate_->WaitForNotificationWithTimeout(kGateTimeout)) {
      absl::MutexLock lock(&mu_);
      timed_out_ = true;
    }
    std::shared_ptr<comm::Work> gather =
        inner_->AllGatherInPlace(buffer, piece_count, type, options);
    absl::MutexLock lock(&mu_);
    ++issued_;
    latest_ = gather;
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

  const size_t piece_elems_;
  absl::Notification* const gate_;
  comm::Communicator* inner_ = nullptr;
  mutable absl::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  bool timed_out_ ABSL_GUARDED_BY(mu_) = false;
  int64_t issued_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<comm::Work> latest_ ABSL_GUARDED_BY(mu_);
};

// The modules in two buckets: "0" (forward's first) in bucket 1, "1" in bucket 0. After step 0
// the engine prefetches the next forward's modules in the order it recorded ("0", then "1"), so
// at step 1 both all-gathers are issued before the trainer asks for "0" (and were they not, the
// gather of "0" queues the next module's before it waits for its own). Rank 1 holds back its
// next all-gather of "1"'s bucket (armed by its trainer before step 0's step request, so the
// held one is that prefetch); rank 0's trainer gathers "0", and only once it has the values does
// it let rank 1 go on, then gathers "1".
//
// Fails when a gather's answer waits for more than the module's own buckets (for every gather in
// flight, say): "0"'s answer then comes only after the hold gave up (timed_out) and "1"'s
// all-gather is done by then; when nothing of "1" was in flight at that moment (no prefetch: the
// test would prove nothing); or when a module's values, "1"'s above all, are not exactly rank 0's
// initial values after one SGD step on both ranks (a half-gathered window).
TEST(AttachedZero3Test, AForwardWaitsForExactlyItsOwnModule) {
  constexpr int kSteps = 2;
  constexpr int kHeldStep = 1;
  const std::vector<sharding::TensorSpec> tensors = TensorsInTwoBuckets();
  const sharding::ShardPlan plan = Plan(tensors);
  // Module "1" (tensors 0, 1) in one bucket, "0" (2, 3) in another, of another piece size.
  ASSERT_EQ(plan.num_buckets(), 2);
  for (int t = 0; t < 4; ++t) {
    ASSERT_EQ(plan.placement(t).num_buckets, 1) << tensors[t].name;
    ASSERT_EQ(plan.placement(t).first_bucket, t < 2 ? 0 : 1) << tensors[t].name;
  }
  const size_t held_piece = static_cast<size_t>(plan.buckets()[0].piece_elems);
  ASSERT_NE(plan.buckets()[1].piece_elems, plan.buckets()[0].piece_elems);

  absl::Notification gate;
  std::vector<std::unique_ptr<BucketGateCommunicator>> gates;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    gates.push_back(std::make_unique<BucketGateCommunicator>(held_piece, &gate));
  }
  // What rank 0's trainer saw once it had module "0" of the held step.
  struct Seen {
    bool reached = false;
    int64_t issued = 0;     // rank 0's all-gathers of "1"'s bucket
    bool done = true;       // the latest of them
    bool timed_out = true;  // rank 1's hold gave up
  };
  Seen seen;
  RunOptions run;
  run.tensors = tensors;
  run.communicator = [&](int rank, comm::Communicator* gloo) -> comm::Communicator* {
    gates[rank]->set_inner(gloo);
    return gates[rank].get();
  };
  run.hooks.before_step = [&](int rank, int step) {
    if (rank == 1 && step == kHeldStep - 1) gates[1]->Arm();
  };
  run.hooks.between_forward_gathers = [&](int rank, int step) {
    if (rank != 0 || step != kHeldStep) return;
    seen.reached = true;
    seen.issued = gates[0]->issued();
    seen.done = gates[0]->latest_done();
    seen.timed_out = gates[1]->timed_out();
    gate.Notify();
  };
  const std::vector<RankOutcome> ranks = RunRanks(engine::EngineMode::kZero3, kSteps, false, run);
  if (!gate.HasBeenNotified()) gate.Notify();
  for (int rank = 0; rank < kWorldSize; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    ASSERT_TRUE(ranks[rank].worker.ok()) << ranks[rank].worker;
    ASSERT_TRUE(ranks[rank].trainer.status.ok()) << ranks[rank].trainer.status;
  }
  ASSERT_TRUE(seen.reached);
  EXPECT_EQ(gates[1]->held(), 1) << "rank 1 held no all-gather of module 1's bucket back";
  EXPECT_FALSE(seen.timed_out)
      << "module 0 was answered only after rank 1 stopped holding module 1's all-gather";
  // Step 0 gathered "1" once; its prefetch after step 0 once more, before forward began.
  EXPECT_EQ(seen.issued, 2) << "module 1's all-gather was not issued before module 0's answer";
  EXPECT_FALSE(seen.done) << "module 1's all-gather had completed when module 0 was answered";
  // Step 1's forward read rank 0's initial values after one SGD step on the mean gradient,
  // exactly (every value is a small multiple of 1/64), on both ranks.
  for (int rank = 0; rank < kWorldSize; ++rank) {
    for (int t = 0; t < 4; ++t) {
      const std::vector<float>& got = ranks[rank].trainer.values[kHeldStep][t];
      ASSERT_EQ(got.size(), static_cast<size_t>(tensors[t].num_elements));
      for (int64_t i = 0; i < tensors[t].num_elements; ++i) {
        const float mean = (Gradient(0, t, i) + Gradient(1, t, i)) / 2;
        const float expected = InitialValue(0, t, i) - static_cast<float>(kLr) * mean;
        ASSERT_EQ(got[i], expected) << "rank " << rank << " tensor " << tensors[t].name << "[" << i
                                    << "] in step " << kHeldStep << "'s forward";
      }
    }
  }
}

}  // namespace
}  // namespace zeroshard::attach
