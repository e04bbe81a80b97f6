// Test support: checkpoints of a small MLP-shaped model as the shard planner splits it, with
// bytes that depend only on (state, tensor, element), whichever rank wrote them.
#ifndef ZEROSHARD_CHECKPOINT_TEST_SHARDS_H_
#define ZEROSHARD_CHECKPOINT_TEST_SHARDS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_file.h"
#include "sharding/shard_planner.h"
#include "sharding/tensor_spec.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint::testing {

// nn.Sequential(Linear(40, 64), ReLU, Linear(64, 10)): 3,274 elements, several 1024-element
// buckets, so a rank's fragments cut tensors at places that change with the world size.
inline std::vector<sharding::TensorSpec> TestModelTensors() {
  std::vector<sharding::TensorSpec> tensors;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    sharding::TensorSpec spec;
    spec.name = std::move(name);
    spec.num_elements = 1;
    for (int64_t dim : shape) spec.num_elements *= dim;
    spec.shape = std::move(shape);
    tensors.push_back(std::move(spec));
  };
  add("0.weight", {64, 40});
  add("0.bias", {64});
  add("2.weight", {10, 64});
  add("2.bias", {10});
  return tensors;
}

inline sharding::ShardPlan TestPlan(int64_t world_size) {
  sharding::ShardPlanOptions options;
  options.bucket_elems = sharding::kMinBucketElems;
  return *sharding::ShardPlan::Create(TestModelTensors(), world_size, options);
}

// bf16 params with fp32 masters and AdamW's two moments.
inline std::vector<std::string> TestStates() {
  return {"param", "master", "exp_avg", "exp_avg_sq"};
}

inline v1::DType TestDType(absl::string_view state) {
  return state == kParamState ? v1::BFLOAT16 : v1::FLOAT32;
}

inline v1::ShardHeader TestHeader(const sharding::ShardPlan& plan, int32_t rank, int64_t step) {
  v1::ShardHeader header;
  header.set_job_id("job-000007");
  header.set_step(step);
  header.set_generation(3);
  header.set_world_size(static_cast<int32_t>(plan.world_size()));
  header.set_rank(rank);
  header.set_layout_hash(plan.layout_hash());
  header.set_optimizer_step(step - 2);
  header.set_loss_scale(32768.0);
  header.set_loss_scale_good_steps(17);
  header.set_optimizer(v1::ADAMW);
  header.set_param_dtype(v1::BFLOAT16);
  for (const sharding::TensorSpec& spec : plan.tensors()) {
    v1::CheckpointTensor* tensor = header.add_tensors();
    tensor->set_name(spec.name);
    for (int64_t dim : spec.shape) tensor->add_shape(dim);
  }
  for (const std::string& state : TestStates()) header.add_states(state);
  return header;
}

// The bytes of elements [begin, end) of (state, tensor): each element's bits are a hash of
// (state, tensor, index), so any element read back can be checked wherever it came from.
inline std::string ElementBytes(absl::string_view state, absl::string_view tensor, v1::DType dtype,
                                int64_t begin, int64_t end) {
  const int size = FragmentDTypeSize(dtype);
  uint64_t seed = 1469598103934665603ull;
  for (char c : absl::StrCat(state, "/", tensor))
    seed = (seed ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  std::string bytes;
  bytes.reserve(static_cast<size_t>((end - begin) * size));
  for (int64_t i = begin; i < end; ++i) {
    uint64_t h = (seed ^ static_cast<uint64_t>(i)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    for (int b = 0; b < size; ++b) bytes.push_back(static_cast<char>((h >> (8 * b)) & 0xFF));
  }
  return bytes;
}

// What one rank owns under `plan`, for every test state, with its bytes.
struct TestShard {
  v1::ShardHeader header;
  std::vector<FragmentSpec> specs;
  std::vector<std::string> bytes;  // bytes[i] holds specs[i]'s elements

  std::vector<FragmentBytes> fragments() const {
    std::vector<FragmentBytes> result;
    for (size_t i = 0; i < specs.size(); ++i) result.push_back({specs[i], bytes[i]});
    return result;
  }
  // Every fragment's bytes back to back, in declaration order.
  std::string data() const {
    std::string all;
    for (const std::string& b : bytes) all += b;
    return all;
  }
};

inline TestShard MakeTestShard(const sharding::ShardPlan& plan, int32_t rank, int64_t step) {
  TestShard shard;
  shard.header = TestHeader(plan, rank, step);
  const sharding::RankView view = *plan.ViewForRank(rank);
  for (const std::string& state : TestStates()) {
    for (const sharding::TensorFragment& fragment : view.fragments()) {
      FragmentSpec spec;
      spec.state = state;
      spec.tensor = plan.tensors()[fragment.tensor].name;
      spec.begin = fragment.tensor_begin;
      spec.end = fragment.tensor_end;
      spec.dtype = TestDType(state);
      shard.bytes.push_back(
          ElementBytes(spec.state, spec.tensor, spec.dtype, spec.begin, spec.end));
      shard.specs.push_back(std::move(spec));
    }
  }
  return shard;
}

}  // namespace zeroshard::checkpoint::testing

#endif  // ZEROSHARD_CHECKPOINT_TEST_SHARDS_H_
