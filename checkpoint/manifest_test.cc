// Tests for manifests and the checkpoint directory: names, durable commits (including a crash
// before the rename), the manifest's size cap, whole-file verification, listing newest first by
// (generation, step), the job id check, and pruning.
#include "checkpoint/manifest.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/proto_json.h"
#include "gtest/gtest.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint {
namespace {

constexpr char kJobId[] = "job-000042";
// Every test's job directory, relative to its root (the test's own directory).
constexpr char kJobDir[] = "job";

// A fresh root for one test, holding the job directory.
std::string MakeTestRoot(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string root = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name);
  ::mkdir(root.c_str(), 0755);
  ::mkdir(absl::StrCat(root, "/", kJobDir).c_str(), 0755);
  return root;
}

std::string JobPath(const std::string& root) { return JobCheckpointDir(root, kJobDir); }

Directory Root(const std::string& root) {
  absl::StatusOr<Directory> directory = Directory::OpenRoot(root);
  EXPECT_TRUE(directory.ok()) << directory.status();
  return *std::move(directory);
}

Directory StepDirectory(const std::string& root, int64_t step) {
  absl::StatusOr<Directory> directory = OpenStepDirectory(Root(root), kJobDir, step);
  EXPECT_TRUE(directory.ok()) << directory.status();
  return *std::move(directory);
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A step directory of the job holding `world_size` rank files of distinct contents, and the
// manifest that would commit them (not written).
v1::CheckpointManifest MakeStep(const std::string& root, int64_t step, int32_t world_size,
                                int64_t generation = 2, const std::string& job_id = kJobId) {
  const std::string dir = StepDir(JobPath(root), step);
  ::mkdir(dir.c_str(), 0755);
  v1::CheckpointManifest manifest;
  manifest.set_job_id(job_id);
  manifest.set_step(step);
  manifest.set_generation(generation);
  manifest.set_world_size(world_size);
  manifest.set_layout_hash(0x1234567890ABCDEFull);
  manifest.mutable_commit_time()->set_seconds(1700000000 + step);
  for (int32_t rank = 0; rank < world_size; ++rank) {
    const std::string contents =
        absl::StrCat("shard of rank ", rank, " at step ", step, " of generation ", generation);
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

void Commit(const std::string& root, int64_t step, int32_t world_size = 2, int64_t generation = 2,
            const std::string& job_id = kJobId) {
  const absl::Status status =
      WriteManifest(Root(root), kJobDir, MakeStep(root, step, world_size, generation, job_id));
  ASSERT_TRUE(status.ok()) << status;
}

absl::StatusOr<CheckpointListing> List(const std::string& root) {
  return ListCheckpoints(Root(root), kJobDir, kJobId);
}

absl::StatusOr<PruneResult> Prune(const std::string& root, int keep) {
  return PruneCheckpoints(Root(root), kJobDir, kJobId, keep);
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

std::vector<int64_t> RefusedSteps(const std::vector<RefusedStep>& refused) {
  std::vector<int64_t> steps;
  for (const RefusedStep& r : refused) steps.push_back(r.step);
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

TEST(ManifestTest, SupersededNames) {
  EXPECT_EQ(SupersededDirName(50, 1), "superseded-step-000000000050-1");
  for (int64_t step : {int64_t{0}, int64_t{50}, int64_t{1234567890123}}) {
    for (int copy : {1, 7, 99999}) {
      EXPECT_EQ(ParseSupersededDirName(SupersededDirName(step, copy)), step) << step << copy;
    }
  }
  for (const char* name :
       {"superseded-step-000000000050", "superseded-step-000000000050-", "superseded-step-50-1",
        "superseded-step-000000000050-0", "superseded-step-000000000050-01",
        "superseded-step-000000000050-100000", "superseded-step-000000000050-x",
        "step-000000000050-1", "superseded-000000000050-1"}) {
    EXPECT_EQ(ParseSupersededDirName(name), std::nullopt) << name;
  }
  // Neither kind of name is taken for the other.
  EXPECT_EQ(ParseStepDirName(SupersededDirName(50, 1)), std::nullopt);
}

TEST(ManifestTest, WrittenManifestReadsBackAndIsIndentedJson) {
  const std::string root = MakeTestRoot("roundtrip");
  v1::CheckpointManifest manifest = MakeStep(root, 40, 3);
  ASSERT_TRUE(WriteManifest(Root(root), kJobDir, manifest).ok());
  const Directory step_dir = StepDirectory(root, 40);
  absl::StatusOr<v1::CheckpointManifest> read = ReadManifest(step_dir);
  ASSERT_TRUE(read.ok()) << read.status();
  manifest.set_format_version(kManifestFormatVersion);
  EXPECT_EQ(read->SerializeAsString(), manifest.SerializeAsString());
  const std::string json = *ReadFileToString(ManifestPath(StepDir(JobPath(root), 40)));
  EXPECT_TRUE(absl::StrContains(json, "\"job_id\": \"job-000042\"")) << json;
  EXPECT_TRUE(absl::StrContains(json, "\"path\": \"rank-00002-of-00003.safetensors\"")) << json;
  for (const v1::CheckpointFile& file : read->files()) {
    EXPECT_TRUE(VerifyCheckpointFile(step_dir, file).ok()) << file.path();
  }
}

TEST(ManifestTest, WriteRefusesInvalidManifestsAndFilesItCannotSee) {
  const std::string root = MakeTestRoot("refusals");
  const v1::CheckpointManifest good = MakeStep(root, 10, 2);
  const std::string step_dir = StepDir(JobPath(root), 10);
  auto message_of = [&](const v1::CheckpointManifest& manifest, absl::StatusCode code) {
    const absl::Status status = WriteManifest(Root(root), kJobDir, manifest);
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
  bad = good;
  bad.set_step(11);  // no such step directory
  EXPECT_TRUE(absl::StrContains(
      message_of(bad, absl::StatusCode::kFailedPrecondition),
      "cannot commit the checkpoint of step 11: open directory " + StepDir(JobPath(root), 11)));
  EXPECT_FALSE(Exists(ManifestPath(step_dir)));
}

TEST(ManifestTest, ReadRefusesWhatIsNotAValidManifestOfThisStep) {
  const std::string root = MakeTestRoot("read_refusals");
  v1::CheckpointManifest manifest = MakeStep(root, 5, 1);
  const std::string manifest_path = ManifestPath(StepDir(JobPath(root), 5));
  const Directory step_dir = StepDirectory(root, 5);
  EXPECT_EQ(ReadManifest(step_dir).status().code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE(WriteFileDurably(manifest_path, "{\"step\": ").ok());
  absl::Status status = ReadManifest(step_dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), manifest_path)) << status;

  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_step(6);
  ASSERT_TRUE(WriteFileDurably(manifest_path, ToJson(manifest)).ok());
  status = ReadManifest(step_dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), "step 6 in the directory of step 5")) << status;

  manifest.set_step(5);
  manifest.set_world_size(0);
  ASSERT_TRUE(WriteFileDurably(manifest_path, ToJson(manifest)).ok());
  status = ReadManifest(step_dir).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), "world_size: 0 outside")) << status;

  manifest.set_world_size(1);
  manifest.set_format_version(kManifestFormatVersion + 1);
  ASSERT_TRUE(WriteFileDurably(manifest_path, ToJson(manifest)).ok());
  EXPECT_EQ(ReadManifest(step_dir).status().code(), absl::StatusCode::kFailedPrecondition);
}

// A worker can plant a sparse manifest.json of 20 GB at no cost to the volume. Today's code
// reads it whole (20 GB of memory, minutes of reading): this test fails there. The cap refuses
// it from its size before reading a byte.
TEST(ManifestTest, ASparse20GbManifestIsRefusedFromItsSizeAtBoundedCost) {
  const std::string root = MakeTestRoot("huge_manifest");
  Commit(root, 10);
  MakeStep(root, 5, 1);
  const std::string manifest_path = ManifestPath(StepDir(JobPath(root), 5));
  constexpr int64_t kHuge = int64_t{20} << 30;
  const int fd = ::open(manifest_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kHuge), 0);
  ASSERT_EQ(::pwrite(fd, "{", 1, 0), 1);
  ::close(fd);

  struct rusage before;
  ::getrusage(RUSAGE_SELF, &before);
  const absl::Time start = absl::Now();
  const absl::Status status = ReadManifest(StepDirectory(root, 5)).status();
  absl::StatusOr<CheckpointListing> listing = List(root);
  const absl::Duration took = absl::Now() - start;
  struct rusage after;
  ::getrusage(RUSAGE_SELF, &after);

  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StrContains(
      status.message(),
      absl::StrCat(manifest_path, " holds ", kHuge, " bytes, more than the ", kMaxManifestBytes)))
      << status;
  // Bounded: no more than the cap of memory (ru_maxrss is in KiB), and no 20 GB read.
  EXPECT_LT((after.ru_maxrss - before.ru_maxrss) * 1024, static_cast<long>(kMaxManifestBytes));
  EXPECT_LT(took, absl::Seconds(10));
  // The listing goes on: step 5 is no checkpoint.
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), std::vector<int64_t>{10});
  EXPECT_EQ(UncommittedSteps(*listing), std::vector<int64_t>{5});
  ::unlink(manifest_path.c_str());
}

// Workers never write manifest.json. Before, a commit renamed its manifest over whatever was
// there; now one that is not this checkpoint's is refused and left, and a 20 GB sparse one is
// refused from its size. A commit retried (the same checkpoint's manifest there) still succeeds.
TEST(ManifestTest, ACommitRefusesAManifestItDidNotWriteAndRetriesItsOwn) {
  const std::string root = MakeTestRoot("foreign_manifest");
  const v1::CheckpointManifest manifest = MakeStep(root, 6, 1);
  const std::string manifest_path = ManifestPath(StepDir(JobPath(root), 6));
  constexpr int64_t kHuge = int64_t{20} << 30;
  {
    const int fd = ::open(manifest_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, kHuge), 0);
    ::close(fd);
  }
  absl::Status status = WriteManifest(Root(root), kJobDir, manifest);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "did not write")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat(" holds ", kHuge, " bytes")))
      << status;
  EXPECT_EQ(std::filesystem::file_size(manifest_path), static_cast<uintmax_t>(kHuge));

  // Another job's manifest: refused too, naming it.
  v1::CheckpointManifest other = manifest;
  other.set_job_id("job-000099");
  other.set_format_version(kManifestFormatVersion);
  ASSERT_TRUE(WriteFileDurably(manifest_path, ToJson(other)).ok());
  status = WriteManifest(Root(root), kJobDir, manifest);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "the manifest of job job-000099")) << status;

  // Its own manifest (a retried commit), or the job's of an earlier generation at this step (a
  // later generation checkpointing the step again after resuming from an earlier one): written
  // again.
  ASSERT_TRUE(::unlink(manifest_path.c_str()) == 0);
  ASSERT_TRUE(WriteManifest(Root(root), kJobDir, manifest).ok());
  status = WriteManifest(Root(root), kJobDir, manifest);
  EXPECT_TRUE(status.ok()) << status;
  v1::CheckpointManifest later = manifest;
  later.set_generation(manifest.generation() + 1);
  status = WriteManifest(Root(root), kJobDir, later);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(ReadManifest(StepDirectory(root, 6))->generation(), later.generation());
  ASSERT_TRUE(List(root).ok());
  EXPECT_EQ(CommittedSteps(*List(root)), std::vector<int64_t>{6});
}

// The cap holds every manifest this code writes: the largest world size, with the largest
// values, fits under it (12,889,118 bytes against 16 MiB).
TEST(ManifestTest, TheLargestManifestFitsUnderTheCap) {
  v1::CheckpointManifest manifest;
  manifest.set_format_version(kManifestFormatVersion);
  manifest.set_job_id(std::string(128, 'j'));
  manifest.set_step(int64_t{1} << 50);
  manifest.set_generation(int64_t{1} << 40);
  manifest.set_world_size(kMaxNamedWorldSize);
  manifest.set_layout_hash(~uint64_t{0});
  manifest.mutable_commit_time()->set_seconds(253402300799);  // the last second of 9999
  manifest.mutable_commit_time()->set_nanos(999999999);
  for (int32_t rank = 0; rank < kMaxNamedWorldSize; ++rank) {
    v1::CheckpointFile* file = manifest.add_files();
    file->set_rank(rank);
    file->set_path(ShardFileName(rank, kMaxNamedWorldSize));
    file->set_bytes(int64_t{1} << 50);
    file->set_crc32c(0xFFFFFFFFu);
  }
  const size_t bytes = ToJson(manifest, JsonStyle::kIndented).size() + 1;
  EXPECT_LT(bytes, kMaxManifestBytes);
}

TEST(ManifestTest, VerifyCheckpointFileCatchesAFlippedByte) {
  const std::string root = MakeTestRoot("verify");
  const v1::CheckpointManifest manifest = MakeStep(root, 3, 1);
  const std::string path = absl::StrCat(StepDir(JobPath(root), 3), "/", manifest.files(0).path());
  std::string contents = *ReadFileToString(path);
  contents[4] ^= 1;
  ASSERT_TRUE(WriteFileDurably(path, contents).ok());
  const absl::Status status = VerifyCheckpointFile(StepDirectory(root, 3), manifest.files(0));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(
      status.message(),
      absl::StrFormat("%s: %d bytes with CRC32C 0x%08x, but the manifest records %d bytes with "
                      "CRC32C 0x%08x",
                      path, contents.size(), Crc32c(contents.data(), contents.size()),
                      manifest.files(0).bytes(), manifest.files(0).crc32c())))
      << status;
}

// What an fsck reports: every file's state, going on past the first failure. Today's code has
// only VerifyCheckpointFile, which stops at the first error and follows links.
TEST(ManifestTest, VerifyCheckpointReportsEveryFilesState) {
  const std::string root = MakeTestRoot("fsck");
  const std::string outside = MakeTestRoot("fsck_outside");
  Commit(root, 8, 6);
  const std::string step_dir = StepDir(JobPath(root), 8);
  auto path_of = [&](int rank) { return absl::StrCat(step_dir, "/", ShardFileName(rank, 6)); };
  // Rank 1 missing; rank 2 one byte longer; rank 3 a flipped byte; rank 4 a link to a copy of
  // itself outside the root (same bytes: following it would pass); rank 5 a directory.
  ASSERT_EQ(::unlink(path_of(1).c_str()), 0);
  std::string longer = *ReadFileToString(path_of(2));
  ASSERT_TRUE(WriteFileDurably(path_of(2), longer + "x").ok());
  std::string flipped = *ReadFileToString(path_of(3));
  flipped[0] ^= 1;
  ASSERT_TRUE(WriteFileDurably(path_of(3), flipped).ok());
  const std::string copy = outside + "/copy";
  ASSERT_TRUE(WriteFileDurably(copy, *ReadFileToString(path_of(4))).ok());
  ASSERT_EQ(::unlink(path_of(4).c_str()), 0);
  ASSERT_EQ(::symlink(copy.c_str(), path_of(4).c_str()), 0);
  ASSERT_EQ(::unlink(path_of(5).c_str()), 0);
  ASSERT_EQ(::mkdir(path_of(5).c_str(), 0755), 0);

  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(listing->committed.size(), 1u);
  const std::vector<CheckpointFileCheck> checks = VerifyCheckpoint(listing->committed[0]);
  ASSERT_EQ(checks.size(), 6u);
  const CheckpointFileState expected[] = {
      CheckpointFileState::kOk,           CheckpointFileState::kMissing,
      CheckpointFileState::kSizeMismatch, CheckpointFileState::kCrcMismatch,
      CheckpointFileState::kRefused,      CheckpointFileState::kRefused};
  for (int rank = 0; rank < 6; ++rank) {
    EXPECT_EQ(checks[rank].file.rank(), rank);
    EXPECT_EQ(CheckpointFileStateName(checks[rank].state), CheckpointFileStateName(expected[rank]))
        << rank << ": " << checks[rank].detail;
    if (rank > 0) {
      EXPECT_TRUE(absl::StrContains(checks[rank].detail.message(), path_of(rank)))
          << checks[rank].detail;
    }
  }
  EXPECT_TRUE(checks[0].detail.ok());
  EXPECT_TRUE(absl::StrContains(checks[4].detail.message(), "is a symbolic link"))
      << checks[4].detail;
}

// The coordinator dies after writing and fsyncing the temporary manifest, before the rename:
// there is no manifest, and readers do not see the step.
TEST(ManifestTest, CrashBeforeTheRenameLeavesNoCheckpoint) {
  const std::string root = MakeTestRoot("crash");
  Commit(root, 100);
  const v1::CheckpointManifest manifest = MakeStep(root, 200, 2);
  const std::string step_dir = StepDir(JobPath(root), 200);
  const pid_t pid = ::fork();
  if (pid == 0) {
    WriteManifest(Root(root), kJobDir, manifest, [] { ::_exit(0); }).IgnoreError();
    ::_exit(1);  // the hook did not run
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(pid, &wait_status, 0), pid);
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;

  EXPECT_FALSE(Exists(ManifestPath(step_dir)));
  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), std::vector<int64_t>{100});
  ASSERT_EQ(UncommittedSteps(*listing), std::vector<int64_t>{200});
  EXPECT_EQ(listing->uncommitted[0].reason.code(), absl::StatusCode::kNotFound);

  // A later commit of the same step (the temporary file left behind does not matter).
  ASSERT_TRUE(WriteManifest(Root(root), kJobDir, manifest).ok());
  listing = List(root);
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{200, 100}));
}

TEST(ManifestTest, ListingIsNewestFirstAndSkipsWhatIsNotACheckpoint) {
  const std::string root = MakeTestRoot("listing");
  EXPECT_TRUE(ListCheckpoints(Root(root), "absent", kJobId)->committed.empty());
  Commit(root, 300);
  Commit(root, 100);
  Commit(root, 1000000);
  MakeStep(root, 200, 2);  // written, never committed
  MakeStep(root, 250, 2);
  const std::string job = JobPath(root);
  ASSERT_TRUE(WriteFileDurably(ManifestPath(StepDir(job, 250)), "not json").ok());
  ASSERT_TRUE(WriteFileDurably(job + "/notes.txt", "x").ok());
  ASSERT_EQ(::mkdir((job + "/step-abc").c_str(), 0755), 0);
  ASSERT_TRUE(WriteFileDurably(job + "/step-000000000400", "a file, not a directory").ok());

  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{1000000, 300, 100}));
  EXPECT_EQ(UncommittedSteps(*listing), (std::vector<int64_t>{250, 200}));
  EXPECT_EQ(listing->uncommitted[0].reason.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(listing->committed[1].directory, StepDir(job, 300));
  EXPECT_EQ(listing->committed[1].manifest.step(), 300);
  // A file named like a step directory is refused, naming it.
  ASSERT_EQ(RefusedSteps(listing->refused), std::vector<int64_t>{400});
  EXPECT_EQ(listing->refused[0].reason.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(listing->refused[0].reason.message(),
                                StepDir(job, 400) + " is a regular file, where a directory"))
      << listing->refused[0].reason;
}

// Newest first means (generation, step), as the coordinator's latest_checkpoint: a generation
// that resumed from an older step is newer than the steps of the one before. Today's listing
// sorts by step alone: this test fails there.
TEST(ManifestTest, ListingOrdersByGenerationThenStep) {
  const std::string root = MakeTestRoot("listing_generations");
  Commit(root, 10, 2, /*generation=*/1);
  Commit(root, 20, 2, /*generation=*/1);
  Commit(root, 40, 2, /*generation=*/1);
  Commit(root, 30, 2, /*generation=*/2);  // generation 2 resumed from 20
  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{30, 40, 20, 10}));
  EXPECT_TRUE(IsNewerCheckpoint(listing->committed[0], listing->committed[1]));
  EXPECT_FALSE(IsNewerCheckpoint(listing->committed[1], listing->committed[0]));
}

// Item 5 of issue 24: a fallback to an older checkpoint must never prune a job's only usable
// one. Generation 1 committed step 40; generation 2 resumed from step 20 and commits step 30.
// Pruning by step alone (today's code) keeps 40 and deletes 30, the checkpoint of the running
// generation: this test fails there.
TEST(ManifestTest, PruneKeepsTheNewestGenerationsCheckpointOverAHigherOlderStep) {
  const std::string root = MakeTestRoot("prune_generations");
  Commit(root, 20, 2, /*generation=*/1);
  Commit(root, 40, 2, /*generation=*/1);
  MakeStep(root, 25, 2, /*generation=*/2);  // an attempt generation 2 abandoned
  Commit(root, 30, 2, /*generation=*/2);
  MakeStep(root, 35, 2, /*generation=*/2);  // being written by generation 2
  absl::StatusOr<PruneResult> pruned = Prune(root, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->deleted_committed, (std::vector<int64_t>{20, 40}));
  EXPECT_EQ(pruned->deleted_uncommitted, std::vector<int64_t>{25});
  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), std::vector<int64_t>{30});
  EXPECT_EQ(listing->committed[0].generation(), 2);
  EXPECT_EQ(UncommittedSteps(*listing), std::vector<int64_t>{35});
  EXPECT_FALSE(Exists(StepDir(JobPath(root), 40)));
}

TEST(ManifestTest, PruneKeepsTheNewestAndDropsAbandonedAttempts) {
  const std::string root = MakeTestRoot("prune");
  MakeStep(root, 50, 2);  // abandoned, older than every checkpoint
  Commit(root, 100);
  MakeStep(root, 200, 3);  // abandoned between checkpoints
  Commit(root, 300);
  Commit(root, 500);
  MakeStep(root, 600, 2);  // perhaps still being written
  const std::string job = JobPath(root);

  EXPECT_EQ(Prune(root, 0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<PruneResult> pruned = Prune(root, 2);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->deleted_committed, std::vector<int64_t>{100});
  EXPECT_EQ(pruned->deleted_uncommitted, (std::vector<int64_t>{50, 200}));
  EXPECT_TRUE(pruned->refused.empty());
  for (int64_t gone : {50, 100, 200}) EXPECT_FALSE(Exists(StepDir(job, gone))) << gone;
  for (int64_t kept : {300, 500, 600}) EXPECT_TRUE(Exists(StepDir(job, kept))) << kept;
  absl::StatusOr<CheckpointListing> listing = List(root);
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{500, 300}));
  EXPECT_EQ(UncommittedSteps(*listing), std::vector<int64_t>{600});

  // Nothing more to do at the same keep; keep 1 drops 300.
  pruned = Prune(root, 2);
  EXPECT_TRUE(pruned->deleted_committed.empty() && pruned->deleted_uncommitted.empty());
  pruned = Prune(root, 1);
  EXPECT_EQ(pruned->deleted_committed, std::vector<int64_t>{300});
}

TEST(ManifestTest, PruneLeavesAManifestOfANewerFormat) {
  const std::string root = MakeTestRoot("prune_newer");
  v1::CheckpointManifest newer = MakeStep(root, 100, 1);
  newer.set_format_version(kManifestFormatVersion + 1);
  ASSERT_TRUE(WriteFileDurably(ManifestPath(StepDir(JobPath(root), 100)), ToJson(newer)).ok());
  Commit(root, 200);
  absl::StatusOr<PruneResult> pruned = Prune(root, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_TRUE(pruned->deleted_uncommitted.empty());
  EXPECT_EQ(RefusedSteps(pruned->refused), std::vector<int64_t>{100});
  EXPECT_TRUE(Exists(ManifestPath(StepDir(JobPath(root), 100))));
}

TEST(ManifestTest, PruneWithoutACheckpointDeletesNothing) {
  const std::string root = MakeTestRoot("prune_none");
  MakeStep(root, 10, 1);
  absl::StatusOr<PruneResult> pruned = Prune(root, 1);
  ASSERT_TRUE(pruned.ok());
  EXPECT_TRUE(pruned->deleted_uncommitted.empty());
  EXPECT_TRUE(Exists(StepDir(JobPath(root), 10)));
}

// Item 2 of issue 24: readers compare the manifest's job id with their job. Another job's
// checkpoints in this job's directory are refused and reported: never listed as committed (so
// never loaded or exported), never pruned. Today's listing has no job id: this test fails there.
TEST(ManifestTest, AnotherJobsManifestIsRefusedNeverListedNorPruned) {
  const std::string root = MakeTestRoot("other_job");
  Commit(root, 10, 2, 1, "job-000007");
  Commit(root, 20, 2, 1, "job-000007");
  Commit(root, 30);
  Commit(root, 40);
  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{40, 30}));
  ASSERT_EQ(RefusedSteps(listing->refused), (std::vector<int64_t>{20, 10}));
  EXPECT_EQ(listing->refused[0].reason.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(listing->refused[0].reason.message(),
                                ManifestPath(StepDir(JobPath(root), 20)) +
                                    " belongs to job \"job-000007\", not to " + kJobId))
      << listing->refused[0].reason;

  absl::StatusOr<PruneResult> pruned = Prune(root, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->deleted_committed, std::vector<int64_t>{30});
  EXPECT_EQ(RefusedSteps(pruned->refused), (std::vector<int64_t>{20, 10}));
  for (int64_t kept : {10, 20}) {
    EXPECT_TRUE(Exists(ManifestPath(StepDir(JobPath(root), kept)))) << kept;
  }
  EXPECT_TRUE(absl::StrContains(SummarizeRefused(pruned->refused),
                                "2 step entries refused and left alone: "))
      << SummarizeRefused(pruned->refused);

  // A checkpoint named explicitly may be another job's.
  listing = ListCheckpoints(Root(root), kJobDir, std::nullopt);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{40, 20, 10}));
  EXPECT_TRUE(OpenCommittedCheckpoint(Root(root), kJobDir, 20, std::nullopt).ok());
  EXPECT_EQ(OpenCommittedCheckpoint(Root(root), kJobDir, 20, kJobId).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ListCheckpoints(Root(root), kJobDir, "").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 27: a job that goes back to an earlier step retires the checkpoints after it: each step
// directory is renamed aside and its manifest marked, everything else in it as committed, so that
// the step can be checkpointed again and no committed manifest is ever overwritten.
TEST(ManifestTest, ASupersededCheckpointIsMovedAsideAndMarked) {
  const std::string root = MakeTestRoot("supersede");
  for (int64_t step : {10, 20, 30}) Commit(root, step, 2, /*generation=*/1);
  const std::string committed_json = *ReadFileToString(ManifestPath(StepDir(JobPath(root), 30)));
  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{30, 20, 10}));
  v1::CheckpointSupersession why;
  why.set_loaded_step(10);
  why.set_generation(1);
  why.mutable_time()->set_seconds(1800000000);
  why.set_reason("rank 0 loaded step 10 at step 30");
  absl::StatusOr<std::string> moved =
      SupersedeCheckpoint(Root(root), kJobDir, listing->committed[0], why);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, absl::StrCat(JobPath(root), "/superseded-step-000000000030-1"));
  EXPECT_FALSE(Exists(StepDir(JobPath(root), 30)));
  // The mark is the committed manifest plus `superseded`; the files are as committed.
  v1::CheckpointManifest committed;
  ASSERT_TRUE(FromJson(committed_json, "committed", &committed).ok());
  absl::StatusOr<std::string> marked_json = ReadFileToString(ManifestPath(*moved));
  ASSERT_TRUE(marked_json.ok()) << marked_json.status();
  v1::CheckpointManifest marked;
  ASSERT_TRUE(FromJson(*marked_json, "marked", &marked).ok());
  EXPECT_EQ(marked.superseded().loaded_step(), 10);
  EXPECT_EQ(marked.superseded().reason(), "rank 0 loaded step 10 at step 30");
  marked.clear_superseded();
  EXPECT_EQ(marked.SerializeAsString(), committed.SerializeAsString());
  for (const v1::CheckpointFile& file : committed.files()) {
    absl::StatusOr<Directory> dir =
        Root(root).OpenPath(absl::StrCat(kJobDir, "/", SupersededDirName(30, 1)));
    ASSERT_TRUE(dir.ok()) << dir.status();
    EXPECT_TRUE(VerifyCheckpointFile(*dir, file).ok()) << file.path();
  }

  // The step is checkpointed again; its old checkpoint, and the step's next retirement, stay
  // apart.
  Commit(root, 30, 2, /*generation=*/1);
  listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{30, 20, 10}));
  ASSERT_EQ(listing->superseded.size(), 1u);
  EXPECT_EQ(listing->superseded[0].step, 30);
  EXPECT_EQ(listing->superseded[0].name, SupersededDirName(30, 1));
  EXPECT_TRUE(listing->superseded[0].manifest.has_superseded());
  why.mutable_time()->set_seconds(1800000100);
  moved = SupersedeCheckpoint(Root(root), kJobDir, listing->committed[0], why);
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(*moved, absl::StrCat(JobPath(root), "/superseded-step-000000000030-2"));
  listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{20, 10}));
  ASSERT_EQ(listing->superseded.size(), 2u);
  EXPECT_EQ(listing->superseded[0].name, SupersededDirName(30, 2));  // latest retired first

  // Nothing loads a superseded checkpoint, wherever its manifest is.
  absl::StatusOr<Directory> aside =
      Root(root).OpenPath(absl::StrCat(kJobDir, "/", SupersededDirName(30, 1)));
  ASSERT_TRUE(aside.ok()) << aside.status();
  const absl::Status refused =
      ReadCommittedCheckpoint(*std::move(aside), 30, std::nullopt).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(),
                                "was superseded: job job-000042 went back to "
                                "step 10 in generation 1"))
      << refused;
}

TEST(ManifestTest, SupersedeRefusesADirectoryThatChangedSinceTheListing) {
  const std::string root = MakeTestRoot("supersede_changed");
  Commit(root, 10);
  Commit(root, 20);
  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  // Someone swapped step 20's directory for step 10's since the listing.
  std::filesystem::rename(StepDir(JobPath(root), 20), JobPath(root) + "/old-20");
  std::filesystem::rename(StepDir(JobPath(root), 10), StepDir(JobPath(root), 20));
  const absl::Status refused =
      SupersedeCheckpoint(Root(root), kJobDir, listing->committed[0], v1::CheckpointSupersession())
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "left unmarked")) << refused;
  absl::StatusOr<v1::CheckpointManifest> left =
      ReadManifest(*Root(root).OpenPath(absl::StrCat(kJobDir, "/", SupersededDirName(20, 1))));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_FALSE(left->has_superseded());
}

TEST(ManifestTest, PruneDropsASupersededCheckpointOnceOlderThanEveryKeptOne) {
  const std::string root = MakeTestRoot("prune_superseded");
  for (int64_t step : {10, 20, 30, 40}) Commit(root, step);
  absl::StatusOr<CheckpointListing> listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  // Back to step 20: 40 and 30 retired, then checkpointed again.
  for (int i : {0, 1}) {
    ASSERT_TRUE(SupersedeCheckpoint(Root(root), kJobDir, listing->committed[i],
                                    v1::CheckpointSupersession())
                    .ok());
  }
  Commit(root, 30);
  Commit(root, 40);
  absl::StatusOr<PruneResult> pruned = Prune(root, 2);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->deleted_committed, (std::vector<int64_t>{10, 20}));
  // Kept: 30 and 40; the superseded 30 is not older than the oldest kept.
  EXPECT_TRUE(pruned->deleted_superseded.empty());
  Commit(root, 50);
  pruned = Prune(root, 2);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->deleted_committed, (std::vector<int64_t>{30}));
  EXPECT_EQ(pruned->deleted_superseded, (std::vector<int64_t>{30}));
  EXPECT_FALSE(Exists(absl::StrCat(JobPath(root), "/", SupersededDirName(30, 1))));
  EXPECT_TRUE(Exists(absl::StrCat(JobPath(root), "/", SupersededDirName(40, 1))));
  listing = List(root);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(CommittedSteps(*listing), (std::vector<int64_t>{50, 40}));
  ASSERT_EQ(listing->superseded.size(), 1u);
}

}  // namespace
}  // namespace zeroshard::checkpoint
