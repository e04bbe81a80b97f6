// The engine's loss scale (loss_scaler.h).
#include "worker/engine/loss_scaler.h"

#include <cmath>

namespace zeroshard::engine {

absl::Status ValidateLossScaleConfig(const LossScaleConfig& config) {
  if (!(config.initial_scale > 0.0) || !std::isfinite(config.initial_scale)) {
    return absl::InvalidArgumentError("loss_scale.initial_scale: must be finite and > 0");
  }
  if (!config.dynamic) return absl::OkStatus();
  if (config.growth_interval < 1) {
    return absl::InvalidArgumentError("loss_scale.growth_interval: must be >= 1");
  }
  if (!(config.backoff_factor > 0.0 && config.backoff_factor < 1.0)) {
    return absl::InvalidArgumentError("loss_scale.backoff_factor: must be in (0, 1)");
  }
  if (!(config.growth_factor > 1.0) || !std::isfinite(config.growth_factor)) {
    return absl::InvalidArgumentError("loss_scale.growth_factor: must be finite and > 1");
  }
  return absl::OkStatus();
}

void LossScaler::Update(bool overflow) {
  if (!config_.dynamic) return;
  if (overflow) {
    scale_ *= config_.backoff_factor;
    good_steps_ = 0;
    return;
  }
  if (++good_steps_ == config_.growth_interval) {
    scale_ *= config_.growth_factor;
    good_steps_ = 0;
  }
}

void LossScaler::Restore(double scale, int64_t good_steps) {
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace zeroshard::engine
