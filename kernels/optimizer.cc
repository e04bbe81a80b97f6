// Validation of optimizer calls and the per-step constants, shared by the CPU and CUDA paths.
#include "kernels/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace zeroshard::kernels {
namespace {

bool IsFiniteNonNegative(double value) { return std::isfinite(value) && value >= 0.0; }

bool IsBeta(double value) { return value >= 0.0 && value < 1.0; }

absl::Status ValidateConfig(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kLion:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("config.kind: unknown optimizer ", static_cast<int>(config.kind)));
  }
  if (!IsFiniteNonNegative(config.lr)) {
    return absl::InvalidArgumentError(absl::StrCat("config.lr must be >= 0, got ", config.lr));
  }
  if (!IsFiniteNonNegative(config.eps)) {
    return absl::InvalidArgumentError(absl::StrCat("config.eps must be >= 0, got ", config.eps));
  }
  switch (config.kind) {
    case OptimizerKind::kSgd:
      if (!IsFiniteNonNegative(config.momentum)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.momentum must be >= 0, got ", config.momentum));
      }
      if (!std::isfinite(config.dampening)) {
        return absl::InvalidArgumentError("config.dampening must be finite");
      }
      if (config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0)) {
        return absl::InvalidArgumentError(
            "config.nesterov requires config.momentum > 0 and config.dampening == 0");
      }
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kLion:
      if (!IsBeta(config.beta1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.beta1 must be in [0, 1), got ", config.beta1));
      }
      if (!IsBeta(config.beta2)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.beta2 must be in [0, 1), got ", config.beta2));
      }
      break;
    case OptimizerKind::kAdagrad:
      if (!IsFiniteNonNegative(config.lr_decay)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.lr_decay must be >= 0, got ", config.lr_decay));
      }
      if (!IsFiniteNonNegative(config.initial_accumulator_value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("config.initial_accumulator_value must be >= 0, got ",
                         config.initial_accumulator_value));
      }
      break;
  }
  return absl::OkStatus();
}

}  // namespace

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kLion:
      return "lion";
  }
  return "invalid";
}

const char* StateArrayName(const OptimizerConfig& config, int index) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return "momentum_buffer";
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      static constexpr const char* kNames[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
      return index >= 0 && index < 3 ? kNames[index] : "invalid";
    }
    case OptimizerKind::kAdagrad:
      return "sum";
    case OptimizerKind::kLion:
      return "exp_avg";
  }
  return "invalid";
}

int StateArraysPerParam(const OptimizerConfig& config) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return config.momentum != 0.0 ? 1 : 0;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return config.amsgrad ? 3 : 2;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kLion:
      return 1;
  }
  return 0;
}

OptimizerConfig WithGroup(const OptimizerConfig& config, const GroupHyperparameters& group) {
  OptimizerConfig with = config;
  with.lr = group.lr;
  with.beta1 = group.beta1;
  with.beta2 = group.beta2;
  with.eps = group.eps;
  with.momentum = group.momentum;
  with.dampening = group.dampening;
  return with;
}

absl::Status ValidateGroup(const OptimizerConfig& config, const GroupHyperparameters& group) {
  const OptimizerConfig with = WithGroup(config, group);
  if (absl::Status valid = ValidateConfig(with); !valid.ok()) {
    // "config.beta1 must be ..." -> "beta1 must be ...": the caller names the group.
    return absl::InvalidArgumentError(absl::StripPrefix(valid.message(), "config."));
  }
  if (!IsFiniteNonNegative(group.weight_decay)) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_decay must be >= 0, got ", group.weight_decay));
  }
  if (StateArraysPerParam(with) != StateArraysPerParam(config)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum ", group.momentum, ": the job's optimizer state was made ",
                     config.momentum == 0.0 ? "without" : "with", " a momentum buffer (momentum ",
                     config.momentum, "); momentum may change, but not to or from 0"));
  }
  return absl::OkStatus();
}

absl::Status ValidateUpdate(const OptimizerConfig& config, int64_t step, float grad_scale,
                            absl::Span<const UpdatePiece> pieces) {
  ZS_RETURN_IF_ERROR(ValidateConfig(config));
  if (step < 1) return absl::InvalidArgumentError(absl::StrCat("step must be >= 1, got ", step));
  if (!std::isfinite(grad_scale)) {
    return absl::InvalidArgumentError(absl::StrCat("grad_scale must be finite, got ", grad_scale));
  }
  const int state_arrays = StateArraysPerParam(config);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const UpdatePiece& piece = pieces[i];
    if (piece.length < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pieces[", i, "].length must be >= 0, got ", piece.length));
    }
    if (!numerics::IsValidDType(piece.grad_dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].grad_dtype is invalid"));
    }
    if (!numerics::IsValidDType(piece.param_dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].param_dtype is invalid"));
    }
    if (piece.step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pieces[", i, "].step must be >= 0 (0: the call's), got ", piece.step));
    }
    if (!IsFiniteNonNegative(piece.lr_scale)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pieces[", i, "].lr_scale must be >= 0, got ", piece.lr_scale));
    }
    if (!IsFiniteNonNegative(piece.weight_decay)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pieces[", i, "].weight_decay must be >= 0, got ", piece.weight_decay));
    }
    // Pieces of one group are consecutive: each group is checked once per run of them.
    if (piece.group != nullptr && (i == 0 || pieces[i - 1].group != piece.group)) {
      if (absl::Status valid = ValidateGroup(config, *piece.group); !valid.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].group: ", valid.message()));
      }
    }
    if (piece.length == 0) continue;
    if (piece.grad == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].grad is null"));
    }
    if (piece.master == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].master is null"));
    }
    for (int s = 0; s < state_arrays; ++s) {
      if (piece.state[s] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].state[", s, "] is null; ",
                                                       OptimizerKindName(config.kind), " needs ",
                                                       state_arrays, " state arrays"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateGradPieces(absl::Span<const GradPiece> pieces) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const GradPiece& piece = pieces[i];
    if (piece.length < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("pieces[", i, "].length must be >= 0, got ", piece.length));
    }
    if (!numerics::IsValidDType(piece.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].dtype is invalid"));
    }
    if (piece.length > 0 && piece.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pieces[", i, "].data is null"));
    }
  }
  return absl::OkStatus();
}

ElementScalars MakeElementScalars(const OptimizerConfig& base, int64_t call_step, float grad_scale,
                                  const UpdatePiece& piece) {
  const int64_t step = piece.step > 0 ? piece.step : call_step;
  const OptimizerConfig config = piece.group != nullptr ? WithGroup(base, *piece.group) : base;
  const double lr = piece.group != nullptr ? piece.group->lr : config.lr * piece.lr_scale;
  const double weight_decay =
      piece.group != nullptr ? piece.group->weight_decay : piece.weight_decay;
  const double step_d = static_cast<double>(step);
  ElementScalars s;
  s.grad_scale = grad_scale;
  s.lr = static_cast<float>(lr);
  s.weight_decay = static_cast<float>(weight_decay);
  s.weight_decay_on = weight_decay != 0.0;
  s.first_step = step == 1;
  s.maximize = config.maximize;
  s.eps = static_cast<float>(config.eps);
  switch (config.kind) {
    case OptimizerKind::kSgd:
      s.momentum = static_cast<float>(config.momentum);
      s.one_minus_dampening = static_cast<float>(1.0 - config.dampening);
      s.nesterov = config.nesterov;
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      s.beta1 = static_cast<float>(config.beta1);
      s.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
      s.beta2 = static_cast<float>(config.beta2);
      s.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
      const double bias_correction1 = 1.0 - std::pow(config.beta1, step_d);
      const double bias_correction2 = 1.0 - std::pow(config.beta2, step_d);
      s.neg_step_size = static_cast<float>(-(lr / bias_correction1));
      s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
      s.amsgrad = config.amsgrad;
      if (config.kind == OptimizerKind::kAdamW) {
        s.decay_factor = static_cast<float>(1.0 - lr * weight_decay);
        s.weight_decay_on = false;  // decoupled: applied through decay_factor
      }
      break;
    }
    case OptimizerKind::kAdagrad:
      s.neg_step_size = static_cast<float>(-(lr / (1.0 + (step_d - 1.0) * config.lr_decay)));
      s.initial_accumulator = static_cast<float>(config.initial_accumulator_value);
      break;
    case OptimizerKind::kLion:
      s.beta1 = static_cast<float>(config.beta1);
      s.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
      s.beta2 = static_cast<float>(config.beta2);
      s.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
      break;
  }
  return s;
}

}  // namespace zeroshard::kernels
