// The ZeRO paper's model-state bytes per rank (Rajbhandari et al. 2020, section 5): what the
// engine's measured memory is compared with. Pure arithmetic; computed once here and served with
// the shard plan (ShardPlan.model_state_formula), so every consumer shows the same number.
#ifndef ZEROSHARD_SHARDING_ZERO_FORMULA_H_
#define ZEROSHARD_SHARDING_ZERO_FORMULA_H_

#include <cstdint>

namespace zeroshard::sharding {

// What each mode shards over the W ranks: kDdp nothing; kZero1 the optimizer state and the fp32
// master copies; kZero2 the gradients too; kZero3 the parameters too.
enum class ZeroStage { kDdp, kZero1, kZero2, kZero3 };

struct ZeroFormulaInputs {
  ZeroStage stage = ZeroStage::kDdp;
  int64_t world_size = 1;  // W (values below 1 count as 1)
  int64_t parameters = 0;  // Ψ: the model's elements, without padding
  int param_bytes = 4;     // bytes per element of the parameter copy
  int grad_bytes = 4;      // bytes per element of the gradients
  // K: fp32 optimizer-state arrays per parameter (Adam 2, AMSGrad 3, SGD with momentum 1, ...).
  int optimizer_state_copies = 0;
};

// Bytes per rank by category, as exact quotients (a fraction where W does not divide).
struct ModelStateBytes {
  double params = 0;           // Ψ·param_bytes, over W from zero3
  double grads = 0;            // Ψ·grad_bytes, over W from zero2
  double master = 0;           // Ψ·4 when the parameters are not fp32 (else 0), over W from zero1
  double optimizer_state = 0;  // K·Ψ·4, over W from zero1
  double total() const { return params + grads + master + optimizer_state; }
};

ModelStateBytes ZeroFormulaBytes(const ZeroFormulaInputs& inputs);

}  // namespace zeroshard::sharding

#endif  // ZEROSHARD_SHARDING_ZERO_FORMULA_H_
