// Tests for reading checkpoints at another world size (W=3 to W'=2 overlaps, every W -> W' in
// {1,2,3,4}^2 byte for byte) and for refusing incomplete, mismatched or corrupt checkpoints.
#include "checkpoint/checkpoint_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/test_shards.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

using testing::ElementBytes;
using testing::MakeTestShard;
using testing::TestDType;
using testing::TestPlan;
using testing::TestShard;
using testing::TestStates;

std::string MakeTestDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

// Writes and commits a checkpoint of the test model at `world_size`; returns it as listed.
CommittedCheckpoint WriteCheckpoint(const std::string& job_dir, int64_t step, int32_t world_size) {
  const sharding::ShardPlan plan = TestPlan(world_size);
  const std::string step_dir = StepDir(job_dir, step);
  ::mkdir(step_dir.c_str(), 0755);
  v1::CheckpointManifest manifest;
  manifest.set_job_id("job-000007");
  manifest.set_step(step);
  manifest.set_generation(3);
  manifest.set_world_size(world_size);
  manifest.set_layout_hash(plan.layout_hash());
  manifest.mutable_commit_time()->set_seconds(1700000000);
  for (int32_t rank = 0; rank < world_size; ++rank) {
    const TestShard shard = MakeTestShard(plan, rank, step);
    const std::string name = ShardFileName(rank, world_size);
    absl::StatusOr<WrittenFile> written =
        WriteShardFile(absl::StrCat(step_dir, "/", name), shard.header, shard.fragments());
    EXPECT_TRUE(written.ok()) << written.status();
    v1::CheckpointFile* file = manifest.add_files();
    file->set_rank(rank);
    file->set_path(name);
    file->set_bytes(static_cast<int64_t>(written->bytes));
    file->set_crc32c(written->crc32c);
  }
  absl::StatusOr<Directory> root = Directory::OpenRoot(job_dir);  // the test's own: trusted
  EXPECT_TRUE(root.ok()) << root.status();
  EXPECT_TRUE(WriteManifest(*root, "", manifest).ok());
  absl::StatusOr<CheckpointListing> listing = ListCheckpoints(*root, "", "job-000007");
  EXPECT_TRUE(listing.ok());
  for (const CommittedCheckpoint& checkpoint : listing->committed) {
    if (checkpoint.step == step) return checkpoint;
  }
  ADD_FAILURE() << "step " << step << " is not committed";
  return {};
}

// (rank, fragment begin, fragment end, overlap begin, overlap end)
using Overlap = std::tuple<int32_t, int64_t, int64_t, int64_t, int64_t>;

// What FindFragments must answer, from the old plan alone: every old fragment of the tensor
// that meets [begin, end), clipped to it, in element order.
std::vector<Overlap> ExpectedOverlaps(const sharding::ShardPlan& old_plan, int64_t tensor,
                                      int64_t begin, int64_t end) {
  std::vector<Overlap> expected;
  for (int32_t rank = 0; rank < old_plan.world_size(); ++rank) {
    const sharding::RankView view = *old_plan.ViewForRank(rank);
    for (const sharding::TensorFragment& f : view.fragments()) {
      if (f.tensor != tensor || f.tensor_end <= begin || f.tensor_begin >= end) continue;
      expected.emplace_back(rank, f.tensor_begin, f.tensor_end, std::max(begin, f.tensor_begin),
                            std::min(end, f.tensor_end));
    }
  }
  std::sort(expected.begin(), expected.end(),
            [](const Overlap& a, const Overlap& b) { return std::get<3>(a) < std::get<3>(b); });
  return expected;
}

TEST(CheckpointReaderTest, ThreeRankCheckpointAnswersTwoRankPiecesWithTheRightOverlaps) {
  const std::string job_dir = MakeTestDir("reshard_3_2");
  const CommittedCheckpoint checkpoint = WriteCheckpoint(job_dir, 40, 3);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(checkpoint);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->header().world_size(), 3);
  EXPECT_EQ((*reader)->header().step(), 40);

  const sharding::ShardPlan old_plan = TestPlan(3);
  const sharding::ShardPlan new_plan = TestPlan(2);
  int pieces_spanning_two_old_ranks = 0;
  for (int32_t new_rank = 0; new_rank < 2; ++new_rank) {
    const sharding::RankView view = *new_plan.ViewForRank(new_rank);
    for (const sharding::TensorFragment& piece : view.fragments()) {
      const std::string& tensor = new_plan.tensors()[piece.tensor].name;
      const std::vector<Overlap> expected =
          ExpectedOverlaps(old_plan, piece.tensor, piece.tensor_begin, piece.tensor_end);
      for (const std::string& state : TestStates()) {
        absl::StatusOr<std::vector<FragmentOverlap>> overlaps =
            (*reader)->FindFragments(state, tensor, piece.tensor_begin, piece.tensor_end);
        ASSERT_TRUE(overlaps.ok()) << overlaps.status();
        std::vector<Overlap> got;
        for (const FragmentOverlap& o : *overlaps) {
          const ShardReader& file = (*reader)->file(o.file);
          const v1::ShardFragment& fragment = file.fragments()[o.fragment];
          EXPECT_EQ(fragment.state(), state);
          EXPECT_EQ(fragment.tensor(), tensor);
          got.emplace_back(file.header().rank(), fragment.begin(), fragment.end(), o.begin, o.end);
        }
        EXPECT_EQ(got, expected) << state << "/" << tensor << " [" << piece.tensor_begin << ", "
                                 << piece.tensor_end << ")";
        const v1::DType dtype = TestDType(state);
        std::string bytes(piece.size() * FragmentDTypeSize(dtype), '\0');
        ASSERT_TRUE((*reader)
                        ->Read(state, tensor, piece.tensor_begin, piece.tensor_end, bytes.data(),
                               bytes.size())
                        .ok());
        EXPECT_EQ(bytes, ElementBytes(state, tensor, dtype, piece.tensor_begin, piece.tensor_end));
      }
      if (expected.size() > 1 && std::get<0>(expected.front()) != std::get<0>(expected.back())) {
        ++pieces_spanning_two_old_ranks;
      }
    }
  }
  // The case the test is for: new pieces that straddle old owners.
  EXPECT_GT(pieces_spanning_two_old_ranks, 0);
}

TEST(CheckpointReaderTest, EveryWorldSizeReadsEveryOtherWorldSizesCheckpointExactly) {
  const std::string job_dir = MakeTestDir("matrix");
  for (int32_t old_size = 1; old_size <= 4; ++old_size) {
    const CommittedCheckpoint checkpoint = WriteCheckpoint(job_dir, 100 + old_size, old_size);
    auto reader = CheckpointReader::Open(checkpoint);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (int32_t new_size = 1; new_size <= 4; ++new_size) {
      const sharding::ShardPlan new_plan = TestPlan(new_size);
      for (int32_t rank = 0; rank < new_size; ++rank) {
        const sharding::RankView view = *new_plan.ViewForRank(rank);
        for (const sharding::TensorFragment& piece : view.fragments()) {
          const std::string& tensor = new_plan.tensors()[piece.tensor].name;
          for (const std::string& state : TestStates()) {
            const v1::DType dtype = TestDType(state);
            std::string bytes(piece.size() * FragmentDTypeSize(dtype), '\0');
            ASSERT_TRUE((*reader)
                            ->Read(state, tensor, piece.tensor_begin, piece.tensor_end,
                                   bytes.data(), bytes.size())
                            .ok())
                << old_size << " -> " << new_size;
            ASSERT_EQ(bytes,
                      ElementBytes(state, tensor, dtype, piece.tensor_begin, piece.tensor_end))
                << old_size << " -> " << new_size << " " << state << "/" << tensor;
          }
        }
      }
    }
  }
}

FragmentIndex::File TableOf(const sharding::ShardPlan& plan, int32_t rank) {
  const TestShard shard = MakeTestShard(plan, rank, 1);
  FragmentIndex::File file;
  file.path = absl::StrCat("rank", rank);
  file.rank = rank;
  for (const FragmentSpec& spec : shard.specs) {
    v1::ShardFragment fragment;
    fragment.set_state(spec.state);
    fragment.set_tensor(spec.tensor);
    fragment.set_begin(spec.begin);
    fragment.set_end(spec.end);
    fragment.set_dtype(spec.dtype);
    file.fragments.push_back(fragment);
  }
  return file;
}

TEST(FragmentIndexTest, MissingRankLeavesAGapThatIsNamed) {
  const sharding::ShardPlan plan = TestPlan(3);
  absl::StatusOr<FragmentIndex> index = FragmentIndex::Create({TableOf(plan, 0), TableOf(plan, 2)});
  ASSERT_TRUE(index.ok()) << index.status();
  // The first fragment rank 1 owns of some tensor: the gap a request over the whole tensor hits.
  const sharding::RankView view = *plan.ViewForRank(1);
  const sharding::TensorFragment hole = view.fragments().front();
  const std::string& tensor = plan.tensors()[hole.tensor].name;
  const int64_t elements = plan.tensors()[hole.tensor].num_elements;
  absl::Status status = index->FindFragments("exp_avg", tensor, 0, elements).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(
      status.message(),
      absl::StrCat("no fragment holds elements [", hole.tensor_begin, ", ", hole.tensor_end,
                   ") of state \"exp_avg\" of "
                   "tensor \"",
                   tensor, "\"")))
      << status;
  EXPECT_EQ(index->CheckComplete(testing::TestHeader(plan, 0, 1)).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(index->FindFragments("exp_avg", "no.such", 0, 1).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(index->FindFragments("exp_avg", tensor, 5, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Ranges that avoid the hole are answered.
  if (hole.tensor_begin > 0) EXPECT_TRUE(index->FindFragments("exp_avg", tensor, 0, 1).ok());
}

TEST(FragmentIndexTest, OverlapAcrossFilesIsDataLossNamingBoth) {
  const sharding::ShardPlan plan = TestPlan(2);
  FragmentIndex::File again = TableOf(plan, 0);
  again.path = "copy";
  const absl::Status status = FragmentIndex::Create({TableOf(plan, 0), again}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), " of copy")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), " of rank0")) << status;
}

TEST(CheckpointReaderTest, FilesThatDisagreeWithTheManifestAreRefused) {
  const std::string job_dir = MakeTestDir("mismatch");
  const CommittedCheckpoint at_10 = WriteCheckpoint(job_dir, 10, 2);
  const CommittedCheckpoint at_20 = WriteCheckpoint(job_dir, 20, 2);

  // Rank 1's file of step 10 in step 20's directory.
  CommittedCheckpoint mixed = at_20;
  const std::string moved = absl::StrCat(at_20.directory, "/", at_20.manifest.files(1).path());
  ASSERT_TRUE(WriteFileDurably(moved, *ReadFileToString(absl::StrCat(
                                          at_10.directory, "/", at_10.manifest.files(1).path())))
                  .ok());
  mixed.manifest.mutable_files(1)->set_bytes(at_10.manifest.files(1).bytes());
  absl::Status status = CheckpointReader::Open(mixed).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), moved + ": step 10, but the manifest says 20"))
      << status;

  CommittedCheckpoint other_model = at_10;
  other_model.manifest.set_layout_hash(at_10.manifest.layout_hash() + 1);
  status = CheckpointReader::Open(other_model).status();
  EXPECT_TRUE(absl::StrContains(status.message(), "layout_hash")) << status;

  CommittedCheckpoint wrong_size = at_10;
  wrong_size.manifest.mutable_files(0)->set_bytes(at_10.manifest.files(0).bytes() + 8);
  status = CheckpointReader::Open(wrong_size).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), ": size ")) << status;
}

TEST(CheckpointReaderTest, CorruptFragmentIsDataLossNamingIt) {
  const std::string job_dir = MakeTestDir("corrupt");
  const CommittedCheckpoint checkpoint = WriteCheckpoint(job_dir, 10, 2);
  const std::string path =
      absl::StrCat(checkpoint.directory, "/", checkpoint.manifest.files(1).path());
  const TestShard shard = MakeTestShard(TestPlan(2), 1, 10);
  const FragmentSpec& victim = shard.specs.front();
  const std::string key = FragmentKey(victim.state, victim.tensor, victim.begin, victim.end);
  {
    auto file = SafetensorsReader::Open(path);
    ASSERT_TRUE(file.ok());
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    const off_t offset = (*file)->data_start() + (*file)->Find(key)->data_begin;
    char byte = 0;
    ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
    byte ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
    ::close(fd);
  }
  auto reader = CheckpointReader::Open(checkpoint);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string bytes(victim.num_elements() * FragmentDTypeSize(victim.dtype), '\0');
  const absl::Status status = (*reader)->Read(victim.state, victim.tensor, victim.begin, victim.end,
                                              bytes.data(), bytes.size());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), key)) << status;
  // The whole-file check the manifest allows sees it too.
  EXPECT_EQ(VerifyCheckpointFile(*checkpoint.step_dir, checkpoint.manifest.files(1)).code(),
            absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace zeroshard::checkpoint
