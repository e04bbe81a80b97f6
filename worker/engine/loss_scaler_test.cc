// LossScaler: GradScaler's backoff and growth, and the configuration's check.
#include "worker/engine/loss_scaler.h"

#include "gtest/gtest.h"

namespace zeroshard::engine {
namespace {

LossScaleConfig Dynamic() {
  LossScaleConfig config;
  config.initial_scale = 1024.0;
  config.dynamic = true;
  config.growth_interval = 3;
  return config;
}

TEST(LossScalerTest, StaticScaleNeverChanges) {
  LossScaleConfig config;
  config.initial_scale = 8.0;
  LossScaler scaler(config);
  scaler.Update(/*overflow=*/true);
  scaler.Update(/*overflow=*/false);
  EXPECT_EQ(scaler.scale(), 8.0);
  EXPECT_EQ(scaler.good_steps(), 0);
}

TEST(LossScalerTest, OverflowBacksOffAndRestartsTheCount) {
  LossScaler scaler(Dynamic());
  scaler.Update(false);
  scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 512.0);
  EXPECT_EQ(scaler.good_steps(), 0);
}

TEST(LossScalerTest, GrowsAfterGrowthIntervalGoodSteps) {
  LossScaler scaler(Dynamic());
  scaler.Update(false);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 1024.0);
  EXPECT_EQ(scaler.good_steps(), 2);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 2048.0);
  EXPECT_EQ(scaler.good_steps(), 0);
}

TEST(LossScalerTest, RestoreContinuesFromTheSavedCount) {
  LossScaler scaler(Dynamic());
  scaler.Restore(64.0, 2);
  scaler.Update(false);
  EXPECT_EQ(scaler.scale(), 128.0);
}

TEST(LossScalerTest, ValidationNamesTheField) {
  LossScaleConfig config = Dynamic();
  EXPECT_TRUE(ValidateLossScaleConfig(config).ok());
  config.initial_scale = 0.0;
  EXPECT_NE(ValidateLossScaleConfig(config).message().find("loss_scale.initial_scale"),
            std::string::npos);
  config = Dynamic();
  config.growth_interval = 0;
  EXPECT_NE(ValidateLossScaleConfig(config).message().find("loss_scale.growth_interval"),
            std::string::npos);
  config = Dynamic();
  config.backoff_factor = 1.0;
  EXPECT_NE(ValidateLossScaleConfig(config).message().find("loss_scale.backoff_factor"),
            std::string::npos);
  config = Dynamic();
  config.growth_factor = 1.0;
  EXPECT_NE(ValidateLossScaleConfig(config).message().find("loss_scale.growth_factor"),
            std::string::npos);
  // Static scaling checks only the scale.
  config.dynamic = false;
  EXPECT_TRUE(ValidateLossScaleConfig(config).ok());
}

}  // namespace
}  // namespace zeroshard::engine
