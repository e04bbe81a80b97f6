// zero3 against zero2, threads as ranks over Gloo (TCP loopback) and over the shared-memory link:
// bitwise equal parameters after every step for SGD, Adam, AdamW and Adagrad in fp32, bf16 (fp32
// masters) and fp16 (dynamic loss scaling) at W = 1..4; a layer never reads a half-gathered
// window while a peer holds its gathers back; a change of the layer order between steps; the
// gather pool's bound as the counting allocator sees it; the pool's errors; checkpoints across
// zero2 and zero3 and across world sizes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "sharding/gather_windows.h"
#include "sharding/model_catalog.h"
#include "sharding/shard_planner.h"
#include "worker/comm/communicator.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/engine/element_convert.h"
#include "worker/engine/engine.h"
#include "worker/workloads/teacher_student_mlp.h"
#include "worker/workloads/testing/least_squares_workload.h"
#include "worker/workloads/workload.h"

namespace zeroshard::engine {
namespace {

using comm::Transport;
using numerics::DType;
using ::zeroshard::comm::testing::RunOnRankThreads;
using ::zeroshard::workloads::testing::LeastSquaresWorkload;

constexpr int64_t kGlobalBatch = 12;  // divisible by every W tested
constexpr uint64_t kSeed = 5;

// Three Linear modules ("4", "2", "0"); at the minimum bucket size the 80 x 48 and 64 x 80
// weights span four and six buckets, and neighbouring modules share their boundary buckets.
const std::vector<int64_t>& LayerSizes() {
  static const std::vector<int64_t> sizes = {48, 80, 64, 16};
  return sizes;
}

// The catalog's tensors for `sizes`, weights decayed (for AdamW), biases not.
std::vector<sharding::TensorSpec> LayerTensors(const std::vector<int64_t>& sizes) {
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors = sharding::TensorsForLayerSizes(sizes);
  EXPECT_TRUE(tensors.ok()) << tensors.status();
  if (!tensors.ok()) return {};
  for (sharding::TensorSpec& spec : *tensors) {
    spec.weight_decay = absl::EndsWith(spec.name, ".weight") ? 1e-2 : 0.0;
  }
  return *std::move(tensors);
}

sharding::ShardPlan PlanFor(const std::vector<sharding::TensorSpec>& tensors, int64_t world_size) {
  sharding::ShardPlanOptions options;
  options.bucket_elems = sharding::kMinBucketElems;
  absl::StatusOr<sharding::ShardPlan> plan =
      sharding::ShardPlan::Create(tensors, world_size, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

bool SameDouble(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> Connect(int rank, int64_t world_size,
                                                                comm::Store* store,
                                                                Transport transport) {
  comm::GlooCommunicatorOptions options;
  options.rank = rank;
  options.world_size = static_cast<int>(world_size);
  options.store = store;
  options.transport = transport;
  options.rendezvous_timeout = absl::Seconds(30);
  return comm::GlooCommunicator::Create(options);
}

// ---- Workloads ----

// The least-squares workload with a layer order chosen per step: it reads the tensor list
// backwards (forward order, as LeastSquaresWorkload does) or, on the steps `forwards` names,
// forwards; each tensor is widened and released at once. Keeps what each step read.
//
// Thread contract: one rank's thread.
class ReorderingLeastSquares : public workloads::Workload {
 public:
  ReorderingLeastSquares(std::vector<sharding::TensorSpec> tensors, int64_t rank,
                         int64_t world_size, std::function<bool(int64_t step)> forwards)
      : inner_(tensors, kGlobalBatch, rank, world_size, kSeed),
        num_tensors_(static_cast<int64_t>(tensors.size())),
        rank_(rank),
        local_batch_(kGlobalBatch / world_size),
        forwards_(std::move(forwards)),
        widened_(tensors.size()) {
    for (const sharding::TensorSpec& spec : tensors) sizes_.push_back(spec.num_elements);
  }

  absl::Status InitialParameters(int64_t tensor, absl::Span<float> out) const override {
    return inner_.InitialParameters(tensor, out);
  }

  absl::StatusOr<double> ForwardBackward(int64_t step, workloads::ParameterSource& params,
                                         workloads::GradientSink& sink) override {
    const bool forwards = forwards_ != nullptr && forwards_(step);
    for (int64_t k = 0; k < num_tensors_; ++k) {
      const int64_t t = forwards ? k : num_tensors_ - 1 - k;
      ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters stored, params.Parameters(t));
      if (stored.size != sizes_[t]) {
        return absl::InternalError(absl::StrCat("tensor ", t, " has ", stored.size, " elements"));
      }
      widened_[t].resize(stored.size);
      workloads::WidenParameters(stored, 0, stored.size, widened_[t].data());
      ZS_RETURN_IF_ERROR(params.ReleaseParameters(t));
    }
    std::vector<float> read;
    for (const std::vector<float>& values : widened_) {
      read.insert(read.end(), values.begin(), values.end());
    }
    reads_.push_back(std::move(read));
    const double loss = inner_.LossAndGradients(
        step, rank_ * local_batch_, (rank_ + 1) * local_batch_,
        [&](int64_t t) { return absl::MakeConstSpan(widened_[t]); }, &gradients_);
    const float scale = static_cast<float>(sink.loss_scale());
    for (int64_t t = 0; t < num_tensors_; ++t) {
      for (float& value : gradients_[t]) value *= scale;
      ZS_RETURN_IF_ERROR(workloads::CopyGradientToSink(sink, t, gradients_[t]));
    }
    return loss;
  }

  int64_t BufferBytes() const override { return inner_.BufferBytes(); }

  // Every tensor as step s read it (widened, tensor-list order, concatenated).
  const std::vector<std::vector<float>>& reads() const { return reads_; }

 private:
  LeastSquaresWorkload inner_;
  const int64_t num_tensors_;
  const int64_t rank_;
  const int64_t local_batch_;
  const std::function<bool(int64_t)> forwards_;
  std::vector<int64_t> sizes_;
  std::vector<std::vector<float>> widened_;
  std::vector<std::vector<float>> gradients_;
  std::vector<std::vector<float>> reads_;
};

enum class WorkloadKind { kMlp, kLeastSquares, kReordering };

const char* WorkloadName(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::kMlp:
      return "mlp";
    case WorkloadKind::kLeastSquares:
      return "least_squares";
    case WorkloadKind::kReordering:
      return "reordering";
  }
  return "?";
}

// ---- The pool's bound, checked at every Parameters() ----

// The engine as the workload's ParameterSource, checking on every call (zero3) that the gather
// pool holds exactly its windows' bytes by the allocator's count, that the parameters and the
// total never passed what creation allocated, and that every tensor handed out lies, with its
// whole module (computed back from the tensor's offset in its module), inside the pool's arena
// of windows() x window_bytes().
//
// Thread contract: the rank's owner thread.
class PoolCheckingSource : public workloads::ParameterSource {
 public:
  explicit PoolCheckingSource(Engine& engine)
      : engine_(engine), geometry_(sharding::GatherWindowsFor(engine.plan())) {
    const MemoryReport created = engine.Memory();
    created_total_ = created.total();
    created_peak_ = created.peak_total_bytes;
  }

  absl::StatusOr<workloads::StoredParameters> Parameters(int64_t tensor) override {
    ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters stored, engine_.Parameters(tensor));
    const GatherPool* pool = engine_.gather_pool();
    if (pool != nullptr) {
      CheckBound();
      const int64_t module = geometry_.tensor_module[tensor];
      const int64_t offset =
          engine_.plan().placement(tensor).flat_offset - geometry_.modules[module].flat_begin;
      const int element = numerics::DTypeSize(stored.dtype);
      const char* const module_begin = static_cast<const char*>(stored.data) - offset * element;
      const char* const module_end =
          module_begin + geometry_.modules[module].span_elems() * element;
      EXPECT_GE(module_begin, pool->arena()) << "tensor " << tensor << " lies before the pool";
      EXPECT_LE(module_end, pool->arena() + pool->windows() * pool->window_bytes())
          << "tensor " << tensor << "'s module lies past the pool's end";
      ++checked_calls_;
    }
    return stored;
  }
  absl::Status ReleaseParameters(int64_t tensor) override {
    return engine_.ReleaseParameters(tensor);
  }

  // The bound between steps too.
  void CheckBound() const {
    const GatherPool* pool = engine_.gather_pool();
    if (pool == nullptr) return;
    const MemoryReport memory = engine_.Memory();
    EXPECT_EQ(memory.of(MemoryCategory::kGatherPool), pool->windows() * pool->window_bytes());
    EXPECT_EQ(memory.of(MemoryCategory::kParams),
              engine_.view().owned_elems() * numerics::DTypeSize(engine_.config().param_dtype));
    // Nothing was allocated after creation, not even for a moment.
    EXPECT_EQ(memory.total(), created_total_);
    EXPECT_EQ(memory.peak_total_bytes, created_peak_);
  }

  int64_t checked_calls() const { return checked_calls_; }

 private:
  Engine& engine_;
  const sharding::GatherWindows geometry_;
  int64_t created_total_ = 0;
  int64_t created_peak_ = 0;
  int64_t checked_calls_ = 0;
};

// ---- Runs ----

struct RunOptions {
  int64_t world_size = 2;
  EngineConfig config;
  Transport transport = Transport::kTcp;
  WorkloadKind workload = WorkloadKind::kMlp;
  std::vector<int64_t> layer_sizes = LayerSizes();
  int64_t steps = 4;
  // ParametersOnHost of every tensor on every rank after every step (zero3: collective).
  bool params_every_step = true;
  // kReordering: the steps that read the tensor list forwards.
  std::function<bool(int64_t)> forwards;
  // kLeastSquares: the last rank's gradient holds an Inf at this step (-1: none).
  int64_t infinity_step = -1;
};

struct RunResult {
  // params[s][r]: every tensor of rank r after step s (only the last step's without
  // params_every_step), concatenated.
  std::vector<std::vector<std::vector<float>>> params;
  std::vector<std::vector<StepResult>> steps_by_rank;
  std::vector<std::vector<std::vector<float>>> reads_by_rank;  // kReordering's reads
  std::vector<MemoryReport> memory_by_rank;                    // after the last step
  // Rank 0's gather pool (zero3).
  int64_t windows = 0;
  int64_t window_bytes = 0;
  int64_t order_changes = 0;
  int64_t buckets_gathered = 0;
  int64_t buckets_shared = 0;
  int64_t buckets_copied = 0;
  int64_t checked_calls = 0;
};

RunResult RunEngines(const RunOptions& run_options) {
  const int64_t world_size = run_options.world_size;
  const std::vector<sharding::TensorSpec> tensors = LayerTensors(run_options.layer_sizes);
  const sharding::ShardPlan plan = PlanFor(tensors, world_size);
  comm::InMemoryStore store;
  RunResult run;
  run.params.resize(run_options.steps);
  for (auto& by_rank : run.params) by_rank.resize(world_size);
  run.steps_by_rank.resize(world_size);
  run.reads_by_rank.resize(world_size);
  run.memory_by_rank.resize(world_size);
  const absl::Status status =
      RunOnRankThreads(static_cast<int>(world_size), [&](int rank) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                            Connect(rank, world_size, &store, run_options.transport));
        if (world_size > 1) EXPECT_EQ(communicator->transport(), run_options.transport);
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::Create(plan, rank, run_options.config, communicator.get()));
        std::unique_ptr<workloads::Workload> workload;
        ReorderingLeastSquares* reordering = nullptr;
        switch (run_options.workload) {
          case WorkloadKind::kMlp: {
            workloads::TeacherStudentMlpOptions options;
            options.layer_sizes = run_options.layer_sizes;
            options.seed = 3;
            options.global_batch = kGlobalBatch;
            options.world_size = world_size;
            options.rank = rank;
            ZS_ASSIGN_OR_RETURN(workload, workloads::TeacherStudentMlp::Create(options));
            break;
          }
          case WorkloadKind::kLeastSquares: {
            auto least_squares = std::make_unique<LeastSquaresWorkload>(tensors, kGlobalBatch, rank,
                                                                        world_size, kSeed);
            if (rank == world_size - 1) {
              least_squares->InjectInfinityAtStep(run_options.infinity_step);
            }
            workload = std::move(least_squares);
            break;
          }
          case WorkloadKind::kReordering: {
            auto owned = std::make_unique<ReorderingLeastSquares>(tensors, rank, world_size,
                                                                  run_options.forwards);
            reordering = owned.get();
            workload = std::move(owned);
            break;
          }
        }
        ZS_RETURN_IF_ERROR(engine->InitializeParameters(
            [&](int64_t t, absl::Span<float> out) { return workload->InitialParameters(t, out); }));
        PoolCheckingSource source(*engine);
        for (int64_t step = 0; step < run_options.steps; ++step) {
          ZS_ASSIGN_OR_RETURN(const double loss, workload->ForwardBackward(step, source, *engine));
          ZS_ASSIGN_OR_RETURN(const StepResult result, engine->Step(loss));
          run.steps_by_rank[rank].push_back(result);
          source.CheckBound();
          if (run_options.params_every_step || step + 1 == run_options.steps) {
            for (int64_t t = 0; t < plan.num_tensors(); ++t) {
              ZS_ASSIGN_OR_RETURN(const std::vector<float> values, engine->ParametersOnHost(t));
              std::vector<float>& all = run.params[step][rank];
              all.insert(all.end(), values.begin(), values.end());
            }
            source.CheckBound();
          }
        }
        if (reordering != nullptr) run.reads_by_rank[rank] = reordering->reads();
        run.memory_by_rank[rank] = engine->Memory();
        if (rank == 0 && engine->gather_pool() != nullptr) {
          run.windows = engine->gather_pool()->windows();
          run.window_bytes = engine->gather_pool()->window_bytes();
          run.order_changes = engine->gather_pool()->order_changes();
          run.buckets_gathered = engine->gather_pool()->buckets_gathered();
          run.buckets_shared = engine->gather_pool()->buckets_shared();
          run.buckets_copied = engine->gather_pool()->buckets_copied();
          run.checked_calls = source.checked_calls();
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return run;
}

// zero3's run equals zero2's bit for bit after every step it recorded, on every rank, and its
// ranks agree; so do the step results. Stops at the first differing step.
void ExpectBitwiseEqualRuns(const RunResult& zero2, const RunResult& zero3) {
  ASSERT_EQ(zero2.params.size(), zero3.params.size());
  ASSERT_EQ(zero2.steps_by_rank.size(), zero3.steps_by_rank.size());
  for (size_t s = 0; s < zero2.params.size(); ++s) {
    for (size_t r = 0; r < zero2.params[s].size(); ++r) {
      ASSERT_TRUE(BitwiseEqual(zero2.params[s][r], zero3.params[s][r]))
          << "step " << s << " rank " << r << ": zero3's parameters differ from zero2's";
      ASSERT_TRUE(BitwiseEqual(zero3.params[s][0], zero3.params[s][r]))
          << "step " << s << ": zero3's rank " << r << " differs from rank 0";
    }
  }
  for (size_t r = 0; r < zero2.steps_by_rank.size(); ++r) {
    const std::vector<StepResult>& a = zero2.steps_by_rank[r];
    const std::vector<StepResult>& b = zero3.steps_by_rank[r];
    ASSERT_EQ(a.size(), b.size());
    for (size_t s = 0; s < a.size(); ++s) {
      SCOPED_TRACE(absl::StrCat("rank ", r, " step ", s));
      EXPECT_EQ(a[s].skipped, b[s].skipped);
      EXPECT_EQ(a[s].optimizer_step, b[s].optimizer_step);
      EXPECT_TRUE(SameDouble(a[s].global_loss, b[s].global_loss))
          << a[s].global_loss << " vs " << b[s].global_loss;
      EXPECT_TRUE(SameDouble(a[s].grad_norm, b[s].grad_norm))
          << a[s].grad_norm << " vs " << b[s].grad_norm;
      EXPECT_TRUE(SameDouble(a[s].clip_coef, b[s].clip_coef));
      EXPECT_EQ(a[s].loss_scale, b[s].loss_scale);
      EXPECT_EQ(a[s].next_loss_scale, b[s].next_loss_scale);
    }
  }
}

// The run trained: some parameter moved between the first and the last recorded step.
void ExpectTrained(const RunResult& run) {
  ASSERT_FALSE(run.params.empty());
  EXPECT_FALSE(BitwiseEqual(run.params.front()[0], run.params.back()[0]));
}

// ---- 1. Bitwise zero3 == zero2 after every step ----

enum class Precision { kFp32, kBf16, kFp16 };

EngineConfig ConfigFor(kernels::OptimizerKind kind, Precision precision) {
  EngineConfig config;
  config.optimizer.kind = kind;
  switch (kind) {
    case kernels::OptimizerKind::kSgd:
      config.optimizer.lr = 0.05;
      config.optimizer.momentum = 0.9;
      config.clip_grad_norm = 0.5;  // clipping in every mode alike
      break;
    case kernels::OptimizerKind::kAdagrad:
      config.optimizer.lr = 0.05;
      break;
    default:
      config.optimizer.lr = 1e-2;
      break;
  }
  switch (precision) {
    case Precision::kFp32:
      break;
    case Precision::kBf16:
      config.param_dtype = DType::kBFloat16;  // fp32 masters
      config.grad_dtype = DType::kBFloat16;
      config.reduce_dtype = DType::kFloat32;
      break;
    case Precision::kFp16:
      config.param_dtype = DType::kFloat16;
      config.grad_dtype = DType::kFloat16;
      config.loss_scale.initial_scale = 1024.0;
      config.loss_scale.dynamic = true;
      config.loss_scale.growth_interval = 2;
      break;
  }
  return config;
}

using Zero3Case = std::tuple<kernels::OptimizerKind, Precision, Transport>;

class Zero3BitwiseTest : public ::testing::TestWithParam<Zero3Case> {};

// Fails when a zero3 layer reads a window holding anything but the current parameters (a
// window kept across an update, a shared boundary bucket copied from the wrong place, a
// half-gathered bucket, the owned piece put at another rank's place), when the update of the
// owned pieces differs from zero2's, or when the pool grows (PoolCheckingSource).
TEST_P(Zero3BitwiseTest, EqualsZero2AfterEveryStep) {
  const auto [kind, precision, transport] = GetParam();
  for (const WorkloadKind workload : {WorkloadKind::kMlp, WorkloadKind::kLeastSquares}) {
    for (int64_t world_size = 1; world_size <= 4; ++world_size) {
      SCOPED_TRACE(absl::StrCat(WorkloadName(workload), " W=", world_size));
      RunOptions options;
      options.world_size = world_size;
      options.transport = transport;
      options.workload = workload;
      options.config = ConfigFor(kind, precision);
      if (precision == Precision::kFp16 && workload == WorkloadKind::kLeastSquares) {
        options.steps = 5;
        options.infinity_step = 2;  // a skipped step: zero3 ends it as any other
      }
      options.config.mode = EngineMode::kZero2;
      const RunResult zero2 = RunEngines(options);
      options.config.mode = EngineMode::kZero3;
      const RunResult zero3 = RunEngines(options);
      ExpectBitwiseEqualRuns(zero2, zero3);
      ExpectTrained(zero3);
      EXPECT_GT(zero3.checked_calls, 0);
      EXPECT_EQ(zero3.windows, 2);  // the default: twice the largest span
      if (options.infinity_step >= 0) {
        EXPECT_TRUE(zero3.steps_by_rank[0][options.infinity_step].skipped);
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<Zero3Case>& info) {
  const auto [kind, precision, transport] = info.param;
  const char* kinds[] = {"Sgd", "Adam", "AdamW", "Adagrad", "Lion"};
  const char* precisions[] = {"Fp32", "Bf16", "Fp16"};
  return absl::StrCat(kinds[static_cast<int>(kind)], precisions[static_cast<int>(precision)],
                      transport == Transport::kShm ? "Shm" : "Tcp");
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Zero3BitwiseTest,
                         ::testing::Combine(::testing::Values(kernels::OptimizerKind::kSgd,
                                                              kernels::OptimizerKind::kAdam,
                                                              kernels::OptimizerKind::kAdamW,
                                                              kernels::OptimizerKind::kAdagrad),
                                            ::testing::Values(Precision::kFp32, Precision::kBf16,
                                                              Precision::kFp16),
                                            ::testing::Values(Transport::kTcp, Transport::kShm)),
                         CaseName);

// ---- 2. A peer holds its gathers back ----

// Forwards every collective to `inner`. Rank 1 holds each all-gather back for `delay` before
// issuing it, so rank 0's gathers (prefetched by Step() and by each Parameters()) are still
// running when its forward asks for them. (A gate that holds rank 1's gathers until rank 0's
// forward has begun, as engine_param_gather_test does for zero2, deadlocks zero3: Step() waits
// on the host inside GatherPool::StartStep when the second prefetched module shares a bucket
// with the first: GatherPool::Fill waits for the neighbour window's gather of that bucket to copy
// it.) Rank 0 keeps a handle on every
// all-gather it issued, to count those still running.
//
// Thread contract: the collectives on the rank's owner thread; Outstanding() too.
class HeldBackGatherCommunicator : public comm::Communicator {
 public:
  HeldBackGatherCommunicator(comm::Communicator* inner, absl::Duration delay)
      : inner_(inner), delay_(delay) {}

  // The all-gathers issued so far that are not done.
  int64_t Outstanding() const {
    int64_t outstanding = 0;
    for (const std::shared_ptr<comm::Work>& work : gathers_) outstanding += work->Done() ? 0 : 1;
    return outstanding;
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
    if (rank() == 1) absl::SleepFor(delay_);  // a slow peer, not a wait for state
    std::shared_ptr<comm::Work> gather =
        inner_->AllGatherInPlace(buffer, piece_count, type, options);
    if (rank() == 0) gathers_.push_back(gather);
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
  const absl::Duration delay_;
  std::vector<std::shared_ptr<comm::Work>> gathers_;
};

// Rank 0's view of the engine: on the step's first call it counts the all-gathers still running;
// every call copies what Parameters() handed out at the moment it returned.
//
// Thread contract: rank 0's owner thread.
class RecordingSource : public workloads::ParameterSource {
 public:
  RecordingSource(Engine& engine, const HeldBackGatherCommunicator& communicator)
      : engine_(engine), communicator_(communicator) {}

  void StartStep() {
    first_call_ = true;
    reads_.clear();
  }

  absl::StatusOr<workloads::StoredParameters> Parameters(int64_t tensor) override {
    if (first_call_) {
      outstanding_at_entry_.push_back(communicator_.Outstanding());
      first_call_ = false;
    }
    ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters stored, engine_.Parameters(tensor));
    std::vector<float> values(stored.size);
    workloads::WidenParameters(stored, 0, stored.size, values.data());
    reads_.push_back({tensor, std::move(values)});
    return stored;
  }
  absl::Status ReleaseParameters(int64_t tensor) override {
    return engine_.ReleaseParameters(tensor);
  }

  const std::vector<std::pair<int64_t, std::vector<float>>>& reads() const { return reads_; }
  // Per step after the first: the all-gathers running when forward first asked.
  const std::vector<int64_t>& outstanding_at_entry() const { return outstanding_at_entry_; }

 private:
  Engine& engine_;
  const HeldBackGatherCommunicator& communicator_;
  bool first_call_ = false;
  std::vector<std::pair<int64_t, std::vector<float>>> reads_;
  std::vector<int64_t> outstanding_at_entry_;
};

struct HeldBackRun {
  // Rank 0's reads of every step, in call order: (tensor, values as handed out).
  std::vector<std::vector<std::pair<int64_t, std::vector<float>>>> reads;
  std::vector<int64_t> outstanding_at_entry;
  std::vector<std::vector<float>> final_params;  // per rank
};

HeldBackRun TrainWithHeldBackGathers(EngineMode mode, int64_t steps) {
  constexpr int kWorldSize = 2;
  const std::vector<sharding::TensorSpec> tensors = LayerTensors(LayerSizes());
  const sharding::ShardPlan plan = PlanFor(tensors, kWorldSize);
  comm::InMemoryStore store;
  HeldBackRun run;
  run.final_params.resize(kWorldSize);
  const absl::Status status = RunOnRankThreads(kWorldSize, [&](int rank) -> absl::Status {
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> gloo,
                        Connect(rank, kWorldSize, &store, Transport::kTcp));
    HeldBackGatherCommunicator communicator(gloo.get(), absl::Milliseconds(10));
    workloads::TeacherStudentMlpOptions mlp;
    mlp.layer_sizes = LayerSizes();
    mlp.seed = 3;
    mlp.global_batch = kGlobalBatch;
    mlp.world_size = kWorldSize;
    mlp.rank = rank;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<workloads::TeacherStudentMlp> workload,
                        workloads::TeacherStudentMlp::Create(mlp));
    EngineConfig config = ConfigFor(kernels::OptimizerKind::kAdamW, Precision::kFp32);
    config.mode = mode;
    ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(plan, rank, config, &communicator));
    ZS_RETURN_IF_ERROR(engine->InitializeParameters(
        [&](int64_t t, absl::Span<float> out) { return workload->InitialParameters(t, out); }));
    RecordingSource recording(*engine, communicator);
    for (int64_t step = 0; step < steps; ++step) {
      double loss = 0.0;
      if (rank == 0) {
        recording.StartStep();
        ZS_ASSIGN_OR_RETURN(loss, workload->ForwardBackward(step, recording, *engine));
        run.reads.push_back(recording.reads());
      } else {
        ZS_ASSIGN_OR_RETURN(loss, workload->ForwardBackward(step, *engine, *engine));
      }
      // What was read is what the parameters are (zero3: gathered anew, on both ranks alike).
      std::map<int64_t, std::vector<float>> current;
      for (int64_t t = 0; t < plan.num_tensors(); ++t) {
        ZS_ASSIGN_OR_RETURN(current[t], engine->ParametersOnHost(t));
      }
      if (rank == 0) {
        for (const auto& [tensor, values] : recording.reads()) {
          EXPECT_TRUE(BitwiseEqual(values, current[tensor]))
              << EngineModeName(mode) << " step " << step << " tensor " << tensor
              << " was read before its gather completed";
        }
      }
      ZS_RETURN_IF_ERROR(engine->Step(loss).status());
    }
    if (rank == 0) run.outstanding_at_entry = recording.outstanding_at_entry();
    for (int64_t t = 0; t < plan.num_tensors(); ++t) {
      ZS_ASSIGN_OR_RETURN(const std::vector<float> values, engine->ParametersOnHost(t));
      run.final_params[rank].insert(run.final_params[rank].end(), values.begin(), values.end());
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return run;
}

// Fails when Parameters() returns a window whose gathers are still running (the copy taken at
// the return then holds this rank's own piece and another module's or zeros elsewhere, and
// differs from ParametersOnHost's values and from zero2's reads), or when zero3 prefetches
// nothing after a step (no gather outstanding at forward's first call). Timing-dependent (rank
// 1's delay makes the gathers outstanding): the target is exclusive.
TEST(Zero3HeldBackGatherTest, ALayerNeverReadsAHalfGatheredWindow) {
  constexpr int64_t kSteps = 4;
  const HeldBackRun zero2 = TrainWithHeldBackGathers(EngineMode::kZero2, kSteps);
  const HeldBackRun zero3 = TrainWithHeldBackGathers(EngineMode::kZero3, kSteps);
  ASSERT_EQ(zero2.reads.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(zero3.reads.size(), static_cast<size_t>(kSteps));
  for (int64_t s = 0; s < kSteps; ++s) {
    // The MLP asks for each weight twice (forward, backward) and each bias once.
    ASSERT_EQ(zero2.reads[s].size(), zero3.reads[s].size()) << "step " << s;
    for (size_t k = 0; k < zero3.reads[s].size(); ++k) {
      EXPECT_EQ(zero2.reads[s][k].first, zero3.reads[s][k].first);
      EXPECT_TRUE(BitwiseEqual(zero2.reads[s][k].second, zero3.reads[s][k].second))
          << "step " << s << " read " << k << " (tensor " << zero3.reads[s][k].first
          << ") differs from zero2's";
    }
  }
  // Forward began each step with gathers in flight that only rank 1 could complete.
  ASSERT_EQ(zero3.outstanding_at_entry.size(), static_cast<size_t>(kSteps));
  for (int64_t s = 1; s < kSteps; ++s) {
    EXPECT_GT(zero3.outstanding_at_entry[s], 0) << "step " << s;
    EXPECT_GT(zero2.outstanding_at_entry[s], 0) << "step " << s;
  }
  EXPECT_TRUE(BitwiseEqual(zero3.final_params[0], zero3.final_params[1]));
  EXPECT_TRUE(BitwiseEqual(zero2.final_params[0], zero3.final_params[0]));
}

// ---- 3. The layer order changes between steps ----

// Steps 3, 4 and 5 read the layers forwards, the others backwards: zero3 records the order of
// step 0, departs at step 3 (prefetching modules it then does not read first) and again at step
// 6, and stays bitwise equal to zero2. Fails when a departure is not handled (a prefetched window
// read for another module, or a wait for a gather never issued on the peer: a timeout) or not
// counted, or when a step that follows the record is counted.
TEST(Zero3OrderTest, AChangedLayerOrderStaysBitwiseEqualAndIsCounted) {
  for (const int64_t world_size : {2, 3}) {
    for (const Transport transport : {Transport::kTcp, Transport::kShm}) {
      SCOPED_TRACE(absl::StrCat("W=", world_size, " ", comm::TransportName(transport)));
      RunOptions options;
      options.world_size = world_size;
      options.transport = transport;
      options.workload = WorkloadKind::kReordering;
      options.steps = 8;
      options.params_every_step = false;  // ParametersOnHost between steps is part of the order
      options.forwards = [](int64_t step) { return step >= 3 && step < 6; };
      options.config = ConfigFor(kernels::OptimizerKind::kAdam, Precision::kFp32);
      options.config.mode = EngineMode::kZero2;
      const RunResult zero2 = RunEngines(options);
      options.config.mode = EngineMode::kZero3;
      const RunResult zero3 = RunEngines(options);
      ExpectBitwiseEqualRuns(zero2, zero3);
      // What every step read (the parameters after the previous step), on every rank.
      for (int64_t r = 0; r < world_size; ++r) {
        ASSERT_EQ(zero3.reads_by_rank[r].size(), 8u);
        for (size_t s = 0; s < 8; ++s) {
          EXPECT_TRUE(BitwiseEqual(zero2.reads_by_rank[r][s], zero3.reads_by_rank[r][s]))
              << "rank " << r << " step " << s;
        }
      }
      EXPECT_EQ(zero3.order_changes, 2);
      // The same workload in one order throughout departs never.
      options.forwards = nullptr;
      EXPECT_EQ(RunEngines(options).order_changes, 0);
    }
  }
}

// ---- 4. The pool's bound ----

// Twelve equal layers at W = 4: zero3's peak (owned parameters plus two windows) is below
// zero2's (the whole parameter copy), and the pool is exactly its windows at every call and
// between steps (PoolCheckingSource). Fails when the pool allocates beyond its windows or the
// engine keeps a full parameter copy in zero3.
TEST(Zero3PoolTest, ThePoolIsItsWindowsAndZero3PeaksBelowZero2) {
  RunOptions options;
  options.world_size = 4;
  options.layer_sizes = std::vector<int64_t>(13, 32);
  options.steps = 3;
  options.config = ConfigFor(kernels::OptimizerKind::kAdamW, Precision::kFp32);
  options.config.mode = EngineMode::kZero2;
  const RunResult zero2 = RunEngines(options);
  options.config.mode = EngineMode::kZero3;
  const RunResult zero3 = RunEngines(options);
  ExpectBitwiseEqualRuns(zero2, zero3);
  const sharding::ShardPlan plan = PlanFor(LayerTensors(options.layer_sizes), 4);
  const sharding::GatherWindows geometry = sharding::GatherWindowsFor(plan);
  EXPECT_EQ(zero3.windows, sharding::DefaultGatherPoolBuckets(plan) / geometry.max_span_buckets);
  EXPECT_EQ(zero3.window_bytes, geometry.window_elems * int64_t{4});
  EXPECT_GT(zero3.checked_calls, 0);
  for (int64_t r = 0; r < 4; ++r) {
    const MemoryReport& memory = zero3.memory_by_rank[r];
    EXPECT_EQ(memory.of(MemoryCategory::kGatherPool), zero3.windows * zero3.window_bytes);
    EXPECT_LT(memory.peak_total_bytes, zero2.memory_by_rank[r].peak_total_bytes) << "rank " << r;
    EXPECT_LT(memory.of(MemoryCategory::kParams) + memory.of(MemoryCategory::kGatherPool),
              zero2.memory_by_rank[r].of(MemoryCategory::kParams))
        << "rank " << r;
    std::cout << "rank " << r << ": zero2 peak " << zero2.memory_by_rank[r].peak_total_bytes
              << " bytes, zero3 peak " << memory.peak_total_bytes << " bytes (" << memory.ToString()
              << ")\n";
  }
}

// Thirteen layers of 1056 elements in 1024-element buckets: every pair of neighbours shares a
// bucket. The arena slides, so a layer finds the bucket it shares with the layer before it in
// place (buckets_shared) rather than copying it (buckets_copied) or gathering it again; copies
// happen only where the walk meets the arena's end (every few layers with this small pool).
// Fails when placement ignores neighbours (then every shared bucket is copied).
TEST(Zero3PoolTest, NeighboursShareTheirBucketInTheArena) {
  RunOptions options;
  options.world_size = 2;
  options.layer_sizes = std::vector<int64_t>(14, 32);
  options.steps = 3;
  options.params_every_step = false;
  options.config = ConfigFor(kernels::OptimizerKind::kAdamW, Precision::kFp32);
  options.config.mode = EngineMode::kZero2;
  const RunResult zero2 = RunEngines(options);
  options.config.mode = EngineMode::kZero3;
  const RunResult zero3 = RunEngines(options);
  ExpectBitwiseEqualRuns(zero2, zero3);
  const sharding::ShardPlan plan = PlanFor(LayerTensors(options.layer_sizes), 2);
  const int64_t layers = 13;
  // Per step, forward and backward each need every layer's buckets: 2 per layer here.
  const int64_t needed_per_step = 2 * 2 * layers;
  std::cout << "buckets: " << plan.num_buckets() << ", gathered " << zero3.buckets_gathered
            << ", shared " << zero3.buckets_shared << ", copied " << zero3.buckets_copied
            << " over " << options.steps << " steps\n";
  EXPECT_GE(zero3.buckets_shared, options.steps * layers);
  EXPECT_LT(zero3.buckets_copied, zero3.buckets_shared);
  EXPECT_GE(zero3.buckets_gathered + zero3.buckets_shared + zero3.buckets_copied,
            options.steps * needed_per_step / 2);
}

// A pool of exactly one window (the largest module's span): no room to prefetch, every module
// gathered when asked, and still bitwise equal. Fails when a window is refilled while the
// module it held is still read, or when prefetch evicts the module in use.
TEST(Zero3PoolTest, OneWindowTrainsBitwiseEqual) {
  for (const WorkloadKind workload : {WorkloadKind::kMlp, WorkloadKind::kLeastSquares}) {
    for (const int64_t world_size : {2, 3}) {
      SCOPED_TRACE(absl::StrCat(WorkloadName(workload), " W=", world_size));
      RunOptions options;
      options.world_size = world_size;
      options.workload = workload;
      options.config = ConfigFor(kernels::OptimizerKind::kAdam, Precision::kBf16);
      options.config.mode = EngineMode::kZero2;
      const RunResult zero2 = RunEngines(options);
      const sharding::ShardPlan plan = PlanFor(LayerTensors(LayerSizes()), world_size);
      options.config.mode = EngineMode::kZero3;
      options.config.gather_pool_buckets = sharding::GatherWindowsFor(plan).max_span_buckets;
      const RunResult zero3 = RunEngines(options);
      ExpectBitwiseEqualRuns(zero2, zero3);
      EXPECT_EQ(zero3.windows, 1);
      EXPECT_EQ(zero3.window_bytes, sharding::GatherWindowsFor(plan).window_elems * int64_t{2});
    }
  }
}

// ---- 5. Errors ----

// One rank (W = 1, identity collectives), three modules, the default two windows (or
// `gather_pool_buckets` buckets).
std::unique_ptr<Engine> OneRankEngine(const sharding::ShardPlan& plan, EngineMode mode,
                                      comm::Communicator* communicator,
                                      int gather_pool_buckets = 0) {
  EngineConfig config = ConfigFor(kernels::OptimizerKind::kAdam, Precision::kFp32);
  config.mode = mode;
  config.gather_pool_buckets = gather_pool_buckets;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(plan, 0, config, communicator);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return nullptr;
  const absl::Status initialized =
      (*engine)->InitializeParameters([](int64_t t, absl::Span<float> out) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = 0.01f * (t + 1) + 1e-4f * i;
        return absl::OkStatus();
      });
  EXPECT_TRUE(initialized.ok()) << initialized;
  return *std::move(engine);
}

// Fails when a module that has no place beside a held one evicts it (or allocates more memory)
// instead of being refused, when the refusal does not name the tensor and the option, or when
// the pool stays unusable after it. A pool of one window: the largest module, "2", fills it.
TEST(Zero3ErrorsTest, HoldingMoreModulesThanTheArenaFitsIsResourceExhausted) {
  const std::vector<sharding::TensorSpec> tensors = LayerTensors(LayerSizes());
  const sharding::ShardPlan plan = PlanFor(tensors, 1);
  comm::testing::IdentityCommunicator communicator;
  const sharding::GatherWindows geometry = sharding::GatherWindowsFor(plan);
  std::unique_ptr<Engine> engine = OneRankEngine(plan, EngineMode::kZero3, &communicator,
                                                 static_cast<int>(geometry.max_span_buckets));
  ASSERT_NE(engine, nullptr);
  ASSERT_EQ(engine->gather_pool()->windows(), 1);
  // Tensors 3 and 5 are the weights of modules "2" and "0", tensor 2 is module "2"'s bias.
  ASSERT_EQ(tensors[2].name, "2.bias");
  ASSERT_EQ(tensors[3].name, "2.weight");
  ASSERT_EQ(tensors[5].name, "0.weight");
  ASSERT_EQ(geometry.modules[geometry.tensor_module[3]].span_elems(), geometry.window_elems);
  ASSERT_TRUE(engine->Parameters(3).ok());
  const absl::StatusOr<workloads::StoredParameters> second = engine->Parameters(5);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "0.weight")) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "gather_pool_buckets"))
      << second.status();
  // Another tensor of a held module needs no place.
  ASSERT_TRUE(engine->Parameters(2).ok());
  EXPECT_EQ(engine->Memory().of(MemoryCategory::kGatherPool),
            engine->gather_pool()->window_bytes());
  // Once the module is released, its place serves the other one, with the right values.
  ASSERT_TRUE(engine->ReleaseParameters(3).ok());
  ASSERT_TRUE(engine->ReleaseParameters(2).ok());
  const absl::StatusOr<workloads::StoredParameters> retried = engine->Parameters(5);
  ASSERT_TRUE(retried.ok()) << retried.status();
  const float* values = static_cast<const float*>(retried->data);
  for (int64_t i = 0; i < retried->size; ++i) {
    ASSERT_EQ(values[i], 0.01f * 6 + 1e-4f * i) << "element " << i;
  }
}

// Fails when a release of a tensor not held succeeds (a workload's double release would then
// let a window be reused while another tensor still reads it) or when zero2 refuses one.
TEST(Zero3ErrorsTest, ReleaseParametersCodes) {
  const std::vector<sharding::TensorSpec> tensors = LayerTensors(LayerSizes());
  const sharding::ShardPlan plan = PlanFor(tensors, 1);
  comm::testing::IdentityCommunicator zero3_communicator;
  std::unique_ptr<Engine> zero3 = OneRankEngine(plan, EngineMode::kZero3, &zero3_communicator);
  ASSERT_NE(zero3, nullptr);
  const absl::Status not_held = zero3->ReleaseParameters(0);
  EXPECT_EQ(not_held.code(), absl::StatusCode::kFailedPrecondition) << not_held;
  EXPECT_TRUE(absl::StrContains(not_held.message(), tensors[0].name)) << not_held;
  ASSERT_TRUE(zero3->Parameters(0).ok());
  EXPECT_TRUE(zero3->ReleaseParameters(0).ok());
  EXPECT_EQ(zero3->ReleaseParameters(0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(zero3->ReleaseParameters(-1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(zero3->ReleaseParameters(plan.num_tensors()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(zero3->Parameters(plan.num_tensors()).status().code(),
            absl::StatusCode::kInvalidArgument);

  comm::testing::IdentityCommunicator zero2_communicator;
  std::unique_ptr<Engine> zero2 = OneRankEngine(plan, EngineMode::kZero2, &zero2_communicator);
  ASSERT_NE(zero2, nullptr);
  EXPECT_EQ(zero2->gather_pool(), nullptr);
  EXPECT_TRUE(zero2->ReleaseParameters(0).ok());  // never asked for: still a no-op
  ASSERT_TRUE(zero2->Parameters(0).ok());
  EXPECT_TRUE(zero2->ReleaseParameters(0).ok());
  EXPECT_TRUE(zero2->ReleaseParameters(0).ok());
  EXPECT_EQ(zero2->ReleaseParameters(plan.num_tensors()).code(),
            absl::StatusCode::kInvalidArgument);
}

// The value an attached trainer's opt.full_parameters() writes into element i of tensor t
// (exact in bf16 too).
float WrittenValue(int64_t t, size_t i) {
  return 0.25f * static_cast<float>(t + 1) + 0.125f * static_cast<float>(i % 8);
}

// zero3's write-back (an attached trainer's opt.full_parameters() writes): every rank writes the
// same values where Parameters(t) pointed, WriteHeldParameters(t) keeps its owned pieces of
// them, and a gather afterwards reads them on every rank, in fp32 and in bf16 (fp32 masters).
// Fails when a rank writes other pieces than its own, or misses some of its own (a gather then
// reads the initial 1.0 there).
TEST(Zero3WriteBackTest, WrittenValuesBecomeTheOwnersPiecesOnEveryRank) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision == Precision::kFp32 ? "fp32" : "bf16");
    constexpr int64_t kRanks = 2;
    const std::vector<sharding::TensorSpec> tensors = LayerTensors(LayerSizes());
    const sharding::ShardPlan plan = PlanFor(tensors, kRanks);
    comm::InMemoryStore store;
    std::vector<std::vector<std::vector<float>>> read(kRanks);
    const absl::Status status =
        RunOnRankThreads(static_cast<int>(kRanks), [&](int rank) -> absl::Status {
          ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                              Connect(rank, kRanks, &store, Transport::kTcp));
          EngineConfig config = ConfigFor(kernels::OptimizerKind::kAdamW, precision);
          config.mode = EngineMode::kZero3;
          ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                              Engine::Create(plan, rank, config, communicator.get()));
          ZS_RETURN_IF_ERROR(engine->InitializeParameters([](int64_t, absl::Span<float> out) {
            std::fill(out.begin(), out.end(), 1.0f);
            return absl::OkStatus();
          }));
          const DType dtype = config.param_dtype;
          for (int64_t t = 0; t < plan.num_tensors(); ++t) {
            ZS_ASSIGN_OR_RETURN(const workloads::StoredParameters stored, engine->Parameters(t));
            std::vector<float> values(stored.size);
            for (size_t i = 0; i < values.size(); ++i) values[i] = WrittenValue(t, i);
            ConvertElements(values.data(), DType::kFloat32,
                            const_cast<void*>(static_cast<const void*>(stored.data)), dtype,
                            stored.size);
            ZS_RETURN_IF_ERROR(engine->WriteHeldParameters(t));
            ZS_RETURN_IF_ERROR(engine->ReleaseParameters(t));
          }
          const absl::Status not_held = engine->WriteHeldParameters(0);
          if (!absl::IsFailedPrecondition(not_held) ||
              !absl::StrContains(not_held.message(), tensors[0].name)) {
            return absl::InternalError(absl::StrCat("not held: ", not_held.ToString()));
          }
          for (int64_t t = 0; t < plan.num_tensors(); ++t) {
            ZS_ASSIGN_OR_RETURN(std::vector<float> values, engine->ParametersOnHost(t));
            read[rank].push_back(std::move(values));
          }
          return absl::OkStatus();
        });
    ASSERT_TRUE(status.ok()) << status;
    for (int64_t rank = 0; rank < kRanks; ++rank) {
      ASSERT_EQ(read[rank].size(), static_cast<size_t>(plan.num_tensors()));
      for (int64_t t = 0; t < plan.num_tensors(); ++t) {
        for (size_t i = 0; i < read[rank][t].size(); ++i) {
          ASSERT_EQ(read[rank][t][i], WrittenValue(t, i))
              << "rank " << rank << " " << tensors[t].name << "[" << i << "]";
        }
      }
    }
  }
  comm::testing::IdentityCommunicator communicator;
  std::unique_ptr<Engine> zero2 =
      OneRankEngine(PlanFor(LayerTensors(LayerSizes()), 1), EngineMode::kZero2, &communicator);
  ASSERT_NE(zero2, nullptr);
  ASSERT_TRUE(zero2->Parameters(0).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(zero2->WriteHeldParameters(0)));
}

// ---- 6. Checkpoints across zero2 and zero3 and across W ----

struct Checkpoint {
  Engine::SavedScalars scalars;
  std::map<std::pair<std::string, int64_t>, std::vector<char>> arrays;
};

struct Segment {
  std::vector<std::vector<float>> params_by_rank;
  Checkpoint saved;  // after the segment's last step
};

bool SameBits(const Checkpoint& a, const Checkpoint& b) {
  return a.arrays == b.arrays && a.scalars.optimizer_step == b.scalars.optimizer_step &&
         a.scalars.loss_scale == b.scalars.loss_scale &&
         a.scalars.good_steps == b.scalars.good_steps;
}

// Steps [first_step, end_step) of the least-squares workload at `world_size` in config's mode,
// from the initial parameters or restored from `resume_from`; saves at the end.
Segment RunSegment(int64_t world_size, const EngineConfig& config, int64_t first_step,
                   int64_t end_step, const Checkpoint* resume_from) {
  const std::vector<sharding::TensorSpec> tensors = LayerTensors(LayerSizes());
  const sharding::ShardPlan plan = PlanFor(tensors, world_size);
  comm::InMemoryStore store;
  Segment segment;
  segment.params_by_rank.resize(world_size);
  absl::Mutex mu;
  const absl::Status status =
      RunOnRankThreads(static_cast<int>(world_size), [&](int rank) -> absl::Status {
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::GlooCommunicator> communicator,
                            Connect(rank, world_size, &store, Transport::kTcp));
        ZS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                            Engine::Create(plan, rank, config, communicator.get()));
        LeastSquaresWorkload workload(tensors, kGlobalBatch, rank, world_size, kSeed);
        if (resume_from == nullptr) {
          ZS_RETURN_IF_ERROR(engine->InitializeParameters([&](int64_t t, absl::Span<float> out) {
            return workload.InitialParameters(t, out);
          }));
        } else {
          ZS_RETURN_IF_ERROR(engine->RestoreState(
              resume_from->scalars,
              [&](const Engine::SavedFragment& range, absl::Span<char> out) -> absl::Status {
                const auto found = resume_from->arrays.find({range.state, range.tensor});
                if (found == resume_from->arrays.end()) {
                  return absl::NotFoundError(absl::StrCat("no array ", range.state));
                }
                const int64_t size = numerics::DTypeSize(range.dtype);
                if (static_cast<int64_t>(out.size()) != (range.end - range.begin) * size) {
                  return absl::InternalError("wrong range size");
                }
                std::memcpy(out.data(), found->second.data() + range.begin * size, out.size());
                return absl::OkStatus();
              }));
        }
        for (int64_t step = first_step; step < end_step; ++step) {
          ZS_ASSIGN_OR_RETURN(const double loss, workload.ForwardBackward(step, *engine, *engine));
          ZS_RETURN_IF_ERROR(engine->Step(loss).status());
        }
        std::vector<char> staging(engine->SavedBytes());
        ZS_ASSIGN_OR_RETURN(const Engine::SavedScalars scalars,
                            engine->CopyStateTo(absl::MakeSpan(staging)));
        {
          absl::MutexLock lock(&mu);
          segment.saved.scalars = scalars;
          for (const Engine::SavedFragment& fragment : engine->SavedFragments()) {
            const int64_t size = numerics::DTypeSize(fragment.dtype);
            std::vector<char>& array = segment.saved.arrays[{fragment.state, fragment.tensor}];
            array.resize(plan.tensors()[fragment.tensor].num_elements * size);
            std::memcpy(array.data() + fragment.begin * size,
                        staging.data() + fragment.staging_offset, fragment.bytes());
          }
        }
        for (int64_t t = 0; t < plan.num_tensors(); ++t) {
          ZS_ASSIGN_OR_RETURN(const std::vector<float> values, engine->ParametersOnHost(t));
          segment.params_by_rank[rank].insert(segment.params_by_rank[rank].end(), values.begin(),
                                              values.end());
        }
        return absl::OkStatus();
      });
  EXPECT_TRUE(status.ok()) << status;
  return segment;
}

EngineConfig CheckpointConfig(EngineMode mode, DType param_dtype) {
  EngineConfig config = ConfigFor(kernels::OptimizerKind::kAdamW, Precision::kFp32);
  config.mode = mode;
  config.param_dtype = param_dtype;
  return config;
}

// At one W, saved by either mode and resumed by either: bitwise the uninterrupted zero2 run.
// Fails when zero3 saves or restores the owned pieces (or the masters) at the wrong place, or
// keeps a window gathered before the restore.
TEST(Zero3CheckpointTest, ResumingAcrossModesAtOneWorldSizeIsBitwiseUninterrupted) {
  for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(numerics::DTypeName(dtype));
    const Segment uninterrupted =
        RunSegment(2, CheckpointConfig(EngineMode::kZero2, dtype), 0, 6, nullptr);
    for (const EngineMode saved_by : {EngineMode::kZero2, EngineMode::kZero3}) {
      const Segment first = RunSegment(2, CheckpointConfig(saved_by, dtype), 0, 3, nullptr);
      for (const EngineMode resumed_by : {EngineMode::kZero2, EngineMode::kZero3}) {
        SCOPED_TRACE(absl::StrCat(EngineModeName(saved_by), " -> ", EngineModeName(resumed_by)));
        const Segment second =
            RunSegment(2, CheckpointConfig(resumed_by, dtype), 3, 6, &first.saved);
        EXPECT_TRUE(SameBits(uninterrupted.saved, second.saved));
        EXPECT_EQ(second.params_by_rank, uninterrupted.params_by_rank);
      }
    }
  }
}

// Saved at W, loaded at another W' in the other mode: loading and saving at once gives the same
// bits (the reshard), and training on is bitwise the same checkpoint resumed by zero2 at W'.
// Fails when zero3 reads the ranges of another rank's pieces or restores without gathering the
// new values.
TEST(Zero3CheckpointTest, ReshardingAcrossModesAndWorldSizesTrainsOnAsZero2) {
  struct Case {
    EngineMode saved_by;
    int64_t from;
    EngineMode resumed_by;
    int64_t to;
    DType dtype;
  };
  const Case cases[] = {
      {EngineMode::kZero2, 4, EngineMode::kZero3, 3, DType::kFloat32},
      {EngineMode::kZero2, 2, EngineMode::kZero3, 1, DType::kFloat32},
      {EngineMode::kZero3, 3, EngineMode::kZero2, 2, DType::kFloat32},
      {EngineMode::kZero3, 1, EngineMode::kZero3, 4, DType::kFloat32},
      {EngineMode::kZero3, 3, EngineMode::kZero2, 4, DType::kBFloat16},
      {EngineMode::kZero2, 2, EngineMode::kZero3, 3, DType::kBFloat16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(EngineModeName(c.saved_by), " W=", c.from, " -> ",
                              EngineModeName(c.resumed_by), " W=", c.to, " ",
                              numerics::DTypeName(c.dtype)));
    const Segment saved = RunSegment(c.from, CheckpointConfig(c.saved_by, c.dtype), 0, 3, nullptr);
    const Segment loaded =
        RunSegment(c.to, CheckpointConfig(c.resumed_by, c.dtype), 3, 3, &saved.saved);
    EXPECT_TRUE(SameBits(saved.saved, loaded.saved));
    for (const std::vector<float>& params : loaded.params_by_rank) {
      EXPECT_EQ(params, saved.params_by_rank[0]);
    }
    const Segment reference =
        RunSegment(c.to, CheckpointConfig(EngineMode::kZero2, c.dtype), 3, 6, &saved.saved);
    const Segment resumed =
        RunSegment(c.to, CheckpointConfig(c.resumed_by, c.dtype), 3, 6, &saved.saved);
    EXPECT_TRUE(SameBits(reference.saved, resumed.saved));
    EXPECT_EQ(resumed.params_by_rank, reference.params_by_rank);
    EXPECT_NE(resumed.params_by_rank[0], saved.params_by_rank[0]);  // it trained on
  }
}

}  // namespace
}  // namespace zeroshard::engine
