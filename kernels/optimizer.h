// The optimizer API shared by the CPU and CUDA implementations: the configuration, the flat
// pieces one call updates, the gradient-statistics request, and their validation.
// Plain C++ (no CUDA headers); the semantics of each optimizer are in docs/kernels.md.
#ifndef ZEROSHARD_KERNELS_OPTIMIZER_H_
#define ZEROSHARD_KERNELS_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/optimizer_kind.h"
#include "kernels/update_math.h"
#include "numerics/dtype.h"

namespace zeroshard::kernels {

const char* OptimizerKindName(OptimizerKind kind);

// Hyperparameters, in double as torch.optim holds them. Defaults are torch.optim.Adam's; set
// the ones your optimizer uses (e.g. Lion's betas 0.9/0.99). Weight decay is per piece
// (UpdatePiece::weight_decay), as parameter groups give it.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdam;
  double lr = 1e-3;
  double beta1 = 0.9;      // Adam, AdamW, Lion
  double beta2 = 0.999;    // Adam, AdamW, Lion
  double eps = 1e-8;       // Adam, AdamW, Adagrad (torch's Adagrad default is 1e-10)
  double momentum = 0.0;   // SGD
  double dampening = 0.0;  // SGD
  bool nesterov = false;   // SGD
  bool amsgrad = false;    // Adam, AdamW
  bool maximize = false;
  double lr_decay = 0.0;                   // Adagrad
  double initial_accumulator_value = 0.0;  // Adagrad
};

// One parameter group's hyperparameters as torch.optim reads them at every step (an attached
// trainer's param_groups, which schedulers and scripts may change between steps). A piece that
// points at one takes lr, weight_decay, betas, eps, momentum and dampening from it instead of
// from the configuration, its own weight_decay and its lr_scale. The flags (nesterov, amsgrad,
// maximize) and Adagrad's lr_decay and initial_accumulator_value stay the configuration's: the
// first two decide the state's shape.
struct GroupHyperparameters {
  double lr = 1e-3;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0.0;
  double dampening = 0.0;
};

// `config` with `group`'s values in place of its own (lr, betas, eps, momentum, dampening).
OptimizerConfig WithGroup(const OptimizerConfig& config, const GroupHyperparameters& group);

// The most fp32 state arrays any optimizer needs per parameter.
inline constexpr int kMaxStateArrays = 3;

// How many fp32 state arrays per parameter `config` needs, in the order UpdatePiece::state
// holds them: SGD: momentum_buffer (none when momentum == 0); Adam/AdamW: exp_avg, exp_avg_sq,
// and max_exp_avg_sq under amsgrad; Adagrad: sum; Lion: exp_avg.
int StateArraysPerParam(const OptimizerConfig& config);

// The name of state array `index` (< StateArraysPerParam(config)) as torch's optimizer state
// dict calls it ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "sum"):
// checkpoints store the arrays under these names.
const char* StateArrayName(const OptimizerConfig& config, int index);

// One flat piece of parameters updated in place. Arrays of one piece have `length` elements and
// must not overlap. The step with step == 1 initialises the state arrays (their contents are
// ignored then), so the caller never has to fill them.
struct UpdatePiece {
  const void* grad = nullptr;  // `length` elements of grad_dtype
  numerics::DType grad_dtype = numerics::DType::kFloat32;
  float* master = nullptr;             // fp32 master weights, updated in place
  float* state[kMaxStateArrays] = {};  // the first StateArraysPerParam(config) are used
  void* param_copy = nullptr;          // optional: receives the updated weights
  numerics::DType param_dtype =
      numerics::DType::kFloat32;  // ... rounded to this type (nearest even)
  int64_t length = 0;
  // This piece's weight decay coefficient (its parameter group's): L2 for SGD, Adam and
  // Adagrad, decoupled for AdamW and Lion (torch.optim's weight_decay). 0: not decayed.
  double weight_decay = 0.0;
  double lr_scale = 1.0;  // this piece's learning rate is lr * lr_scale
  // Not null: the piece's group, whose values replace lr * lr_scale, weight_decay and the
  // configuration's betas, eps, momentum and dampening (GroupHyperparameters). Not owned.
  const GroupHyperparameters* group = nullptr;
  // > 0: this piece's own step count (1-based), replacing the call's step. A tensor that had no
  // gradient in some steps is not updated in them, as torch.optim skips a parameter whose .grad
  // is None, so it counts its own steps: its Adam bias correction, Adagrad lr decay and state
  // initialisation (at its own step 1) follow its count, not the job's.
  int64_t step = 0;
};

// One flat piece of gradients whose statistics are wanted.
struct GradPiece {
  const void* data = nullptr;
  numerics::DType dtype = numerics::DType::kFloat32;
  int64_t length = 0;
};

struct GradStats {
  double sum_squares = 0.0;  // sum of the squared elements, accumulated in fp64
  bool non_finite = false;   // some element is NaN or +-Inf (then sum_squares is too)
};

// One chunk of a conversion that also sums the squares of what it writes (the engine's move of
// reduced gradients, ConvertWithGradStatsCpu): elements [begin, begin + length) of the source
// and of the destination, whose sum of squares is one partial.
struct GradStatsChunk {
  int64_t begin = 0;
  int64_t length = 0;
};

// Checks the configuration, the step (counted from 1, as torch.optim counts) and every piece
// (with its group's values, when it has a group): InvalidArgument naming the field otherwise.
absl::Status ValidateUpdate(const OptimizerConfig& config, int64_t step, float grad_scale,
                            absl::Span<const UpdatePiece> pieces);
absl::Status ValidateGradPieces(absl::Span<const GradPiece> pieces);

// OK when `config` with `group`'s values is a valid configuration; InvalidArgument naming the
// field ("beta1 must be in [0, 1), ...") otherwise, and when the group would change the state's
// shape: SGD's momentum to or from 0 (the momentum buffer exists only with momentum).
absl::Status ValidateGroup(const OptimizerConfig& config, const GroupHyperparameters& group);

// The constants the element arithmetic of `piece` uses at `step` (1-based; the piece's own step
// when it has one).
ElementScalars MakeElementScalars(const OptimizerConfig& config, int64_t step, float grad_scale,
                                  const UpdatePiece& piece);

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_OPTIMIZER_H_
