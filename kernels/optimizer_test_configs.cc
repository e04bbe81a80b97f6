// The optimizer configurations shared by the CPU and GPU kernel tests.
#include "kernels/optimizer_test_configs.h"

namespace zeroshard::kernels {

std::vector<NamedOptimizerConfig> OptimizerTestConfigs() {
  std::vector<NamedOptimizerConfig> configs;
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.05;
  configs.push_back({"sgd", c});
  c.momentum = 0.9;
  c.dampening = 0.1;
  c.weight_decay = 0.01;
  configs.push_back({"sgd_momentum_dampening_decay", c});
  c.dampening = 0.0;
  c.nesterov = true;
  c.maximize = true;
  configs.push_back({"sgd_nesterov_maximize", c});

  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdam;
  c.lr = 0.01;
  c.weight_decay = 0.01;
  configs.push_back({"adam_l2", c});
  c.amsgrad = true;
  c.maximize = true;
  configs.push_back({"adam_amsgrad_maximize", c});

  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdamW;
  c.lr = 0.01;
  c.weight_decay = 0.1;
  configs.push_back({"adamw", c});
  c.amsgrad = true;
  configs.push_back({"adamw_amsgrad", c});

  c = OptimizerConfig();
  c.kind = OptimizerKind::kAdagrad;
  c.lr = 0.1;
  c.lr_decay = 0.01;
  c.initial_accumulator_value = 0.1;
  c.eps = 1e-10;
  c.weight_decay = 0.01;
  configs.push_back({"adagrad", c});

  c = OptimizerConfig();
  c.kind = OptimizerKind::kLion;
  c.lr = 1e-3;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  c.weight_decay = 0.1;
  configs.push_back({"lion", c});
  return configs;
}

}  // namespace zeroshard::kernels
