// The dashboard's job endpoint on a real cluster (coordinator and 2 worker processes): while a
// job runs every rank's latest metrics are there (rank 1 reports after its first step), and
// after it ends each rank's last step.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "http/http_test_client.h"
#include "tests/integration/local_cluster.h"

namespace zeroshard::testing {
namespace {

constexpr int64_t kShortSteps = 5;

v1::JobSpec SeedSpec(const std::string& name, int64_t steps) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_mode(v1::ZERO2);
  spec.set_min_workers(2);
  spec.set_max_workers(2);
  spec.set_global_batch(128);
  spec.set_steps(steps);
  return spec;
}

// GET /api/v1/jobs/<id> on the coordinator's HTTP port, parsed.
absl::StatusOr<v1::Job> JobOverHttp(const LocalCluster& cluster, const std::string& job_id) {
  absl::StatusOr<http::testing::HttpReply> reply = http::testing::Get(
      cluster.metrics_port(), "/api/v1/jobs/" + job_id, absl::Now() + absl::Seconds(10));
  if (!reply.ok()) return reply.status();
  if (reply->status != 200) {
    return absl::InternalError(absl::StrCat("HTTP ", reply->status, ": ", reply->body));
  }
  v1::Job job;
  const auto parsed = google::protobuf::util::JsonStringToMessage(reply->body, &job);
  if (!parsed.ok()) return absl::InternalError(std::string(parsed.message()));
  return job;
}

TEST(DashboardRankProgressTest, EveryRankOfARunningJobHasReportedItsMetrics) {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(250);
  LocalCluster cluster(options);
  absl::Status started = cluster.Start(2);
  ASSERT_TRUE(started.ok()) << started;

  // Long enough never to finish here; cancelled below.
  absl::StatusOr<v1::Job> endless = cluster.client().SubmitJob(SeedSpec("endless", 1'000'000));
  ASSERT_TRUE(endless.ok()) << endless.status();
  v1::Job seen;
  absl::Status reported = cluster.WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = JobOverHttp(cluster, endless->id());
        if (!job.ok()) return false;
        seen = *job;
        return job->state() == v1::RUNNING && job->rank_progress_size() == 2 &&
               job->rank_progress(0).step() > 1 && job->rank_progress(1).step() > 0;
      },
      absl::Seconds(60), "both ranks' metrics in rankProgress of the running job");
  ASSERT_TRUE(reported.ok()) << reported << "\n" << seen.DebugString();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_GT(seen.rank_progress(rank).memory().total_bytes(), 0) << rank;
    EXPECT_GT(seen.rank_progress(rank).memory().optimizer_state_bytes(), 0) << rank;
  }
  // Rank 0 reports every step (its entry is the job's progress); rank 1 after its first only.
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(seen.rank_progress(0), seen.progress()));
  EXPECT_EQ(seen.rank_progress(1).step(), 1);
  ASSERT_TRUE(cluster.client().CancelJob(endless->id(), "test done").ok());

  absl::StatusOr<v1::Job> short_job = cluster.client().SubmitJob(SeedSpec("short", kShortSteps));
  ASSERT_TRUE(short_job.ok()) << short_job.status();
  absl::StatusOr<v1::Job> ended = cluster.WaitForJob(
      short_job->id(), [](const v1::Job& job) { return IsFinalJobState(job.state()); },
      absl::Seconds(60), "the short job's end");
  ASSERT_TRUE(ended.ok()) << ended.status();
  ASSERT_EQ(ended->state(), v1::SUCCEEDED) << ended->DebugString();
  absl::StatusOr<v1::Job> finished = JobOverHttp(cluster, short_job->id());
  ASSERT_TRUE(finished.ok()) << finished.status();
  ASSERT_EQ(finished->rank_progress_size(), 2);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(finished->rank_progress(rank).step(), kShortSteps) << rank;
  }
  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace zeroshard::testing
