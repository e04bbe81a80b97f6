// Issue 24, item 1, against the real file system: links planted at every level of a job's
// checkpoint directory (the job directory itself, step directories, shard files, manifest.json,
// the writers' temporary names) point outside the checkpoint root at directories holding files.
// Listing, pruning, committing, reading, loading and writing refuse each link with an error
// naming its path, and nothing outside the root changes. Every test here fails on the code
// before the directory-descriptor layer, which followed links (stat, unlink of the target's
// entries, writes through them).
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/directory.h"
#include "checkpoint/file_io.h"
#include "checkpoint/manifest.h"
#include "checkpoint/test_checkpoints.h"
#include "checkpoint/test_hostile_storage.h"
#include "checkpoint/test_storage_hooks.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

using testing::MakeTempDir;
using testing::OutsideDirectory;
using testing::SnapshotDirectory;

constexpr char kJobId[] = "job-000007";
constexpr char kJobDir[] = "job";

std::string JobPath(const std::string& root) { return JobCheckpointDir(root, kJobDir); }

Directory Root(const std::string& path, std::shared_ptr<StorageHooks> hooks = nullptr) {
  absl::StatusOr<Directory> root = Directory::OpenRoot(path, std::move(hooks));
  EXPECT_TRUE(root.ok()) << root.status();
  return *std::move(root);
}

testing::TestCheckpointSpec Spec(int64_t step) {
  testing::TestCheckpointSpec spec;
  spec.job_id = kJobId;
  spec.step = step;
  spec.world_size = 1;
  spec.tensors = testing::SequentialTensors({4, 3});
  spec.states = {{kParamState, v1::FLOAT32}};
  return spec;
}

float Value(absl::string_view, absl::string_view, int64_t index) {
  return 0.5f * static_cast<float>(index);
}

// Writes the rank files of `step` into `step_dir` (a path the test trusts) and returns the
// manifest that commits them.
v1::CheckpointManifest WriteStepFiles(const std::string& step_dir, int64_t step) {
  const testing::TestCheckpointSpec spec = Spec(step);
  absl::StatusOr<std::vector<WrittenFile>> files =
      testing::WriteTestShardFiles(step_dir, spec, Value);
  EXPECT_TRUE(files.ok()) << files.status();
  sharding::ShardPlanOptions options;
  options.bucket_elems = spec.bucket_elems;
  const uint64_t layout_hash =
      sharding::ShardPlan::Create(spec.tensors, spec.world_size, options)->layout_hash();
  return testing::TestManifest(spec, layout_hash, *files);
}

v1::CheckpointManifest WriteStep(const std::string& root, int64_t step) {
  return WriteStepFiles(StepDir(JobPath(root), step), step);
}

void Commit(const std::string& root, int64_t step) {
  const absl::Status status = WriteManifest(Root(root), kJobDir, WriteStep(root, step));
  ASSERT_TRUE(status.ok()) << status;
}

void Link(const std::string& target, const std::string& link) {
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0) << link;
}

bool IsLink(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

void ExpectLinkRefused(const absl::Status& status, const std::string& path) {
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), path + " is a symbolic link"))
      << status << " (expected the refusal of " << path << ")";
}

std::vector<int64_t> Steps(const std::vector<RefusedStep>& refused) {
  std::vector<int64_t> steps;
  for (const RefusedStep& r : refused) steps.push_back(r.step);
  return steps;
}

std::vector<int64_t> Steps(const std::vector<CommittedCheckpoint>& committed) {
  std::vector<int64_t> steps;
  for (const CommittedCheckpoint& c : committed) steps.push_back(c.step);
  return steps;
}

// The audit's reproduction: three step-* links in the job directory point at a directory outside
// the root holding 5 files. The job commits a checkpoint every 2 steps and prunes (keep 1). The
// coordinator used to delete all 5 files (RemoveStepDirectory unlinked every entry of each link's
// target) and would write a manifest through a link. Now the links are refused and reported, and
// all 5 files are still there.
TEST(HostileStorageTest, StepLinksAtAnOutsideDirectoryDeleteNothingThere) {
  const std::string root = MakeTempDir("audit");
  ::mkdir(JobPath(root).c_str(), 0755);
  const OutsideDirectory outside("audit_outside", /*files=*/5, /*decoys=*/false);
  ASSERT_EQ(outside.count(), 5u);
  for (int64_t step : {6, 8, 10}) Link(outside.path(), StepDir(JobPath(root), step));
  for (int64_t step : {2, 4, 12, 14}) {
    Commit(root, step);
    absl::StatusOr<PruneResult> pruned = PruneCheckpoints(Root(root), kJobDir, kJobId, 1);
    ASSERT_TRUE(pruned.ok()) << pruned.status();
    EXPECT_EQ(Steps(pruned->refused), (std::vector<int64_t>{10, 8, 6}));
    ExpectLinkRefused(pruned->refused[0].reason, StepDir(JobPath(root), 10));
  }
  // A commit of a step whose directory is a link writes nothing through it.
  const v1::CheckpointManifest manifest = WriteStepFiles(MakeTempDir("audit_files"), 8);
  ExpectLinkRefused(WriteManifest(Root(root), kJobDir, manifest), StepDir(JobPath(root), 8));
  EXPECT_EQ(outside.count(), 5u);
  EXPECT_TRUE(outside.Unchanged());
  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(Root(root), kJobDir, kJobId);
  ASSERT_TRUE(listing.ok());
  EXPECT_EQ(Steps(listing->committed), std::vector<int64_t>{14});
}

// The job directory itself is a link to another directory holding a committed checkpoint of
// this job: nothing reads it as this job's, writes or prunes there.
TEST(HostileStorageTest, AJobDirectoryThatIsALinkIsRefusedByEveryOperation) {
  const std::string root = MakeTempDir("job_link");
  const std::string elsewhere = MakeTempDir("job_link_outside");
  ::mkdir((elsewhere + "/job").c_str(), 0755);
  for (int64_t step : {2, 4}) {
    ASSERT_TRUE(WriteManifest(Root(elsewhere), "job",
                              WriteStepFiles(StepDir(elsewhere + "/job", step), step))
                    .ok());
  }
  const auto before = SnapshotDirectory(elsewhere + "/job");
  const auto before_step = SnapshotDirectory(StepDir(elsewhere + "/job", 2));
  Link(elsewhere + "/job", JobPath(root));
  const std::string job = JobPath(root);

  ExpectLinkRefused(ListCheckpoints(Root(root), kJobDir, kJobId).status(), job);
  ExpectLinkRefused(PruneCheckpoints(Root(root), kJobDir, kJobId, 1).status(), job);
  ExpectLinkRefused(OpenCommittedCheckpoint(Root(root), kJobDir, 2, kJobId).status(), job);
  const v1::CheckpointManifest manifest = WriteStepFiles(MakeTempDir("job_link_files"), 6);
  ExpectLinkRefused(WriteManifest(Root(root), kJobDir, manifest), job);
  // Where a worker's writer creates its step directory.
  ExpectLinkRefused(Root(root).CreatePath(absl::StrCat(kJobDir, "/", StepDirName(6))).status(),
                    job);
  EXPECT_EQ(SnapshotDirectory(elsewhere + "/job"), before);
  EXPECT_EQ(SnapshotDirectory(StepDir(elsewhere + "/job", 2)), before_step);
}

// A step directory that is a link to a valid checkpoint of this job elsewhere: not listed as
// committed, not opened, not committed into, not pruned.
TEST(HostileStorageTest, AStepDirectoryLinkIsNeitherReadNorWrittenNorPruned) {
  const std::string root = MakeTempDir("step_link");
  ::mkdir(JobPath(root).c_str(), 0755);
  const std::string elsewhere = MakeTempDir("step_link_outside");
  ::mkdir((elsewhere + "/job").c_str(), 0755);
  ASSERT_TRUE(
      WriteManifest(Root(elsewhere), "job", WriteStepFiles(StepDir(elsewhere + "/job", 6), 6))
          .ok());
  const std::string target = StepDir(elsewhere + "/job", 6);
  const auto before = SnapshotDirectory(target);
  Commit(root, 2);
  Commit(root, 8);
  const std::string link = StepDir(JobPath(root), 6);
  Link(target, link);

  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(Root(root), kJobDir, kJobId);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(Steps(listing->committed), (std::vector<int64_t>{8, 2}));
  ASSERT_EQ(Steps(listing->refused), std::vector<int64_t>{6});
  ExpectLinkRefused(listing->refused[0].reason, link);
  ExpectLinkRefused(OpenCommittedCheckpoint(Root(root), kJobDir, 6, kJobId).status(), link);
  ExpectLinkRefused(WriteManifest(Root(root), kJobDir, WriteStepFiles(target + "-copy", 6)), link);
  ExpectLinkRefused(Root(root).CreatePath(absl::StrCat(kJobDir, "/", StepDirName(6))).status(),
                    link);
  absl::StatusOr<PruneResult> pruned = PruneCheckpoints(Root(root), kJobDir, kJobId, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(pruned->deleted_committed, std::vector<int64_t>{2});
  EXPECT_EQ(Steps(pruned->refused), std::vector<int64_t>{6});
  EXPECT_TRUE(IsLink(link));
  EXPECT_EQ(SnapshotDirectory(target), before);
}

// A committed checkpoint's shard file is a link to a copy of itself outside the root (same
// bytes, so following it would pass every check): the reader, fsck, a commit and a writer of
// that name refuse it; pruning removes the checkpoint's regular files and leaves the link.
TEST(HostileStorageTest, AShardFileLinkIsRefusedByReadersCommitsWritersAndPruning) {
  const std::string root = MakeTempDir("shard_link");
  ::mkdir(JobPath(root).c_str(), 0755);
  const OutsideDirectory outside("shard_link_outside");
  Commit(root, 4);
  const std::string shard = absl::StrCat(StepDir(JobPath(root), 4), "/", ShardFileName(0, 1));
  const std::string copy = outside.path() + "/" + ShardFileName(0, 1) + ".copy";
  ASSERT_TRUE(WriteFileDurably(copy, *ReadFileToString(shard)).ok());
  const auto before = SnapshotDirectory(outside.path());
  ASSERT_EQ(::unlink(shard.c_str()), 0);
  Link(copy, shard);

  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(Root(root), kJobDir, kJobId);
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(Steps(listing->committed), std::vector<int64_t>{4});
  ExpectLinkRefused(CheckpointReader::Open(listing->committed[0]).status(), shard);
  const std::vector<CheckpointFileCheck> checks = VerifyCheckpoint(listing->committed[0]);
  ASSERT_EQ(checks.size(), 1u);
  EXPECT_EQ(checks[0].state, CheckpointFileState::kRefused);
  ExpectLinkRefused(checks[0].detail, shard);
  ExpectLinkRefused(WriteManifest(Root(root), kJobDir, listing->committed[0].manifest), shard);
  // A writer of that name (a rank writing step 4 again) refuses to replace the link.
  const absl::Status rewritten =
      testing::WriteTestShardFiles(StepDir(JobPath(root), 4), Spec(4), Value).status();
  ExpectLinkRefused(rewritten, shard);

  Commit(root, 6);
  absl::StatusOr<PruneResult> pruned = PruneCheckpoints(Root(root), kJobDir, kJobId, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_TRUE(pruned->deleted_committed.empty());
  ASSERT_EQ(Steps(pruned->refused), std::vector<int64_t>{4});
  ExpectLinkRefused(pruned->refused[0].reason, shard);
  EXPECT_TRUE(IsLink(shard));
  EXPECT_FALSE(IsLink(ManifestPath(StepDir(JobPath(root), 4))));  // the manifest went first
  EXPECT_EQ(SnapshotDirectory(outside.path()), before);
}

// manifest.json is a link to a valid manifest of this job outside the root: the step is not a
// checkpoint, ReadManifest refuses it, a commit refuses to replace it, pruning leaves it.
TEST(HostileStorageTest, AManifestLinkIsNeverReadWrittenThroughOrPruned) {
  const std::string root = MakeTempDir("manifest_link");
  ::mkdir(JobPath(root).c_str(), 0755);
  const OutsideDirectory outside("manifest_link_outside");
  const v1::CheckpointManifest manifest = WriteStep(root, 6);
  const std::string valid = outside.path() + "/valid-manifest.json";
  {
    // A valid manifest of step 6, committed in a scratch copy and copied out.
    const std::string scratch = MakeTempDir("manifest_link_scratch");
    ::mkdir((scratch + "/job").c_str(), 0755);
    ASSERT_TRUE(
        WriteManifest(Root(scratch), "job", WriteStepFiles(StepDir(scratch + "/job", 6), 6)).ok());
    ASSERT_TRUE(
        WriteFileDurably(valid, *ReadFileToString(ManifestPath(StepDir(scratch + "/job", 6))))
            .ok());
  }
  const auto before = SnapshotDirectory(outside.path());
  const std::string link = ManifestPath(StepDir(JobPath(root), 6));
  Link(valid, link);
  Commit(root, 8);

  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(Root(root), kJobDir, kJobId);
  ASSERT_TRUE(listing.ok()) << listing.status();
  EXPECT_EQ(Steps(listing->committed), std::vector<int64_t>{8});
  ASSERT_EQ(Steps(listing->refused), std::vector<int64_t>{6});
  ExpectLinkRefused(listing->refused[0].reason, link);
  absl::StatusOr<Directory> step_dir = OpenStepDirectory(Root(root), kJobDir, 6);
  ASSERT_TRUE(step_dir.ok());
  ExpectLinkRefused(ReadManifest(*step_dir).status(), link);
  ExpectLinkRefused(WriteManifest(Root(root), kJobDir, manifest), link);
  absl::StatusOr<PruneResult> pruned = PruneCheckpoints(Root(root), kJobDir, kJobId, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_EQ(Steps(pruned->refused), std::vector<int64_t>{6});
  EXPECT_TRUE(IsLink(link));
  EXPECT_EQ(SnapshotDirectory(outside.path()), before);
}

// The writers' temporary names: a link planted under the very name a shard writer or the
// manifest writer is about to create (at that moment, through the storage hooks) is not written
// through, and stale temporary-name links in an abandoned step directory are left by pruning.
TEST(HostileStorageTest, LinksUnderTemporaryNamesAreNeverFollowed) {
  const std::string root = MakeTempDir("temp_links");
  ::mkdir(JobPath(root).c_str(), 0755);
  const OutsideDirectory outside("temp_links_outside");
  auto hooks = std::make_shared<testing::TestStorageHooks>();
  std::vector<std::string> planted;
  hooks->RunAt(StorageOperation::kCreate, "", [&](const std::string& path) {
    // The first attempt of each file: a link to an outside file under its temporary name.
    auto file_of = [](const std::string& temp_path) {
      return temp_path.substr(0, temp_path.find(".tmp-"));
    };
    for (const std::string& done : planted) {
      if (file_of(done) == file_of(path)) return;
    }
    planted.push_back(path);
    ASSERT_EQ(::symlink(outside.file().c_str(), path.c_str()), 0);
  });
  const Directory hooked_root = Root(root, hooks);
  absl::StatusOr<Directory> step_dir =
      hooked_root.CreatePath(absl::StrCat(kJobDir, "/", StepDirName(4)));
  ASSERT_TRUE(step_dir.ok()) << step_dir.status();
  // A shard writer, as a worker's writer creates it (relative to the step directory).
  absl::StatusOr<std::vector<WrittenFile>> files = [&]() {
    v1::ShardHeader header;
    header.set_job_id(kJobId);
    header.set_step(4);
    header.set_generation(1);
    header.set_world_size(1);
    header.set_rank(0);
    header.set_layout_hash(1);
    header.set_loss_scale(1.0);
    header.set_optimizer(v1::ADAMW);
    header.set_param_dtype(v1::FLOAT32);
    header.add_states(kParamState);
    v1::CheckpointTensor* tensor = header.add_tensors();
    tensor->set_name("w");
    tensor->add_shape(2);
    FragmentSpec fragment{kParamState, "w", 0, 2, v1::FLOAT32};
    absl::StatusOr<std::unique_ptr<ShardWriter>> writer =
        ShardWriter::Create(*step_dir, "extra.safetensors", header, {fragment});
    if (!writer.ok()) return absl::StatusOr<std::vector<WrittenFile>>(writer.status());
    const float values[2] = {1.0f, 2.0f};
    absl::Status appended = (*writer)->Append(values, sizeof(values));
    if (!appended.ok()) return absl::StatusOr<std::vector<WrittenFile>>(appended);
    absl::StatusOr<WrittenFile> written = (*writer)->Finish();
    if (!written.ok()) return absl::StatusOr<std::vector<WrittenFile>>(written.status());
    return absl::StatusOr<std::vector<WrittenFile>>(std::vector<WrittenFile>{*written});
  }();
  ASSERT_TRUE(files.ok()) << files.status();
  // The manifest writer's temporary name.
  ASSERT_TRUE(WriteManifest(hooked_root, kJobDir, WriteStep(root, 4)).ok());
  ASSERT_EQ(planted.size(), 2u);
  EXPECT_TRUE(absl::StrContains(planted[0], "/.extra.safetensors.tmp-")) << planted[0];
  EXPECT_TRUE(absl::StrContains(planted[1], "/.manifest.json.tmp-")) << planted[1];
  for (const std::string& link : planted) EXPECT_TRUE(IsLink(link)) << link;
  EXPECT_TRUE(outside.Unchanged());

  // Pruning an abandoned step directory holding such links leaves them, and says so.
  WriteStep(root, 2);
  const std::string stale =
      StepDir(JobPath(root), 2) + "/.rank-00000-of-00001.safetensors.tmp-1-0000000000000001";
  Link(outside.path(), stale);
  absl::StatusOr<PruneResult> pruned = PruneCheckpoints(Root(root), kJobDir, kJobId, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status();
  EXPECT_TRUE(pruned->deleted_uncommitted.empty());
  ASSERT_EQ(Steps(pruned->refused), std::vector<int64_t>{2});
  ExpectLinkRefused(pruned->refused[0].reason, stale);
  EXPECT_TRUE(IsLink(stale));
  EXPECT_TRUE(outside.Unchanged());
}

}  // namespace
}  // namespace zeroshard::checkpoint
