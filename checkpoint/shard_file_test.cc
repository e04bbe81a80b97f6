// Tests for shard files: writes round-trip with checksums, the layout is plain safetensors, and
// corruption, truncation and bad tables are refused by name.
#include "checkpoint/shard_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/file_io.h"
#include "checkpoint/proto_json.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/test_shards.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

using testing::ElementBytes;
using testing::MakeTestShard;
using testing::TestPlan;
using testing::TestShard;

std::string MakeTestDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

void FlipByte(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char byte;
  ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
  ::close(fd);
}

TEST(ShardFileTest, FragmentKey) {
  EXPECT_EQ(FragmentKey("exp_avg", "0.weight", 1024, 4096), "exp_avg/0.weight/1024-4096");
  EXPECT_TRUE(ValidateStateName("max_exp_avg_sq").ok());
  EXPECT_FALSE(ValidateStateName("a/b").ok());
  EXPECT_FALSE(ValidateStateName("").ok());
}

TEST(ShardFileTest, StreamedFileReadsBackFragmentByFragment) {
  const sharding::ShardPlan plan = TestPlan(3);
  const TestShard shard = MakeTestShard(plan, 1, 120);
  ASSERT_GT(shard.specs.size(), 8u);  // several buckets, four states
  const std::string path = MakeTestDir("streamed") + "/rank-00001-of-00003.safetensors";

  auto writer = ShardWriter::Create(path, shard.header, shard.specs);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string data = shard.data();
  EXPECT_EQ((*writer)->data_bytes(), data.size());
  std::mt19937 rng(11);
  for (size_t at = 0; at < data.size();) {
    const size_t chunk = std::min<size_t>(data.size() - at, rng() % 2000);
    ASSERT_TRUE((*writer)->Append(data.data() + at, chunk).ok());
    at += chunk;
  }
  absl::StatusOr<WrittenFile> written = (*writer)->Finish();
  ASSERT_TRUE(written.ok()) << written.status();
  const std::string contents = *ReadFileToString(path);
  EXPECT_EQ(written->bytes, contents.size());
  EXPECT_EQ(written->crc32c, Crc32c(contents.data(), contents.size()));

  absl::StatusOr<std::unique_ptr<ShardReader>> reader = ShardReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  v1::ShardHeader expected_header = shard.header;
  expected_header.set_format_version(kShardFormatVersion);
  EXPECT_EQ((*reader)->header().SerializeAsString(), expected_header.SerializeAsString());
  ASSERT_EQ((*reader)->fragments().size(), shard.specs.size());
  for (size_t i = 0; i < shard.specs.size(); ++i) {
    const v1::ShardFragment& fragment = (*reader)->fragments()[i];
    const FragmentSpec& spec = shard.specs[i];
    EXPECT_EQ(fragment.state(), spec.state);
    EXPECT_EQ(fragment.tensor(), spec.tensor);
    EXPECT_EQ(fragment.begin(), spec.begin);
    EXPECT_EQ(fragment.end(), spec.end);
    EXPECT_EQ(fragment.dtype(), spec.dtype);
    EXPECT_EQ(fragment.crc32c(), Crc32c(shard.bytes[i].data(), shard.bytes[i].size()));
    std::string bytes(shard.bytes[i].size(), '\0');
    ASSERT_TRUE((*reader)->ReadFragment(i, bytes.data(), bytes.size()).ok());
    EXPECT_EQ(bytes, shard.bytes[i]) << FragmentKey(fragment);
  }
  // A part of a fragment.
  const FragmentSpec& spec = shard.specs.back();
  const int64_t begin = spec.begin + 3, end = spec.end - 1;
  std::string part((end - begin) * FragmentDTypeSize(spec.dtype), '\0');
  ASSERT_TRUE((*reader)
                  ->ReadFragmentRange(shard.specs.size() - 1, begin, end, part.data(), part.size())
                  .ok());
  EXPECT_EQ(part, ElementBytes(spec.state, spec.tensor, spec.dtype, begin, end));
  EXPECT_EQ((*reader)->ReadFragmentRange(0, -1, 2, part.data(), part.size()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reader)->ReadFragment(0, part.data(), 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardFileTest, OneShotWriteProducesTheSameBytesAsTheStream) {
  const sharding::ShardPlan plan = TestPlan(2);
  const TestShard shard = MakeTestShard(plan, 0, 50);
  const std::string dir = MakeTestDir("one_shot");
  const std::vector<FragmentBytes> fragments = shard.fragments();
  absl::StatusOr<WrittenFile> one_shot = WriteShardFile(dir + "/a", shard.header, fragments);
  ASSERT_TRUE(one_shot.ok()) << one_shot.status();
  auto writer = ShardWriter::Create(dir + "/b", shard.header, shard.specs);
  ASSERT_TRUE(writer.ok());
  const std::string data = shard.data();
  ASSERT_TRUE((*writer)->Append(data.data(), data.size()).ok());
  absl::StatusOr<WrittenFile> streamed = (*writer)->Finish();
  ASSERT_TRUE(streamed.ok());
  EXPECT_EQ(*ReadFileToString(dir + "/a"), *ReadFileToString(dir + "/b"));
  EXPECT_EQ(one_shot->crc32c, streamed->crc32c);

  std::vector<FragmentBytes> short_one = fragments;
  short_one[2].bytes.remove_suffix(2);
  const absl::Status status = WriteShardFile(dir + "/c", shard.header, short_one).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  const FragmentSpec& spec = short_one[2].spec;
  EXPECT_TRUE(absl::StrContains(
      status.message(),
      absl::StrCat("fragments[2] \"", FragmentKey(spec.state, spec.tensor, spec.begin, spec.end),
                   "\": ", short_one[2].bytes.size(), " bytes produced for ",
                   fragments[2].bytes.size())))
      << status;
}

TEST(ShardFileTest, ProducerStreamsFragmentsInChunksAndMustGiveExactlyTheirBytes) {
  const sharding::ShardPlan plan = TestPlan(3);
  const TestShard shard = MakeTestShard(plan, 0, 50);
  const std::string dir = MakeTestDir("producer");
  std::vector<size_t> produced_order;
  // Three-byte chunks: most chunks end inside an element.
  auto in_chunks = [&](size_t index, const ByteSink& sink) -> absl::Status {
    produced_order.push_back(index);
    const std::string& bytes = shard.bytes[index];
    for (size_t at = 0; at < bytes.size(); at += 3) {
      ZS_RETURN_IF_ERROR(sink(bytes.data() + at, std::min<size_t>(3, bytes.size() - at)));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<WrittenFile> produced =
      WriteShardFile(dir + "/produced", shard.header, shard.specs, in_chunks);
  ASSERT_TRUE(produced.ok()) << produced.status();
  ASSERT_TRUE(WriteShardFile(dir + "/spans", shard.header, shard.fragments()).ok());
  EXPECT_EQ(*ReadFileToString(dir + "/produced"), *ReadFileToString(dir + "/spans"));
  ASSERT_EQ(produced_order.size(), shard.specs.size());
  for (size_t i = 0; i < produced_order.size(); ++i) EXPECT_EQ(produced_order[i], i);

  // One byte too many: refused at the chunk that overruns, not passed on to the next fragment.
  const absl::Status too_many =
      WriteShardFile(dir + "/too_many", shard.header, shard.specs,
                     [&](size_t index, const ByteSink& sink) -> absl::Status {
                       ZS_RETURN_IF_ERROR(in_chunks(index, sink));
                       return index == 1 ? sink("x", 1) : absl::OkStatus();
                     })
          .status();
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  const FragmentSpec& second = shard.specs[1];
  EXPECT_TRUE(absl::StrContains(
      too_many.message(),
      absl::StrCat(
          "fragments[1] \"", FragmentKey(second.state, second.tensor, second.begin, second.end),
          "\": ", shard.bytes[1].size() + 1, " bytes produced for ", shard.bytes[1].size())))
      << too_many;
  // The producer's own error comes back as it is.
  const absl::Status failed =
      WriteShardFile(dir + "/failed", shard.header, shard.specs, [](size_t index, const ByteSink&) {
        return absl::UnavailableError(absl::StrCat("staging buffer ", index));
      }).status();
  EXPECT_EQ(failed, absl::UnavailableError("staging buffer 0"));
  EXPECT_EQ(ReadFileToString(dir + "/too_many").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadFileToString(dir + "/failed").status().code(), absl::StatusCode::kNotFound);
}

// The container is plain safetensors: one 1-D tensor per fragment named by its key, and the two
// metadata entries as JSON with the proto's field names.
TEST(ShardFileTest, LayoutIsPlainSafetensors) {
  const sharding::ShardPlan plan = TestPlan(2);
  const TestShard shard = MakeTestShard(plan, 1, 9);
  const std::string path = MakeTestDir("layout") + "/f.safetensors";
  ASSERT_TRUE(WriteShardFile(path, shard.header, shard.fragments()).ok());
  auto file = SafetensorsReader::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), shard.specs.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < shard.specs.size(); ++i) {
    const TensorInfo& tensor = (*file)->tensors()[i];  // in data order = declaration order
    const FragmentSpec& spec = shard.specs[i];
    EXPECT_EQ(tensor.name, FragmentKey(spec.state, spec.tensor, spec.begin, spec.end));
    EXPECT_EQ(tensor.dtype,
              spec.state == "param" ? SafetensorsDType::kBF16 : SafetensorsDType::kF32);
    EXPECT_EQ(tensor.shape, std::vector<int64_t>{spec.num_elements()});
    EXPECT_EQ(tensor.data_begin, offset);
    offset = tensor.data_end;
  }
  const std::string& header_json = (*file)->metadata().at(kShardHeaderMetadataKey);
  EXPECT_TRUE(absl::StrContains(header_json, "\"job_id\":\"job-000007\"")) << header_json;
  EXPECT_TRUE(absl::StrContains(header_json, "\"loss_scale_good_steps\":\"17\"")) << header_json;
  EXPECT_TRUE(absl::StrContains(header_json, "\"optimizer\":\"ADAMW\"")) << header_json;
  const std::string& table_json = (*file)->metadata().at(kFragmentTableMetadataKey);
  EXPECT_TRUE(absl::StrContains(
      table_json,
      absl::StrFormat("\"crc32c\":%u", Crc32c(shard.bytes[0].data(), shard.bytes[0].size()))))
      << table_json;
  EXPECT_EQ((*file)->metadata().size(), 2u);
}

TEST(ShardFileTest, FlippedByteIsDataLossNamingFileFragmentAndChecksums) {
  const sharding::ShardPlan plan = TestPlan(3);
  const TestShard shard = MakeTestShard(plan, 2, 30);
  const std::string path = MakeTestDir("flipped") + "/rank-00002-of-00003.safetensors";
  ASSERT_TRUE(WriteShardFile(path, shard.header, shard.fragments()).ok());
  const size_t victim = 5;
  const std::string key = FragmentKey(shard.specs[victim].state, shard.specs[victim].tensor,
                                      shard.specs[victim].begin, shard.specs[victim].end);
  {
    auto file = SafetensorsReader::Open(path);
    ASSERT_TRUE(file.ok());
    const TensorInfo* tensor = (*file)->Find(key);
    ASSERT_NE(tensor, nullptr);
    FlipByte(path, (*file)->data_start() + tensor->data_end - 1);  // the fragment's last byte
  }
  auto reader = ShardReader::Open(path);  // the table and header are intact
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string bytes(shard.bytes[victim].size(), '\0');
  const absl::Status status = (*reader)->ReadFragment(victim, bytes.data(), bytes.size());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat("fragment \"", key, "\"")))
      << status;
  const uint32_t recorded = Crc32c(shard.bytes[victim].data(), shard.bytes[victim].size());
  std::string corrupted = shard.bytes[victim];
  corrupted.back() ^= 0x10;
  EXPECT_TRUE(absl::StrContains(
      status.message(), absl::StrFormat("has CRC32C 0x%08x, but the fragment table records 0x%08x",
                                        Crc32c(corrupted.data(), corrupted.size()), recorded)))
      << status;
  // The first element alone is intact, but the whole fragment is verified.
  const FragmentSpec& spec = shard.specs[victim];
  std::string first(FragmentDTypeSize(spec.dtype), '\0');
  EXPECT_EQ((*reader)
                ->ReadFragmentRange(victim, spec.begin, spec.begin + 1, first.data(), first.size())
                .code(),
            absl::StatusCode::kDataLoss);
  // Other fragments still read.
  std::string other(shard.bytes[victim + 1].size(), '\0');
  EXPECT_TRUE((*reader)->ReadFragment(victim + 1, other.data(), other.size()).ok());
}

TEST(ShardFileTest, TruncatedFileIsRefusedAtOpen) {
  const sharding::ShardPlan plan = TestPlan(2);
  const TestShard shard = MakeTestShard(plan, 0, 30);
  const std::string path = MakeTestDir("truncated") + "/f.safetensors";
  absl::StatusOr<WrittenFile> written = WriteShardFile(path, shard.header, shard.fragments());
  ASSERT_TRUE(written.ok());
  ASSERT_EQ(::truncate(path.c_str(), written->bytes - 100), 0);
  const absl::Status status = ShardReader::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), path)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "truncated")) << status;
}

TEST(ShardFileTest, WriterRefusesBadHeadersAndFragments) {
  const sharding::ShardPlan plan = TestPlan(2);
  const TestShard shard = MakeTestShard(plan, 0, 30);
  const std::string dir = MakeTestDir("refusals");
  auto message_of = [&](const v1::ShardHeader& header, const std::vector<FragmentSpec>& specs) {
    const absl::Status status = ShardWriter::Create(dir + "/x", header, specs).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    return std::string(status.message());
  };
  v1::ShardHeader header = shard.header;
  header.set_rank(2);
  EXPECT_EQ(message_of(header, shard.specs), "header.rank: 2 outside [0, 2)");
  header = shard.header;
  header.set_loss_scale(0);
  EXPECT_TRUE(absl::StrContains(message_of(header, shard.specs), "header.loss_scale"));
  header = shard.header;
  header.clear_job_id();
  EXPECT_EQ(message_of(header, shard.specs), "header.job_id: empty");
  header = shard.header;
  header.add_states("exp_avg");
  EXPECT_EQ(message_of(header, shard.specs), "header.states[4]: duplicate \"exp_avg\"");
  // Per-tensor steps (issue 26): one per tensor, each within the optimizer's step.
  header = shard.header;
  header.add_tensor_steps(1);
  EXPECT_TRUE(absl::StrContains(message_of(header, shard.specs), "header.tensor_steps: 1 entries"));
  header.clear_tensor_steps();
  for (int i = 0; i < header.tensors_size(); ++i) header.add_tensor_steps(header.optimizer_step());
  header.set_tensor_steps(1, header.optimizer_step() + 1);
  EXPECT_TRUE(absl::StrContains(message_of(header, shard.specs), "header.tensor_steps[1]"));

  std::vector<FragmentSpec> specs = shard.specs;
  specs.push_back(specs[0]);
  specs.back().begin += 1;
  EXPECT_TRUE(absl::StrContains(
      message_of(shard.header, specs),
      absl::StrCat("overlaps fragments[0] \"",
                   FragmentKey(specs[0].state, specs[0].tensor, specs[0].begin, specs[0].end))))
      << message_of(shard.header, specs);
  specs = shard.specs;
  specs[1].state = "momentum_buffer";
  EXPECT_TRUE(absl::StrContains(message_of(shard.header, specs),
                                "state \"momentum_buffer\" is not in header.states"));
  specs = shard.specs;
  specs[1].tensor = "9.weight";
  EXPECT_TRUE(absl::StrContains(message_of(shard.header, specs),
                                "tensor \"9.weight\" is not in header.tensors"));
  specs = shard.specs;
  specs[0] = {"exp_avg", "0.bias", 60, 65, v1::FLOAT32};
  EXPECT_TRUE(absl::StrContains(message_of(shard.header, specs),
                                "elements [60, 65) are not a non-empty part of [0, 64)"));
  specs[0] = {"exp_avg", "0.bias", 6, 6, v1::FLOAT32};
  EXPECT_TRUE(absl::StrContains(message_of(shard.header, specs), "not a non-empty part"));
  specs[0] = {"exp_avg", "0.bias", 0, 6, v1::DTYPE_UNSPECIFIED};
  EXPECT_TRUE(absl::StrContains(message_of(shard.header, specs), "is not a tensor dtype"));
}

TEST(ShardFileTest, RankOwningNoElementsWritesAnEmptyTable) {
  const sharding::ShardPlan plan = TestPlan(1);
  v1::ShardHeader header = testing::TestHeader(plan, 0, 4);
  const std::string path = MakeTestDir("empty") + "/f.safetensors";
  ASSERT_TRUE(WriteShardFile(path, header, {}).ok());
  auto reader = ShardReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE((*reader)->fragments().empty());
  EXPECT_EQ((*reader)->header().job_id(), "job-000007");
}

// Files whose table disagrees with their tensors, written with the container's own writer.
TEST(ShardFileTest, ReaderRefusesTablesThatDisagreeWithTheFile) {
  const sharding::ShardPlan plan = TestPlan(1);
  v1::ShardHeader header = testing::TestHeader(plan, 0, 4);
  header.set_format_version(kShardFormatVersion);
  const std::string dir = MakeTestDir("disagree");
  v1::ShardFragmentTable table;
  v1::ShardFragment* fragment = table.add_fragments();
  fragment->set_state("master");
  fragment->set_tensor("0.bias");
  fragment->set_begin(0);
  fragment->set_end(4);
  fragment->set_dtype(v1::FLOAT32);
  const std::string data(16, 'd');
  fragment->set_crc32c(Crc32c(data.data(), data.size()));
  auto write = [&](const std::string& name, std::vector<TensorDecl> tensors,
                   SafetensorsMetadata metadata) {
    auto writer = SafetensorsWriter::Create(dir + "/" + name, std::move(tensors), metadata);
    EXPECT_TRUE(writer.ok()) << writer.status();
    uint64_t bytes = (*writer)->data_bytes();
    const std::string fill(bytes, 'd');
    EXPECT_TRUE((*writer)->Append(fill.data(), fill.size()).ok());
    EXPECT_TRUE((*writer)->Finish().ok());
    return ShardReader::Open(dir + "/" + name).status();
  };
  const SafetensorsMetadata good = {{kShardHeaderMetadataKey, ToJson(header)},
                                    {kFragmentTableMetadataKey, ToJson(table)}};
  EXPECT_TRUE(write("good", {{"master/0.bias/0-4", SafetensorsDType::kF32, {4}}}, good).ok());

  absl::Status status = write(
      "stray",
      {{"master/0.bias/0-4", SafetensorsDType::kF32, {4}}, {"extra", SafetensorsDType::kU8, {1}}},
      good);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), "tensor \"extra\" is in no fragment")) << status;

  status = write("missing", {{"master/0.bias/0-3", SafetensorsDType::kF32, {3}}}, good);
  EXPECT_TRUE(absl::StrContains(status.message(),
                                "fragment \"master/0.bias/0-4\" has no safetensors tensor"))
      << status;

  status = write("dtype", {{"master/0.bias/0-4", SafetensorsDType::kF16, {8}}}, good);
  EXPECT_TRUE(absl::StrContains(status.message(), "is stored as F16 [8]")) << status;

  status = write("no_table", {}, {{kShardHeaderMetadataKey, ToJson(header)}});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), "has no \"zeroshard.fragments\"")) << status;

  status =
      write("not_json", {}, {{kShardHeaderMetadataKey, "{"}, {kFragmentTableMetadataKey, "{}"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(status.message(), "zeroshard.checkpoint:")) << status;

  v1::ShardHeader newer = header;
  newer.set_format_version(2);
  status = write("newer", {},
                 {{kShardHeaderMetadataKey, ToJson(newer)}, {kFragmentTableMetadataKey, "{}"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(status.message(), "format_version 2")) << status;
}

}  // namespace
}  // namespace zeroshard::checkpoint
