// Test support for export_torch_test: checkpoints of nn.Sequential(Linear(10, 64), ReLU(),
// Linear(64, 10)) exported into the directory it is given.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/export.h"
#include "checkpoint/test_checkpoints.h"
#include "common/status_macros.h"

namespace zeroshard::checkpoint {
namespace {

// Element i of tensor t holds k / 1024 with k = (i * 7919 + len(t) * 131) % 2001 - 1000: exact in
// fp32 and fp16 but mostly not in bf16, so an export of bf16 params instead of masters shows.
float FixtureValue(absl::string_view, absl::string_view tensor, int64_t index) {
  const int64_t k = (index * 7919 + static_cast<int64_t>(tensor.size()) * 131) % 2001 - 1000;
  return static_cast<float>(k) / 1024.0f;
}

absl::Status WriteAndExport(const std::string& dir, const std::string& name,
                            const testing::TestCheckpointSpec& spec, bool is_final) {
  ZS_ASSIGN_OR_RETURN(CommittedCheckpoint committed,
                      testing::WriteTestCheckpoint(absl::StrCat(dir, "/", name, "-checkpoints"),
                                                   spec, FixtureValue));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                      CheckpointReader::Open(std::move(committed)));
  ZS_ASSIGN_OR_RETURN(const CheckpointExport plan,
                      CheckpointExport::Create(reader.get(), is_final));
  return WriteExportFile(plan, absl::StrCat(dir, "/", name, ".safetensors")).status();
}

// masters.safetensors: bf16 params with fp32 masters at W=3, step 20, the job's final state.
// fp16.safetensors: fp16 params without masters at W=2, step 12.
absl::Status Run(const std::string& dir) {
  testing::TestCheckpointSpec masters;
  masters.step = 20;
  masters.world_size = 3;
  masters.tensors = testing::SequentialTensors({10, 64, 10});
  masters.states = {{"param", v1::BFLOAT16}, {"master", v1::FLOAT32}, {"exp_avg", v1::FLOAT32}};
  ZS_RETURN_IF_ERROR(WriteAndExport(dir, "masters", masters, /*is_final=*/true));
  testing::TestCheckpointSpec fp16 = masters;
  fp16.step = 12;
  fp16.world_size = 2;
  fp16.states = {{"param", v1::FLOAT16}, {"exp_avg", v1::FLOAT32}};
  return WriteAndExport(dir, "fp16", fp16, /*is_final=*/false);
}

}  // namespace
}  // namespace zeroshard::checkpoint

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const absl::Status status = zeroshard::checkpoint::Run(argv[1]);
  if (!status.ok()) {
    std::fprintf(stderr, "export_torch_fixture: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
