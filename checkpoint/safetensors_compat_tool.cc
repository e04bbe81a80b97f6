// Run by tools/check_safetensors_compat.sh, not a test: writes a checkpoint shard for PyPI's
// safetensors to read, and prints what our reader makes of files PyPI's safetensors wrote.
//
//   safetensors_compat_tool write-shard OUT.safetensors EXPECTED.json
//   safetensors_compat_tool read IN.safetensors      (JSON on stdout)
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/file_io.h"
#include "checkpoint/proto_json.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/test_shards.h"
#include "google/protobuf/struct.pb.h"

namespace zeroshard::checkpoint {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

Value ShapeValue(const std::vector<int64_t>& shape) {
  Value value;
  for (int64_t dim : shape) {
    value.mutable_list_value()->add_values()->set_number_value(static_cast<double>(dim));
  }
  if (shape.empty()) value.mutable_list_value();
  return value;
}

Struct TensorStruct(absl::string_view name, absl::string_view dtype,
                    const std::vector<int64_t>& shape, absl::string_view bytes) {
  Struct tensor;
  (*tensor.mutable_fields())["name"].set_string_value(std::string(name));
  (*tensor.mutable_fields())["dtype"].set_string_value(std::string(dtype));
  (*tensor.mutable_fields())["shape"] = ShapeValue(shape);
  (*tensor.mutable_fields())["hex"].set_string_value(absl::BytesToHexString(bytes));
  return tensor;
}

// The W=2 rank 1 shard of the test model (bf16 params, fp32 masters and AdamW moments).
int WriteShard(const std::string& path, const std::string& expected_path) {
  const testing::TestShard shard = testing::MakeTestShard(testing::TestPlan(2), 1, 120);
  absl::StatusOr<WrittenFile> written = WriteShardFile(path, shard.header, shard.fragments());
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", written.status().ToString().c_str());
    return 1;
  }
  Struct expected;
  Value& tensors = (*expected.mutable_fields())["tensors"];
  tensors.mutable_list_value();
  for (size_t i = 0; i < shard.specs.size(); ++i) {
    const FragmentSpec& spec = shard.specs[i];
    *tensors.mutable_list_value()->add_values()->mutable_struct_value() = TensorStruct(
        FragmentKey(spec.state, spec.tensor, spec.begin, spec.end),
        spec.dtype == v1::BFLOAT16 ? "BF16" : "F32", {spec.num_elements()}, shard.bytes[i]);
  }
  (*expected.mutable_fields())["bytes"].set_number_value(static_cast<double>(written->bytes));
  absl::Status saved = WriteFileDurably(expected_path, ToJson(expected));
  if (!saved.ok()) {
    std::fprintf(stderr, "%s\n", saved.ToString().c_str());
    return 1;
  }
  return 0;
}

int Read(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsReader>> reader = SafetensorsReader::Open(path);
  if (!reader.ok()) {
    std::fprintf(stderr, "%s\n", reader.status().ToString().c_str());
    return 1;
  }
  Struct out;
  Value& metadata = (*out.mutable_fields())["metadata"];
  metadata.mutable_struct_value();
  for (const auto& [key, value] : (*reader)->metadata()) {
    (*metadata.mutable_struct_value()->mutable_fields())[key].set_string_value(value);
  }
  Value& tensors = (*out.mutable_fields())["tensors"];
  tensors.mutable_list_value();
  for (const TensorInfo& tensor : (*reader)->tensors()) {
    std::string bytes(tensor.num_bytes(), '\0');
    absl::Status read = (*reader)->ReadTensorBytes(tensor, 0, bytes.data(), bytes.size());
    if (!read.ok()) {
      std::fprintf(stderr, "%s\n", read.ToString().c_str());
      return 1;
    }
    *tensors.mutable_list_value()->add_values()->mutable_struct_value() =
        TensorStruct(tensor.name, SafetensorsDTypeName(tensor.dtype), tensor.shape, bytes);
  }
  std::printf("%s\n", ToJson(out).c_str());
  return 0;
}

}  // namespace
}  // namespace zeroshard::checkpoint

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "write-shard") {
    return zeroshard::checkpoint::WriteShard(args[1], args[2]);
  }
  if (args.size() == 2 && args[0] == "read") return zeroshard::checkpoint::Read(args[1]);
  std::fprintf(stderr,
               "usage: %s write-shard OUT.safetensors EXPECTED.json | read IN.safetensors\n",
               argv[0]);
  return 2;
}
