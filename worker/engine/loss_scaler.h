// The engine's loss scale: torch.cuda.amp.GradScaler's rule for backing the scale off on overflow
// and growing it after a run of good steps, and the check of its configuration.
#ifndef ZEROSHARD_WORKER_ENGINE_LOSS_SCALER_H_
#define ZEROSHARD_WORKER_ENGINE_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"

namespace zeroshard::engine {

// Loss scaling as torch.cuda.amp.GradScaler does it: gradients are stored multiplied by the
// scale; a step whose gradients hold a NaN or Inf is skipped and (dynamic) multiplies the scale
// by backoff_factor; after growth_interval consecutive good steps it multiplies by growth_factor.
struct LossScaleConfig {
  double initial_scale = 1.0;  // > 0; 1 with dynamic == false means no loss scaling
  bool dynamic = false;
  int64_t growth_interval = 2000;  // >= 1
  double backoff_factor = 0.5;     // in (0, 1)
  double growth_factor = 2.0;      // > 1
};

// InvalidArgument naming the field ("loss_scale.<field>") for a config LossScaler refuses.
absl::Status ValidateLossScaleConfig(const LossScaleConfig& config);

// The current scale and the good steps counted towards its next growth.
//
// Thread contract: not thread-safe; its owner (the engine's owner thread) calls everything.
class LossScaler {
 public:
  // REQUIRES: ValidateLossScaleConfig(config).ok().
  explicit LossScaler(const LossScaleConfig& config)
      : config_(config), scale_(config.initial_scale) {}

  // The scale the current step's gradients carry.
  double scale() const { return scale_; }
  // Consecutive non-skipped steps since the scale last changed (0 without dynamic scaling).
  int64_t good_steps() const { return good_steps_; }

  // Applies the outcome of one step: `overflow` (the step was skipped) backs off, a run of
  // growth_interval good steps grows. Nothing changes without dynamic scaling.
  void Update(bool overflow);
  // Sets the scale and the good-step count a checkpoint saved.
  void Restore(double scale, int64_t good_steps);

 private:
  const LossScaleConfig config_;
  double scale_;
  // Invariant: < config_.growth_interval after every Update().
  int64_t good_steps_ = 0;
};

}  // namespace zeroshard::engine

#endif  // ZEROSHARD_WORKER_ENGINE_LOSS_SCALER_H_
