// The adoption and regroup rules on hand-made records.
#include "coordinator/recovery_rules.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "security/identity.h"

namespace zeroshard::coordinator {
namespace {

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-000001");
  job.set_state(v1::RUNNING);
  job.set_generation(3);
  job.add_worker_ids("worker-000001");
  job.add_worker_ids("worker-000002");
  return job;
}

v1::Assignment StoredRun(const v1::Job& job) {
  v1::Assignment run;
  run.set_kind(v1::ASSIGNMENT_RUN);
  run.set_job_id(job.id());
  run.set_generation(job.generation());
  run.set_world_size(job.worker_ids_size());
  run.set_plan_layout_hash(77);
  return run;
}

TEST(CheckStoredRunAssignment, NeedsARunOfTheGenerationAndWorldSize) {
  const v1::Job job = RunningJob();
  v1::Assignment stored = StoredRun(job);
  EXPECT_TRUE(CheckStoredRunAssignment(job, &stored).ok());
  EXPECT_EQ(CheckStoredRunAssignment(job, nullptr).message(),
            "no RUN assignment of generation 3 was stored");
  stored.set_generation(2);
  EXPECT_TRUE(absl::IsFailedPrecondition(CheckStoredRunAssignment(job, &stored)));
  stored = StoredRun(job);
  stored.set_world_size(3);
  EXPECT_FALSE(CheckStoredRunAssignment(job, &stored).ok());
  stored = StoredRun(job);
  stored.set_kind(v1::ASSIGNMENT_ABORT);
  EXPECT_FALSE(CheckStoredRunAssignment(job, &stored).ok());
}

TEST(CheckSameLayout, RefusesAnotherLayoutNamingBoth) {
  const v1::Assignment stored = StoredRun(RunningJob());
  EXPECT_TRUE(CheckSameLayout(77, stored).ok());
  const absl::Status changed = CheckSameLayout(78, stored);
  EXPECT_TRUE(absl::IsFailedPrecondition(changed));
  EXPECT_EQ(changed.message(), "its plan's layout hash is now 78, the workers run 77");
}

struct AdoptionCase {
  v1::Job job = RunningJob();
  std::vector<RankIdentity> identities = std::vector<RankIdentity>(2);
  v1::RegisterWorkerRequest request;
  AdoptionCase() {
    identities[1].worker_id = "worker-000002";
    identities[1].secret_sha256 = security::Sha256("secret-2");
    request.set_name("w2");
    request.set_previous_worker_id("worker-000002");
    request.mutable_status()->set_job_id(job.id());
    request.mutable_status()->set_generation(3);
    request.mutable_status()->set_rank(1);
  }
  AdoptionTarget Target(bool adopting = true) const {
    AdoptionTarget target;
    target.job = &job;
    target.adopting = adopting;
    target.rank_identities = &identities;
    return target;
  }
};

RegistrationProof WorkerProof(const std::string& secret) {
  RegistrationProof proof;
  proof.acts_for_any_worker = false;
  proof.presented_secret = secret;
  return proof;
}

TEST(CheckRankAdoption, TheRankHolderWithItsSecretTakesItBack) {
  const AdoptionCase c;
  EXPECT_TRUE(CheckRankAdoption(c.request, WorkerProof("secret-2"), c.Target()).ok());
  EXPECT_TRUE(CheckRankAdoption(c.request, RegistrationProof{}, c.Target()).ok());
}

TEST(CheckRankAdoption, EachRuleRefusesWithItsCode) {
  AdoptionCase c;
  EXPECT_TRUE(absl::IsFailedPrecondition(
      CheckRankAdoption(c.request, RegistrationProof{}, c.Target(/*adopting=*/false))));
  c.request.mutable_status()->set_generation(2);
  EXPECT_TRUE(
      absl::IsFailedPrecondition(CheckRankAdoption(c.request, RegistrationProof{}, c.Target())));
  c.request.mutable_status()->set_generation(3);
  c.request.mutable_status()->set_rank(0);
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckRankAdoption(c.request, RegistrationProof{}, c.Target())));
  c.request.mutable_status()->set_rank(5);
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckRankAdoption(c.request, RegistrationProof{}, c.Target())));
  c.request.mutable_status()->set_rank(1);
  AdoptionTarget registered = c.Target();
  registered.previous_id_registered = true;
  EXPECT_TRUE(absl::IsAlreadyExists(CheckRankAdoption(c.request, RegistrationProof{}, registered)));
  const absl::Status wrong_secret = CheckRankAdoption(c.request, WorkerProof("other"), c.Target());
  EXPECT_TRUE(absl::IsPermissionDenied(wrong_secret));
  EXPECT_EQ(wrong_secret.message(),
            "worker secret: not the one of worker-000002, which held rank 1");
  AdoptionTarget name_held = c.Target();
  name_held.live_name_holder = "worker-000009";
  const absl::Status held = CheckRankAdoption(c.request, RegistrationProof{}, name_held);
  EXPECT_TRUE(absl::IsAlreadyExists(held));
  EXPECT_EQ(held.message(), "worker name w2 is held by the live registration worker-000009");
}

TEST(CheckRankAdoption, NoStoredIdentityMeansNoWorkerCanProveIt) {
  AdoptionCase c;
  c.identities[1].worker_id.clear();
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckRankAdoption(c.request, WorkerProof("secret-2"), c.Target())));
  // An admin needs no proof.
  EXPECT_TRUE(CheckRankAdoption(c.request, RegistrationProof{}, c.Target()).ok());
}

TEST(MissingRanks, ListsTheRanksNotBackInOrder) {
  EXPECT_EQ(MissingRanks(4, {1, 3}), (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE(MissingRanks(2, {0, 1}).empty());
}

TEST(LostPeersToNote, OnlyAMembersReportAboutThatGenerationCounts) {
  const std::vector<std::string> members = {"a", "b", "c"};
  v1::WorkerStatus status;
  status.set_generation(5);
  status.set_rank(0);
  status.add_lost_peer_ranks(2);
  status.add_lost_peer_ranks(0);  // itself: ignored
  status.add_lost_peer_ranks(7);  // out of range: ignored
  EXPECT_EQ(LostPeersToNote("a", status, 5, members), (std::vector<int32_t>{2}));
  EXPECT_TRUE(LostPeersToNote("b", status, 5, members).empty());  // not rank 0's holder
  EXPECT_TRUE(LostPeersToNote("a", status, 4, members).empty());  // another generation
  status.set_rank(3);
  EXPECT_TRUE(LostPeersToNote("a", status, 5, members).empty());
}

v1::WorkerInfo Worker(v1::WorkerState state, v1::AssignmentKind kind, int64_t generation) {
  v1::WorkerInfo worker;
  worker.set_state(state);
  worker.mutable_assignment()->set_kind(kind);
  worker.mutable_assignment()->set_job_id("job-000001");
  worker.mutable_assignment()->set_generation(generation);
  return worker;
}

TEST(AwaitedMembers, ALiveMemberStillAbortingTheGenerationIsAwaited) {
  const v1::WorkerInfo aborting = Worker(v1::BUSY, v1::ASSIGNMENT_ABORT, 5);
  const v1::WorkerInfo back = Worker(v1::IDLE, v1::ASSIGNMENT_IDLE, 0);
  const v1::WorkerInfo dead = Worker(v1::DEAD, v1::ASSIGNMENT_ABORT, 5);
  const v1::WorkerInfo older = Worker(v1::IDLE, v1::ASSIGNMENT_ABORT, 4);
  EXPECT_TRUE(IsAwaitedMember(&aborting, "job-000001", 5));
  EXPECT_FALSE(IsAwaitedMember(&aborting, "job-000002", 5));
  EXPECT_FALSE(IsAwaitedMember(&back, "job-000001", 5));
  EXPECT_FALSE(IsAwaitedMember(&dead, "job-000001", 5));
  EXPECT_FALSE(IsAwaitedMember(&older, "job-000001", 5));
  EXPECT_FALSE(IsAwaitedMember(nullptr, "job-000001", 5));
  const std::vector<std::string> members = {"a", "b", "c", "d"};
  EXPECT_EQ(AwaitedMembers(members, {"c"}, {&aborting, &back, &aborting, nullptr}, "job-000001", 5),
            (std::vector<std::string>{"a (rank 0)"}));
}

TEST(NextRegroupStep, WaitsUntilAllAreBackOrTheDeadline) {
  const absl::Time deadline = absl::FromUnixSeconds(100);
  EXPECT_EQ(NextRegroupStep(true, absl::FromUnixSeconds(99), deadline), RegroupStep::kWait);
  EXPECT_EQ(NextRegroupStep(true, deadline, deadline), RegroupStep::kStopWaiting);
  EXPECT_EQ(NextRegroupStep(false, absl::FromUnixSeconds(99), deadline), RegroupStep::kAllBack);
  EXPECT_EQ(NextRegroupStep(false, absl::FromUnixSeconds(200), deadline), RegroupStep::kAllBack);
}

}  // namespace
}  // namespace zeroshard::coordinator
