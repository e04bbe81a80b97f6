// Tests for the FIFO gang scheduler: world-size choice, host contiguity, backfill and its bound,
// the reservation (no starvation) and jobs larger than the cluster (blocking nobody), jobs pinned
// to their workers, and recovering jobs' former members (preferred, and held while the job
// regroups).
#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1000);

PendingJob Job(std::string id, int64_t min, int64_t max, int64_t batch,
               absl::Duration waited = absl::ZeroDuration()) {
  PendingJob job;
  job.job_id = std::move(id);
  job.min_workers = min;
  job.max_workers = max;
  job.global_batch = batch;
  job.pending_since = kNow - waited;
  return job;
}

std::vector<FreeWorker> Workers(int n, v1::DeviceKind kind = v1::CPU) {
  std::vector<FreeWorker> workers;
  for (int i = 0; i < n; ++i) {
    workers.push_back({"w" + std::to_string(i), "host-" + std::to_string(i % 2), kind});
  }
  return workers;
}

// The placements at kNow on a cluster whose live workers are `free` plus `busy` (by kind).
std::vector<Placement> Placements(const std::vector<PendingJob>& pending,
                                  const std::vector<FreeWorker>& free,
                                  const SchedulerOptions& options = {},
                                  const LiveWorkerCounts& busy = {}) {
  LiveWorkerCounts live = busy;
  for (const FreeWorker& worker : free) ++live[worker.device_kind];
  return Schedule(pending, free, live, kNow, options).placements;
}

TEST(ChooseWorldSizeTest, LargestDivisorInRange) {
  EXPECT_EQ(ChooseWorldSize(Job("a", 1, 8, 128), 5), 4);
  EXPECT_EQ(ChooseWorldSize(Job("a", 1, 8, 128), 8), 8);
  EXPECT_EQ(ChooseWorldSize(Job("a", 3, 3, 128), 8), 0);
  EXPECT_EQ(ChooseWorldSize(Job("a", 2, 6, 12), 1), 0);
  EXPECT_EQ(ChooseWorldSize(Job("a", 2, 6, 12), 5), 4);
  EXPECT_EQ(ChooseWorldSize(Job("a", 1, 1, 7), 100), 1);
}

TEST(SchedulerTest, PlacesJobsInFifoOrderWithHostsContiguous) {
  const std::vector<Placement> placements =
      Placements({Job("a", 2, 4, 128), Job("b", 2, 2, 128)}, Workers(6));
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].job_id, "a");
  // host-0 holds w0, w2, w4; host-1 holds w1, w3, w5.
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2", "w4", "w1"}));
  EXPECT_EQ(placements[1].worker_ids, (std::vector<std::string>{"w3", "w5"}));
}

TEST(SchedulerTest, DeviceKindsDoNotMix) {
  std::vector<FreeWorker> workers = Workers(2, v1::CUDA);
  PendingJob cpu_job = Job("cpu", 1, 2, 2);
  EXPECT_TRUE(Placements({cpu_job}, workers).empty());
  PendingJob gpu_job = cpu_job;
  gpu_job.device_kind = v1::CUDA;
  EXPECT_EQ(Placements({gpu_job}, workers).size(), 1u);
}

TEST(SchedulerTest, LaterJobBackfillsWhileTheHeadIsYoung) {
  // 6 more workers are busy: "big" fits the cluster, just not now.
  const std::vector<Placement> placements =
      Placements({Job("big", 8, 8, 128, absl::Seconds(5)), Job("small", 2, 2, 128)}, Workers(4), {},
                 {{v1::CPU, 6}});
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "small");
}

TEST(SchedulerTest, HeadThatWaitedTooLongReservesWorkers) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  EXPECT_TRUE(Placements({Job("big", 8, 8, 128, absl::Seconds(30)), Job("small", 2, 2, 128)},
                         Workers(4), options, {{v1::CPU, 6}})
                  .empty());
  // Once enough workers exist, the head starts first.
  const std::vector<Placement> placements = Placements(
      {Job("big", 8, 8, 128, absl::Seconds(31)), Job("small", 2, 2, 128)}, Workers(10), options);
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].job_id, "big");
  EXPECT_EQ(placements[0].worker_ids.size(), 8u);
}

PendingJob Pinned(std::string id, std::vector<std::string> worker_ids,
                  absl::Duration waited = absl::ZeroDuration()) {
  PendingJob job = Job(std::move(id), 1, 1, 1, waited);
  job.pinned_worker_ids = std::move(worker_ids);
  return job;
}

TEST(SchedulerTest, PinnedJobRunsOnItsWorkersInItsRankOrder) {
  // Rank order is the job's, not the hosts' or registration's.
  const std::vector<Placement> placements =
      Placements({Pinned("attached", {"w3", "w0", "w5"})}, Workers(6));
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "attached");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w3", "w0", "w5"}));
}

TEST(SchedulerTest, PinnedJobWaitsUntilEveryWorkerIsFree) {
  std::vector<FreeWorker> workers = Workers(4);
  // w9 is not free (busy, dead, or not registered), nor is a rank nobody registered as ("").
  EXPECT_TRUE(Placements({Pinned("a", {"w1", "w9"})}, workers).empty());
  EXPECT_TRUE(Placements({Pinned("a", {"w1", ""})}, workers).empty());
  // A worker of another device kind is not free for it.
  workers.push_back({"w9", "host-0", v1::CUDA});
  EXPECT_TRUE(Placements({Pinned("a", {"w1", "w9"})}, workers).empty());
  PendingJob on_cuda = Pinned("a", {"w9"});
  on_cuda.device_kind = v1::CUDA;
  EXPECT_EQ(Placements({on_cuda}, workers).size(), 1u);
}

TEST(SchedulerTest, PinnedAndUnpinnedJobsShareTheWorkers) {
  const std::vector<Placement> placements =
      Placements({Job("first", 2, 2, 128), Pinned("pinned", {"w0", "w1"}), Job("third", 2, 2, 128),
                  Pinned("late", {"w3"})},
                 Workers(6));
  ASSERT_EQ(placements.size(), 3u);
  // "first" took w0 and w2 (host-0), so "pinned" waits; "third" gets the next free workers.
  EXPECT_EQ(placements[0].job_id, "first");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2"}));
  EXPECT_EQ(placements[1].job_id, "third");
  EXPECT_EQ(placements[1].worker_ids, (std::vector<std::string>{"w4", "w1"}));
  // "late" is behind both and its worker is still free.
  EXPECT_EQ(placements[2].job_id, "late");
  EXPECT_EQ(placements[2].worker_ids, (std::vector<std::string>{"w3"}));
}

TEST(SchedulerTest, PinnedWorkersTakenFirstAreSkippedByLaterJobs) {
  const std::vector<Placement> placements =
      Placements({Pinned("pinned", {"w2", "w1"}), Job("any", 1, 4, 4)}, Workers(6));
  ASSERT_EQ(placements.size(), 2u);
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w2", "w1"}));
  // The other four, host-0's first: w0 and w4, then w3 and w5.
  EXPECT_EQ(placements[1].worker_ids, (std::vector<std::string>{"w0", "w4", "w3", "w5"}));
}

TEST(SchedulerTest, PinnedJobThatWaitedTooLongHoldsOnlyItsOwnWorkers) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  // w1 is free, w9 is not: while young, the pinned job lets a later job take w1.
  std::vector<Placement> placements =
      Placements({Pinned("pinned", {"w1", "w9"}, absl::Seconds(29)), Job("any", 4, 4, 4)},
                 Workers(4), options);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "any");
  // After the wait it holds w1, but the kind stays open: a later job gets the other workers.
  placements = Placements({Pinned("pinned", {"w1", "w9"}, absl::Seconds(30)), Job("any", 1, 4, 4)},
                          Workers(4), options);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "any");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2"}))
      << "w1 is held for the pinned job, w3 would make 3 workers, which do not divide 4";
}

TEST(SchedulerTest, PinnedJobWaitsBehindAnEarlierJobThatReservedItsKind) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  EXPECT_TRUE(Placements({Job("big", 8, 8, 128, absl::Seconds(31)), Pinned("pinned", {"w0"})},
                         Workers(4), options, {{v1::CPU, 4}})
                  .empty());
  // Another kind's reservation does not hold it.
  PendingJob big_on_cuda = Job("big", 8, 8, 128, absl::Seconds(31));
  big_on_cuda.device_kind = v1::CUDA;
  EXPECT_EQ(
      Placements({big_on_cuda, Pinned("pinned", {"w0"})}, Workers(4), options, {{v1::CUDA, 8}})
          .size(),
      1u);
}

PendingJob Recovering(std::string id, int64_t min, int64_t max, int64_t batch,
                      std::vector<std::string> former_members, bool regrouping) {
  PendingJob job = Job(std::move(id), min, max, batch);
  job.preferred_worker_ids = std::move(former_members);
  job.regrouping = regrouping;
  return job;
}

TEST(SchedulerTest, FormerMembersArePlacedBeforeOtherWorkersInHostOrder) {
  // Without a preference the job would get w0, w2 (host-0) and w1: w3 and w5 come first, and
  // the rank order still keeps each host's workers together.
  const std::vector<Placement> placements =
      Placements({Recovering("back", 1, 3, 96, {"w5", "w3", "w9"}, false)}, Workers(6));
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w3", "w5"}));
  // More former members than the job may take: the first ones in host order.
  const std::vector<Placement> capped =
      Placements({Recovering("back", 1, 2, 96, {"w5", "w3", "w1"}, false)}, Workers(6));
  ASSERT_EQ(capped.size(), 1u);
  EXPECT_EQ(capped[0].worker_ids, (std::vector<std::string>{"w1", "w3"}));
}

TEST(SchedulerTest, ARegroupingJobStartsNothingAndHoldsItsFormerMembers) {
  // "later" could take every worker; the members already back (w1, w4) are held for "back".
  std::vector<Placement> placements = Placements(
      {Recovering("back", 1, 4, 96, {"w1", "w4"}, true), Job("later", 1, 4, 4)}, Workers(6));
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "later");
  EXPECT_EQ(placements[0].worker_ids, (std::vector<std::string>{"w0", "w2", "w3", "w5"}));
  // An earlier job still comes first: FIFO order is not changed by regrouping.
  placements =
      Placements({Job("earlier", 6, 6, 6), Recovering("back", 1, 4, 96, {"w1"}, true)}, Workers(6));
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "earlier");
}

// ---- Reservation and unschedulable jobs ----

// The probe's case: a 3-worker job on a 2-worker cluster, waiting far past the backfill bound,
// reserves nothing, and a later 1-worker job runs on the idle workers.
TEST(SchedulerTest, AJobLargerThanTheClusterBlocksNobodyAndSaysWhy) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  const ScheduleResult result =
      Schedule({Job("three", 3, 3, 96, absl::Hours(1)), Job("one", 1, 1, 96)}, Workers(2),
               {{v1::CPU, 2}}, kNow, options);
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].job_id, "one");
  ASSERT_EQ(result.unschedulable.size(), 1u);
  EXPECT_EQ(result.unschedulable[0].job_id, "three");
  EXPECT_TRUE(absl::StartsWith(result.unschedulable[0].reason, kUnschedulablePrefix));
  EXPECT_TRUE(absl::StrContains(result.unschedulable[0].reason,
                                "needs 3 CPU workers and the cluster has 2 live"))
      << result.unschedulable[0].reason;
  // Busy workers count: with a third one running another job, "three" fits the cluster and,
  // having waited, holds the idle workers.
  const ScheduleResult fits =
      Schedule({Job("three", 3, 3, 96, absl::Hours(1)), Job("one", 1, 1, 96)}, Workers(2),
               {{v1::CPU, 3}}, kNow, options);
  EXPECT_TRUE(fits.placements.empty());
  EXPECT_TRUE(fits.unschedulable.empty());
}

TEST(SchedulerTest, TheFewestWorkersAJobCanUseDecideWhetherItFits) {
  // min_workers 3 does not divide 8: the job needs 4.
  EXPECT_EQ(SmallestWorldSize(Job("a", 3, 8, 8)), 4);
  EXPECT_EQ(SmallestWorldSize(Job("a", 3, 3, 8)), 0);
  const ScheduleResult result =
      Schedule({Job("a", 3, 8, 8), Job("b", 3, 3, 8)}, Workers(3), {{v1::CPU, 3}}, kNow);
  EXPECT_TRUE(result.placements.empty());
  ASSERT_EQ(result.unschedulable.size(), 2u);
  EXPECT_TRUE(absl::StrContains(result.unschedulable[0].reason,
                                "needs 4 CPU workers and the cluster has 3 live"))
      << result.unschedulable[0].reason;
  EXPECT_TRUE(absl::StrContains(result.unschedulable[1].reason,
                                "no world size in [min_workers 3, max_workers 3] divides "
                                "global_batch 8"))
      << result.unschedulable[1].reason;
}

// A small cluster simulated in whole seconds: jobs run for a fixed time, then free their
// workers; the scheduler runs once a second after the arrivals.
class Simulation {
 public:
  Simulation(int workers, SchedulerOptions options) : options_(options) {
    for (int i = 0; i < workers; ++i) idle_.push_back("w" + std::to_string(i));
  }

  void Submit(PendingJob job, absl::Duration runs_for) {
    job.pending_since = now_;
    run_time_[job.job_id] = runs_for;
    pending_.push_back(std::move(job));
  }

  // Ends the jobs due by the next second, moves the clock there and schedules.
  void Step() {
    now_ += absl::Seconds(1);
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->end > now_) {
        ++it;
        continue;
      }
      idle_.insert(idle_.end(), it->worker_ids.begin(), it->worker_ids.end());
      it = running_.erase(it);
    }
    std::sort(idle_.begin(), idle_.end(), [](const std::string& a, const std::string& b) {
      return std::stoi(a.substr(1)) < std::stoi(b.substr(1));
    });
    std::vector<FreeWorker> free;
    for (const std::string& id : idle_) free.push_back({id, "host-0", v1::CPU});
    const LiveWorkerCounts live = {{v1::CPU, static_cast<int64_t>(total_workers())}};
    const ScheduleResult result = Schedule(pending_, free, live, now_, options_);
    for (const Placement& placement : result.placements) {
      for (const std::string& id : placement.worker_ids) {
        idle_.erase(std::find(idle_.begin(), idle_.end(), id));
      }
      running_.push_back(
          {placement.job_id, placement.worker_ids, now_ + run_time_[placement.job_id]});
      started_at_[placement.job_id] = now_;
      pending_.erase(std::find_if(pending_.begin(), pending_.end(), [&](const PendingJob& job) {
        return job.job_id == placement.job_id;
      }));
    }
  }

  absl::Time now() const { return now_; }
  // When the job started, or nullopt.
  std::optional<absl::Time> started_at(const std::string& job_id) const {
    const auto it = started_at_.find(job_id);
    if (it == started_at_.end()) return std::nullopt;
    return it->second;
  }
  const std::map<std::string, absl::Time>& starts() const { return started_at_; }

 private:
  struct Running {
    std::string job_id;
    std::vector<std::string> worker_ids;
    absl::Time end;
  };
  size_t total_workers() const {
    size_t busy = 0;
    for (const Running& job : running_) busy += job.worker_ids.size();
    return busy + idle_.size();
  }

  SchedulerOptions options_;
  absl::Time now_ = kNow;
  std::vector<std::string> idle_;
  std::vector<Running> running_;
  std::vector<PendingJob> pending_;
  std::map<std::string, absl::Duration> run_time_;
  std::map<std::string, absl::Time> started_at_;
};

// A 4-worker job on a 4-worker cluster that a stream of 1-worker jobs keeps 3 workers busy on
// (one arrives every second and runs 3 s). It waits the backfill bound, then gets its workers as
// they free up, and no small job takes one meanwhile.
TEST(SchedulerTest, AStreamOfSmallJobsDoesNotStarveALargeOne) {
  const auto run = [](absl::Duration max_backfill_wait, int seconds) {
    SchedulerOptions options;
    options.max_backfill_wait = max_backfill_wait;
    Simulation cluster(4, options);
    cluster.Submit(Job("small-0", 1, 1, 8), absl::Seconds(3));
    cluster.Step();
    cluster.Submit(Job("big", 4, 4, 8), absl::Seconds(10));
    for (int second = 1; second < seconds; ++second) {
      cluster.Submit(Job("small-" + std::to_string(second), 1, 1, 8), absl::Seconds(3));
      cluster.Step();
    }
    return cluster;
  };
  // Without a reservation (a bound longer than the run) the big job starves: the scenario is real.
  EXPECT_EQ(run(absl::Hours(1), 200).started_at("big"), std::nullopt);

  const Simulation cluster = run(absl::Seconds(30), 200);
  const absl::Time submitted = kNow + absl::Seconds(1);
  const std::optional<absl::Time> big_started = cluster.started_at("big");
  ASSERT_TRUE(big_started.has_value());
  // Reserved once it waited 30 s; the small jobs then running end within their 3 s.
  EXPECT_GE(*big_started - submitted, absl::Seconds(30));
  EXPECT_LE(*big_started - submitted, absl::Seconds(34));
  int small_before_reservation = 0;
  for (const auto& [job_id, started] : cluster.starts()) {
    if (job_id == "big") continue;
    // Small jobs backfill while the big one is young...
    if (started < submitted + absl::Seconds(30)) ++small_before_reservation;
    // ...but none starts on a reserved worker, nor beside the big job (it takes every worker).
    EXPECT_FALSE(started >= submitted + absl::Seconds(30) &&
                 started < *big_started + absl::Seconds(10))
        << job_id << " started " << (started - kNow) << " after the start";
  }
  EXPECT_GE(small_before_reservation, 25);
  // After the big job, the queued small jobs run again.
  EXPECT_TRUE(cluster.started_at("small-60").has_value());
}

// The 3-worker job cannot fit 2 workers; once a third registers it reserves (it waited past the
// bound) and starts when the worker running a small job frees up, while later small jobs wait.
TEST(SchedulerTest, AJobThatDidNotFitStartsOnceAWorkerJoins) {
  SchedulerOptions options;
  options.max_backfill_wait = absl::Seconds(30);
  const PendingJob three = Job("three", 3, 3, 96, absl::Seconds(40));
  ScheduleResult result =
      Schedule({three, Job("one", 1, 1, 96)}, Workers(2), {{v1::CPU, 2}}, kNow, options);
  ASSERT_EQ(result.placements.size(), 1u);
  ASSERT_EQ(result.placements[0].job_id, "one");
  const std::string busy = result.placements[0].worker_ids[0];

  // w2 joins while "one" runs: the other two workers are held for "three".
  std::vector<FreeWorker> free;
  for (const FreeWorker& worker : Workers(3)) {
    if (worker.worker_id != busy) free.push_back(worker);
  }
  result = Schedule({three, Job("two", 1, 1, 96)}, free, {{v1::CPU, 3}}, kNow, options);
  EXPECT_TRUE(result.placements.empty());
  EXPECT_TRUE(result.unschedulable.empty());

  // "one" ends: "three" starts on all three, "two" still waits.
  result = Schedule({three, Job("two", 1, 1, 96)}, Workers(3), {{v1::CPU, 3}}, kNow, options);
  ASSERT_EQ(result.placements.size(), 1u);
  EXPECT_EQ(result.placements[0].job_id, "three");
  EXPECT_EQ(result.placements[0].worker_ids.size(), 3u);
}

TEST(SchedulerTest, SchedulesAThousandWorkerJob) {
  const std::vector<Placement> placements = Placements({Job("x", 1024, 1024, 1024)}, Workers(1500));
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].worker_ids.size(), 1024u);
}

TEST(PinnedWorkerIdsTest, EachRankGetsItsNamedLiveWorkerOrWaits) {
  v1::JobSpec spec;
  spec.set_device_kind(v1::CPU);
  spec.mutable_workload()->mutable_attached()->add_workers("t0");
  spec.mutable_workload()->mutable_attached()->add_workers("t1");
  v1::WorkerInfo t0;
  t0.set_id("worker-000007");
  t0.set_name("t0");
  t0.set_device_kind(v1::CPU);
  t0.set_attach_socket("/run/t0.sock");
  absl::flat_hash_map<std::string, const v1::WorkerInfo*> live = {{"t0", &t0}};
  absl::StatusOr<std::vector<std::string>> ids = PinnedWorkerIds(spec, live);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, (std::vector<std::string>{"worker-000007", ""}));
  t0.clear_attach_socket();
  EXPECT_TRUE(absl::IsFailedPrecondition(PinnedWorkerIds(spec, live).status()));
  t0.set_attach_socket("/run/t0.sock");
  t0.set_device_kind(v1::CUDA);
  const absl::Status kind = PinnedWorkerIds(spec, live).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(kind));
  EXPECT_EQ(kind.message(),
            "workload.attached.workers[0]: worker t0 (worker-000007) is a CUDA worker; the job's "
            "device_kind is CPU");
}

// Fails before the fix: the scheduler ignored the workers' memory limits and placed a job on
// workers its engine could not fit in.
TEST(SchedulerTest, WorkersWhoseMemoryLimitIsBelowTheNeedAreLeftOut) {
  // Need per rank: 1000 bytes / W (a sharded job).
  PendingJob job = Job("a", 1, 4, 4);
  job.memory_need_bytes = [](int64_t world_size) { return 1000 / world_size; };
  std::vector<FreeWorker> free = Workers(4);
  free[1].memory_limit_bytes = 200;  // fits neither W = 4 (250) nor less
  free[2].memory_limit_bytes = 400;  // fits W = 4 and W = 3, not W = 2 (500)
  // W = 4 needs 250: three workers fit (w0 without a limit, w2, w3); W = 3 does not divide 4; W = 2
  // needs 500: w0 and w3 fit.
  std::vector<Placement> placements = Placements({job}, free);
  ASSERT_EQ(placements.size(), 1u);
  std::vector<std::string> ids = placements[0].worker_ids;
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{"w0", "w3"}));
  // No worker fits any W: the job waits (no reservation), and a later job that fits starts.
  for (FreeWorker& worker : free) worker.memory_limit_bytes = 100;
  PendingJob small = Job("b", 1, 1, 1);
  placements = Placements({job, small}, free);
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].job_id, "b");
  // Without limits, the need is not asked for.
  PendingJob unasked = Job("c", 1, 4, 4);
  unasked.memory_need_bytes = [](int64_t) -> int64_t {
    ADD_FAILURE() << "asked without limits";
    return 0;
  };
  placements = Placements({unasked}, Workers(4));
  ASSERT_EQ(placements.size(), 1u);
  EXPECT_EQ(placements[0].worker_ids.size(), 4u);
}

}  // namespace
}  // namespace zeroshard::coordinator
