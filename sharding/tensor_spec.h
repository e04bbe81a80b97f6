// TensorSpec: one parameter tensor of a model as the shard planner sees it (name, shape,
// element count and the per-tensor optimizer options that fragments carry).
#ifndef ZEROSHARD_SHARDING_TENSOR_SPEC_H_
#define ZEROSHARD_SHARDING_TENSOR_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

namespace zeroshard::sharding {

// A plain value. Invariant (checked by the planner): num_elements == product of shape,
// num_elements >= 1. Plans count elements, so they do not depend on the parameter dtype.
struct TensorSpec {
  std::string name;            // e.g. "2.weight" (torch naming); unique within a model
  std::vector<int64_t> shape;  // e.g. {out_features, in_features}
  int64_t num_elements = 0;
  // The weight decay coefficient of this tensor's parameter group (>= 0; 0: never decayed).
  double weight_decay = 0.0;
  float lr_scale = 1.0f;  // multiplies the job's learning rate (the group's lr scale)

  friend bool operator==(const TensorSpec& a, const TensorSpec& b) {
    return a.name == b.name && a.shape == b.shape && a.num_elements == b.num_elements &&
           a.weight_decay == b.weight_decay && a.lr_scale == b.lr_scale;
  }
  friend bool operator!=(const TensorSpec& a, const TensorSpec& b) { return !(a == b); }
};

}  // namespace zeroshard::sharding

#endif  // ZEROSHARD_SHARDING_TENSOR_SPEC_H_
