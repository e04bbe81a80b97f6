// Issue 6, bad job specs through the real `zeroshard` CLI against a real cluster: each fails
// with one line on stderr naming the field and a non-zero exit, and nothing else is disturbed.
// Issue 14: `zeroshard workers` lists more workers than one gRPC message holds.
// Issue 24: `zeroshard fsck` reports each checkpoint file's state and exits 5 on damage.
// Issue 27: the CLI reads the coordinator's address and the credentials from the environment
// (ZEROSHARD_COORDINATOR, ZEROSHARD_CA, ZEROSHARD_TOKEN), and its flags win.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "checkpoint/manifest.h"
#include "coordinator/test_checkpointed_job.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_credentials.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/subprocess.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::testing {
namespace {

constexpr absl::Duration kCommandDeadline = absl::Seconds(30);

std::string WriteFile(const LocalCluster& cluster, const std::string& name,
                      const std::string& text) {
  const std::string path = absl::StrCat(cluster.base_dir(), "/", name);
  std::ofstream(path) << text;
  return path;
}

absl::StatusOr<CommandResult> RunCli(const LocalCluster& cluster, std::vector<std::string> args) {
  std::vector<std::string> argv = {LocalCluster::RunfilePath("client/zeroshard"),
                                   "--coordinator=" + cluster.coordinator_target()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, kCommandDeadline);
}

// `zeroshard ARGS` with the environment variables `env` ("NAME=value") and none of the others
// the CLI reads: no --coordinator unless ARGS has one.
absl::StatusOr<CommandResult> RunCliWithEnv(std::vector<std::string> env,
                                            std::vector<std::string> args) {
  std::vector<std::string> argv = {"/usr/bin/env"};
  for (const char* name : {"ZEROSHARD_COORDINATOR", "ZEROSHARD_CA", "ZEROSHARD_CERT",
                           "ZEROSHARD_KEY", "ZEROSHARD_TOKEN", "ZEROSHARD_INSECURE"}) {
    argv.insert(argv.end(), {"-u", name});
  }
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(LocalCluster::RunfilePath("client/zeroshard"));
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, kCommandDeadline);
}

struct BadSpec {
  std::string what;
  // `zeroshard` arguments after --coordinator.
  std::vector<std::string> args;
  // The error line must contain this (the field, or for a file that does not parse, the spec).
  std::string names;
};

TEST(CliTest, BadSpecsFailWithOneLineNamingTheFieldAndDisturbNothing) {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(200);
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.Start(1);
  ASSERT_TRUE(started.ok()) << started;

  const std::string malformed_yaml =
      WriteFile(cluster, "malformed.yaml", "name: [unclosed\nworkload: {preset: seed\n");
  const std::string malformed_json = WriteFile(
      cluster, "malformed.json", R"({"name": "bad-json", "workload": {"preset": "seed"},, })");
  const std::string unknown_preset = WriteFile(cluster, "unknown_preset.yaml",
                                               "name: typo\n"
                                               "workload:\n"
                                               "  preset: seeed\n"
                                               "optimizer:\n"
                                               "  kind: ADAMW\n");
  const std::vector<BadSpec> bad_specs = {
      {"malformed YAML file", {"submit", malformed_yaml}, "job spec: malformed YAML"},
      {"JSON file with a syntax error", {"submit", malformed_json}, "job spec:"},
      {"unknown preset", {"submit", unknown_preset}, "workload.preset"},
      {"negative lr",
       {"submit", "--name=neg-lr", "--preset=seed", "--optimizer=adamw", "--lr=-0.01"},
       "optimizer.lr"},
      {"world size 0",
       {"submit", "--name=no-workers", "--preset=seed", "--optimizer=adamw", "--workers=0"},
       "min_workers"},
      {"empty --no_decay pattern",
       {"submit", "--name=empty-pattern", "--preset=seed", "--optimizer=adamw",
        "--no_decay=*.bias,"},
       "param_groups[0].patterns[1]"},
      {"negative checkpoint interval",
       {"submit", "--name=bad-ckpt", "--preset=seed", "--optimizer=adamw", "--checkpoint_every=-1"},
       "checkpoint.every_steps"},
  };
  for (const BadSpec& bad : bad_specs) {
    SCOPED_TRACE(bad.what);
    absl::StatusOr<CommandResult> run = RunCli(cluster, bad.args);
    ASSERT_TRUE(run.ok()) << run.status();
    EXPECT_TRUE(run->exited());
    EXPECT_NE(run->exit_code(), 0);
    EXPECT_EQ(run->stdout_text, "");
    // Exactly one line: one newline, at the end.
    EXPECT_TRUE(absl::EndsWith(run->stderr_text, "\n")) << run->stderr_text;
    EXPECT_EQ(std::count(run->stderr_text.begin(), run->stderr_text.end(), '\n'), 1)
        << run->stderr_text;
    EXPECT_TRUE(absl::StrContains(run->stderr_text, bad.names))
        << "expected '" << bad.names << "' in: " << run->stderr_text;
  }

  // Nothing else was disturbed: no job was created, the worker is still idle, and a valid spec
  // file submitted the same way runs to completion.
  absl::StatusOr<std::vector<v1::Job>> jobs =
      cluster.client().ListJobs(v1::JOB_STATE_UNSPECIFIED, 100);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_TRUE(jobs->empty()) << jobs->size() << " jobs, e.g. " << jobs->front().ShortDebugString();
  absl::StatusOr<v1::WorkerInfo> worker = cluster.FindWorker("worker-0");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->state(), v1::IDLE);

  // Its parameter groups come from the file and from --no_decay, which goes first.
  const std::string valid = WriteFile(cluster, "valid.yaml",
                                      "name: valid\n"
                                      "workload:\n"
                                      "  preset: seed\n"
                                      "optimizer:\n"
                                      "  kind: ADAMW\n"
                                      "  lr: 0.01\n"
                                      "steps: 20\n"
                                      "param_groups:\n"
                                      "  - patterns: ['0.*']\n"
                                      "    lr_scale: 0.5\n");
  absl::StatusOr<CommandResult> submitted =
      RunCli(cluster, {"submit", valid, "--no_decay=*.bias,2.weight", "--checkpoint_every=5",
                       "--checkpoint_keep=3", "--max_attempts=2"});
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_EQ(submitted->exit_code(), 0) << submitted->stderr_text;
  const std::string job_id(absl::StripSuffix(submitted->stdout_text, "\n"));
  ASSERT_TRUE(absl::StartsWith(job_id, "job-")) << submitted->stdout_text;
  v1::Job last;
  absl::Status succeeded = cluster.WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = cluster.client().GetJob(job_id);
        if (job.ok()) last = *job;
        return job.ok() && (job->state() == v1::SUCCEEDED || job->state() == v1::FAILED ||
                            job->state() == v1::CANCELLED);
      },
      absl::Seconds(60), absl::StrCat(job_id, " ended"));
  ASSERT_TRUE(succeeded.ok()) << succeeded;
  EXPECT_EQ(last.state(), v1::SUCCEEDED) << last.message();
  ASSERT_EQ(last.spec().param_groups_size(), 2) << last.spec().ShortDebugString();
  EXPECT_EQ(last.spec().checkpoint().every_steps(), 5);
  EXPECT_EQ(last.spec().checkpoint().keep(), 3);
  EXPECT_EQ(last.spec().max_attempts(), 2);
  // Checkpoints at 5, 10, 15 and the final one at 20; three kept.
  EXPECT_EQ(last.latest_checkpoint().step(), 20);
  const v1::ParamGroup& no_decay = last.spec().param_groups(0);
  ASSERT_EQ(no_decay.patterns_size(), 2);
  EXPECT_EQ(no_decay.patterns(0), "*.bias");
  EXPECT_EQ(no_decay.patterns(1), "2.weight");
  EXPECT_TRUE(no_decay.has_weight_decay());
  EXPECT_EQ(no_decay.weight_decay(), 0.0);
  const v1::ParamGroup& from_file = last.spec().param_groups(1);
  ASSERT_EQ(from_file.patterns_size(), 1);
  EXPECT_EQ(from_file.patterns(0), "0.*");
  EXPECT_FALSE(from_file.has_weight_decay());
  EXPECT_EQ(from_file.lr_scale(), 0.5);

  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// The ids in the first column of `zeroshard workers` output, after its header line.
std::vector<std::string> FirstColumn(const std::string& table) {
  std::vector<std::string> ids;
  std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  for (size_t i = 1; i < lines.size(); ++i) {
    ids.push_back(std::string(lines[i].substr(0, lines[i].find(' '))));
  }
  return ids;
}

// Issue 14, the probe's case: 600 workers with 32 labels each (about 6 MiB of WorkerInfo, over
// gRPC's 4 MiB message limit) are all listed by `zeroshard workers`, which follows the
// coordinator's pages; also once they are all DEAD (they never heartbeat) and still listed.
TEST(CliTest, WorkersListsSixHundredLabelledWorkersThroughPages) {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(200);
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.StartCoordinator();
  ASSERT_TRUE(started.ok()) << started;
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(cluster.coordinator_target(), grpc::InsecureChannelCredentials()));
  std::vector<std::string> registered;
  for (int i = 0; i < 600; ++i) {
    v1::RegisterWorkerRequest request;
    request.set_name(absl::StrCat("probe-", i));
    request.set_host(absl::StrCat("host-", i));
    request.set_device_kind(v1::CPU);
    for (int label = 0; label < 32; ++label) {
      std::string key = absl::StrCat("label-", label, "-");
      key.resize(63, 'k');
      (*request.mutable_labels())[key] = std::string(256, 'v');
    }
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kCommandDeadline));
    const grpc::Status status = stub->RegisterWorker(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    registered.push_back(response.worker_id());
  }

  absl::StatusOr<CommandResult> listed = RunCli(cluster, {"workers"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->exit_code(), 0) << listed->stderr_text;
  EXPECT_EQ(FirstColumn(listed->stdout_text), registered);

  absl::Status dead = cluster.WaitFor(
      [&] {
        absl::StatusOr<std::vector<v1::WorkerInfo>> workers =
            cluster.client().ListWorkers(v1::DEAD);
        return workers.ok() && workers->size() == registered.size();
      },
      absl::Seconds(30), "all 600 workers DEAD");
  ASSERT_TRUE(dead.ok()) << dead;
  listed = RunCli(cluster, {"workers", "--state=DEAD"});
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->exit_code(), 0) << listed->stderr_text;
  EXPECT_EQ(FirstColumn(listed->stdout_text), registered);

  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// `zeroshard fsck` against a coordinator whose checkpoint root holds a job's committed
// checkpoints (written and committed through its RPCs as the workers would): one line per file
// and a summary, exit 0 while every file is OK; a flipped byte makes that file's line
// CRC_MISMATCH and the exit 5, which an export of the damaged checkpoint shares.
TEST(CliTest, FsckReportsEveryFileAndExitsFiveOnDamage) {
  LocalCluster cluster;
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.StartCoordinator();
  ASSERT_TRUE(started.ok()) << started;
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(cluster.coordinator_target(), grpc::InsecureChannelCredentials()));
  coordinator::testing::CheckpointedJobOptions options;
  options.name = "fsck";
  options.layer_sizes = {64, 64, 16};
  absl::StatusOr<v1::Job> job =
      coordinator::testing::RunCheckpointedJob(*stub, cluster.checkpoint_root(), options);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::SUCCEEDED);
  const std::string& job_id = job->id();
  const std::string step4 =
      absl::StrCat(job->spec().checkpoint().dir(), "/", checkpoint::StepDirName(4));

  absl::StatusOr<CommandResult> run = RunCli(cluster, {"fsck", job_id});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stdout_text << run->stderr_text;
  EXPECT_EQ(run->stderr_text, "");
  std::vector<std::string> lines = absl::StrSplit(run->stdout_text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << run->stdout_text;
  EXPECT_TRUE(absl::StartsWith(lines[0], absl::StrCat(job_id, " step 4 (generation 1")) &&
              absl::EndsWith(lines[0], step4 + "/manifest.json"))
      << lines[0];
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(absl::StartsWith(lines[1 + rank], "OK ") &&
                absl::StrContains(lines[1 + rank],
                                  absl::StrCat(step4, "/", checkpoint::ShardFileName(rank, 2))))
        << lines[1 + rank];
  }
  EXPECT_EQ(lines[3], absl::StrCat(job_id, " step 4: all 2 files OK"));

  // A byte of rank 1's file flipped on the volume.
  const std::string victim =
      absl::StrCat(cluster.checkpoint_root(), "/", step4, "/", checkpoint::ShardFileName(1, 2));
  {
    std::fstream file(victim, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    const char last = static_cast<char>(file.get());
    file.seekp(-1, std::ios::end);
    file.put(static_cast<char>(last ^ 0x01));
    ASSERT_TRUE(file.good()) << victim;
  }
  run = RunCli(cluster, {"fsck", job_id});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 5) << run->stdout_text << run->stderr_text;
  lines = absl::StrSplit(run->stdout_text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u) << run->stdout_text;
  EXPECT_TRUE(absl::StartsWith(lines[1], "OK ")) << lines[1];
  EXPECT_TRUE(absl::StartsWith(lines[2], "CRC_MISMATCH ") &&
              absl::StrContains(lines[2], checkpoint::ShardFileName(1, 2)))
      << lines[2];
  EXPECT_EQ(lines[3], absl::StrCat(job_id, " step 4: 1 of 2 files damaged (1 CRC_MISMATCH)"));

  // The same as JSON, for scripts.
  run = RunCli(cluster, {"fsck", job_id, "--output=json"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 5) << run->stderr_text;
  v1::VerifyCheckpointResponse report;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(run->stdout_text, &report).ok())
      << run->stdout_text;
  EXPECT_FALSE(report.ok());
  ASSERT_EQ(report.files_size(), 2);
  EXPECT_EQ(report.files(0).state(), v1::CHECKPOINT_FILE_OK);
  EXPECT_EQ(report.files(1).state(), v1::CHECKPOINT_FILE_CRC_MISMATCH);

  // Another step is intact; a step without a checkpoint is a refusal (exit 1); no job id is
  // bad usage (exit 2).
  run = RunCli(cluster, {"fsck", job_id, "--step=2"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stdout_text << run->stderr_text;
  run = RunCli(cluster, {"fsck", job_id, "--step=3"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 1) << run->stderr_text;
  EXPECT_TRUE(absl::StrContains(run->stderr_text, "NOT_FOUND") &&
              absl::StrContains(run->stderr_text, "committed steps: 2, 4"))
      << run->stderr_text;
  run = RunCli(cluster, {"fsck"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 2) << run->stderr_text;

  // An export of the damaged checkpoint is refused before it writes anything: exit 5 too.
  const std::string exported = absl::StrCat(cluster.base_dir(), "/model.safetensors");
  run = RunCli(cluster, {"export", job_id, "--step=4", "--output=" + exported});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 5) << run->stderr_text;
  EXPECT_TRUE(absl::StrContains(run->stderr_text, "DATA_LOSS") &&
              absl::StrContains(run->stderr_text, checkpoint::ShardFileName(1, 2)))
      << run->stderr_text;
  EXPECT_FALSE(std::filesystem::exists(exported));

  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// Issue 27: inside a local cluster's command (where cluster.py and zeroshard-launch set
// ZEROSHARD_COORDINATOR) the CLI finds the coordinator as the Python client does; a flag given
// wins over a wrong value, and without the flag the environment's address is the one used.
TEST(CliTest, TheCoordinatorComesFromTheEnvironmentUnlessTheFlagIsGiven) {
  LocalClusterOptions options;
  options.heartbeat_period = absl::Milliseconds(200);
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.Start(1);
  ASSERT_TRUE(started.ok()) << started;
  const std::string from_env = "ZEROSHARD_COORDINATOR=" + cluster.coordinator_target();

  absl::StatusOr<CommandResult> run = RunCliWithEnv({from_env}, {"workers"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stderr_text;
  EXPECT_EQ(FirstColumn(run->stdout_text).size(), 1u) << run->stdout_text;
  run = RunCliWithEnv({from_env}, {"jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stderr_text;
  EXPECT_TRUE(absl::StartsWith(run->stdout_text, "ID ")) << run->stdout_text;

  const std::string wrong = "ZEROSHARD_COORDINATOR=127.0.0.1:1";
  run = RunCliWithEnv({wrong}, {"--coordinator=" + cluster.coordinator_target(), "workers"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stderr_text;
  EXPECT_EQ(FirstColumn(run->stdout_text).size(), 1u) << run->stdout_text;
  run = RunCliWithEnv({wrong}, {"jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 4) << run->stderr_text;
  EXPECT_TRUE(absl::StrContains(run->stderr_text, "is the coordinator at 127.0.0.1:1 up"))
      << run->stderr_text;

  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// Issue 27: against a cluster with TLS and tokens, ZEROSHARD_CA and ZEROSHARD_TOKEN (what a
// secured local cluster's command gets) are enough; each flag given wins over its variable:
// --ca= is plaintext (refused by the TLS port), --token_file= sends no token, and a --ca or
// --token_file replaces an unusable or unknown value from the environment.
TEST(CliTest, TlsAndTheTokenComeFromTheEnvironmentUnlessFlagsAreGiven) {
  absl::StatusOr<ClusterCredentials> credentials =
      MakeClusterCredentials(absl::StrCat(std::getenv("TEST_TMPDIR"), "/cli-env-pki"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  LocalClusterOptions options;
  options.security = credentials->security;
  LocalCluster cluster(options);
  LogTailsOnFailure log_tails(cluster);
  absl::Status started = cluster.StartCoordinator();
  ASSERT_TRUE(started.ok()) << started;
  const std::string coordinator = "ZEROSHARD_COORDINATOR=" + cluster.coordinator_target();
  const std::string ca = "ZEROSHARD_CA=" + credentials->ca_file;
  const std::string token = "ZEROSHARD_TOKEN=" + credentials->submitter_token;
  const std::string token_file =
      WriteFile(cluster, "submitter.token", credentials->submitter_token + "\n");

  absl::StatusOr<CommandResult> run = RunCliWithEnv({coordinator, ca, token}, {"jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stderr_text;
  EXPECT_TRUE(absl::StartsWith(run->stdout_text, "ID ")) << run->stdout_text;

  run = RunCliWithEnv({coordinator, ca, token}, {"--ca=", "jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 4) << run->stderr_text;
  run = RunCliWithEnv({coordinator, ca, token}, {"--token_file=", "jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 3) << run->stderr_text;
  EXPECT_TRUE(absl::StrContains(run->stderr_text, "UNAUTHENTICATED")) << run->stderr_text;

  const std::string missing_ca = "ZEROSHARD_CA=/nonexistent/ca.pem";
  run = RunCliWithEnv({coordinator, missing_ca, token}, {"jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 2) << run->stderr_text;
  EXPECT_TRUE(absl::StrContains(run->stderr_text, "/nonexistent/ca.pem") &&
              absl::StrContains(run->stderr_text, "from the environment: ZEROSHARD_CA"))
      << run->stderr_text;
  run = RunCliWithEnv({coordinator, missing_ca, token}, {"--ca=" + credentials->ca_file, "jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stderr_text;
  const std::string unknown_token = "ZEROSHARD_TOKEN=" + std::string(32, 'u');
  run = RunCliWithEnv({coordinator, ca, unknown_token}, {"jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 3) << run->stderr_text;
  run = RunCliWithEnv({coordinator, ca, unknown_token}, {"--token_file=" + token_file, "jobs"});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->exit_code(), 0) << run->stderr_text;

  absl::Status stopped = cluster.StopAll();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace zeroshard::testing
