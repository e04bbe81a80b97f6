// CallAgreement with threads as ranks over Gloo: matching calls agree; a call only some ranks
// make fails every rank at once, naming the calls and the ranks; a rank that makes no call is
// named at the timeout, with the last agreed call; a slower rank is waited for.
#include "worker/attach/call_agreement.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/testing/rank_threads.h"

namespace zeroshard::attach {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::zeroshard::comm::testing::RunOnRankThreads;

// One communicator and one agreement per rank.
struct Group {
  comm::InMemoryStore store;
  std::vector<std::unique_ptr<comm::GlooCommunicator>> communicators;
  std::vector<std::unique_ptr<CallAgreement>> agreements;
};

std::unique_ptr<Group> MakeGroup(int world_size, absl::Duration timeout) {
  auto group = std::make_unique<Group>();
  group->communicators.resize(world_size);
  group->agreements.resize(world_size);
  const absl::Status made = RunOnRankThreads(world_size, [&](int rank) -> absl::Status {
    comm::GlooCommunicatorOptions options;
    options.rank = rank;
    options.world_size = world_size;
    options.store = &group->store;
    options.rendezvous_timeout = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<comm::GlooCommunicator>> communicator =
        comm::GlooCommunicator::Create(options);
    if (!communicator.ok()) return communicator.status();
    group->communicators[rank] = *std::move(communicator);
    CallAgreementOptions agreement;
    agreement.rank = rank;
    agreement.world_size = world_size;
    agreement.timeout = timeout;
    absl::StatusOr<std::unique_ptr<CallAgreement>> created =
        CallAgreement::Create(group->communicators[rank].get(), agreement);
    if (!created.ok()) return created.status();
    group->agreements[rank] = *std::move(created);
    return absl::OkStatus();
  });
  EXPECT_TRUE(made.ok()) << made;
  return group;
}

TEST(CallAgreementTest, MatchingCallsAgree) {
  for (const int world_size : {1, 2, 3}) {
    std::unique_ptr<Group> group = MakeGroup(world_size, absl::Seconds(30));
    const absl::Status agreed = RunOnRankThreads(world_size, [&](int rank) -> absl::Status {
      for (int64_t step = 0; step < 3; ++step) {
        if (absl::Status s = group->agreements[rank]->Agree(TrainerCall::kBackward, step, 0);
            !s.ok()) {
          return s;
        }
        if (absl::Status s = group->agreements[rank]->Agree(TrainerCall::kStep, step, 0); !s.ok()) {
          return s;
        }
      }
      return group->agreements[rank]->Agree(TrainerCall::kFinish, 3, 0);
    });
    EXPECT_TRUE(agreed.ok()) << "world size " << world_size << ": " << agreed;
  }
}

// Fails before the fix (no agreement): rank 0's state_dict and rank 1's backward each ran their
// own collectives, which never matched, until the collectives' timeout.
TEST(CallAgreementTest, ACallOnlySomeRanksMakeFailsEveryRankNamingTheCallsAndRanks) {
  std::unique_ptr<Group> group = MakeGroup(3, absl::Minutes(5));
  std::vector<absl::Status> results(3);
  const absl::Time start = absl::Now();
  (void)RunOnRankThreads(3, [&](int rank) -> absl::Status {
    absl::Status agreed = group->agreements[rank]->Agree(TrainerCall::kStep, 4, 0);
    if (agreed.ok()) {
      agreed = group->agreements[rank]->Agree(
          rank == 0 ? TrainerCall::kSaveState : TrainerCall::kBackward, 5, 0);
    }
    results[rank] = agreed;
    return absl::OkStatus();
  });
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  for (const absl::Status& result : results) EXPECT_TRUE(absl::IsFailedPrecondition(result));
  EXPECT_THAT(
      results[0].message(),
      AllOf(HasSubstr("opt.state_dict() on rank 0 (at step 5, collective call #2)"),
            HasSubstr("rank 1 called backward at step 5"),
            HasSubstr("rank 2 called backward at step 5"), HasSubstr("\"Collective calls\"")));
  EXPECT_THAT(results[1].message(),
              AllOf(HasSubstr("backward on rank 1 (at step 5, collective call #2)"),
                    HasSubstr("rank 0 called opt.state_dict() at step 5")));
  EXPECT_THAT(results[2].message(), HasSubstr("rank 0 called opt.state_dict() at step 5"));
  EXPECT_THAT(results[2].message(), testing::Not(HasSubstr("rank 1 called")));
}

TEST(CallAgreementTest, ARankThatMakesNoCallIsNamedAtTheTimeoutWithTheLastAgreedCall) {
  std::unique_ptr<Group> group = MakeGroup(2, absl::Seconds(1));
  std::vector<absl::Status> results(2);
  (void)RunOnRankThreads(2, [&](int rank) -> absl::Status {
    results[rank] = group->agreements[rank]->Agree(TrainerCall::kStep, 11, 0);
    if (results[rank].ok() && rank == 0) {
      results[rank] = group->agreements[rank]->Agree(TrainerCall::kSaveState, 12, 0);
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(results[1].ok()) << results[1];
  EXPECT_TRUE(absl::IsDeadlineExceeded(results[0])) << results[0];
  EXPECT_THAT(results[0].message(),
              AllOf(HasSubstr("opt.state_dict() on rank 0 (at step 12"),
                    HasSubstr("rank 1 did not make any collective call within 1s"),
                    HasSubstr("every rank's last collective call was opt.step() at step 11")));
}

TEST(CallAgreementTest, ASlowerRankIsWaitedFor) {
  std::unique_ptr<Group> group = MakeGroup(2, absl::Seconds(30));
  const absl::Status agreed = RunOnRankThreads(2, [&](int rank) -> absl::Status {
    // Rank 1 evaluates for a while before its next call; rank 0 waits in its call meanwhile.
    if (rank == 1) absl::SleepFor(absl::Milliseconds(1500));
    return group->agreements[rank]->Agree(TrainerCall::kSaveState, 7, 0);
  });
  EXPECT_TRUE(agreed.ok()) << agreed;
}

}  // namespace
}  // namespace zeroshard::attach
