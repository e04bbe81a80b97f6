// Nothing in the engine's step allocates: after warm-up, whole iterations (Parameters() in
// forward order, every gradient segment, Step()) make no heap allocation of the engine's own, in
// every mode, with fp32 and with bf16 parameters and gradients. The global operator new of this
// test binary counts the allocations of the thread that has counting on; what the communicator
// and the CPU kernels allocate inside their own calls is left out (each collective's Work
// handle is the communicator's, and kernels/ is another library), as named below.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "numerics/dtype.h"
#include "sharding/shard_planner.h"
#include "sharding/test_plans.h"
#include "worker/comm/communicator.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/engine.h"
#include "worker/workloads/workload.h"

namespace {

// Allocations made by this thread while counting is on.
thread_local bool counting = false;
thread_local int64_t allocations = 0;

void* Allocate(std::size_t bytes) {
  if (counting) ++allocations;
  return std::malloc(bytes == 0 ? 1 : bytes);
}

void* AllocateAligned(std::size_t bytes, std::align_val_t alignment) {
  if (counting) ++allocations;
  void* data = nullptr;
  const std::size_t align = std::max(sizeof(void*), static_cast<std::size_t>(alignment));
  return posix_memalign(&data, align, bytes == 0 ? 1 : bytes) == 0 ? data : nullptr;
}

void* AllocateOrThrow(void* data) {
  if (data == nullptr) throw std::bad_alloc();
  return data;
}

}  // namespace

void* operator new(std::size_t bytes) { return AllocateOrThrow(Allocate(bytes)); }
void* operator new[](std::size_t bytes) { return AllocateOrThrow(Allocate(bytes)); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept { return Allocate(bytes); }
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept { return Allocate(bytes); }
void* operator new(std::size_t bytes, std::align_val_t alignment) {
  return AllocateOrThrow(AllocateAligned(bytes, alignment));
}
void* operator new[](std::size_t bytes, std::align_val_t alignment) {
  return AllocateOrThrow(AllocateAligned(bytes, alignment));
}
void* operator new(std::size_t bytes, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  return AllocateAligned(bytes, alignment);
}
void* operator new[](std::size_t bytes, std::align_val_t alignment,
                     const std::nothrow_t&) noexcept {
  return AllocateAligned(bytes, alignment);
}
void operator delete(void* data) noexcept { std::free(data); }
void operator delete[](void* data) noexcept { std::free(data); }
void operator delete(void* data, std::size_t) noexcept { std::free(data); }
void operator delete[](void* data, std::size_t) noexcept { std::free(data); }
void operator delete(void* data, const std::nothrow_t&) noexcept { std::free(data); }
void operator delete[](void* data, const std::nothrow_t&) noexcept { std::free(data); }
void operator delete(void* data, std::align_val_t) noexcept { std::free(data); }
void operator delete[](void* data, std::align_val_t) noexcept { std::free(data); }
void operator delete(void* data, std::size_t, std::align_val_t) noexcept { std::free(data); }
void operator delete[](void* data, std::size_t, std::align_val_t) noexcept { std::free(data); }

namespace zeroshard::engine {
namespace {

// Counting stays off for the scope's lifetime (allocations of other libraries). Thread contract:
// affects only the thread that creates it, which must also destroy it.
class NotCounted {
 public:
  NotCounted() : was_counting_(counting) { counting = false; }
  ~NotCounted() { counting = was_counting_; }
  NotCounted(const NotCounted&) = delete;
  NotCounted& operator=(const NotCounted&) = delete;

 private:
  const bool was_counting_;
};

// One rank (W = 1) whose collectives' own allocations (their Work handles) are not counted.
// Thread contract: as IdentityCommunicator.
class UncountedCommunicator : public comm::testing::IdentityCommunicator {
 public:
  std::unique_ptr<comm::Work> ReduceScatterInPlace(
      void* buffer, size_t count, comm::ElementType type, comm::ReduceOp op,
      const comm::CollectiveOptions& options) override {
    NotCounted apart;
    return IdentityCommunicator::ReduceScatterInPlace(buffer, count, type, op, options);
  }
  std::unique_ptr<comm::Work> AllGatherInPlace(void* buffer, size_t count, comm::ElementType type,
                                               const comm::CollectiveOptions& options) override {
    NotCounted apart;
    return IdentityCommunicator::AllGatherInPlace(buffer, count, type, options);
  }
  std::unique_ptr<comm::Work> AllReduce(void* buffer, size_t count, comm::ElementType type,
                                        comm::ReduceOp op,
                                        const comm::CollectiveOptions& options) override {
    NotCounted apart;
    return IdentityCommunicator::AllReduce(buffer, count, type, op, options);
  }
};

// HostDeviceOps whose optimizer and whole-piece statistics kernels (kernels/cpu_optimizer.h,
// which cut their pieces into chunks in vectors of their own) are not counted; the rest is the
// engine's, the statistics summed on the moves of reduced gradients included (the engine's
// chunk table, cut once at creation). Counts the calls of those moves, so the test can see that
// the step took that path. Thread contract: as DeviceOps.
class UncountedKernels final : public DeviceOps {
 public:
  void* AllocateZeroed(int64_t bytes) override { return host_.AllocateZeroed(bytes); }
  void Free(void* data) override { host_.Free(data); }
  const char* name() const override { return host_.name(); }
  bool host_memory() const override { return host_.host_memory(); }
  absl::Status CopyFromHost(void* dst, const void* host_src, int64_t bytes) override {
    return host_.CopyFromHost(dst, host_src, bytes);
  }
  absl::Status CopyToHost(void* host_dst, const void* src, int64_t bytes) override {
    return host_.CopyToHost(host_dst, src, bytes);
  }
  absl::Status StoreScaledGradient(const float* grad, float scale, int64_t count,
                                   numerics::DType storage_dtype, void* dst,
                                   numerics::DType dst_dtype) override {
    return host_.StoreScaledGradient(grad, scale, count, storage_dtype, dst, dst_dtype);
  }
  absl::Status ConvertElements(const void* src, numerics::DType src_dtype, void* dst,
                               numerics::DType dst_dtype, int64_t count) override {
    return host_.ConvertElements(src, src_dtype, dst, dst_dtype, count);
  }
  absl::Status ZeroElements(void* dst, numerics::DType dtype, int64_t count) override {
    return host_.ZeroElements(dst, dtype, count);
  }
  absl::Status ApplyUpdate(const kernels::OptimizerConfig& config, int64_t step, float grad_scale,
                           absl::Span<const kernels::UpdatePiece> pieces) override {
    NotCounted apart;
    return host_.ApplyUpdate(config, step, grad_scale, pieces);
  }
  absl::StatusOr<kernels::GradStats> ComputeGradStats(
      absl::Span<const kernels::GradPiece> pieces) override {
    NotCounted apart;
    ++whole_piece_stats_calls_;
    return host_.ComputeGradStats(pieces);
  }
  int64_t GradStatsChunkElements() const override { return host_.GradStatsChunkElements(); }
  absl::Status ConvertWithGradStats(const void* src, numerics::DType src_dtype, void* dst,
                                    numerics::DType dst_dtype,
                                    const kernels::GradStatsChunk* chunks, int64_t num_chunks,
                                    double* partials) override {
    ++moves_with_stats_;
    return host_.ConvertWithGradStats(src, src_dtype, dst, dst_dtype, chunks, num_chunks, partials);
  }
  absl::Status CombineGradStats(const double* partials, int64_t count, double* result) override {
    return host_.CombineGradStats(partials, count, result);
  }
  absl::Status Synchronize() override { return host_.Synchronize(); }

  int64_t moves_with_stats() const { return moves_with_stats_; }
  int64_t whole_piece_stats_calls() const { return whole_piece_stats_calls_; }

 private:
  HostDeviceOps host_{/*threads=*/1};
  int64_t moves_with_stats_ = 0;
  int64_t whole_piece_stats_calls_ = 0;
};

// Tensors of 700 to 2600 elements in 1024-element buckets: several buckets, more than the zero2
// pool holds, and tensors spanning them.
sharding::ShardPlan AllocationPlan() {
  auto plan = sharding::PlanOfSizes({700, 2600, 64, 1500, 900, 2048}, /*world_size=*/1,
                                    sharding::kMinBucketElems);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// One iteration as a workload drives it: every tensor's parameters in forward order, every
// gradient segment in tensor-list order (written in place), then Step().
absl::Status Iteration(Engine& engine, int64_t step) {
  const int64_t tensors = engine.plan().num_tensors();
  for (int64_t t = tensors - 1; t >= 0; --t) {
    absl::StatusOr<workloads::StoredParameters> stored = engine.Parameters(t);
    if (!stored.ok()) return stored.status();
  }
  for (int64_t t = 0; t < tensors; ++t) {
    absl::Status written = workloads::ForEachGradSegment(
        engine, t, engine.plan().placement(t).num_elements,
        [&](int64_t begin, int64_t, absl::Span<float> out) {
          for (size_t k = 0; k < out.size(); ++k) {
            out[k] = 1e-3f * static_cast<float>((begin + k + step) % 7) - 3e-3f;
          }
          return absl::OkStatus();
        });
    if (!written.ok()) return written;
  }
  return engine.Step(/*local_loss=*/0.5).status();
}

struct Precision {
  const char* name;
  numerics::DType params;
  numerics::DType grads;
};

TEST(EngineStepAllocationTest, IterationsAfterWarmUpAllocateNothing) {
  constexpr int kWarmUp = 2;
  // Enough steps that a container growing a little per bucket launch would have to allocate.
  constexpr int kCounted = 100;
  const sharding::ShardPlan plan = AllocationPlan();
  ASSERT_GT(plan.num_buckets(), 4);
  for (const Precision& precision :
       {Precision{"fp32", numerics::DType::kFloat32, numerics::DType::kFloat32},
        Precision{"bf16", numerics::DType::kBFloat16, numerics::DType::kBFloat16}}) {
    for (EngineMode mode : {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2}) {
      SCOPED_TRACE(absl::StrCat(precision.name, " ", EngineModeName(mode)));
      UncountedCommunicator communicator;
      UncountedKernels device;
      EngineConfig config;
      config.mode = mode;
      config.optimizer.kind = kernels::OptimizerKind::kAdamW;
      config.optimizer.lr = 1e-3;
      config.param_dtype = precision.params;
      config.grad_dtype = precision.grads;
      config.device = &device;
      auto engine = Engine::Create(plan, /*rank=*/0, config, &communicator);
      ASSERT_TRUE(engine.ok()) << engine.status();
      ASSERT_TRUE((*engine)
                      ->InitializeParameters([](int64_t, absl::Span<float> out) {
                        for (float& value : out) value = 0.01f;
                        return absl::OkStatus();
                      })
                      .ok());
      for (int step = 0; step < kWarmUp; ++step) ASSERT_TRUE(Iteration(**engine, step).ok());
      allocations = 0;
      const int64_t moves_before = device.moves_with_stats();
      counting = true;
      absl::Status status;
      for (int step = kWarmUp; step < kWarmUp + kCounted && status.ok(); ++step) {
        status = Iteration(**engine, step);
      }
      counting = false;
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(allocations, 0) << "over " << kCounted << " iterations";
      EXPECT_EQ((*engine)->optimizer_step(), kWarmUp + kCounted);
      // The counted steps summed their statistics on every bucket's move, and on no other pass.
      EXPECT_EQ(device.moves_with_stats() - moves_before, kCounted * plan.num_buckets());
      EXPECT_EQ(device.whole_piece_stats_calls(), 0);
    }
  }
}

// The counter itself works: an allocation on this thread while counting is on is counted.
TEST(EngineStepAllocationTest, TheCounterCountsAllocations) {
  allocations = 0;
  counting = true;
  auto held = std::make_unique<std::vector<int>>(16);
  counting = false;
  EXPECT_EQ(held->size(), 16u);
  EXPECT_EQ(allocations, 2);  // the vector object and its elements
}

}  // namespace
}  // namespace zeroshard::engine
