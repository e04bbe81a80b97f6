// Tests for manifests and the checkpoint directory: names, durable commits (including a crash
// before the rename), whole-file verification, listing newest first, and pruning.
#include "checkpoint/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/proto_json.h"
#include "gtest/gtest.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint {
namespace {

std::string MakeTestDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// A step directory holding `world_size` rank files of distinct contents, and the manifest that
// would commit them (not written).
v1::CheckpointManifest MakeStep(const std::string& job_dir, int64_t step, int32_t world_size) {
  const std::string dir = StepDir(job_dir, step);
  ::mkdir(dir.c_str(), 0755);
  v1::CheckpointManifest manifest;
  manifest.set_job_id("job-000042");
  manifest.set_step(step);
  manifest.set_generation(2);
  manifest.set_world_size(world_size);
  manifest.set_layout_hash(0x1234567890ABCDEFull);
  manifest.mutable_commit_time()->set_seconds(1700000000 + step);
  for (int32_t rank = 0; rank < world_size; ++rank) {
    const std::string contents = absl::StrCat("shard of rank ", rank, " at step ", step);
    const std::string name = ShardFileName(rank, world_size);
    EXPECT_TRUE(WriteFileDurably(absl::StrCat(dir, "/", name), contents).ok());
    v1::CheckpointFile* file = manifest.add_files();
    file->set_rank(rank);
    file->set_path(name);
    file->set_bytes(static_cast<int64_t>(contents.size()));
    file->set_crc32c(Crc32c(contents.data(), contents.size()));
  }
  return manifest;
}

void Commit(const std::string& job_dir, int64_t step, int32_t world_size = 2) {
  ASSERT_TRUE(WriteManifest(StepDir(job_dir, step), MakeStep(job_dir, step, world_size)).ok());
}

std::vector<int64_t> CommittedSteps(const CheckpointListing& listing) {
  std::vector<int64_t> steps;
  for (const CommittedCheckpoint& c : listing.committed) steps.push_back(c.step);
  return steps;
}

std::vector<int64_t> UncommittedSteps(const CheckpointListing& listing) {
  std::vector<int64_t> steps;
  for (const UncommittedStep& u : listing.uncommitted) steps.push_back(u.step);
  return steps;
}

TEST(ManifestTest, Names) {
  EXPECT_EQ(JobCheckpointDir("/ckpt", "team/job-000042"), "/ckpt/team/job-000042");
  EXPECT_EQ(StepDirName(1200), "step-000000001200");
  EXPECT_EQ(StepDir("/ckpt/j", 7), "/ckpt/j/step-000000000007");
  EXPECT_EQ(ShardFileName(1, 4), "rank-00001-of-00004.safetensors");
  EXPECT_EQ(ManifestPath("/ckpt/j/step-000000000007"), "/ckpt/j/step-000000000007/manifest.json");
  for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{999999999999}, int64_t{1234567890123}}) {
    EXPECT_EQ(ParseStepDirName(StepDirName(step)), step);
  }
  for (const char* name :
       {"step-12", "step-00000000001x", "step-0000000000012", "step--00000000001",
        "steps-000000000012", "manifest.json", ".step-000000000012.tmp"}) {
    EXPECT_EQ(ParseStepDirName(name), std::nullopt) << name;
  }
}

TEST(ManifestTest, WrittenManifestReadsBackAndIsIndentedJson) {
  const std::string job_dir = MakeTestDir("roundtrip");
  v1::CheckpointManifest manifest = MakeStep(job_dir, 40, 3);
  const std::string step_dir = StepDir(job_dir, 40);
  ASSERT_TRUE(WriteManifest(step_dir, manifest).ok());
  absl::StatusOr<v1::CheckpointManifest> read = ReadManifest(step_dir);
  ASSERT_TRUE(read.ok()) << read.status();
  manifest.set_format_version(kManifestFormatVersion);
  EXPECT_EQ(read->SerializeAsString(), manifest.SerializeAsString());
  const std::string json = *ReadFileToString(ManifestPath(step_dir));
  EXPECT_TRUE(absl::StrContains(json, "\"job_id\": \"job-000042\"")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"path\": \"rank-00002-of-00003.safetensors\"")) << json;
  for (const v1::CheckpointFile& file : read->files()) {
    EXPECT_TRUE(VerifyCheckpointFile(step_dir, file).ok()) << file.path();
  }
}

TEST(ManifestTest, WriteRefusesInvalidManifestsAndFilesItCannotSee) {
  const std::string job_dir = MakeTestDir("refusals");
  const v1::CheckpointManifest good = MakeStep(job_dir, 10, 2);
  const std::string step_dir = StepDir(job_dir, 10);
  auto message_of = [&](const v1::CheckpointManifest& manifest, absl::StatusCode code) {
    const absl::Status status = WriteManifest(step_dir, manifest);
    EXPECT_EQ(status.code(), code) << status;
    return std::string(status.message());
  };
  v1::CheckpointManifest bad = good;
  bad.mutable_files()->RemoveLast();
  EXPECT_TRUE(absl::StrContains(message_of(bad, absl::StatusCode::kInvalidArgument),
                                "files: 1 files for world_size 2"));
  bad = good;
  bad.mutable_files(1)->set_rank(0);
  EXPECT_TRUE(absl::StrContains(message_of(bad, absl::StatusCode::kInvalidArgument),
                                "files[1].rank: rank 0 is listed twice"));
  bad = good;
  bad.mutable_files(0)->set_path("../x");
  EXPECT_TRUE(absl::StrContains(message_of(bad, absl::StatusCode::kInvalidArgument),
                                "files[0].path: \"../x\" is not a file name"));
  bad = good;
  bad.clear_commit_time();
  EXPECT_TRUE(
      absl::StrContains(message_of(bad, absl::StatusCode::kInvalidArgument), "commit_time: unset"));
  bad = good;
  bad.mutable_files(1)->set_path("rank-00001-of-00003.safetensors");
  EXPECT_TRUE(absl::StrContains(message_of(bad, absl::StatusCode::kFailedPrecondition),
                                "cannot commit rank 1's file: stat " + step_dir +
                                    "/rank-00001-of-00003.safetensors: No such file"));
  bad = good;
  bad.mutable_files(0)->set_bytes(good.files(0).bytes() + 1);
  EXPECT_TRUE(absl::StrContains(message_of(bad, absl::StatusCode::kFailedPrecondition),
                                "cannot commit rank 0's file"));
  EXPECT_FALSE(Exists(ManifestPath(step_dir)));
}

TEST(ManifestTest, ReadRefusesWhatIsNotAValidManifestOfThisStep) {
  const std::string job_dir = MakeTestDir("read_refusals");
  v1::CheckpointManifest manifest = MakeStep(job_dir, 5, 1);
  const std::string step_dir = StepDir(job_dir, 5);
  EXPECT_EQ(ReadManifest(step_dir).status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(WriteFileDurably(ManifestPath(step_dir), "{\"step\": ").ok());
  absl::Status status = ReadManifest(step_dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), ManifestPath(step_dir))) << status;

  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_step(6);
  ASSERT_TRUE(WriteFileDurably(ManifestPath(step_dir), ToJson(manifest)).ok());
  status = ReadManifest(step_dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), "step 6 in the directory of step 5")) << status;

  manifest.set_step(5);
  manifest.set_world_size(0);
  ASSERT_TRUE(WriteFileDurably(ManifestPath(step_dir), ToJson(manifest)).ok());
  status = ReadManifest(step_dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), "world_size: 0 outside")) << status;

  manifest.set_world_size(1);
  manifest.set_format_version(kManifestFormatVersion + 1);
  ASSERT_TRUE(WriteFileDurably(ManifestPath(step_dir), ToJson(manifest)).ok());
  EXPECT_EQ(ReadManifest(step_dir).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ManifestTest, VerifyCheckpointFileCatchesAFlippedByte) {
  const std::string job_dir = MakeTestDir("verify");
  const v1::CheckpointManifest manifest = MakeStep(job_dir, 3, 1);
  const std::string step_dir = StepDir(job_dir, 3);
  const std::string path = absl::StrCat(step_dir, "/", manifest.files(0).path());
  std::string contents = *ReadFileToString(path);
  contents[4] ^= 1;
  ASSERT_TRUE(WriteFileDurably(path, contents).ok());
  const absl::Status status = VerifyCheckpointFile(step_dir, manifest.files(0));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(
      status.message(),
      absl::StrFormat("%s: %d bytes with CRC32C 0x%08x, but the manifest records %d bytes with "
                      "CRC32C 0x%08x",
                      path, contents.size(), Crc32c(contents.data(), contents.size()),
                      manifest.files(0).bytes(), manifest.files(0).crc32c())))
      << status;
}

// The coordinator dies after writing and fsyncing the temporary manifest, before the rename:
// there is no manifest, and readers do not see the step.
TEST(ManifestTest, CrashBeforeTheRenameLeavesNoCheckpoint) {
  const std::string job_dir = MakeTestDir("crash");
  Commit(job_dir, 100);
  const v1::CheckpointManifest manifest = MakeStep(job_dir, 200, 2);
  const std::string step_dir = StepDir(job_dir, 200);
  const pid_t pid = ::fork();
  if (pid == 0) {
    WriteManifest(step_dir, manifest, [] { ::_exit(0); }).IgnoreError();
    ::_exit(1);  // the hook did not run
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(pid, &wait_status, 0), pid);
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;

  EXPECT_FALSE(Exists(ManifestPath(step_dir)));
  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(job_dir);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), std::vector<int64_t>{100});
  ASSERT_EQ(UncommittedSteps(*listing), std::vector<int64_t>{200});
  EXPECT_EQ(listing->uncommitted[0].reason.code(), absl::StatusCode::kNotFound);

  // A later commit of the same step (the temporary file left behind does not matter).
  ASSERT_TRUE(WriteManifest(step_dir, manifest).ok());
  listing = ListCheckpoints(job_dir);
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{200, 100}));
}

TEST(ManifestTest, ListingIsNewestFirstAndSkipsWhatIsNotACheckpoint) {
  const std::string job_dir = MakeTestDir("listing");
  EXPECT_TRUE(ListCheckpoints(job_dir + "/absent")->committed.empty());
  Commit(job_dir, 300);
  Commit(job_dir, 100);
  Commit(job_dir, 1000000);
  MakeStep(job_dir, 200, 2);  // written, never committed
  MakeStep(job_dir, 250, 2);
  ASSERT_TRUE(WriteFileDurably(ManifestPath(StepDir(job_dir, 250)), "not json").ok());
  ASSERT_TRUE(WriteFileDurably(job_dir + "/notes.txt", "x").ok());
  ASSERT_EQ(::mkdir((job_dir + "/step-abc").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileDurably(job_dir + "/step-000000000400", "a file, not a directory").ok());

  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(job_dir);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{1000000, 300, 100}));
  EXPECT_EQ(UncommittedSteps(*listing), (std::vector<int64_t>{250, 200}));
  EXPECT_EQ(listing->uncommitted[0].reason.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(listing->committed[1].directory, StepDir(job_dir, 300));
  EXPECT_EQ(listing->committed[1].manifest.step(), 300);
}

TEST(ManifestTest, PruneKeepsTheNewestAndDropsAbandonedAttempts) {
  const std::string job_dir = MakeTestDir("prune");
  MakeStep(job_dir, 50, 2);  // abandoned, older than every checkpoint
  Commit(job_dir, 100);
  MakeStep(job_dir, 200, 3);  // abandoned between checkpoints
  Commit(job_dir, 300);
  Commit(job_dir, 500);
  MakeStep(job_dir, 600, 2);  // perhaps still being written

  EXPECT_EQ(PruneCheckpoints(job_dir, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PruneResult> pruned = PruneCheckpoints(job_dir, 2);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->deleted_committed, std::vector<int64_t>{100});
  EXPECT_EQ(pruned->deleted_uncommitted, (std::vector<int64_t>{50, 200}));
  for (int64_t gone : {50, 100, 200}) EXPECT_FALSE(Exists(StepDir(job_dir, gone))) << gone;
  for (int64_t kept : {300, 500, 600}) EXPECT_TRUE(Exists(StepDir(job_dir, kept))) << kept;
  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(job_dir);
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{500, 300}));
  EXPECT_EQ(UncommittedSteps(*listing), std::vector<int64_t>{600});

  // Nothing more to do at the same keep; keep 1 drops 300.
  pruned = PruneCheckpoints(job_dir, 2);
  EXPECT_TRUE(pruned->deleted_committed.empty() && pruned->deleted_uncommitted.empty());
  pruned = PruneCheckpoints(job_dir, 1);
  EXPECT_EQ(pruned->deleted_committed, std::vector<int64_t>{300});
}

TEST(ManifestTest, PruneLeavesAManifestOfANewerFormat) {
  const std::string job_dir = MakeTestDir("prune_newer");
  v1::CheckpointManifest newer = MakeStep(job_dir, 100, 1);
  newer.set_format_version(kManifestFormatVersion + 1);
  ASSERT_TRUE(WriteFileDurably(ManifestPath(StepDir(job_dir, 100)), ToJson(newer)).ok());
  Commit(job_dir, 200);
  absl::StatusOr<PruneResult> pruned = PruneCheckpoints(job_dir, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_TRUE(pruned->deleted_uncommitted.empty());
  EXPECT_TRUE(Exists(ManifestPath(StepDir(job_dir, 100))));
}

TEST(ManifestTest, PruneWithoutACheckpointDeletesNothing) {
  const std::string job_dir = MakeTestDir("prune_none");
  MakeStep(job_dir, 10, 1);
  absl::StatusOr<PruneResult> pruned = PruneCheckpoints(job_dir, 1);
  ASSERT_TRUE(pruned.ok());
  EXPECT_TRUE(pruned->deleted_uncommitted.empty());
  EXPECT_TRUE(Exists(StepDir(job_dir, 10)));
}

}  // namespace
}  // namespace zeroshard::checkpoint
