// Attached zero3 (issue 39), the worker's side end to end in one process: two ranks, each a real
// zero3 Engine over Gloo with its memory in memfd blocks (SharedMemoryBacking) and an
// AttachedTrainer on a real unix socket, and per rank a trainer thread that speaks the protocol
// as zeroshard.torch does: the initial values one tensor at a time, then per step a gather and a
// release around each module's forward and backward, gradient segments, and step.
//
// It checks what the trainer sees: no parameter block in the welcome, rank 0's initial values
// on both ranks (the broadcast), gathered values inside the gather pool's block, the SGD update
// after a step, and a clear error for a release of a tensor not held.
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

sharding::ShardPlan Plan() {
  absl::StatusOr<sharding::ShardPlan> plan =
      sharding::ShardPlan::Create(Tensors(), kWorldSize, PlanOptions());
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

// The trainer of `rank`: `steps` steps of forward (module "0" then "1") and backward ("1" then
// "0"), each module gathered before and released after, then one more gather of everything,
// and finish. With `release_twice`, the first step releases module "0" twice (an error).
class FakeTrainer {
 public:
  FakeTrainer(const Listener& listener, SharedMemoryBacking& blocks, int rank, int steps)
      : listener_(listener), blocks_(blocks), rank_(rank), steps_(steps) {}

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
      ZS_RETURN_IF_ERROR(Gather({0, 1}, &view.values[step]));
      ZS_RETURN_IF_ERROR(Release({0, 1}));
      // Backward: "1" then "0", each gathered again; gradients by segment in plan order.
      ZS_RETURN_IF_ERROR(Gather({0, 1}));
      ZS_RETURN_IF_ERROR(HandOver({0, 1}));
      ZS_RETURN_IF_ERROR(Release({0, 1}));
      ZS_RETURN_IF_ERROR(Gather({2, 3}));
      ZS_RETURN_IF_ERROR(HandOver({2, 3}));
      ZS_RETURN_IF_ERROR(Release({2, 3}));
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
  std::unique_ptr<FrameSocket> socket_;
  v1::AttachWelcome welcome_;
  int32_t pool_block_ = -1;
};

struct RankOutcome {
  absl::Status worker;
  TrainerView trainer;
};

// Runs both ranks: the worker's side as the daemon's run loop does (engine_training_run.cc),
// each rank's trainer on its own thread.
std::vector<RankOutcome> RunRanks(engine::EngineMode mode, int steps, bool release_twice) {
  const sharding::ShardPlan plan = Plan();
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
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> engine,
                            engine::Engine::Create(plan, rank, config, communicator.get()));
        AttachedTrainerOptions options;
        options.listen_fd = listener.fd();
        options.job_id = "job-000001";
        options.rank = rank;
        options.world_size = kWorldSize;
        options.attach_deadline = absl::Now() + absl::Seconds(30);
        AttachedTrainer trainer(options, &blocks);
        FakeTrainer fake(listener, blocks, rank, steps);
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

}  // namespace
}  // namespace zeroshard::attach
