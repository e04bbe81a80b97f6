// CheckpointWriter on the real file system: a rank's shard file lands in its step directory and
// is committed, and links planted in the job's checkpoint directory (the job directory, the step
// directory, the shard file's name) are refused, the commit FAILED with the path named, and
// nothing outside the checkpoint root changes (issue 24, item 1).
#include "worker/daemon/checkpoint_writer.h"

#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/test_hostile_storage.h"
#include "gtest/gtest.h"

namespace zeroshard::worker {
namespace {

using checkpoint::testing::MakeTempDir;
using checkpoint::testing::OutsideDirectory;

constexpr char kJobDir[] = "team/job-000042";
constexpr int64_t kElements = 300;

// Records the writer's commits.
class Commits {
 public:
  CheckpointWriter::CommitFn Fn() {
    return [this](const v1::CommitCheckpointRequest& request) {
      absl::MutexLock lock(&mu_);
      commits_.push_back(request);
      return absl::OkStatus();
    };
  }
  std::vector<v1::CommitCheckpointRequest> Get() {
    absl::MutexLock lock(&mu_);
    return commits_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::CommitCheckpointRequest> commits_ ABSL_GUARDED_BY(mu_);
};

CheckpointWriterOptions Options(const std::string& root) {
  CheckpointWriterOptions options;
  options.root = root;
  options.job_dir = kJobDir;
  v1::ShardHeader& header = options.header;
  header.set_job_id("job-000042");
  header.set_generation(1);
  header.set_world_size(1);
  header.set_rank(0);
  header.set_layout_hash(7);
  header.set_optimizer(v1::SGD);
  header.set_param_dtype(v1::FLOAT32);
  header.add_states("param");
  v1::CheckpointTensor* tensor = header.add_tensors();
  tensor->set_name("0.weight");
  tensor->add_shape(kElements);
  engine::Engine::SavedFragment fragment;
  fragment.state = "param";
  fragment.tensor = 0;
  fragment.begin = 0;
  fragment.end = kElements;
  options.fragments.push_back(fragment);
  options.commit_template.set_job_id("job-000042");
  options.commit_template.set_generation(1);
  options.commit_template.set_rank(0);
  return options;
}

// Writes the checkpoint of `step` on the calling thread and returns its commit.
v1::CommitCheckpointRequest WriteNow(const std::string& root, int64_t step) {
  Commits commits;
  {
    CheckpointWriter writer(Options(root), commits.Fn());
    const absl::Status copied = writer.WriteNow(
        step, engine::Engine::SavedScalars{}, [](size_t, int64_t first, absl::Span<char> out) {
          std::vector<float> values(out.size() / sizeof(float));
          for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(first + i);
          std::memcpy(out.data(), values.data(), out.size());
          return absl::OkStatus();
        });
    EXPECT_TRUE(copied.ok()) << copied;
  }
  const std::vector<v1::CommitCheckpointRequest> sent = commits.Get();
  EXPECT_EQ(sent.size(), 1u);
  return sent.empty() ? v1::CommitCheckpointRequest() : sent.front();
}

std::string StepPath(const std::string& root, int64_t step) {
  return checkpoint::StepDir(checkpoint::JobCheckpointDir(root, kJobDir), step);
}

void ExpectFailedNaming(const v1::CommitCheckpointRequest& commit, const std::string& path) {
  EXPECT_EQ(commit.outcome(), v1::CHECKPOINT_FAILED) << commit.ShortDebugString();
  EXPECT_TRUE(absl::StrContains(commit.message(), path + " is a symbolic link"))
      << commit.message() << " (expected the refusal of " << path << ")";
}

TEST(CheckpointWriterTest, WritesTheShardIntoItsStepDirectoryAndCommitsIt) {
  const std::string root = MakeTempDir("writes");
  const v1::CommitCheckpointRequest commit = WriteNow(root, 4);
  EXPECT_EQ(commit.outcome(), v1::CHECKPOINT_WRITTEN) << commit.message();
  EXPECT_EQ(commit.path(),
            absl::StrCat(kJobDir, "/step-000000000004/rank-00000-of-00001.safetensors"));
  absl::StatusOr<std::unique_ptr<checkpoint::ShardReader>> shard =
      checkpoint::ShardReader::Open(StepPath(root, 4) + "/rank-00000-of-00001.safetensors");
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ(static_cast<int64_t>((*shard)->file_size()), commit.bytes());
  EXPECT_EQ((*shard)->header().step(), 4);
}

// Today's writer creates its directories with std::filesystem::create_directories and its file
// by path: it writes through each of these links (or, for the file, replaces the link without a
// word). This test fails there.
TEST(CheckpointWriterTest, LinksOnTheWayOrInPlaceOfTheFileAreRefusedNeverFollowed) {
  const std::string root = MakeTempDir("links");
  const OutsideDirectory outside("links_outside");
  std::filesystem::create_directories(root + "/team");

  // The job directory.
  const std::string job = checkpoint::JobCheckpointDir(root, kJobDir);
  std::filesystem::create_directory_symlink(outside.path(), job);
  ExpectFailedNaming(WriteNow(root, 4), job);
  EXPECT_TRUE(outside.Unchanged());
  std::filesystem::remove(job);

  // A directory on the way to it.
  std::filesystem::remove(root + "/team");
  std::filesystem::create_directory_symlink(outside.path(), root + "/team");
  ExpectFailedNaming(WriteNow(root, 4), root + "/team");
  EXPECT_TRUE(outside.Unchanged());
  std::filesystem::remove(root + "/team");

  // The step directory.
  std::filesystem::create_directories(job);
  std::filesystem::create_directory_symlink(outside.path(), StepPath(root, 6));
  ExpectFailedNaming(WriteNow(root, 6), StepPath(root, 6));
  EXPECT_TRUE(outside.Unchanged());

  // The shard file's name.
  std::filesystem::create_directories(StepPath(root, 8));
  const std::string shard = StepPath(root, 8) + "/rank-00000-of-00001.safetensors";
  std::filesystem::create_symlink(outside.file(), shard);
  ExpectFailedNaming(WriteNow(root, 8), shard);
  EXPECT_TRUE(std::filesystem::is_symlink(shard));
  EXPECT_TRUE(outside.Unchanged());
  // Nothing else was left behind (the temporary file went with the refusal).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(StepPath(root, 8)),
                          std::filesystem::directory_iterator()),
            1);
}

}  // namespace
}  // namespace zeroshard::worker
