// Writes the teacher-student MLP's generated tensors (the first samples' inputs, the student's
// and the teacher's initial weights) as raw little-endian float32 files, named as
// tools/reference/workload_reference.py names them, so the two can be compared byte for byte.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "sharding/model_catalog.h"
#include "worker/workloads/teacher_student_mlp.h"

ABSL_FLAG(std::string, preset, "", "catalog preset (seed, small, medium, large, deep)");
ABSL_FLAG(std::string, layer_sizes, "", "comma-separated layer sizes, e.g. 10,64,10");
ABSL_FLAG(uint64_t, seed, 0, "generator seed");
ABSL_FLAG(int64_t, samples, 4, "how many inputs to write, from sample 0");
ABSL_FLAG(std::string, out, "", "directory for the .f32 files (must exist)");

namespace zeroshard::workloads {
namespace {

absl::Status WriteFloats(const std::string& path, const std::vector<float>& values) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "files are little-endian float32");
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return absl::UnavailableError(absl::StrCat("out: cannot create ", path));
  const size_t written = std::fwrite(values.data(), sizeof(float), values.size(), file);
  const bool closed = std::fclose(file) == 0;
  if (written != values.size() || !closed) {
    return absl::UnavailableError(absl::StrCat("out: cannot write ", path));
  }
  return absl::OkStatus();
}

absl::Status Dump() {
  sharding::WorkloadSpec spec;
  spec.preset = absl::GetFlag(FLAGS_preset);
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_layer_sizes), ',', absl::SkipEmpty())) {
    int64_t size = 0;
    if (!absl::SimpleAtoi(part, &size)) {
      return absl::InvalidArgumentError(absl::StrCat("layer_sizes: not an integer: ", part));
    }
    spec.layer_sizes.push_back(size);
  }
  const absl::StatusOr<std::vector<int64_t>> sizes = sharding::ResolveLayerSizes(spec);
  if (!sizes.ok()) return sizes.status();
  const std::string dir = absl::GetFlag(FLAGS_out);
  if (dir.empty()) return absl::InvalidArgumentError("out: required");
  const int64_t samples = absl::GetFlag(FLAGS_samples);
  if (samples < 0) return absl::InvalidArgumentError("samples: negative");
  const uint64_t seed = absl::GetFlag(FLAGS_seed);

  std::vector<float> inputs(samples * (*sizes)[0]);
  for (int64_t i = 0; i < samples; ++i) {
    FillSampleInput(*sizes, seed, i, absl::MakeSpan(inputs.data() + i * (*sizes)[0], (*sizes)[0]));
  }
  absl::Status status = WriteFloats(absl::StrCat(dir, "/inputs.f32"), inputs);
  if (!status.ok()) return status;
  const int64_t num_layers = static_cast<int64_t>(sizes->size()) - 1;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    for (const auto& [net, role] :
         {std::pair{"student", MlpRole::kStudent}, std::pair{"teacher", MlpRole::kTeacher}}) {
      for (const bool bias : {false, true}) {
        const int64_t out = (*sizes)[layer + 1];
        std::vector<float> values(bias ? out : out * (*sizes)[layer]);
        status = FillLayerParameters(role, *sizes, seed, layer, bias, absl::MakeSpan(values));
        if (!status.ok()) return status;
        status = WriteFloats(
            absl::StrCat(dir, "/", net, ".layers.", layer, bias ? ".bias" : ".weight", ".f32"),
            values);
        if (!status.ok()) return status;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace zeroshard::workloads

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = zeroshard::workloads::Dump();
  if (!status.ok()) {
    std::fprintf(stderr, "dump_workload: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
