// Test support: checkpoints of any nn.Sequential-shaped model, with any states and stored dtypes,
// whose element values come from a function, written rank by rank as the shard planner splits it.
#ifndef ZEROSHARD_CHECKPOINT_TEST_CHECKPOINTS_H_
#define ZEROSHARD_CHECKPOINT_TEST_CHECKPOINTS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/shard_file.h"
#include "numerics/dtype.h"
#include "sharding/shard_planner.h"
#include "sharding/tensor_spec.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint::testing {

// nn.Sequential(Linear(s0, s1), ReLU(), Linear(s1, s2), ...)'s tensors as torch names them:
// Linear layer l is module 2l, its weight [s(l+1), s(l)] and bias [s(l+1)].
inline std::vector<sharding::TensorSpec> SequentialTensors(
    const std::vector<int64_t>& layer_sizes) {
  std::vector<sharding::TensorSpec> tensors;
  for (size_t layer = 0; layer + 1 < layer_sizes.size(); ++layer) {
    const int64_t in = layer_sizes[layer];
    const int64_t out = layer_sizes[layer + 1];
    sharding::TensorSpec weight;
    weight.name = absl::StrCat(2 * layer, ".weight");
    weight.shape = {out, in};
    weight.num_elements = out * in;
    tensors.push_back(weight);
    sharding::TensorSpec bias;
    bias.name = absl::StrCat(2 * layer, ".bias");
    bias.shape = {out};
    bias.num_elements = out;
    tensors.push_back(bias);
  }
  return tensors;
}

struct TestState {
  std::string name;
  v1::DType dtype = v1::FLOAT32;
};

// The value of element `index` (row-major) of `tensor` in `state`, before it is stored in the
// state's dtype.
using TestValueFn =
    std::function<float(absl::string_view state, absl::string_view tensor, int64_t index)>;

struct TestCheckpointSpec {
  std::string job_id = "job-000007";
  int64_t step = 10;
  int64_t generation = 1;
  int32_t world_size = 1;
  std::vector<sharding::TensorSpec> tensors;
  // The first state named "param" gives the header's param_dtype.
  std::vector<TestState> states;
  int64_t bucket_elems = sharding::kMinBucketElems;
  // 0: the plan's layout hash at world_size (the coordinator's plan may differ: tests that
  // commit through it pass the assignment's).
  uint64_t layout_hash = 0;
};

// `value` as `dtype` stores it: FLOAT32 and FLOAT64 exactly, BFLOAT16 and FLOAT16 rounded to
// nearest even.
inline void StoreValue(v1::DType dtype, float value, char* out) {
  if (dtype == v1::FLOAT32) {
    std::memcpy(out, &value, sizeof(value));
    return;
  }
  if (dtype == v1::FLOAT64) {
    const double wide = value;
    std::memcpy(out, &wide, sizeof(wide));
    return;
  }
  const uint16_t bits =
      dtype == v1::BFLOAT16 ? numerics::FloatToBFloat16(value) : numerics::FloatToHalf(value);
  std::memcpy(out, &bits, sizeof(bits));
}

// What an fp32 reader gets back from `value` stored as `dtype`.
inline float StoredValue(v1::DType dtype, float value) {
  if (dtype == v1::BFLOAT16) return numerics::BFloat16ToFloat(numerics::FloatToBFloat16(value));
  if (dtype == v1::FLOAT16) return numerics::HalfToFloat(numerics::FloatToHalf(value));
  return value;
}

// Writes every rank's shard file into `step_dir` (created when missing), as ShardWriter does for
// a worker. Returns the files in rank order.
inline absl::StatusOr<std::vector<WrittenFile>> WriteTestShardFiles(const std::string& step_dir,
                                                                    const TestCheckpointSpec& spec,
                                                                    const TestValueFn& value) {
  std::error_code error;
  std::filesystem::create_directories(step_dir, error);
  if (error) return absl::InternalError(absl::StrCat(step_dir, ": ", error.message()));
  sharding::ShardPlanOptions options;
  options.bucket_elems = spec.bucket_elems;
  absl::StatusOr<sharding::ShardPlan> plan =
      sharding::ShardPlan::Create(spec.tensors, spec.world_size, options);
  if (!plan.ok()) return plan.status();
  std::vector<WrittenFile> files;
  for (int32_t rank = 0; rank < spec.world_size; ++rank) {
    v1::ShardHeader header;
    header.set_job_id(spec.job_id);
    header.set_step(spec.step);
    header.set_generation(spec.generation);
    header.set_world_size(spec.world_size);
    header.set_rank(rank);
    header.set_layout_hash(spec.layout_hash != 0 ? spec.layout_hash : plan->layout_hash());
    header.set_optimizer_step(spec.step);
    header.set_loss_scale(1.0);
    header.set_optimizer(v1::ADAMW);
    header.set_param_dtype(v1::FLOAT32);
    for (const TestState& state : spec.states) {
      header.add_states(state.name);
      if (state.name == kParamState) header.set_param_dtype(state.dtype);
    }
    for (const sharding::TensorSpec& tensor : plan->tensors()) {
      v1::CheckpointTensor* entry = header.add_tensors();
      entry->set_name(tensor.name);
      for (int64_t dim : tensor.shape) entry->add_shape(dim);
    }
    absl::StatusOr<sharding::RankView> view = plan->ViewForRank(rank);
    if (!view.ok()) return view.status();
    std::vector<FragmentSpec> fragments;
    for (const TestState& state : spec.states) {
      for (const sharding::TensorFragment& owned : view->fragments()) {
        FragmentSpec fragment;
        fragment.state = state.name;
        fragment.tensor = plan->tensors()[owned.tensor].name;
        fragment.begin = owned.tensor_begin;
        fragment.end = owned.tensor_end;
        fragment.dtype = state.dtype;
        fragments.push_back(std::move(fragment));
      }
    }
    const std::vector<FragmentSpec> specs = fragments;
    absl::StatusOr<WrittenFile> written = WriteShardFile(
        absl::StrCat(step_dir, "/", ShardFileName(rank, spec.world_size)), std::move(header),
        std::move(fragments), [&](size_t index, const ByteSink& sink) -> absl::Status {
          const FragmentSpec& fragment = specs[index];
          const int size = FragmentDTypeSize(fragment.dtype);
          // A tile at a time, as a worker's writer converts out of its staging buffer.
          constexpr int64_t kTile = 1 << 16;
          std::string bytes;
          for (int64_t begin = fragment.begin; begin < fragment.end; begin += kTile) {
            const int64_t end = std::min(fragment.end, begin + kTile);
            bytes.resize(static_cast<size_t>((end - begin) * size));
            for (int64_t i = begin; i < end; ++i) {
              StoreValue(fragment.dtype, value(fragment.state, fragment.tensor, i),
                         bytes.data() + (i - begin) * size);
            }
            absl::Status sunk = sink(bytes.data(), bytes.size());
            if (!sunk.ok()) return sunk;
          }
          return absl::OkStatus();
        });
    if (!written.ok()) return written.status();
    files.push_back(*std::move(written));
  }
  return files;
}

// The manifest a coordinator writes for `files` (rank order).
inline v1::CheckpointManifest TestManifest(const TestCheckpointSpec& spec, uint64_t layout_hash,
                                           const std::vector<WrittenFile>& files) {
  v1::CheckpointManifest manifest;
  manifest.set_job_id(spec.job_id);
  manifest.set_step(spec.step);
  manifest.set_generation(spec.generation);
  manifest.set_world_size(spec.world_size);
  manifest.set_layout_hash(layout_hash);
  manifest.mutable_commit_time()->set_seconds(1700000000 + spec.step);
  for (size_t rank = 0; rank < files.size(); ++rank) {
    v1::CheckpointFile* file = manifest.add_files();
    file->set_rank(static_cast<int32_t>(rank));
    file->set_path(ShardFileName(static_cast<int32_t>(rank), spec.world_size));
    file->set_bytes(static_cast<int64_t>(files[rank].bytes));
    file->set_crc32c(files[rank].crc32c);
  }
  return manifest;
}

// Writes the shard files into <job_dir>/step-<step> and commits them with a manifest: a
// checkpoint as ListCheckpoints lists it.
inline absl::StatusOr<CommittedCheckpoint> WriteTestCheckpoint(const std::string& job_dir,
                                                               const TestCheckpointSpec& spec,
                                                               const TestValueFn& value) {
  const std::string step_dir = StepDir(job_dir, spec.step);
  absl::StatusOr<std::vector<WrittenFile>> files = WriteTestShardFiles(step_dir, spec, value);
  if (!files.ok()) return files.status();
  uint64_t layout_hash = spec.layout_hash;
  if (layout_hash == 0) {
    sharding::ShardPlanOptions options;
    options.bucket_elems = spec.bucket_elems;
    layout_hash =
        sharding::ShardPlan::Create(spec.tensors, spec.world_size, options)->layout_hash();
  }
  // The job directory is the test's own: trusted as a root.
  absl::StatusOr<Directory> root = Directory::OpenRoot(job_dir);
  if (!root.ok()) return root.status();
  absl::Status committed = WriteManifest(*root, "", TestManifest(spec, layout_hash, *files));
  if (!committed.ok()) return committed;
  return OpenCommittedCheckpoint(*root, "", spec.step, spec.job_id);
}

}  // namespace zeroshard::checkpoint::testing

#endif  // ZEROSHARD_CHECKPOINT_TEST_CHECKPOINTS_H_
