// NcclCommunicator at world size 1 on a GPU machine (tag "gpu"): every collective leaves the
// expected values, WaitOnComputeStream orders the compute stream on the device without blocking
// the host, RunTime comes from CUDA events and leaves out time queued behind the compute stream,
// and Abort() ends later calls with ABORTED.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/comm/in_memory_store.h"

namespace zeroshard::comm {
namespace {

// Holds a stream at the point of construction until Release() (a host function queued on it), so
// a test controls when work queued behind it may run. Destruction releases it and waits for the
// stream, so the host function never outlives the gate.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {
    EXPECT_EQ(cudaLaunchHostFunc(stream_, &StreamGate::Hold, this), cudaSuccess);
  }
  ~StreamGate() {
    Release();
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }

 private:
  static void CUDART_CB Hold(void* gate) {
    // Bounded, so a failing test cannot hold the stream for ever.
    static_cast<StreamGate*>(gate)->released_.WaitForNotificationWithTimeout(absl::Seconds(60));
  }

  const cudaStream_t stream_;
  absl::Notification released_;
};

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute_stream_, cudaStreamNonBlocking), cudaSuccess);
    NcclCommunicatorOptions options;
    options.store = &store_;
    options.compute_stream = compute_stream_;
    auto communicator = NcclCommunicator::Create(options);
    ASSERT_TRUE(communicator.ok()) << communicator.status();
    communicator_ = std::move(*communicator);
    ASSERT_EQ(cudaMalloc(&device_, kCount * sizeof(float)), cudaSuccess);
  }
  void TearDown() override {
    communicator_.reset();
    if (device_ != nullptr) cudaFree(device_);
    if (compute_stream_ != nullptr) cudaStreamDestroy(compute_stream_);
  }

  void Upload(const std::vector<float>& values) {
    ASSERT_EQ(
        cudaMemcpy(device_, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice),
        cudaSuccess);
  }
  std::vector<float> Download() {
    std::vector<float> values(kCount);
    EXPECT_EQ(cudaMemcpy(values.data(), device_, kCount * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return values;
  }

  static constexpr size_t kCount = 1001;
  cudaStream_t compute_stream_ = nullptr;
  InMemoryStore store_;
  std::unique_ptr<NcclCommunicator> communicator_;
  float* device_ = nullptr;
};

TEST_F(NcclCommunicatorTest, CollectivesAtWorldSizeOne) {
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = 0.5f * i;
  Upload(values);
  EXPECT_TRUE(communicator_->AllReduce(device_, kCount, ElementType::kFloat32, ReduceOp::kSum)
                  ->Wait(absl::Seconds(30))
                  .ok());
  EXPECT_TRUE(
      communicator_->ReduceScatterInPlace(device_, kCount, ElementType::kFloat32, ReduceOp::kSum)
          ->Wait(absl::Seconds(30))
          .ok());
  EXPECT_TRUE(communicator_->AllGatherInPlace(device_, kCount, ElementType::kFloat32)
                  ->Wait(absl::Seconds(30))
                  .ok());
  EXPECT_TRUE(communicator_->Broadcast(device_, kCount, ElementType::kFloat32, 0)
                  ->Wait(absl::Seconds(30))
                  .ok());
  EXPECT_TRUE(communicator_->Barrier()->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(Download(), values);
  EXPECT_EQ(communicator_->stats().operations_completed, 5);
}

TEST_F(NcclCommunicatorTest, ComputeStreamWaitsForTheCollectiveOnTheDevice) {
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = 1.5f * i + 1.0f;
  Upload(values);
  float* output = nullptr;
  ASSERT_EQ(cudaMalloc(&output, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(output, 0, kCount * sizeof(float)), cudaSuccess);
  float* copied = nullptr;  // pinned, so the copy below is queued, not done by the host
  ASSERT_EQ(cudaMallocHost(&copied, kCount * sizeof(float)), cudaSuccess);
  {
    StreamGate gate(compute_stream_);
    // At W = 1 an out-of-place reduce-scatter copies `device_` into `output`; it cannot start
    // before the gate opens (NCCL's stream waits for the compute stream).
    std::unique_ptr<Work> work = communicator_->ReduceScatter(
        device_, output, kCount, ElementType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(work->WaitOnComputeStream().ok());
    // The host was not held until the collective finished.
    EXPECT_FALSE(work->Done());
    ASSERT_EQ(cudaMemcpyAsync(copied, output, kCount * sizeof(float), cudaMemcpyDeviceToHost,
                              compute_stream_),
              cudaSuccess);
    gate.Release();
    ASSERT_EQ(cudaStreamSynchronize(compute_stream_), cudaSuccess);
    EXPECT_TRUE(work->Wait(absl::Seconds(30)).ok());
  }
  EXPECT_EQ(std::vector<float>(copied, copied + kCount), values);
  cudaFreeHost(copied);
  cudaFree(output);
}

TEST_F(NcclCommunicatorTest, RunTimeLeavesOutTimeQueuedBehindTheComputeStream) {
  constexpr absl::Duration kQueued = absl::Milliseconds(200);
  std::unique_ptr<Work> work;
  {
    StreamGate gate(compute_stream_);
    work = communicator_->AllReduce(device_, kCount, ElementType::kFloat32, ReduceOp::kSum);
    // Not waiting for state: this is the time the collective spends queued behind the gate.
    absl::SleepFor(kQueued);
  }
  ASSERT_TRUE(work->Wait(absl::Seconds(30)).ok());
  const std::optional<absl::Duration> run_time = work->RunTime();
  ASSERT_TRUE(run_time.has_value());
  EXPECT_GE(*run_time, absl::ZeroDuration());
  // A 4 KB all-reduce of one rank runs for microseconds; a wall-clock time would include kQueued.
  EXPECT_LT(*run_time, kQueued / 2);
}

TEST_F(NcclCommunicatorTest, AbortEndsLaterCalls) {
  std::unique_ptr<Work> before = communicator_->Barrier();
  ASSERT_TRUE(before->Wait(absl::Seconds(30)).ok());
  communicator_->Abort();
  EXPECT_EQ(communicator_->Barrier()->Wait(absl::Seconds(30)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(communicator_->Barrier()->WaitOnComputeStream().code(), absl::StatusCode::kAborted);
  // An operation that finished before the abort keeps its outcome and run time.
  EXPECT_TRUE(before->Wait(absl::Seconds(30)).ok());
  EXPECT_TRUE(before->RunTime().has_value());
  communicator_->Abort();
}

}  // namespace
}  // namespace zeroshard::comm
