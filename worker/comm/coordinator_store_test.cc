// CoordinatorStore against a small in-process fake of the coordinator's four store RPCs over a
// real localhost channel (the coordinator itself is tested with it in the integration tests),
// including an abort that cancels a Get in flight.
#include "worker/comm/coordinator_store.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "worker/comm/abort_signal.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"

namespace zeroshard::comm {
namespace {

using ::zeroshard::comm::testing::RunOnRankThreads;

// The store RPCs only, over an InMemoryStore keyed by (job, generation, key). Generations
// below `current_generation` are refused as the coordinator does.
class FakeStoreService : public v1::Coordinator::Service {
 public:
  explicit FakeStoreService(int64_t current_generation) : current_generation_(current_generation) {}

  grpc::Status StoreSet(grpc::ServerContext*, const v1::StoreSetRequest* request,
                        v1::StoreSetResponse*) override {
    absl::Status scope = CheckScope(request->generation());
    if (!scope.ok()) return common::ToGrpcStatus(scope);
    return common::ToGrpcStatus(store_.Set(
        Scoped(request->job_id(), request->generation(), request->key()), request->value()));
  }

  // As the coordinator's: a missing key is NOT_FOUND when asked not to wait (timeout_ms 0),
  // DEADLINE_EXCEEDED after a wait. Waits in short slices so that a call the client cancelled
  // ends too, instead of holding up the server's shutdown.
  grpc::Status StoreGet(grpc::ServerContext* context, const v1::StoreGetRequest* request,
                        v1::StoreGetResponse* response) override {
    absl::Status scope = CheckScope(request->generation());
    if (!scope.ok()) return common::ToGrpcStatus(scope);
    const std::string key = Scoped(request->job_id(), request->generation(), request->key());
    if (request->timeout_ms() == 0) {
      auto value = store_.Get(key, absl::ZeroDuration());
      if (!value.ok()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "key is not set");
      response->set_value(*value);
      return grpc::Status::OK;
    }
    const absl::Time deadline = absl::Now() + absl::Milliseconds(request->timeout_ms());
    while (true) {
      auto value = store_.Get(key, std::min(deadline - absl::Now(), absl::Milliseconds(50)));
      if (value.ok()) {
        response->set_value(*value);
        return grpc::Status::OK;
      }
      if (!absl::IsDeadlineExceeded(value.status()) || absl::Now() >= deadline) {
        return common::ToGrpcStatus(value.status());
      }
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
    }
  }

  grpc::Status StoreAdd(grpc::ServerContext*, const v1::StoreAddRequest* request,
                        v1::StoreAddResponse* response) override {
    absl::Status scope = CheckScope(request->generation());
    if (!scope.ok()) return common::ToGrpcStatus(scope);
    auto value = store_.Add(Scoped(request->job_id(), request->generation(), request->key()),
                            request->delta());
    if (!value.ok()) return common::ToGrpcStatus(value.status());
    response->set_value(*value);
    return grpc::Status::OK;
  }

  grpc::Status StoreDelete(grpc::ServerContext*, const v1::StoreDeleteRequest* request,
                           v1::StoreDeleteResponse* response) override {
    absl::Status scope = CheckScope(request->generation());
    if (!scope.ok()) return common::ToGrpcStatus(scope);
    auto deleted = store_.Delete(Scoped(request->job_id(), request->generation(), request->key()));
    if (!deleted.ok()) return common::ToGrpcStatus(deleted.status());
    response->set_deleted(*deleted);
    return grpc::Status::OK;
  }

 private:
  static std::string Scoped(const std::string& job, int64_t generation, const std::string& key) {
    return absl::StrCat(job, "/", generation, "/", key);
  }
  absl::Status CheckScope(int64_t generation) const {
    if (generation < current_generation_) {
      return absl::FailedPreconditionError(absl::StrCat("generation ", generation, " is stale"));
    }
    return absl::OkStatus();
  }

  const int64_t current_generation_;
  InMemoryStore store_;
};

class CoordinatorStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  FakeStoreService service_{/*current_generation=*/3};
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<v1::Coordinator::StubInterface> stub_;
};

TEST_F(CoordinatorStoreTest, SetGetAddDeleteRoundTrip) {
  CoordinatorStore store(stub_, "job-a", 3);
  ASSERT_TRUE(store.Set("k", std::string("\0bytes", 6)).ok());
  auto value = store.Get("k", absl::ZeroDuration());
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("\0bytes", 6));
  EXPECT_EQ(*store.Add("n", 5), 5);
  EXPECT_EQ(*store.Add("n", -2), 3);
  EXPECT_TRUE(*store.Delete("k"));
  EXPECT_FALSE(*store.Delete("k"));
}

TEST_F(CoordinatorStoreTest, ScopedToJobAndGeneration) {
  CoordinatorStore job_a(stub_, "job-a", 3);
  CoordinatorStore job_b(stub_, "job-b", 3);
  CoordinatorStore next_generation(stub_, "job-a", 4);
  ASSERT_TRUE(job_a.Set("k", "a").ok());
  EXPECT_EQ(job_b.Get("k", absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(next_generation.Get("k", absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorStoreTest, StaleGenerationIsRefused) {
  CoordinatorStore stale(stub_, "job-a", 2);
  EXPECT_EQ(stale.Set("k", "v").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stale.Get("k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorStoreTest, GetWaitsForAKeySetLater) {
  CoordinatorStore store(stub_, "job-a", 3);
  EXPECT_EQ(store.Get("missing", absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread setter([this] {
    CoordinatorStore other(stub_, "job-a", 3);
    ASSERT_TRUE(other.Set("late", "v").ok());
  });
  auto value = store.Get("late", absl::Seconds(30));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "v");
}

TEST_F(CoordinatorStoreTest, AbortCancelsAGetInFlightAndFailsLaterCallsAtOnce) {
  AbortSignal signal;
  CoordinatorStore store(stub_, "job-a", 3, absl::Seconds(30), &signal);
  absl::StatusOr<std::string> value = absl::UnknownError("not returned");
  absl::Time returned_at;
  absl::Notification returned;
  std::thread getter([&] {
    value = store.Get("never-set", absl::Seconds(60));
    returned_at = absl::Now();
    returned.Notify();
  });
  EXPECT_FALSE(returned.WaitForNotificationWithTimeout(absl::Milliseconds(300)));
  const absl::Time aborted_at = absl::Now();
  signal.Abort();
  const bool ended = returned.WaitForNotificationWithTimeout(absl::Seconds(90));
  getter.join();
  ASSERT_TRUE(ended);
  EXPECT_EQ(value.status().code(), absl::StatusCode::kCancelled) << value.status();
  EXPECT_LT(returned_at - aborted_at, absl::Seconds(2));

  EXPECT_EQ(store.Set("k", "v").code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(store.Add("n", 1).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(store.Delete("k").status().code(), absl::StatusCode::kCancelled);
  // Nothing reached the coordinator.
  CoordinatorStore other(stub_, "job-a", 3);
  EXPECT_EQ(other.Get("k", absl::Milliseconds(20)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorStoreTest, AWaitOfAFractionOfAMillisecondIsStillAWait) {
  CoordinatorStore store(stub_, "job-a", 3);
  // Rounded down to whole milliseconds, the wait would end with a request not to wait at all
  // (timeout_ms 0), which the coordinator answers with NOT_FOUND.
  for (const absl::Duration timeout : {absl::Microseconds(1500), absl::Microseconds(300)}) {
    EXPECT_EQ(store.Get("missing", timeout).status().code(), absl::StatusCode::kDeadlineExceeded)
        << timeout;
  }
}

TEST_F(CoordinatorStoreTest, GlooRendezvousThroughTheCoordinator) {
  std::unique_ptr<GlooCommunicator> communicators[2];
  const absl::Status status = RunOnRankThreads(2, [&](int rank) -> absl::Status {
    CoordinatorStore store(stub_, "job-a", 3);
    GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = 2;
    options.store = &store;
    options.rendezvous_timeout = absl::Seconds(30);
    auto communicator = GlooCommunicator::Create(options);
    if (!communicator.ok()) return communicator.status();
    communicators[rank] = std::move(*communicator);
    return absl::OkStatus();
  });
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_NE(communicators[0], nullptr);
  ASSERT_NE(communicators[1], nullptr);
  float values[2][2] = {{1.0f, 2.0f}, {10.0f, 20.0f}};
  auto first = communicators[0]->AllReduce(values[0], 2, ElementType::kFloat32, ReduceOp::kSum);
  auto second = communicators[1]->AllReduce(values[1], 2, ElementType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(first->Wait(absl::Seconds(30)).ok());
  ASSERT_TRUE(second->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(values[0][0], 11.0f);
  EXPECT_EQ(values[1][1], 22.0f);
}

}  // namespace
}  // namespace zeroshard::comm
