// Test support for checkpoint_test.py: checkpoints written by the real C++ writer (ShardWriter,
// WriteManifest), and the C++ reader's verdict on a step directory, so that the Python reader
// (zeroshard/_checkpoint.py) can be held to the same rules.
//
//   checkpoint_fixture write OUTPUT_DIR
//     OUTPUT_DIR/<case>/step-000000000010/: manifest.json and the ranks' files, job "job-000007":
//       good            nn.Sequential(Linear(10, 64), ReLU(), Linear(64, 10)) at W = 2 as the
//                       shard planner splits it; states param, exp_avg, exp_avg_sq (FLOAT32)
//       tiny            w [8, 4] and b [4], state param, at W = 2: rank 0 holds w [0, 16) and b,
//                       rank 1 w [16, 32)
//       gap             the same but rank 1 holds w [20, 32): elements [16, 20) are nowhere
//       overlap         rank 1 holds w [12, 32): [12, 16) twice
//       gap_and_overlap rank 1 holds w [8, 16) and [20, 32): as many elements as w has, but
//                       [8, 16) twice and [16, 20) nowhere
//     Element i of tensor t in state s holds k / 1024, k = (i * 7919 + len(t) * 131 + len(s) *
//     17) % 2001 - 1000 (exact in float32).
//   checkpoint_fixture verify STEP_DIR
//     ReadManifest and CheckpointReader::Open: prints "OK" and exits 0, or prints the error and
//     exits 1.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/directory.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/test_checkpoints.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

constexpr int64_t kStep = 10;

float FixtureValue(absl::string_view state, absl::string_view tensor, int64_t index) {
  const int64_t k = (index * 7919 + static_cast<int64_t>(tensor.size()) * 131 +
                     static_cast<int64_t>(state.size()) * 17) %
                        2001 -
                    1000;
  return static_cast<float>(k) / 1024.0f;
}

absl::Status WriteGood(const std::string& dir) {
  testing::TestCheckpointSpec spec;
  spec.step = kStep;
  spec.world_size = 2;
  spec.tensors = testing::SequentialTensors({10, 64, 10});
  spec.states = {{"param", v1::FLOAT32}, {"exp_avg", v1::FLOAT32}, {"exp_avg_sq", v1::FLOAT32}};
  return testing::WriteTestCheckpoint(absl::StrCat(dir, "/good"), spec, FixtureValue).status();
}

struct Range {
  std::string tensor;
  int64_t begin;
  int64_t end;
};

// w [8, 4] and b [4], state "param" (FLOAT32), at W = 2: rank r holds `ranks[r]`. The writer
// checks each file on its own (ranges inside the tensor, no overlap within a file), not how the
// files fit together: that is the reader's to check.
absl::Status WriteTiny(const std::string& dir, absl::string_view name,
                       const std::vector<std::vector<Range>>& ranks) {
  const std::string step_dir = StepDir(absl::StrCat(dir, "/", name), kStep);
  std::error_code error;
  std::filesystem::create_directories(step_dir, error);
  if (error) return absl::InternalError(absl::StrCat(step_dir, ": ", error.message()));
  const int32_t world_size = static_cast<int32_t>(ranks.size());
  constexpr uint64_t kLayoutHash = 0x5eed;
  std::vector<WrittenFile> files;
  for (int32_t rank = 0; rank < world_size; ++rank) {
    v1::ShardHeader header;
    header.set_job_id("job-000007");
    header.set_step(kStep);
    header.set_generation(1);
    header.set_world_size(world_size);
    header.set_rank(rank);
    header.set_layout_hash(kLayoutHash);
    header.set_optimizer_step(kStep);
    header.set_loss_scale(1.0);
    header.set_optimizer(v1::ADAMW);
    header.set_param_dtype(v1::FLOAT32);
    header.add_states("param");
    v1::CheckpointTensor* w = header.add_tensors();
    w->set_name("w");
    w->add_shape(8);
    w->add_shape(4);
    v1::CheckpointTensor* b = header.add_tensors();
    b->set_name("b");
    b->add_shape(4);
    std::vector<std::string> data;
    std::vector<FragmentBytes> fragments;
    for (const Range& range : ranks[rank]) {
      std::string bytes;
      for (int64_t i = range.begin; i < range.end; ++i) {
        const float value = FixtureValue("param", range.tensor, i);
        bytes.append(reinterpret_cast<const char*>(&value), sizeof(value));
      }
      data.push_back(std::move(bytes));
    }
    for (size_t i = 0; i < ranks[rank].size(); ++i) {
      const Range& range = ranks[rank][i];
      fragments.push_back({{"param", range.tensor, range.begin, range.end, v1::FLOAT32}, data[i]});
    }
    ZS_ASSIGN_OR_RETURN(WrittenFile written,
                        WriteShardFile(absl::StrCat(step_dir, "/", ShardFileName(rank, world_size)),
                                       std::move(header), fragments));
    files.push_back(std::move(written));
  }
  testing::TestCheckpointSpec spec;
  spec.step = kStep;
  spec.world_size = world_size;
  // The job directory is the fixture's own: trusted as a root.
  ZS_ASSIGN_OR_RETURN(const Directory root, Directory::OpenRoot(absl::StrCat(dir, "/", name)));
  return WriteManifest(root, "", testing::TestManifest(spec, kLayoutHash, files));
}

absl::Status Write(const std::string& dir) {
  ZS_RETURN_IF_ERROR(WriteGood(dir));
  ZS_RETURN_IF_ERROR(WriteTiny(dir, "tiny", {{{"w", 0, 16}, {"b", 0, 4}}, {{"w", 16, 32}}}));
  ZS_RETURN_IF_ERROR(WriteTiny(dir, "gap", {{{"w", 0, 16}, {"b", 0, 4}}, {{"w", 20, 32}}}));
  ZS_RETURN_IF_ERROR(WriteTiny(dir, "overlap", {{{"w", 0, 16}, {"b", 0, 4}}, {{"w", 12, 32}}}));
  return WriteTiny(dir, "gap_and_overlap",
                   {{{"w", 0, 16}, {"b", 0, 4}}, {{"w", 8, 16}, {"w", 20, 32}}});
}

// The step directory's parent is trusted as a root; the step directory and everything in it are
// the C++ reader's to check (any job's checkpoint: the caller names it).
absl::Status Verify(const std::string& step_dir) {
  const std::filesystem::path path(step_dir);
  const std::optional<int64_t> step = ParseStepDirName(path.filename().string());
  if (!step.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(step_dir, ": not a step directory's name"));
  }
  ZS_ASSIGN_OR_RETURN(const Directory root, Directory::OpenRoot(path.parent_path().string()));
  ZS_ASSIGN_OR_RETURN(CommittedCheckpoint checkpoint,
                      OpenCommittedCheckpoint(root, "", *step, std::nullopt));
  return CheckpointReader::Open(std::move(checkpoint)).status();
}

}  // namespace
}  // namespace zeroshard::checkpoint

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "write") != 0 && std::strcmp(argv[1], "verify") != 0)) {
    std::fprintf(stderr, "usage: %s write OUTPUT_DIR | verify STEP_DIR\n", argv[0]);
    return 2;
  }
  if (std::strcmp(argv[1], "write") == 0) {
    const absl::Status status = zeroshard::checkpoint::Write(argv[2]);
    if (!status.ok()) {
      std::fprintf(stderr, "checkpoint_fixture: %s\n", status.ToString().c_str());
      return 1;
    }
    return 0;
  }
  const absl::Status status = zeroshard::checkpoint::Verify(argv[2]);
  std::printf("%s\n", status.ok() ? "OK" : status.ToString().c_str());
  return status.ok() ? 0 : 1;
}
