// EngineConfigForJob: every PrecisionSpec field reaches the engine's configuration, the JobSpec
// defaults become the engine's loss scaling, zero3 takes its gather pool, and unsupported values
// are refused by field.
#include "worker/daemon/engine_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "jobspec/job_spec_defaults.h"

namespace zeroshard::worker {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Fp16Spec() {
  v1::JobSpec spec;
  spec.set_mode(v1::ZERO2);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.mutable_precision()->set_param_dtype(v1::FLOAT16);
  return spec;
}

// Values that differ from every default, so a field that is not passed on shows.
TEST(EngineConfigTest, EveryPrecisionFieldReachesTheEngine) {
  v1::JobSpec spec = Fp16Spec();
  v1::PrecisionSpec& precision = *spec.mutable_precision();
  precision.set_param_dtype(v1::BFLOAT16);
  precision.set_grad_dtype(v1::FLOAT16);
  precision.set_master_dtype(v1::FLOAT32);
  precision.set_reduce_dtype(v1::BFLOAT16);
  precision.set_initial_loss_scale(1024.0);
  precision.set_dynamic_loss_scale(true);
  precision.set_loss_scale_growth_interval(7);
  precision.set_loss_scale_backoff_factor(0.25);
  precision.set_loss_scale_growth_factor(3.0);
  spec.set_clip_grad_norm(0.5);
  const absl::StatusOr<engine::EngineConfig> config =
      EngineConfigForJob(jobspec::WithDefaults(spec), /*threads=*/3);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mode, engine::EngineMode::kZero2);
  EXPECT_EQ(config->optimizer.kind, kernels::OptimizerKind::kAdamW);
  EXPECT_EQ(config->param_dtype, numerics::DType::kBFloat16);
  EXPECT_EQ(config->grad_dtype, numerics::DType::kFloat16);
  EXPECT_EQ(config->reduce_dtype, numerics::DType::kBFloat16);
  EXPECT_EQ(config->loss_scale.initial_scale, 1024.0);
  EXPECT_TRUE(config->loss_scale.dynamic);
  EXPECT_EQ(config->loss_scale.growth_interval, 7);
  EXPECT_EQ(config->loss_scale.backoff_factor, 0.25);
  EXPECT_EQ(config->loss_scale.growth_factor, 3.0);
  EXPECT_EQ(config->clip_grad_norm, 0.5);
  EXPECT_EQ(config->threads, 3);
}

// An fp16 job that says nothing about loss scaling gets torch's GradScaler defaults through
// the JobSpec defaults: 2^16, dynamic, growth every 2000 steps, backoff 0.5, growth 2.
TEST(EngineConfigTest, Fp16DefaultsAreDynamicLossScaling) {
  const absl::StatusOr<engine::EngineConfig> config =
      EngineConfigForJob(jobspec::WithDefaults(Fp16Spec()), 1);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->param_dtype, numerics::DType::kFloat16);
  EXPECT_EQ(config->grad_dtype, numerics::DType::kFloat16);
  EXPECT_EQ(config->reduce_dtype, numerics::DType::kFloat32);
  EXPECT_EQ(config->loss_scale.initial_scale, 65536.0);
  EXPECT_TRUE(config->loss_scale.dynamic);
  EXPECT_EQ(config->loss_scale.growth_interval, 2000);
  EXPECT_EQ(config->loss_scale.backoff_factor, 0.5);
  EXPECT_EQ(config->loss_scale.growth_factor, 2.0);
}

// Fails before the fix: ZERO3 was refused ("mode: ZERO3 is not supported by this worker").
TEST(EngineConfigTest, Zero3AndItsGatherPoolReachTheEngine) {
  v1::JobSpec spec = Fp16Spec();
  spec.set_mode(v1::ZERO3);
  spec.set_gather_pool_buckets(6);
  absl::StatusOr<engine::EngineConfig> config = EngineConfigForJob(jobspec::WithDefaults(spec), 1);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mode, engine::EngineMode::kZero3);
  EXPECT_EQ(config->gather_pool_buckets, 6);
  // Unset: 0, the engine's default pool.
  spec.clear_gather_pool_buckets();
  config = EngineConfigForJob(jobspec::WithDefaults(spec), 1);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mode, engine::EngineMode::kZero3);
  EXPECT_EQ(config->gather_pool_buckets, 0);
}

TEST(EngineConfigTest, UnsupportedDtypesAreRefusedByField) {
  struct Case {
    void (*set)(v1::PrecisionSpec&);
    std::string field;
  };
  const Case cases[] = {
      {[](v1::PrecisionSpec& p) { p.set_param_dtype(v1::FLOAT64); }, "precision.param_dtype"},
      {[](v1::PrecisionSpec& p) { p.set_grad_dtype(v1::FLOAT64); }, "precision.grad_dtype"},
      {[](v1::PrecisionSpec& p) { p.set_reduce_dtype(v1::FLOAT64); }, "precision.reduce_dtype"},
      {[](v1::PrecisionSpec& p) { p.set_master_dtype(v1::BFLOAT16); }, "precision.master_dtype"},
  };
  for (const Case& c : cases) {
    v1::JobSpec spec = jobspec::WithDefaults(Fp16Spec());
    c.set(*spec.mutable_precision());
    const absl::StatusOr<engine::EngineConfig> config = EngineConfigForJob(spec, 1);
    ASSERT_FALSE(config.ok()) << c.field;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(c.field));
  }
}

}  // namespace
}  // namespace zeroshard::worker
