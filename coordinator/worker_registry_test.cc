// Tests for worker membership: ids, leases on explicit times, expiry, leaving, assignment state.
#include "coordinator/worker_registry.h"

#include <optional>
#include <string>
#include <vector>

#include "coordinator/ids.h"
#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

v1::RegisterWorkerRequest Request(const std::string& name, v1::DeviceKind kind = v1::CPU) {
  v1::RegisterWorkerRequest request;
  request.set_name(name);
  request.set_host("host-a");
  request.set_device_kind(kind);
  return request;
}

TEST(WorkerRegistryTest, RegisterAssignsDistinctIdsAndIdleState) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  const std::string a = registry.Register(Request("a"), kStart).id();
  const std::string b = registry.Register(Request("b"), kStart).id();
  EXPECT_EQ(a, "worker-000001");
  EXPECT_EQ(b, "worker-000002");
  EXPECT_EQ(registry.Find(a)->state(), v1::IDLE);
  EXPECT_EQ(registry.Find(a)->assignment().kind(), v1::ASSIGNMENT_IDLE);
  EXPECT_EQ(registry.IdleWorkers(v1::CPU).size(), 2u);
  EXPECT_EQ(registry.IdleWorkers(v1::CUDA).size(), 0u);
}

TEST(WorkerRegistryTest, LeaseExpiresAfterMissedHeartbeats) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  const std::string a = registry.Register(Request("a"), kStart).id();
  const std::string b = registry.Register(Request("b"), kStart).id();
  ASSERT_TRUE(registry.Renew(a, kStart + absl::Seconds(2)).ok());
  EXPECT_TRUE(registry.ExpireLeases(kStart + absl::Seconds(3)).empty());  // lease is 3 s
  EXPECT_EQ(registry.ExpireLeases(kStart + absl::Seconds(3) + absl::Milliseconds(1)),
            std::vector<std::string>{b});
  EXPECT_EQ(registry.Find(b)->state(), v1::DEAD);
  EXPECT_EQ(registry.Renew(b, kStart + absl::Seconds(4)).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.ExpireLeases(kStart + absl::Seconds(5) + absl::Milliseconds(1)),
            std::vector<std::string>{a});
}

TEST(WorkerRegistryTest, UnknownIdsAreNotFound) {
  WorkerRegistry registry({});
  EXPECT_EQ(registry.Renew("worker-000042", kStart).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.Leave("worker-000042").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(registry.FindLive("worker-000042"), nullptr);
}

TEST(WorkerRegistryTest, LeaveAndForget) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  const std::string a = registry.Register(Request("a"), kStart).id();
  ASSERT_TRUE(registry.Leave(a).ok());
  EXPECT_EQ(registry.Find(a)->state(), v1::LEFT);
  EXPECT_EQ(registry.FindLive(a), nullptr);
  EXPECT_EQ(registry.List(v1::LEFT).size(), 1u);
  registry.ForgetGone(kStart + absl::Hours(1));
  EXPECT_EQ(registry.Find(a), nullptr);
}

TEST(WorkerRegistryTest, ListAfterSkipsLowerNumbersAndFiltersByState) {
  WorkerRegistry registry({});
  const std::string a = registry.Register(Request("a"), kStart).id();
  const std::string b = registry.Register(Request("b"), kStart).id();
  const std::string c = registry.Register(Request("c"), kStart).id();
  ASSERT_TRUE(registry.Leave(b).ok());
  const std::optional<int64_t> a_number = ParseWorkerId(a);
  ASSERT_TRUE(a_number.has_value());
  std::vector<std::string> after_a;
  for (const v1::WorkerInfo* worker : registry.ListAfter(v1::WORKER_STATE_UNSPECIFIED, *a_number)) {
    after_a.push_back(worker->id());
  }
  EXPECT_EQ(after_a, (std::vector<std::string>{b, c}));
  const std::vector<const v1::WorkerInfo*> idle_after_a = registry.ListAfter(v1::IDLE, *a_number);
  ASSERT_EQ(idle_after_a.size(), 1u);
  EXPECT_EQ(idle_after_a[0]->id(), c);
  EXPECT_TRUE(registry.ListAfter(v1::WORKER_STATE_UNSPECIFIED, *ParseWorkerId(c)).empty());
}

TEST(WorkerRegistryTest, AssignmentDrivesBusyAndIdle) {
  WorkerRegistry registry({});
  v1::WorkerInfo* worker = registry.FindLive(registry.Register(Request("a"), kStart).id());
  v1::Assignment run;
  run.set_kind(v1::ASSIGNMENT_RUN);
  run.set_job_id("job-000001");
  registry.Assign(*worker, run);
  EXPECT_EQ(worker->state(), v1::BUSY);
  EXPECT_TRUE(registry.IdleWorkers(v1::CPU).empty());
  v1::Assignment abort;
  abort.set_kind(v1::ASSIGNMENT_ABORT);
  registry.Assign(*worker, abort);
  EXPECT_EQ(worker->state(), v1::IDLE);
  // A worker still aborting a generation is not free yet.
  EXPECT_TRUE(registry.IdleWorkers(v1::CPU).empty());
  EXPECT_EQ(registry.List(v1::IDLE).size(), 1u);
  EXPECT_EQ(registry.List(v1::WORKER_STATE_UNSPECIFIED).size(), 1u);
}

TEST(WorkerRegistryTest, RegisterAsTakesAFreeIdOnceAndNewIdsContinueAboveIt) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  const std::string fresh = registry.Register(Request("a"), kStart).id();
  ASSERT_EQ(fresh, "worker-000001");
  absl::StatusOr<v1::WorkerInfo*> adopted =
      registry.RegisterAs(Request("b"), "worker-000042", kStart);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ((*adopted)->id(), "worker-000042");
  EXPECT_EQ((*adopted)->name(), "b");
  EXPECT_EQ((*adopted)->state(), v1::IDLE);
  EXPECT_EQ(registry.FindLive("worker-000042"), *adopted);
  // Its lease runs from `now` like any registration's.
  EXPECT_EQ(registry.ExpireLeases(kStart + absl::Seconds(4)).size(), 2u);

  // Taken ids are refused, whether live, dead (above) or given out by Register.
  EXPECT_EQ(registry.RegisterAs(Request("c"), "worker-000042", kStart).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.RegisterAs(Request("c"), fresh, kStart).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.RegisterAs(Request("c"), "worker-42", kStart).status().code(),
            absl::StatusCode::kInvalidArgument);
  // New ids never collide with the adopted one.
  EXPECT_EQ(registry.Register(Request("d"), kStart).id(), "worker-000043");
  // An adopted id below the numbering leaves it where it was.
  ASSERT_TRUE(registry.RegisterAs(Request("e"), "worker-000007", kStart).ok());
  EXPECT_EQ(registry.Register(Request("f"), kStart).id(), "worker-000044");
}

TEST(WorkerRegistryTest, AttachSocketIsStoredOnEveryRegistration) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  v1::RegisterWorkerRequest request = Request("a");
  request.set_attach_socket("/run/zeroshard/a.sock");
  const std::string first = registry.Register(request, kStart).id();
  EXPECT_EQ(registry.Find(first)->attach_socket(), "/run/zeroshard/a.sock");
  // Registering again (a new id, or an adopted one) takes what the worker says now.
  request.set_attach_socket("/run/zeroshard/a2.sock");
  const std::string again = registry.Register(request, kStart).id();
  EXPECT_EQ(registry.Find(again)->attach_socket(), "/run/zeroshard/a2.sock");
  absl::StatusOr<v1::WorkerInfo*> adopted = registry.RegisterAs(request, "worker-000042", kStart);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ((*adopted)->attach_socket(), "/run/zeroshard/a2.sock");
  EXPECT_EQ(registry.Register(Request("b"), kStart).attach_socket(), "");
}

// Fails before the fix: WorkerInfo had no memory_limit_bytes, so the coordinator could not compare
// a job's need with the worker's --memory_limit_bytes.
TEST(WorkerRegistryTest, MemoryLimitIsStoredOnEveryRegistration) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  v1::RegisterWorkerRequest request = Request("a");
  request.set_memory_limit_bytes(int64_t{300} << 20);
  const std::string first = registry.Register(request, kStart).id();
  EXPECT_EQ(registry.Find(first)->memory_limit_bytes(), int64_t{300} << 20);
  request.set_memory_limit_bytes(0);
  absl::StatusOr<v1::WorkerInfo*> adopted = registry.RegisterAs(request, "worker-000042", kStart);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  EXPECT_EQ((*adopted)->memory_limit_bytes(), 0);
}

TEST(WorkerRegistryTest, LiveWorkersByNameTakesTheNewestLiveIdOfEachName) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  const std::string old_a = registry.Register(Request("a"), kStart).id();
  const std::string b = registry.Register(Request("b"), kStart).id();
  const std::string new_a = registry.Register(Request("a"), kStart + absl::Seconds(2)).id();
  absl::flat_hash_map<std::string, const v1::WorkerInfo*> by_name = registry.LiveWorkersByName();
  ASSERT_EQ(by_name.size(), 2u);
  EXPECT_EQ(by_name["a"]->id(), new_a);
  EXPECT_EQ(by_name["b"]->id(), b);
  // The newer "a" leaves: the older one, still live, is "a" again. Dead workers are not listed.
  ASSERT_TRUE(registry.Leave(new_a).ok());
  EXPECT_EQ(registry.LiveWorkersByName()["a"]->id(), old_a);
  EXPECT_EQ(registry.ExpireLeases(kStart + absl::Seconds(4)).size(), 2u);
  EXPECT_TRUE(registry.LiveWorkersByName().empty());
}

TEST(WorkerRegistryTest, NewSecretReplacesTheOldOneAndProvesTheWorker) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  const std::string a = registry.Register(Request("a"), kStart).id();
  const std::string first = registry.NewSecret(a);
  EXPECT_TRUE(registry.SecretMatches(a, first));
  const std::string second = registry.NewSecret(a);
  EXPECT_NE(first, second);
  EXPECT_FALSE(registry.SecretMatches(a, first));
  EXPECT_TRUE(registry.SecretMatches(a, second));
  ASSERT_NE(registry.FindBySecret(second), nullptr);
  EXPECT_EQ(registry.FindBySecret(second)->id(), a);
}

TEST(WorkerRegistryTest, NumbersComeFromTheReservedBlocks) {
  WorkerRegistry registry({absl::Seconds(1), 3});
  EXPECT_TRUE(registry.NeedsNumberBlock());
  registry.UseNumberBlock(500, 2);
  EXPECT_FALSE(registry.NeedsNumberBlock());
  EXPECT_EQ(registry.next_number(), 500);
  registry.Register(Request("a"), kStart);
  EXPECT_FALSE(registry.NeedsNumberBlock());
  registry.Register(Request("b"), kStart);
  EXPECT_TRUE(registry.NeedsNumberBlock());
}

}  // namespace
}  // namespace zeroshard::coordinator
