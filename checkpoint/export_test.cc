// Tests for export: masters (or params widened) bit for bit in a valid file streamed in bounded
// pieces, at W=2 and 3; corrupt fragments, failing sinks and unexportable checkpoints.
#include "checkpoint/export.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/file_io.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/test_checkpoints.h"
#include "gtest/gtest.h"

namespace zeroshard::checkpoint {
namespace {

using testing::SequentialTensors;
using testing::StoredValue;
using testing::TestCheckpointSpec;
using testing::WriteTestCheckpoint;

std::string MakeTestDir(const std::string& name) {
  const char* root = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(root != nullptr ? root : "/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

// Distinct values per (state, tensor, element) with 24 significant bits, so bf16 and fp16
// rounding changes most of them and a state read in place of another shows.
float TestValue(absl::string_view state, absl::string_view tensor, int64_t index) {
  uint64_t h = 1469598103934665603ull;
  for (char c : absl::StrCat(state, "/", tensor))
    h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  h = (h ^ static_cast<uint64_t>(index)) * 0x9E3779B97F4A7C15ull;
  h ^= h >> 29;
  const float magnitude = std::ldexp(static_cast<float>((h & 0xFFFFFF) | 0x800000),
                                     static_cast<int>((h >> 24) % 12) - 30);
  return (h >> 40) & 1 ? -magnitude : magnitude;
}

// What the export must hold for `tensor`: the state's values as stored, widened to fp32.
std::string ExpectedTensorBytes(const sharding::TensorSpec& tensor, absl::string_view state,
                                v1::DType stored) {
  std::string bytes(static_cast<size_t>(tensor.num_elements) * sizeof(float), '\0');
  for (int64_t i = 0; i < tensor.num_elements; ++i) {
    const float value = StoredValue(stored, TestValue(state, tensor.name, i));
    std::memcpy(bytes.data() + i * sizeof(float), &value, sizeof(value));
  }
  return bytes;
}

struct Streamed {
  absl::Status status;
  std::string bytes;
  size_t largest_piece = 0;
};

Streamed StreamToString(const CheckpointExport& plan, size_t chunk_bytes) {
  Streamed out;
  out.status = plan.Stream(
      [&](const void* data, size_t n) {
        out.bytes.append(static_cast<const char*>(data), n);
        out.largest_piece = std::max(out.largest_piece, n);
        return absl::OkStatus();
      },
      chunk_bytes);
  return out;
}

class ExportTest : public ::testing::Test {
 protected:
  // Writes a checkpoint of `spec` into a fresh job directory and opens it.
  void Open(const std::string& name, const TestCheckpointSpec& spec) {
    job_dir_ = MakeTestDir(name);
    absl::StatusOr<CommittedCheckpoint> committed = WriteTestCheckpoint(job_dir_, spec, TestValue);
    ASSERT_TRUE(committed.ok()) << committed.status();
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        CheckpointReader::Open(*std::move(committed));
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
  }

  // Exports the opened checkpoint to a file (in `chunk_bytes` pieces) and checks it against the
  // model's tensors, each holding `state`'s values as stored in `stored`, widened to fp32.
  void ExpectExportOf(const TestCheckpointSpec& spec, absl::string_view state, v1::DType stored,
                      size_t chunk_bytes) {
    absl::StatusOr<CheckpointExport> plan = CheckpointExport::Create(reader_.get(), false);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->source_state(), state);
    EXPECT_EQ(plan->step(), spec.step);
    const Streamed streamed = StreamToString(*plan, chunk_bytes);
    ASSERT_TRUE(streamed.status.ok()) << streamed.status;
    EXPECT_LE(streamed.largest_piece, chunk_bytes);
    EXPECT_EQ(streamed.bytes.size(), plan->total_bytes());

    const std::string path = job_dir_ + "/export.safetensors";
    ASSERT_TRUE(WriteFileDurably(path, streamed.bytes).ok());
    absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->metadata(),
              (SafetensorsMetadata{{"format", "pt"},
                                   {"zeroshard.job_id", spec.job_id},
                                   {"zeroshard.step", absl::StrCat(spec.step)},
                                   {"zeroshard.source", absl::StrCat("step ", spec.step)}}));
    ASSERT_EQ((*file)->tensors().size(), spec.tensors.size());
    for (const sharding::TensorSpec& tensor : spec.tensors) {
      SCOPED_TRACE(tensor.name);
      const TensorInfo* info = (*file)->Find(tensor.name);
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(info->dtype, SafetensorsDType::kF32);
      EXPECT_EQ(info->shape, tensor.shape);
      std::string bytes(info->num_bytes(), '\0');
      ASSERT_TRUE((*file)->ReadTensorBytes(*info, 0, bytes.data(), bytes.size()).ok());
      EXPECT_TRUE(bytes == ExpectedTensorBytes(tensor, state, stored)) << "values differ";
    }
  }

  std::string job_dir_;
  std::unique_ptr<CheckpointReader> reader_;
};

TEST_F(ExportTest, Bf16ParamsWithMastersAtWorldSize3ExportTheMastersBitForBit) {
  TestCheckpointSpec spec;
  spec.world_size = 3;
  spec.step = 40;
  spec.tensors = SequentialTensors({40, 64, 10});
  spec.states = {{"param", v1::BFLOAT16}, {"master", v1::FLOAT32}, {"exp_avg", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("bf16_masters", spec));
  // Every tensor is cut between ranks somewhere: the export joins fragments of several files.
  size_t files_holding_0_weight = 0;
  for (const FragmentIndex::File& file : reader_->index().files()) {
    for (const v1::ShardFragment& fragment : file.fragments) {
      if (fragment.state() == "master" && fragment.tensor() == "0.weight") {
        ++files_holding_0_weight;
        break;
      }
    }
  }
  EXPECT_GE(files_holding_0_weight, 2u);
  ExpectExportOf(spec, "master", v1::FLOAT32, 1000);
  // The params differ from their masters, so reading "param" would have shown.
  EXPECT_NE(ExpectedTensorBytes(spec.tensors[0], "master", v1::FLOAT32),
            ExpectedTensorBytes(spec.tensors[0], "param", v1::BFLOAT16));
}

TEST_F(ExportTest, Fp32ParamsWithoutMastersExportTheParams) {
  TestCheckpointSpec spec;
  spec.world_size = 2;
  spec.tensors = SequentialTensors({40, 64, 10});
  spec.states = {{"param", v1::FLOAT32}, {"exp_avg", v1::FLOAT32}, {"exp_avg_sq", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("fp32_params", spec));
  ExpectExportOf(spec, "param", v1::FLOAT32, 4096);
}

TEST_F(ExportTest, Fp16ParamsWithoutMastersAreWidenedExactly) {
  TestCheckpointSpec spec;
  spec.world_size = 3;
  spec.tensors = SequentialTensors({10, 64, 10});
  spec.states = {{"param", v1::FLOAT16}, {"momentum_buffer", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("fp16_params", spec));
  // Odd pieces: a piece ends inside an element.
  ExpectExportOf(spec, "param", v1::FLOAT16, 7);
}

TEST_F(ExportTest, FinalStateSaysSoInTheMetadata) {
  TestCheckpointSpec spec;
  spec.step = 100;
  spec.tensors = SequentialTensors({4, 8, 2});
  spec.states = {{"param", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("final", spec));
  absl::StatusOr<CheckpointExport> plan = CheckpointExport::Create(reader_.get(), true);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->metadata().at("zeroshard.source"), "final");
  EXPECT_EQ(plan->metadata().at("zeroshard.step"), "100");
  const std::string path = job_dir_ + "/final.safetensors";
  absl::StatusOr<WrittenFile> written = WriteExportFile(*plan, path);
  ASSERT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(written->bytes, contents->size());
  EXPECT_EQ(written->bytes, plan->total_bytes());
  EXPECT_EQ(*contents, StreamToString(*plan, 1 << 20).bytes);
}

// Issue 27: a tied weight is written under each of its names (safetensors has no aliasing), so
// that a strict torch load of the model finds every name of its state_dict().
TEST_F(ExportTest, AliasesGetACopyOfTheirTensorsData) {
  TestCheckpointSpec spec;
  spec.world_size = 2;
  spec.tensors = SequentialTensors({40, 64, 10});
  spec.states = {{"param", v1::FLOAT32}, {"exp_avg", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("aliases", spec));
  const CheckpointExport::Aliases aliases = {{"0.weight", {"decoder.weight"}},
                                             {"2.bias", {"head.bias", "tied.bias"}}};
  absl::StatusOr<CheckpointExport> plan = CheckpointExport::Create(reader_.get(), false, aliases);
  ASSERT_TRUE(plan.ok()) << plan.status();
  std::vector<std::string> names;
  for (const TensorDecl& tensor : plan->tensors()) names.push_back(tensor.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "decoder.weight", "0.bias", "2.weight",
                                             "2.bias", "head.bias", "tied.bias"}));
  const std::string path = job_dir_ + "/aliases.safetensors";
  absl::StatusOr<WrittenFile> written = WriteExportFile(*plan, path);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->bytes, plan->total_bytes());
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 7u);
  auto read = [&](const std::string& name) {
    const TensorInfo* info = (*file)->Find(name);
    EXPECT_NE(info, nullptr) << name;
    if (info == nullptr) return std::string();
    std::string bytes(info->num_bytes(), '\0');
    EXPECT_TRUE((*file)->ReadTensorBytes(*info, 0, bytes.data(), bytes.size()).ok());
    return bytes;
  };
  for (const auto& [source, names_of] : aliases) {
    const sharding::TensorSpec& tensor = source == "0.weight" ? spec.tensors[0] : spec.tensors[3];
    ASSERT_EQ(tensor.name, source);
    const std::string expected = ExpectedTensorBytes(tensor, "param", v1::FLOAT32);
    EXPECT_TRUE(read(source) == expected) << source;
    for (const std::string& alias : names_of) {
      EXPECT_EQ((*file)->Find(alias)->shape, tensor.shape) << alias;
      EXPECT_TRUE(read(alias) == expected) << alias;
    }
  }
  EXPECT_TRUE(read("2.weight") == ExpectedTensorBytes(spec.tensors[2], "param", v1::FLOAT32));

  // An alias of a tensor the checkpoint does not hold, or one that repeats a name, is refused.
  absl::Status refused =
      CheckpointExport::Create(reader_.get(), false, {{"encoder.weight", {"decoder.weight"}}})
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "holds no tensor \"encoder.weight\""))
      << refused;
  refused = CheckpointExport::Create(reader_.get(), false, {{"0.weight", {"2.bias"}}}).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "duplicate name")) << refused;
}

TEST_F(ExportTest, CorruptFragmentIsDataLossAndLeavesNoFile) {
  TestCheckpointSpec spec;
  spec.world_size = 2;
  spec.tensors = SequentialTensors({40, 64, 10});
  spec.states = {{"param", v1::BFLOAT16}, {"master", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("corrupt", spec));
  // Flip one byte of rank 1's first master fragment (headers stay intact: Open succeeded).
  const std::string rank1 = absl::StrCat(StepDir(job_dir_, spec.step), "/", ShardFileName(1, 2));
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> file = SafetensorsReader::Open(rank1);
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo* victim = nullptr;
  for (const TensorInfo& tensor : (*file)->tensors()) {
    if (absl::StartsWith(tensor.name, "master/")) {
      victim = &tensor;
      break;
    }
  }
  ASSERT_NE(victim, nullptr);
  const int fd = ::open(rank1.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t offset = static_cast<off_t>((*file)->data_start() + victim->data_begin);
  char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
  byte ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
  ::close(fd);

  absl::StatusOr<CheckpointExport> plan = CheckpointExport::Create(reader_.get(), false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string out_dir = MakeTestDir("corrupt_out");
  absl::StatusOr<WrittenFile> written = WriteExportFile(*plan, out_dir + "/model.safetensors");
  EXPECT_EQ(written.status().code(), absl::StatusCode::kDataLoss) << written.status();
  EXPECT_TRUE(absl::StrContains(written.status().message(), victim->name)) << written.status();
  EXPECT_TRUE(ListDir(out_dir).empty());
}

TEST_F(ExportTest, ASinkErrorStopsTheStreamAndIsReturned) {
  TestCheckpointSpec spec;
  spec.tensors = SequentialTensors({40, 64, 10});
  spec.states = {{"param", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("sink_error", spec));
  absl::StatusOr<CheckpointExport> plan = CheckpointExport::Create(reader_.get(), false);
  ASSERT_TRUE(plan.ok()) << plan.status();
  int calls = 0;
  const absl::Status status = plan->Stream(
      [&](const void*, size_t) {
        return ++calls == 3 ? absl::CancelledError("client went away") : absl::OkStatus();
      },
      64);
  EXPECT_EQ(status, absl::CancelledError("client went away"));
  EXPECT_EQ(calls, 3);
}

TEST_F(ExportTest, CheckpointsWithoutWeightsOrWithWideParamsAreRefused) {
  TestCheckpointSpec moments_only;
  moments_only.tensors = SequentialTensors({4, 8, 2});
  moments_only.states = {{"exp_avg", v1::FLOAT32}};
  ASSERT_NO_FATAL_FAILURE(Open("moments_only", moments_only));
  absl::Status refused = CheckpointExport::Create(reader_.get(), false).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "neither \"master\" nor \"param\"")) << refused;

  TestCheckpointSpec fp64;
  fp64.tensors = SequentialTensors({4, 8, 2});
  fp64.states = {{"param", v1::FLOAT64}};
  ASSERT_NO_FATAL_FAILURE(Open("fp64_params", fp64));
  refused = CheckpointExport::Create(reader_.get(), false).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "FLOAT64")) << refused;
}

}  // namespace
}  // namespace zeroshard::checkpoint
