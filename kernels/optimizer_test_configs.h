// The optimizer configurations the kernel tests (CPU and GPU) run: every optimizer, with the
// options that change its arithmetic (momentum, dampening, nesterov, amsgrad, maximize, decay).
#ifndef ZEROSHARD_KERNELS_OPTIMIZER_TEST_CONFIGS_H_
#define ZEROSHARD_KERNELS_OPTIMIZER_TEST_CONFIGS_H_

#include <string>
#include <vector>

#include "kernels/optimizer.h"

namespace zeroshard::kernels {

struct NamedOptimizerConfig {
  std::string name;  // a test-name-safe label, e.g. "adam_amsgrad_maximize"
  OptimizerConfig config;
  // The weight decay the tests give their decayed pieces (others get 0).
  double weight_decay = 0.0;
};

std::vector<NamedOptimizerConfig> OptimizerTestConfigs();

}  // namespace zeroshard::kernels

#endif  // ZEROSHARD_KERNELS_OPTIMIZER_TEST_CONFIGS_H_
