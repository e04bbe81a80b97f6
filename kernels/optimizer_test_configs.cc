// The optimizer configurations shared by the CPU and GPU kernel tests.
#include "kernels/optimizer_test_configs.h"

namespace zeroshard::kernels {

std::vector<NamedOptimizerConfig> OptimizerTestConfigs() {
  std::vector<NamedOptimizerConfig> configs;
  OptimizerConfig c;
  double wd = 0.0;
  c.kind = OptimizerKind::kSgd;
  c.lr = 0.05;
  configs.push_back({"sgd", c, wd});
  c.momentum = 0.9;
  c.dampening = 0.1;
  wd = 0.01;
  configs.push_back({"sgd_momentum_dampening_decay", c, wd});
  c.dampening = 0.0;
  c.nesterov = true;
  c.maximize = true;
  configs.push_back({"sgd_nesterov_maximize", c, wd});

  c = OptimizerConfig();
  wd = 0.0;
  c.kind = OptimizerKind::kAdam;
  c.lr = 0.01;
  wd = 0.01;
  configs.push_back({"adam_l2", c, wd});
  c.amsgrad = true;
  c.maximize = true;
  configs.push_back({"adam_amsgrad_maximize", c, wd});

  c = OptimizerConfig();
  wd = 0.0;
  c.kind = OptimizerKind::kAdamW;
  c.lr = 0.01;
  wd = 0.1;
  configs.push_back({"adamw", c, wd});
  c.amsgrad = true;
  configs.push_back({"adamw_amsgrad", c, wd});

  c = OptimizerConfig();
  wd = 0.0;
  c.kind = OptimizerKind::kAdagrad;
  c.lr = 0.1;
  c.lr_decay = 0.01;
  c.initial_accumulator_value = 0.1;
  c.eps = 1e-10;
  wd = 0.01;
  configs.push_back({"adagrad", c, wd});

  c = OptimizerConfig();
  wd = 0.0;
  c.kind = OptimizerKind::kLion;
  c.lr = 1e-3;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  wd = 0.1;
  configs.push_back({"lion", c, wd});
  return configs;
}

}  // namespace zeroshard::kernels
