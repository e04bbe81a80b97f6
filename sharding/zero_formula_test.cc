// The ZeRO formula per mode: what each stage divides by W, master copies for non-fp32
// parameters, and exact quotients where W does not divide.
#include "sharding/zero_formula.h"

#include "gtest/gtest.h"

namespace zeroshard::sharding {
namespace {

ZeroFormulaInputs AdamFp32(ZeroStage stage, int64_t world_size) {
  ZeroFormulaInputs inputs;
  inputs.stage = stage;
  inputs.world_size = world_size;
  inputs.parameters = 1000;
  inputs.optimizer_state_copies = 2;
  return inputs;
}

TEST(ZeroFormulaTest, DdpKeepsEverythingWhole) {
  const ModelStateBytes bytes = ZeroFormulaBytes(AdamFp32(ZeroStage::kDdp, 4));
  EXPECT_EQ(bytes.params, 4000);
  EXPECT_EQ(bytes.grads, 4000);
  EXPECT_EQ(bytes.master, 0);
  EXPECT_EQ(bytes.optimizer_state, 8000);
  EXPECT_EQ(bytes.total(), 16000);
}

TEST(ZeroFormulaTest, EachStageShardsOneMoreCategory) {
  const ModelStateBytes zero1 = ZeroFormulaBytes(AdamFp32(ZeroStage::kZero1, 4));
  EXPECT_EQ(zero1.params, 4000);
  EXPECT_EQ(zero1.grads, 4000);
  EXPECT_EQ(zero1.optimizer_state, 2000);
  const ModelStateBytes zero2 = ZeroFormulaBytes(AdamFp32(ZeroStage::kZero2, 4));
  EXPECT_EQ(zero2.params, 4000);
  EXPECT_EQ(zero2.grads, 1000);
  EXPECT_EQ(zero2.optimizer_state, 2000);
  const ModelStateBytes zero3 = ZeroFormulaBytes(AdamFp32(ZeroStage::kZero3, 4));
  EXPECT_EQ(zero3.params, 1000);
  EXPECT_EQ(zero3.grads, 1000);
  EXPECT_EQ(zero3.optimizer_state, 2000);
}

TEST(ZeroFormulaTest, HalfPrecisionParametersCarryShardedMasterCopies) {
  ZeroFormulaInputs inputs = AdamFp32(ZeroStage::kZero1, 4);
  inputs.param_bytes = 2;
  inputs.grad_bytes = 2;
  const ModelStateBytes bytes = ZeroFormulaBytes(inputs);
  EXPECT_EQ(bytes.params, 2000);
  EXPECT_EQ(bytes.grads, 2000);
  EXPECT_EQ(bytes.master, 1000);
  inputs.stage = ZeroStage::kDdp;
  EXPECT_EQ(ZeroFormulaBytes(inputs).master, 4000);
}

TEST(ZeroFormulaTest, QuotientsAreExactWhereWDoesNotDivide) {
  ZeroFormulaInputs inputs = AdamFp32(ZeroStage::kZero2, 3);
  inputs.parameters = 1001;
  const ModelStateBytes bytes = ZeroFormulaBytes(inputs);
  EXPECT_EQ(bytes.grads, 1001.0 * 4 / 3);
  EXPECT_EQ(bytes.optimizer_state, 2.0 * 1001 * 4 / 3);
}

TEST(ZeroFormulaTest, WorldSizeBelowOneCountsAsOne) {
  EXPECT_EQ(ZeroFormulaBytes(AdamFp32(ZeroStage::kZero1, 0)).optimizer_state, 8000);
}

}  // namespace
}  // namespace zeroshard::sharding
