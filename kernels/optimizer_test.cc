// Tests of the optimizer API's validation, state-array counts and per-step constants.
#include "kernels/optimizer.h"

#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace zeroshard::kernels {
namespace {

OptimizerConfig Config(OptimizerKind kind) {
  OptimizerConfig config;
  config.kind = kind;
  return config;
}

TEST(OptimizerTest, StateArraysPerParam) {
  OptimizerConfig sgd = Config(OptimizerKind::kSgd);
  EXPECT_EQ(StateArraysPerParam(sgd), 0);
  sgd.momentum = 0.9;
  EXPECT_EQ(StateArraysPerParam(sgd), 1);
  OptimizerConfig adam = Config(OptimizerKind::kAdam);
  EXPECT_EQ(StateArraysPerParam(adam), 2);
  adam.amsgrad = true;
  EXPECT_EQ(StateArraysPerParam(adam), 3);
  EXPECT_EQ(StateArraysPerParam(Config(OptimizerKind::kAdamW)), 2);
  EXPECT_EQ(StateArraysPerParam(Config(OptimizerKind::kAdagrad)), 1);
  EXPECT_EQ(StateArraysPerParam(Config(OptimizerKind::kLion)), 1);
}

TEST(OptimizerTest, ValidPiecesPass) {
  std::vector<float> grad(4), master(4), m(4), v(4);
  UpdatePiece piece;
  piece.grad = grad.data();
  piece.master = master.data();
  piece.state[0] = m.data();
  piece.state[1] = v.data();
  piece.length = 4;
  UpdatePiece empty;  // length 0 needs no arrays
  EXPECT_TRUE(ValidateUpdate(Config(OptimizerKind::kAdam), 1, 1.0f, {piece, empty}).ok());
}

TEST(OptimizerTest, RejectsBadInput) {
  std::vector<float> grad(4), master(4), m(4);
  UpdatePiece piece;
  piece.grad = grad.data();
  piece.master = master.data();
  piece.state[0] = m.data();
  piece.length = 4;
  const OptimizerConfig adam = Config(OptimizerKind::kAdam);
  // Adam needs two state arrays.
  absl::Status status = ValidateUpdate(adam, 1, 1.0f, {piece});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("pieces[0].state[1]"), std::string::npos) << status;

  const OptimizerConfig lion = Config(OptimizerKind::kLion);
  EXPECT_TRUE(ValidateUpdate(lion, 1, 1.0f, {piece}).ok());
  EXPECT_EQ(ValidateUpdate(lion, 0, 1.0f, {piece}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateUpdate(lion, 1, INFINITY, {piece}).code(), absl::StatusCode::kInvalidArgument);

  UpdatePiece bad = piece;
  bad.length = -1;
  EXPECT_EQ(ValidateUpdate(lion, 1, 1.0f, {bad}).code(), absl::StatusCode::kInvalidArgument);
  bad = piece;
  bad.grad = nullptr;
  EXPECT_EQ(ValidateUpdate(lion, 1, 1.0f, {bad}).code(), absl::StatusCode::kInvalidArgument);
  bad = piece;
  bad.grad_dtype = static_cast<numerics::DType>(9);
  EXPECT_EQ(ValidateUpdate(lion, 1, 1.0f, {bad}).code(), absl::StatusCode::kInvalidArgument);
  bad = piece;
  bad.lr_scale = -1.0;
  EXPECT_EQ(ValidateUpdate(lion, 1, 1.0f, {bad}).code(), absl::StatusCode::kInvalidArgument);
  bad = piece;
  bad.step = -1;
  status = ValidateUpdate(lion, 1, 1.0f, {bad});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("pieces[0].step"), std::string::npos) << status;

  OptimizerConfig config = Config(OptimizerKind::kSgd);
  config.nesterov = true;
  EXPECT_EQ(ValidateUpdate(config, 1, 1.0f, {piece}).code(), absl::StatusCode::kInvalidArgument);
  config.momentum = 0.9;
  EXPECT_TRUE(ValidateUpdate(config, 1, 1.0f, {piece}).ok());
  config.dampening = 0.1;
  EXPECT_EQ(ValidateUpdate(config, 1, 1.0f, {piece}).code(), absl::StatusCode::kInvalidArgument);

  config = Config(OptimizerKind::kAdamW);
  config.beta2 = 1.0;
  EXPECT_EQ(ValidateUpdate(config, 1, 1.0f, {}).code(), absl::StatusCode::kInvalidArgument);
  config = Config(OptimizerKind::kAdamW);
  config.lr = -1.0;
  EXPECT_EQ(ValidateUpdate(config, 1, 1.0f, {}).code(), absl::StatusCode::kInvalidArgument);
  config = Config(static_cast<OptimizerKind>(42));
  EXPECT_EQ(ValidateUpdate(config, 1, 1.0f, {}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerTest, AdamScalarsFollowTorch) {
  OptimizerConfig config = Config(OptimizerKind::kAdamW);
  config.lr = 0.01;
  UpdatePiece piece;
  piece.weight_decay = 0.1;
  piece.lr_scale = 0.5;
  const ElementScalars s = MakeElementScalars(config, 3, 0.25f, piece);
  EXPECT_EQ(s.grad_scale, 0.25f);
  EXPECT_EQ(s.neg_step_size, static_cast<float>(-(0.005 / (1.0 - std::pow(0.9, 3.0)))));
  EXPECT_EQ(s.bias_correction2_sqrt, static_cast<float>(std::sqrt(1.0 - std::pow(0.999, 3.0))));
  EXPECT_EQ(s.decay_factor, static_cast<float>(1.0 - 0.005 * 0.1));
  EXPECT_EQ(s.one_minus_beta1, static_cast<float>(1.0 - 0.9));
  EXPECT_FALSE(s.first_step);
  piece.weight_decay = 0.0;
  EXPECT_EQ(MakeElementScalars(config, 1, 1.0f, piece).decay_factor, 1.0f);
  EXPECT_TRUE(MakeElementScalars(config, 1, 1.0f, piece).first_step);
}

// Issue 26: a tensor skipped in the steps it had no gradient counts its own steps, as torch.optim
// keeps a step per parameter: its piece's step replaces the call's in the bias correction and
// the state's initialisation.
TEST(OptimizerTest, APiecesOwnStepReplacesTheCalls) {
  OptimizerConfig config = Config(OptimizerKind::kAdam);
  config.lr = 0.01;
  UpdatePiece own;
  own.step = 1;
  const ElementScalars first = MakeElementScalars(config, 7, 1.0f, own);
  EXPECT_TRUE(first.first_step);
  EXPECT_EQ(first.neg_step_size, MakeElementScalars(config, 1, 1.0f, UpdatePiece()).neg_step_size);
  own.step = 3;
  const ElementScalars third = MakeElementScalars(config, 7, 1.0f, own);
  EXPECT_FALSE(third.first_step);
  EXPECT_EQ(third.neg_step_size, static_cast<float>(-(0.01 / (1.0 - std::pow(0.9, 3.0)))));
  EXPECT_EQ(third.bias_correction2_sqrt, static_cast<float>(std::sqrt(1.0 - std::pow(0.999, 3.0))));
}

TEST(OptimizerTest, AdagradLearningRateDecays) {
  OptimizerConfig config = Config(OptimizerKind::kAdagrad);
  config.lr = 0.1;
  config.lr_decay = 0.5;
  const ElementScalars s = MakeElementScalars(config, 5, 1.0f, UpdatePiece());
  EXPECT_EQ(s.neg_step_size, static_cast<float>(-(0.1 / (1.0 + 4 * 0.5))));
}

// Issue 26: a piece of a group takes the group's values (read at every step, as torch.optim
// does), not the configuration's: the same scalars as a configuration holding those values.
TEST(OptimizerTest, AGroupsValuesReplaceTheConfigurations) {
  OptimizerConfig config = Config(OptimizerKind::kAdamW);
  config.lr = 0.01;
  GroupHyperparameters group;
  group.lr = 0.003;
  group.weight_decay = 0.2;
  group.beta1 = 0.85;
  group.beta2 = 0.99;
  group.eps = 1e-6;
  UpdatePiece piece;
  piece.weight_decay = 0.1;  // replaced
  piece.lr_scale = 0.5;      // replaced
  piece.group = &group;
  OptimizerConfig same = config;
  same.lr = group.lr;
  same.beta1 = group.beta1;
  same.beta2 = group.beta2;
  same.eps = group.eps;
  UpdatePiece plain;
  plain.weight_decay = group.weight_decay;
  const ElementScalars a = MakeElementScalars(config, 4, 1.0f, piece);
  const ElementScalars b = MakeElementScalars(same, 4, 1.0f, plain);
  EXPECT_EQ(a.neg_step_size, b.neg_step_size);
  EXPECT_EQ(a.bias_correction2_sqrt, b.bias_correction2_sqrt);
  EXPECT_EQ(a.decay_factor, b.decay_factor);
  EXPECT_EQ(a.beta1, b.beta1);
  EXPECT_EQ(a.one_minus_beta2, b.one_minus_beta2);
  EXPECT_EQ(a.eps, b.eps);
  EXPECT_EQ(a.decay_factor, static_cast<float>(1.0 - 0.003 * 0.2));
  EXPECT_TRUE(ValidateUpdate(config, 4, 1.0f, {&piece, 1}).ok());
  group.beta2 = 1.0;
  const absl::Status bad = ValidateUpdate(config, 4, 1.0f, {&piece, 1});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "pieces[0].group: beta2 must be in [0, 1), got 1");
}

TEST(OptimizerTest, AGroupMayNotAddOrDropTheMomentumBuffer) {
  OptimizerConfig sgd = Config(OptimizerKind::kSgd);
  sgd.momentum = 0.9;
  GroupHyperparameters group;
  group.momentum = 0.5;
  EXPECT_TRUE(ValidateGroup(sgd, group).ok());
  group.momentum = 0.0;
  const absl::Status dropped = ValidateGroup(sgd, group);
  EXPECT_EQ(dropped.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(dropped.message(), "not to or from 0")) << dropped;
  sgd.momentum = 0.0;
  group.momentum = 0.9;
  EXPECT_FALSE(ValidateGroup(sgd, group).ok());
  group.momentum = 0.0;
  group.weight_decay = -1;
  EXPECT_TRUE(absl::StrContains(ValidateGroup(sgd, group).message(), "weight_decay"));
}

}  // namespace
}  // namespace zeroshard::kernels
