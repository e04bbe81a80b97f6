// The ZeRO formula (zero_formula.h).
#include "sharding/zero_formula.h"

namespace zeroshard::sharding {

ModelStateBytes ZeroFormulaBytes(const ZeroFormulaInputs& inputs) {
  const double w = static_cast<double>(inputs.world_size < 1 ? 1 : inputs.world_size);
  const double psi = static_cast<double>(inputs.parameters);
  const bool shards_state = inputs.stage != ZeroStage::kDdp;
  const bool shards_grads = inputs.stage == ZeroStage::kZero2 || inputs.stage == ZeroStage::kZero3;
  const bool shards_params = inputs.stage == ZeroStage::kZero3;
  ModelStateBytes bytes;
  // Each product is an exact integer (below 2^53), so the one division rounds once.
  bytes.params = (psi * inputs.param_bytes) / (shards_params ? w : 1.0);
  bytes.grads = (psi * inputs.grad_bytes) / (shards_grads ? w : 1.0);
  bytes.master = inputs.param_bytes == 4 ? 0.0 : (psi * 4) / (shards_state ? w : 1.0);
  bytes.optimizer_state = (inputs.optimizer_state_copies * psi * 4) / (shards_state ? w : 1.0);
  return bytes;
}

}  // namespace zeroshard::sharding
