// ValidateJobSpec and ValidateCheckpointPath: valid specs pass (including every range's edges),
// and a table of malformed specs each fails with INVALID_ARGUMENT naming the field; the same for
// attached specs (workload.attached) and their rules of their own.
#include "jobspec/job_spec_validation.h"

#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "jobspec/job_spec_defaults.h"

namespace zeroshard::jobspec {
namespace {

using ::zeroshard::v1::JobSpec;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A valid spec before defaults: what a client would submit.
JobSpec BaseSpec() {
  JobSpec spec;
  spec.set_name("mlp-seed-1");
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::ADAM);
  spec.set_min_workers(2);
  spec.set_max_workers(4);
  return spec;
}

absl::Status ValidateWithDefaults(const JobSpec& spec) {
  return ValidateJobSpec(WithDefaults(spec, "job-000001"));
}

TEST(ValidateJobSpecTest, BaseSpecIsValid) { EXPECT_TRUE(ValidateWithDefaults(BaseSpec()).ok()); }

TEST(ValidateJobSpecTest, EveryOptimizerKindWithItsDefaultsIsValid) {
  for (v1::OptimizerKind kind : {v1::SGD, v1::ADAM, v1::ADAMW, v1::ADAGRAD, v1::LION}) {
    JobSpec spec = BaseSpec();
    spec.mutable_optimizer()->set_kind(kind);
    EXPECT_TRUE(ValidateWithDefaults(spec).ok()) << v1::OptimizerKind_Name(kind);
  }
}

TEST(ValidateJobSpecTest, EmptyCheckpointDirIsValidBeforeTheJobHasAnId) {
  EXPECT_TRUE(ValidateJobSpec(WithDefaults(BaseSpec())).ok());
}

struct ValidCase {
  std::string name;
  std::function<void(JobSpec&)> mutate;
};

void PrintTo(const ValidCase& c, std::ostream* os) { *os << c.name; }

class ValidSpecTest : public ::testing::TestWithParam<ValidCase> {};

TEST_P(ValidSpecTest, Passes) {
  JobSpec spec = BaseSpec();
  GetParam().mutate(spec);
  const absl::Status status = ValidateWithDefaults(spec);
  EXPECT_TRUE(status.ok()) << status;
}

INSTANTIATE_TEST_SUITE_P(
    RangeEdges, ValidSpecTest,
    ::testing::Values(
        ValidCase{"LayerSizes",
                  [](JobSpec& s) {
                    s.mutable_workload()->clear_preset();
                    s.mutable_workload()->add_layer_sizes(1);
                    s.mutable_workload()->add_layer_sizes(1048576);
                  }},
        ValidCase{"LargePreset", [](JobSpec& s) { s.mutable_workload()->set_preset("large"); }},
        // Fails before the fix: ZERO3 was refused as not implemented.
        ValidCase{"Zero3", [](JobSpec& s) { s.set_mode(v1::ZERO3); }},
        ValidCase{"Zero3GatherPoolEdges",
                  [](JobSpec& s) {
                    s.set_mode(v1::ZERO3);
                    s.set_gather_pool_buckets(65536);
                  }},
        // Fails before the fix (issue 38): resume_from did not exist.
        ValidCase{"ResumeFrom",
                  [](JobSpec& s) {
                    s.mutable_resume_from()->set_job_id("job-000001");
                    s.mutable_resume_from()->set_step(1000000000);
                  }},
        ValidCase{"DatasetSizeEdges",
                  [](JobSpec& s) { s.mutable_workload()->set_dataset_size(int64_t{1} << 40); }},
        ValidCase{"LrTen", [](JobSpec& s) { s.mutable_optimizer()->set_lr(10); }},
        ValidCase{"TinyLr", [](JobSpec& s) { s.mutable_optimizer()->set_lr(1e-300); }},
        ValidCase{"BetasZero",
                  [](JobSpec& s) {
                    s.mutable_optimizer()->set_beta1(0);
                    s.mutable_optimizer()->set_beta2(0);
                  }},
        ValidCase{"EpsEdges", [](JobSpec& s) { s.mutable_optimizer()->set_eps(1); }},
        ValidCase{"WeightDecayTen",
                  [](JobSpec& s) { s.mutable_optimizer()->set_weight_decay(10); }},
        ValidCase{"AmsgradOnAdamW",
                  [](JobSpec& s) {
                    s.mutable_optimizer()->set_kind(v1::ADAMW);
                    s.mutable_optimizer()->set_amsgrad(true);
                  }},
        ValidCase{"SgdNesterov",
                  [](JobSpec& s) {
                    s.mutable_optimizer()->set_kind(v1::SGD);
                    s.mutable_optimizer()->set_momentum(0.99);
                    s.mutable_optimizer()->set_nesterov(true);
                  }},
        ValidCase{"SgdFullDampening",
                  [](JobSpec& s) {
                    s.mutable_optimizer()->set_kind(v1::SGD);
                    s.mutable_optimizer()->set_momentum(0.5);
                    s.mutable_optimizer()->set_dampening(1);
                  }},
        // Indistinguishable from unset after defaults, so accepted.
        ValidCase{"SgdWithBeta2AtItsDefault",
                  [](JobSpec& s) {
                    s.mutable_optimizer()->set_kind(v1::SGD);
                    s.mutable_optimizer()->set_beta2(0.999);
                  }},
        ValidCase{"AdagradOptions",
                  [](JobSpec& s) {
                    s.mutable_optimizer()->set_kind(v1::ADAGRAD);
                    s.mutable_optimizer()->set_lr_decay(1);
                    s.mutable_optimizer()->set_initial_accumulator_value(1e6);
                    s.mutable_optimizer()->set_eps(0);
                  }},
        ValidCase{"LionBetas",
                  [](JobSpec& s) {
                    s.mutable_optimizer()->set_kind(v1::LION);
                    s.mutable_optimizer()->set_beta1(0.95);
                    s.mutable_optimizer()->set_beta2(0.98);
                    s.mutable_optimizer()->set_maximize(true);
                  }},
        ValidCase{"Fp16WithDefaultLossScale",
                  [](JobSpec& s) { s.mutable_precision()->set_param_dtype(v1::FLOAT16); }},
        ValidCase{"Bf16Reduce",
                  [](JobSpec& s) {
                    s.mutable_precision()->set_param_dtype(v1::BFLOAT16);
                    s.mutable_precision()->set_reduce_dtype(v1::BFLOAT16);
                  }},
        ValidCase{"LossScaleEdges",
                  [](JobSpec& s) {
                    s.mutable_precision()->set_initial_loss_scale(16777216);
                    s.mutable_precision()->set_loss_scale_growth_interval(1000000);
                  }},
        ValidCase{"ClipEdge", [](JobSpec& s) { s.set_clip_grad_norm(1e6); }},
        ValidCase{"BucketLow", [](JobSpec& s) { s.set_bucket_elems(1024); }},
        ValidCase{"BucketHigh", [](JobSpec& s) { s.set_bucket_elems(int64_t{1} << 30); }},
        ValidCase{"MostWorkers",
                  [](JobSpec& s) {
                    s.set_min_workers(65536);
                    s.set_max_workers(65536);
                    s.set_global_batch(65536);
                  }},
        ValidCase{"SomeWorldSizeDividesBatch",
                  [](JobSpec& s) {
                    s.set_min_workers(3);
                    s.set_max_workers(5);
                    s.set_global_batch(100);
                  }},
        ValidCase{"ManySteps", [](JobSpec& s) { s.set_steps(1000000000); }},
        ValidCase{"LargestBatch", [](JobSpec& s) { s.set_global_batch(int64_t{1} << 24); }},
        ValidCase{"Cuda", [](JobSpec& s) { s.set_device_kind(v1::CUDA); }},
        ValidCase{"Ddp", [](JobSpec& s) { s.set_mode(v1::DDP); }},
        ValidCase{"Checkpoints",
                  [](JobSpec& s) {
                    s.mutable_checkpoint()->set_every_steps(1000000000);
                    s.mutable_checkpoint()->set_dir("runs/mlp-seed.1");
                    s.mutable_checkpoint()->set_keep(100);
                  }},
        ValidCase{"MostAttempts", [](JobSpec& s) { s.set_max_attempts(100); }},
        ValidCase{"LossScaleFactorEdges",
                  [](JobSpec& s) {
                    s.mutable_precision()->set_loss_scale_backoff_factor(0.999);
                    s.mutable_precision()->set_loss_scale_growth_factor(1000);
                  }},
        ValidCase{"ParamGroupEdges",
                  [](JobSpec& s) {
                    for (int g = 0; g < 64; ++g) {
                      v1::ParamGroup& group = *s.add_param_groups();
                      for (int p = 0; p < 64; ++p) group.add_patterns(std::string(256, '*'));
                      group.set_weight_decay(g % 2 == 0 ? 0 : 10);
                      group.set_lr_scale(g % 2 == 0 ? 0 : 1000);
                    }
                  }},
        ValidCase{"ParamGroupWithPatternsOnly",
                  [](JobSpec& s) { s.add_param_groups()->add_patterns("no-such-tensor"); }}),
    [](const ::testing::TestParamInfo<ValidCase>& info) { return info.param.name; });

struct InvalidCase {
  std::string name;
  std::function<void(JobSpec&)> mutate;
  std::string field;     // the message starts with "<field>: "
  std::string contains;  // and contains this
};

void PrintTo(const InvalidCase& c, std::ostream* os) { *os << c.name; }

class InvalidSpecTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidSpecTest, FailsNamingTheField) {
  const InvalidCase& c = GetParam();
  JobSpec spec = BaseSpec();
  c.mutate(spec);
  const absl::Status status = ValidateWithDefaults(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), c.field + ": ")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), c.contains)) << status;
}

void SetOptimizer(JobSpec& s, v1::OptimizerKind kind) { s.mutable_optimizer()->set_kind(kind); }

INSTANTIATE_TEST_SUITE_P(
    Malformed, InvalidSpecTest,
    ::testing::Values(
        InvalidCase{"EmptyName", [](JobSpec& s) { s.clear_name(); }, "name",
                    "\"\" must be 1 to 63 characters of [a-z0-9-]"},
        InvalidCase{"NameWithUpperCase", [](JobSpec& s) { s.set_name("Bad_Name"); }, "name",
                    "name: \"Bad_Name\" must be 1 to 63 characters of [a-z0-9-]"},
        InvalidCase{"NameTooLong", [](JobSpec& s) { s.set_name(std::string(64, 'a')); }, "name",
                    "must be 1 to 63 characters"},
        InvalidCase{"NameWithSpace", [](JobSpec& s) { s.set_name("my job"); }, "name",
                    "[a-z0-9-]"},
        InvalidCase{"NoWorkload", [](JobSpec& s) { s.mutable_workload()->clear_preset(); },
                    "workload", "preset or layer_sizes"},
        InvalidCase{"PresetAndLayerSizes",
                    [](JobSpec& s) {
                      s.mutable_workload()->add_layer_sizes(4);
                      s.mutable_workload()->add_layer_sizes(4);
                    },
                    "workload", "not both"},
        InvalidCase{"UnknownPreset", [](JobSpec& s) { s.mutable_workload()->set_preset("huge"); },
                    "workload.preset", "unknown preset 'huge'; known: seed, small, medium, large"},
        InvalidCase{"PresetTooLong",
                    [](JobSpec& s) { s.mutable_workload()->set_preset(std::string(65, 's')); },
                    "workload.preset", "65 bytes is longer than the limit of 64"},
        InvalidCase{"OneLayerSize",
                    [](JobSpec& s) {
                      s.mutable_workload()->clear_preset();
                      s.mutable_workload()->add_layer_sizes(10);
                    },
                    "workload.layer_sizes", "at least 2"},
        InvalidCase{"ZeroLayerSize",
                    [](JobSpec& s) {
                      s.mutable_workload()->clear_preset();
                      s.mutable_workload()->add_layer_sizes(10);
                      s.mutable_workload()->add_layer_sizes(0);
                    },
                    "workload.layer_sizes[1]", "0 is out of range [1, 1048576]"},
        InvalidCase{"NegativeLayerSize",
                    [](JobSpec& s) {
                      s.mutable_workload()->clear_preset();
                      s.mutable_workload()->add_layer_sizes(-5);
                      s.mutable_workload()->add_layer_sizes(10);
                    },
                    "workload.layer_sizes[0]", "-5 is out of range"},
        InvalidCase{"HugeLayerSize",
                    [](JobSpec& s) {
                      s.mutable_workload()->clear_preset();
                      s.mutable_workload()->add_layer_sizes(10);
                      s.mutable_workload()->add_layer_sizes(int64_t{1} << 21);
                    },
                    "workload.layer_sizes[1]", "out of range"},
        InvalidCase{"ZeroDatasetSize", [](JobSpec& s) { s.mutable_workload()->set_dataset_size(0); },
                    "workload.dataset_size", "0 is out of range [1, 1099511627776]"},
        InvalidCase{"HugeDatasetSize",
                    [](JobSpec& s) {
                      s.mutable_workload()->set_dataset_size((int64_t{1} << 40) + 1);
                    },
                    "workload.dataset_size", "out of range"},
        InvalidCase{"NegativeDatasetSize",
                    [](JobSpec& s) { s.mutable_workload()->set_dataset_size(-1); },
                    "workload.dataset_size", "-1 is out of range"},
        InvalidCase{"NoOptimizerKind", [](JobSpec& s) { s.mutable_optimizer()->clear_kind(); },
                    "optimizer.kind", "required; allowed: SGD, ADAM, ADAMW, ADAGRAD, LION"},
        InvalidCase{"UnknownOptimizerKind",
                    [](JobSpec& s) { SetOptimizer(s, static_cast<v1::OptimizerKind>(99)); },
                    "optimizer.kind", "unknown OptimizerKind value 99"},
        InvalidCase{"NegativeLr", [](JobSpec& s) { s.mutable_optimizer()->set_lr(-0.1); },
                    "optimizer.lr", "optimizer.lr: -0.1 is out of range (0, 1000]"},
        InvalidCase{"ZeroLr", [](JobSpec& s) { s.mutable_optimizer()->set_lr(0); },
                    "optimizer.lr", "0 is out of range (0, 1000]"},
        InvalidCase{"NaNLr", [](JobSpec& s) { s.mutable_optimizer()->set_lr(kNaN); },
                    "optimizer.lr", "NaN is not allowed"},
        InvalidCase{"InfLr", [](JobSpec& s) { s.mutable_optimizer()->set_lr(kInf); },
                    "optimizer.lr", "Inf is not allowed"},
        InvalidCase{"MinusInfLr", [](JobSpec& s) { s.mutable_optimizer()->set_lr(-kInf); },
                    "optimizer.lr", "-Inf is not allowed"},
        InvalidCase{"LrAboveAThousand", [](JobSpec& s) { s.mutable_optimizer()->set_lr(1000.5); },
                    "optimizer.lr", "1000.5 is out of range (0, 1000]"},
        InvalidCase{"Beta1One", [](JobSpec& s) { s.mutable_optimizer()->set_beta1(1); },
                    "optimizer.beta1", "1 is out of range [0, 1)"},
        InvalidCase{"NaNBeta1", [](JobSpec& s) { s.mutable_optimizer()->set_beta1(kNaN); },
                    "optimizer.beta1", "NaN"},
        InvalidCase{"NegativeBeta2", [](JobSpec& s) { s.mutable_optimizer()->set_beta2(-0.5); },
                    "optimizer.beta2", "-0.5 is out of range [0, 1)"},
        InvalidCase{"EpsTwo", [](JobSpec& s) { s.mutable_optimizer()->set_eps(2); },
                    "optimizer.eps", "2 is out of range [0, 1]"},
        InvalidCase{"NaNEps", [](JobSpec& s) { s.mutable_optimizer()->set_eps(kNaN); },
                    "optimizer.eps", "NaN is not allowed"},
        InvalidCase{"NegativeWeightDecay",
                    [](JobSpec& s) { s.mutable_optimizer()->set_weight_decay(-1); },
                    "optimizer.weight_decay", "-1 is out of range [0, 10]"},
        InvalidCase{"HugeWeightDecay",
                    [](JobSpec& s) { s.mutable_optimizer()->set_weight_decay(1e300); },
                    "optimizer.weight_decay", "1e+300 is out of range [0, 10]"},
        InvalidCase{"InfWeightDecay",
                    [](JobSpec& s) { s.mutable_optimizer()->set_weight_decay(kInf); },
                    "optimizer.weight_decay", "Inf is not allowed"},
        InvalidCase{"MomentumOnAdam", [](JobSpec& s) { s.mutable_optimizer()->set_momentum(0.9); },
                    "optimizer.momentum", "only applies to SGD; leave it unset for ADAM"},
        InvalidCase{"MomentumOne",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::SGD);
                      s.mutable_optimizer()->set_momentum(1);
                    },
                    "optimizer.momentum", "1 is out of range [0, 1)"},
        InvalidCase{"DampeningAboveOne",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::SGD);
                      s.mutable_optimizer()->set_dampening(1.5);
                    },
                    "optimizer.dampening", "1.5 is out of range [0, 1]"},
        InvalidCase{"DampeningOnAdamW",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::ADAMW);
                      s.mutable_optimizer()->set_dampening(0.1);
                    },
                    "optimizer.dampening", "only applies to SGD; leave it unset for ADAMW"},
        InvalidCase{"NesterovWithoutMomentum",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::SGD);
                      s.mutable_optimizer()->set_nesterov(true);
                    },
                    "optimizer.nesterov", "needs momentum > 0 and dampening 0"},
        InvalidCase{"NesterovWithDampening",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::SGD);
                      s.mutable_optimizer()->set_momentum(0.9);
                      s.mutable_optimizer()->set_dampening(0.1);
                      s.mutable_optimizer()->set_nesterov(true);
                    },
                    "optimizer.nesterov", "got momentum 0.9 and dampening 0.1"},
        InvalidCase{"NesterovOnAdam", [](JobSpec& s) { s.mutable_optimizer()->set_nesterov(true); },
                    "optimizer.nesterov", "only applies to SGD"},
        InvalidCase{"AmsgradOnSgd",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::SGD);
                      s.mutable_optimizer()->set_amsgrad(true);
                    },
                    "optimizer.amsgrad", "optimizer.amsgrad: only applies to ADAM and ADAMW"},
        InvalidCase{"Beta1OnSgd",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::SGD);
                      s.mutable_optimizer()->set_beta1(0.5);
                    },
                    "optimizer.beta1", "only applies to ADAM, ADAMW and LION; leave it unset for SGD"},
        InvalidCase{"Beta2OnAdagrad",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::ADAGRAD);
                      s.mutable_optimizer()->set_beta2(0.9);
                    },
                    "optimizer.beta2", "leave it unset for ADAGRAD"},
        InvalidCase{"EpsOnLion",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::LION);
                      s.mutable_optimizer()->set_eps(1e-6);
                    },
                    "optimizer.eps", "only applies to ADAM, ADAMW and ADAGRAD"},
        InvalidCase{"LrDecayOnAdam", [](JobSpec& s) { s.mutable_optimizer()->set_lr_decay(0.1); },
                    "optimizer.lr_decay", "only applies to ADAGRAD"},
        InvalidCase{"LrDecayTwo",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::ADAGRAD);
                      s.mutable_optimizer()->set_lr_decay(2);
                    },
                    "optimizer.lr_decay", "2 is out of range [0, 1]"},
        InvalidCase{"HugeInitialAccumulator",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::ADAGRAD);
                      s.mutable_optimizer()->set_initial_accumulator_value(1e7);
                    },
                    "optimizer.initial_accumulator_value", "10000000 is out of range [0, 1000000]"},
        InvalidCase{"InitialAccumulatorOnSgd",
                    [](JobSpec& s) {
                      SetOptimizer(s, v1::SGD);
                      s.mutable_optimizer()->set_initial_accumulator_value(0.1);
                    },
                    "optimizer.initial_accumulator_value", "only applies to ADAGRAD"},
        InvalidCase{"UnknownMode", [](JobSpec& s) { s.set_mode(static_cast<v1::Mode>(99)); },
                    "mode", "unknown Mode value 99; allowed: DDP, ZERO1, ZERO2, ZERO3"},
        // Fails before the fix: gather_pool_buckets did not exist (and ZERO3 was refused).
        InvalidCase{"GatherPoolBucketsOnZero2",
                    [](JobSpec& s) {
                      s.set_mode(v1::ZERO2);
                      s.set_gather_pool_buckets(4);
                    },
                    "gather_pool_buckets", "only applies to mode ZERO3; leave it unset for ZERO2"},
        InvalidCase{"ResumeFromNoJob", [](JobSpec& s) { s.mutable_resume_from()->set_step(5); },
                    "resume_from.job_id", "required"},
        InvalidCase{"ResumeFromStepZero",
                    [](JobSpec& s) {
                      s.mutable_resume_from()->set_job_id("job-000001");
                      s.mutable_resume_from()->set_step(0);
                    },
                    "resume_from.step", "0 is out of range [1, 1000000000]"},
        InvalidCase{"GatherPoolBucketsOnDdp",
                    [](JobSpec& s) {
                      s.set_mode(v1::DDP);
                      s.set_gather_pool_buckets(4);
                    },
                    "gather_pool_buckets", "leave it unset for DDP"},
        InvalidCase{"ZeroGatherPoolBuckets",
                    [](JobSpec& s) {
                      s.set_mode(v1::ZERO3);
                      s.set_gather_pool_buckets(0);
                    },
                    "gather_pool_buckets", "0 is out of range [1, 65536]"},
        InvalidCase{"HugeGatherPoolBuckets",
                    [](JobSpec& s) {
                      s.set_mode(v1::ZERO3);
                      s.set_gather_pool_buckets(65537);
                    },
                    "gather_pool_buckets", "65537 is out of range [1, 65536]"},
        InvalidCase{"Float64Params",
                    [](JobSpec& s) { s.mutable_precision()->set_param_dtype(v1::FLOAT64); },
                    "precision.param_dtype",
                    "FLOAT64 is not supported; allowed: FLOAT32, BFLOAT16, FLOAT16"},
        InvalidCase{"UnknownParamDtype",
                    [](JobSpec& s) {
                      s.mutable_precision()->set_param_dtype(static_cast<v1::DType>(42));
                    },
                    "precision.param_dtype", "unknown DType value 42"},
        InvalidCase{"Float64Grads",
                    [](JobSpec& s) { s.mutable_precision()->set_grad_dtype(v1::FLOAT64); },
                    "precision.grad_dtype", "FLOAT64 is not supported"},
        InvalidCase{"Bf16Master",
                    [](JobSpec& s) { s.mutable_precision()->set_master_dtype(v1::BFLOAT16); },
                    "precision.master_dtype",
                    "precision.master_dtype: only FLOAT32 is supported, got BFLOAT16"},
        InvalidCase{"UnknownReduceDtype",
                    [](JobSpec& s) {
                      s.mutable_precision()->set_reduce_dtype(static_cast<v1::DType>(-3));
                    },
                    "precision.reduce_dtype", "unknown DType value -3"},
        InvalidCase{"LossScaleBelowOne",
                    [](JobSpec& s) { s.mutable_precision()->set_initial_loss_scale(0.5); },
                    "precision.initial_loss_scale", "0.5 is out of range [1, 16777216]"},
        InvalidCase{"HugeLossScale",
                    [](JobSpec& s) { s.mutable_precision()->set_initial_loss_scale(16777217); },
                    "precision.initial_loss_scale", "16777217 is out of range"},
        InvalidCase{"NaNLossScale",
                    [](JobSpec& s) { s.mutable_precision()->set_initial_loss_scale(kNaN); },
                    "precision.initial_loss_scale", "NaN is not allowed"},
        InvalidCase{"ZeroGrowthInterval",
                    [](JobSpec& s) { s.mutable_precision()->set_loss_scale_growth_interval(0); },
                    "precision.loss_scale_growth_interval", "0 is out of range [1, 1000000]"},
        InvalidCase{"HugeGrowthInterval",
                    [](JobSpec& s) {
                      s.mutable_precision()->set_loss_scale_growth_interval(1000001);
                    },
                    "precision.loss_scale_growth_interval", "1000001 is out of range"},
        InvalidCase{"ZeroBackoffFactor",
                    [](JobSpec& s) { s.mutable_precision()->set_loss_scale_backoff_factor(0); },
                    "precision.loss_scale_backoff_factor", "0 is out of range (0, 1)"},
        InvalidCase{"BackoffFactorOne",
                    [](JobSpec& s) { s.mutable_precision()->set_loss_scale_backoff_factor(1); },
                    "precision.loss_scale_backoff_factor", "1 is out of range (0, 1)"},
        InvalidCase{"NaNBackoffFactor",
                    [](JobSpec& s) { s.mutable_precision()->set_loss_scale_backoff_factor(kNaN); },
                    "precision.loss_scale_backoff_factor", "NaN is not allowed"},
        InvalidCase{"GrowthFactorOne",
                    [](JobSpec& s) { s.mutable_precision()->set_loss_scale_growth_factor(1); },
                    "precision.loss_scale_growth_factor", "1 is out of range (1, 1000]"},
        InvalidCase{"HugeGrowthFactor",
                    [](JobSpec& s) { s.mutable_precision()->set_loss_scale_growth_factor(1001); },
                    "precision.loss_scale_growth_factor", "1001 is out of range"},
        InvalidCase{"TooManyParamGroups",
                    [](JobSpec& s) {
                      for (int g = 0; g < 65; ++g) s.add_param_groups()->add_patterns("*.bias");
                    },
                    "param_groups", "65 groups; at most 64"},
        InvalidCase{"TensorIndicesForABuiltInModel",
                    [](JobSpec& s) { s.add_param_groups()->add_tensors(0); },
                    "param_groups[0].tensors", "only attached models list tensors by index"},
        InvalidCase{"ParamGroupWithoutPatterns",
                    [](JobSpec& s) {
                      s.add_param_groups()->add_patterns("*.bias");
                      s.add_param_groups()->set_weight_decay(0);
                    },
                    "param_groups[1].patterns", "0 patterns; 1 to 64 are allowed"},
        InvalidCase{"TooManyPatterns",
                    [](JobSpec& s) {
                      v1::ParamGroup& group = *s.add_param_groups();
                      for (int p = 0; p < 65; ++p) group.add_patterns("*.bias");
                    },
                    "param_groups[0].patterns", "65 patterns"},
        InvalidCase{"EmptyPattern",
                    [](JobSpec& s) {
                      v1::ParamGroup& group = *s.add_param_groups();
                      group.add_patterns("*.bias");
                      group.add_patterns("");
                    },
                    "param_groups[0].patterns[1]", "\"\" must be 1 to 256 characters"},
        InvalidCase{"LongPattern",
                    [](JobSpec& s) { s.add_param_groups()->add_patterns(std::string(257, 'x')); },
                    "param_groups[0].patterns[0]", "must be 1 to 256 characters"},
        InvalidCase{"NegativeGroupWeightDecay",
                    [](JobSpec& s) {
                      v1::ParamGroup& group = *s.add_param_groups();
                      group.add_patterns("*.bias");
                      group.set_weight_decay(-0.1);
                    },
                    "param_groups[0].weight_decay", "-0.1 is out of range [0, 10]"},
        InvalidCase{"InfiniteGroupWeightDecay",
                    [](JobSpec& s) {
                      v1::ParamGroup& group = *s.add_param_groups();
                      group.add_patterns("*.bias");
                      group.set_weight_decay(kInf);
                    },
                    "param_groups[0].weight_decay", "is not allowed"},
        InvalidCase{"HugeGroupLrScale",
                    [](JobSpec& s) {
                      v1::ParamGroup& group = *s.add_param_groups();
                      group.add_patterns("*.weight");
                      group.set_lr_scale(1001);
                    },
                    "param_groups[0].lr_scale", "1001 is out of range [0, 1000]"},
        InvalidCase{"NegativeClip", [](JobSpec& s) { s.set_clip_grad_norm(-1); }, "clip_grad_norm",
                    "-1 is out of range [0, 1000000]"},
        InvalidCase{"NaNClip", [](JobSpec& s) { s.set_clip_grad_norm(kNaN); }, "clip_grad_norm",
                    "NaN is not allowed"},
        InvalidCase{"HugeClip", [](JobSpec& s) { s.set_clip_grad_norm(1e7); }, "clip_grad_norm",
                    "out of range"},
        InvalidCase{"SmallBucket", [](JobSpec& s) { s.set_bucket_elems(1023); }, "bucket_elems",
                    "1023 is out of range [1024, 1073741824]"},
        InvalidCase{"HugeBucket", [](JobSpec& s) { s.set_bucket_elems((int64_t{1} << 30) + 1); },
                    "bucket_elems", "out of range"},
        InvalidCase{"ZeroBucket", [](JobSpec& s) { s.set_bucket_elems(0); }, "bucket_elems",
                    "0 is out of range"},
        InvalidCase{"ZeroMinWorkers", [](JobSpec& s) { s.set_min_workers(0); }, "min_workers",
                    "0 is out of range [1, 65536]"},
        InvalidCase{"NegativeMinWorkers", [](JobSpec& s) { s.set_min_workers(-3); },
                    "min_workers", "-3 is out of range"},
        InvalidCase{"TooManyMinWorkers",
                    [](JobSpec& s) {
                      s.set_min_workers(65537);
                      s.set_max_workers(65537);
                    },
                    "min_workers", "65537 is out of range [1, 65536]"},
        InvalidCase{"MaxBelowMin",
                    [](JobSpec& s) {
                      s.set_min_workers(4);
                      s.set_max_workers(2);
                    },
                    "max_workers", "max_workers: 2 is below min_workers 4"},
        InvalidCase{"TooManyMaxWorkers", [](JobSpec& s) { s.set_max_workers(70000); },
                    "max_workers", "70000 is out of range [min_workers, 65536]"},
        InvalidCase{"UnknownDeviceKind",
                    [](JobSpec& s) { s.set_device_kind(static_cast<v1::DeviceKind>(7)); },
                    "device_kind", "unknown DeviceKind value 7; allowed: CPU, CUDA"},
        InvalidCase{"ZeroSteps", [](JobSpec& s) { s.set_steps(0); }, "steps",
                    "0 is out of range [1, 1000000000]"},
        InvalidCase{"NegativeSteps", [](JobSpec& s) { s.set_steps(-1); }, "steps",
                    "-1 is out of range"},
        InvalidCase{"HugeSteps", [](JobSpec& s) { s.set_steps(std::numeric_limits<int64_t>::max()); },
                    "steps", "9223372036854775807 is out of range"},
        InvalidCase{"ZeroGlobalBatch", [](JobSpec& s) { s.set_global_batch(0); }, "global_batch",
                    "0 is out of range [1, 16777216]"},
        InvalidCase{"HugeGlobalBatch", [](JobSpec& s) { s.set_global_batch((int64_t{1} << 24) + 1); },
                    "global_batch", "out of range"},
        InvalidCase{"NoWorldSizeDividesBatch",
                    [](JobSpec& s) {
                      s.set_min_workers(3);
                      s.set_max_workers(3);
                      s.set_global_batch(100);
                    },
                    "global_batch",
                    "global_batch: 100 has no divisor in [min_workers, max_workers] = [3, 3]"},
        InvalidCase{"PrimeBatch", [](JobSpec& s) { s.set_global_batch(7); }, "global_batch",
                    "= [2, 4]"},
        InvalidCase{"NegativeCheckpointEvery",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_every_steps(-1); },
                    "checkpoint.every_steps", "-1 is out of range [0, 1000000000]"},
        InvalidCase{"HugeCheckpointEvery",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_every_steps(1000000001); },
                    "checkpoint.every_steps", "out of range"},
        InvalidCase{"AbsoluteCheckpointDir",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_dir("/etc"); }, "checkpoint.dir",
                    "must be relative and must not contain \"..\""},
        InvalidCase{"CheckpointDirEscapes",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_dir("../x"); }, "checkpoint.dir",
                    "must be relative and must not contain \"..\""},
        InvalidCase{"CheckpointDirDotDotInside",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_dir("a/../../b"); },
                    "checkpoint.dir", "\"..\" component"},
        InvalidCase{"CheckpointDirEmptyComponent",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_dir("a//b"); }, "checkpoint.dir",
                    "empty"},
        InvalidCase{"CheckpointDirWithNul",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_dir(std::string("a\0b", 3)); },
                    "checkpoint.dir", "\"a\\000b\" contains a control character"},
        InvalidCase{"HugeCheckpointDir",
                    [](JobSpec& s) { s.mutable_checkpoint()->set_dir(std::string(5000, 'd')); },
                    "checkpoint.dir", "5000 bytes is longer than the limit of 4096"},
        InvalidCase{"ZeroKeep", [](JobSpec& s) { s.mutable_checkpoint()->set_keep(0); },
                    "checkpoint.keep", "0 is out of range [1, 100]"},
        InvalidCase{"TooManyKept", [](JobSpec& s) { s.mutable_checkpoint()->set_keep(101); },
                    "checkpoint.keep", "101 is out of range"},
        InvalidCase{"ZeroAttempts", [](JobSpec& s) { s.set_max_attempts(0); }, "max_attempts",
                    "0 is out of range [1, 100]"},
        InvalidCase{"TooManyAttempts", [](JobSpec& s) { s.set_max_attempts(101); }, "max_attempts",
                    "101 is out of range"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

// ---- Attached models ----

// A valid attached spec before defaults: two tensors on two pinned workers.
JobSpec AttachedSpec() {
  JobSpec spec;
  spec.set_name("torch-run");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  v1::AttachedModel& attached = *spec.mutable_workload()->mutable_attached();
  v1::AttachedTensor& bias = *attached.add_tensors();
  bias.set_name("fc.bias");
  bias.add_shape(10);
  v1::AttachedTensor& weight = *attached.add_tensors();
  weight.set_name("fc.weight");
  weight.add_shape(10);
  weight.add_shape(64);
  attached.add_workers("node-b");
  attached.add_workers("node-a");
  return spec;
}

v1::AttachedModel& Attached(JobSpec& s) { return *s.mutable_workload()->mutable_attached(); }

// Sets tensor `t`'s shape (the tensor is added when it is the next one).
void SetShape(JobSpec& s, int t, std::vector<int64_t> shape) {
  v1::AttachedModel& attached = Attached(s);
  if (t == attached.tensors_size()) attached.add_tensors()->set_name(absl::StrCat("extra.", t));
  attached.mutable_tensors(t)->clear_shape();
  for (int64_t dim : shape) attached.mutable_tensors(t)->add_shape(dim);
}

// Fails before the fix (issue 38): resume_from did not exist. An attached trainer loads states
// itself.
TEST(ValidateAttachedSpecTest, ResumeFromIsRefused) {
  JobSpec spec = AttachedSpec();
  spec.mutable_resume_from()->set_job_id("job-000001");
  const absl::Status status = ValidateWithDefaults(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), "resume_from: not for attached models")) << status;
}

TEST(ValidateAttachedSpecTest, AttachedSpecIsValid) {
  const absl::Status status = ValidateWithDefaults(AttachedSpec());
  EXPECT_TRUE(status.ok()) << status;
}

class ValidAttachedSpecTest : public ::testing::TestWithParam<ValidCase> {};

TEST_P(ValidAttachedSpecTest, Passes) {
  JobSpec spec = AttachedSpec();
  GetParam().mutate(spec);
  const absl::Status status = ValidateWithDefaults(spec);
  EXPECT_TRUE(status.ok()) << status;
}

INSTANTIATE_TEST_SUITE_P(
    Edges, ValidAttachedSpecTest,
    ::testing::Values(
        ValidCase{"ScalarTensor", [](JobSpec& s) { SetShape(s, 2, {}); }},
        ValidCase{"OneTensor", [](JobSpec& s) { Attached(s).mutable_tensors()->RemoveLast(); }},
        // Fails before issue 39: attached zero3 was refused as not built.
        ValidCase{"Zero3", [](JobSpec& s) { s.set_mode(v1::ZERO3); }},
        ValidCase{"MostTensors",
                  [](JobSpec& s) {
                    Attached(s).clear_tensors();
                    for (int t = 0; t < 100000; ++t) {
                      Attached(s).add_tensors()->set_name(absl::StrCat("p", t));
                    }
                  }},
        // Issue 26: groups by identity, any size: one group of 100,000 tensors, or a group per
        // tensor (before, each tensor was a pattern: at most 64 per group and 64 groups).
        ValidCase{"OneGroupOfEveryTensor",
                  [](JobSpec& s) {
                    Attached(s).clear_tensors();
                    v1::ParamGroup& group = *s.add_param_groups();
                    for (int t = 0; t < 100000; ++t) {
                      Attached(s).add_tensors()->set_name(absl::StrCat("p", t));
                      group.add_tensors(t);
                    }
                  }},
        ValidCase{"AGroupPerTensor",
                  [](JobSpec& s) {
                    Attached(s).clear_tensors();
                    for (int t = 0; t < 1000; ++t) {
                      Attached(s).add_tensors()->set_name(absl::StrCat("p", t));
                      v1::ParamGroup& group = *s.add_param_groups();
                      group.add_tensors(t);
                      group.set_weight_decay(t % 2 == 0 ? 0 : 0.1);
                    }
                  }},
        ValidCase{
            "LongestName",
            [](JobSpec& s) { Attached(s).mutable_tensors(0)->set_name(std::string(256, 'n')); }},
        // Tensor names are the trainer's own: any characters.
        ValidCase{"NameWithAnyCharacters",
                  [](JobSpec& s) { Attached(s).mutable_tensors(0)->set_name("Layer[0]/W q.k"); }},
        ValidCase{"MostElements",
                  [](JobSpec& s) {
                    SetShape(s, 0, {int64_t{1} << 20, int64_t{1} << 13});
                    SetShape(s, 1, {int64_t{1} << 33});
                  }},
        // Issue 27: tied weights' other names, for exports.
        ValidCase{"TiedAliases",
                  [](JobSpec& s) {
                    Attached(s).mutable_tensors(1)->add_aliases("decoder.weight");
                    Attached(s).mutable_tensors(1)->add_aliases("lm_head.weight");
                    Attached(s).mutable_tensors(0)->add_aliases(std::string(256, 'a'));
                  }},
        ValidCase{"MostAliases",
                  [](JobSpec& s) {
                    for (int a = 0; a < 100000; ++a) {
                      Attached(s).mutable_tensors(a % 2)->add_aliases(absl::StrCat("alias.", a));
                    }
                  }},
        ValidCase{"OneWorker", [](JobSpec& s) { Attached(s).mutable_workers()->RemoveLast(); }},
        ValidCase{"ExplicitWorkerCounts",
                  [](JobSpec& s) {
                    s.set_min_workers(2);
                    s.set_max_workers(2);
                  }},
        ValidCase{"ZeroSteps", [](JobSpec& s) { s.set_steps(0); }},
        ValidCase{"ExplicitFp32",
                  [](JobSpec& s) { s.mutable_precision()->set_param_dtype(v1::FLOAT32); }},
        ValidCase{"Bf16Reduce",
                  [](JobSpec& s) { s.mutable_precision()->set_reduce_dtype(v1::BFLOAT16); }},
        ValidCase{"Cuda", [](JobSpec& s) { s.set_device_kind(v1::CUDA); }},
        ValidCase{"Zero1", [](JobSpec& s) { s.set_mode(v1::ZERO1); }},
        ValidCase{"GroupsAndCheckpoints",
                  [](JobSpec& s) {
                    v1::ParamGroup& group = *s.add_param_groups();
                    group.add_patterns("*.bias");
                    group.set_weight_decay(0);
                    s.mutable_checkpoint()->set_every_steps(50);
                  }}),
    [](const ::testing::TestParamInfo<ValidCase>& info) { return info.param.name; });

class InvalidAttachedSpecTest : public ::testing::TestWithParam<InvalidCase> {};

TEST_P(InvalidAttachedSpecTest, FailsNamingTheField) {
  const InvalidCase& c = GetParam();
  JobSpec spec = AttachedSpec();
  c.mutate(spec);
  const absl::Status status = ValidateWithDefaults(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StartsWith(status.message(), c.field + ": ")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), c.contains)) << status;
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, InvalidAttachedSpecTest,
    ::testing::Values(
        InvalidCase{"AlsoPreset", [](JobSpec& s) { s.mutable_workload()->set_preset("seed"); },
                    "workload.attached", "set either attached or preset/layer_sizes, not both"},
        InvalidCase{"AlsoLayerSizes",
                    [](JobSpec& s) {
                      s.mutable_workload()->add_layer_sizes(4);
                      s.mutable_workload()->add_layer_sizes(4);
                    },
                    "workload.attached", "not both"},
        InvalidCase{"DatasetSize", [](JobSpec& s) { s.mutable_workload()->set_dataset_size(1024); },
                    "workload.dataset_size",
                    "does not apply to attached models (their trainers load the data); leave it "
                    "unset, got 1024"},
        InvalidCase{"GroupTensorOutOfRange",
                    [](JobSpec& s) { s.add_param_groups()->add_tensors(2); },
                    "param_groups[0].tensors[0]", "2 is not a tensor index in [0, 2)"},
        InvalidCase{"GroupTensorListedTwice",
                    [](JobSpec& s) {
                      s.add_param_groups()->add_tensors(1);
                      s.add_param_groups()->add_tensors(1);
                    },
                    "param_groups[1].tensors[0]", "tensor 1 is already in param_groups[0]"},
        InvalidCase{"GroupWithPatternsAndTensors",
                    [](JobSpec& s) {
                      v1::ParamGroup& group = *s.add_param_groups();
                      group.add_tensors(0);
                      group.add_patterns("*");
                    },
                    "param_groups[0]", "has both patterns and tensors"},
        InvalidCase{"MoreGroupsThanTensors",
                    [](JobSpec& s) {
                      for (int g = 0; g < 65; ++g) s.add_param_groups()->add_tensors(g % 2);
                    },
                    "param_groups", "65 groups; at most 64"},
        InvalidCase{"EmptyAlias",
                    [](JobSpec& s) { Attached(s).mutable_tensors(1)->add_aliases(""); },
                    "workload.attached.tensors[1].aliases[0]", "\"\" must be 1 to 256 characters"},
        InvalidCase{"LongAlias",
                    [](JobSpec& s) {
                      Attached(s).mutable_tensors(0)->add_aliases("ok");
                      Attached(s).mutable_tensors(0)->add_aliases(std::string(257, 'a'));
                    },
                    "workload.attached.tensors[0].aliases[1]", "must be 1 to 256 characters"},
        InvalidCase{"AliasIsALaterName",
                    [](JobSpec& s) { Attached(s).mutable_tensors(0)->add_aliases("fc.weight"); },
                    "workload.attached.tensors[0].aliases[0]",
                    "\"fc.weight\" is the name of tensors[1]; names and aliases must be unique"},
        InvalidCase{"AliasIsItsOwnName",
                    [](JobSpec& s) { Attached(s).mutable_tensors(1)->add_aliases("fc.weight"); },
                    "workload.attached.tensors[1].aliases[0]", "is the name of tensors[1]"},
        InvalidCase{"AliasOfTwoTensors",
                    [](JobSpec& s) {
                      Attached(s).mutable_tensors(0)->add_aliases("tied");
                      Attached(s).mutable_tensors(1)->add_aliases("tied");
                    },
                    "workload.attached.tensors[1].aliases[0]",
                    "\"tied\" is also an alias of tensors[0]; names and aliases must be unique"},
        InvalidCase{"AliasTwice",
                    [](JobSpec& s) {
                      Attached(s).mutable_tensors(1)->add_aliases("tied");
                      Attached(s).mutable_tensors(1)->add_aliases("tied");
                    },
                    "workload.attached.tensors[1].aliases[1]", "is also an alias of tensors[1]"},
        InvalidCase{"TooManyAliases",
                    [](JobSpec& s) {
                      for (int a = 0; a < 100001; ++a) {
                        Attached(s).mutable_tensors(a % 2)->add_aliases(absl::StrCat("alias.", a));
                      }
                    },
                    "workload.attached.tensors",
                    "more than 100000 aliases in all (the limit is passed at tensors[1])"},
        InvalidCase{"NoTensors", [](JobSpec& s) { Attached(s).clear_tensors(); },
                    "workload.attached.tensors", "0 tensors; 1 to 100000 are allowed"},
        InvalidCase{"TooManyTensors",
                    [](JobSpec& s) {
                      for (int t = 2; t < 100001; ++t) {
                        Attached(s).add_tensors()->set_name(absl::StrCat("p", t));
                      }
                    },
                    "workload.attached.tensors", "100001 tensors; 1 to 100000 are allowed"},
        InvalidCase{"EmptyName", [](JobSpec& s) { Attached(s).mutable_tensors(1)->clear_name(); },
                    "workload.attached.tensors[1].name", "\"\" must be 1 to 256 characters"},
        InvalidCase{
            "LongName",
            [](JobSpec& s) { Attached(s).mutable_tensors(0)->set_name(std::string(257, 'n')); },
            "workload.attached.tensors[0].name", "must be 1 to 256 characters"},
        InvalidCase{"DuplicateName",
                    [](JobSpec& s) {
                      SetShape(s, 2, {3});
                      Attached(s).mutable_tensors(2)->set_name("fc.bias");
                    },
                    "workload.attached.tensors[2].name",
                    "\"fc.bias\" is also the name of tensors[0]; names must be unique"},
        InvalidCase{"ZeroDim",
                    [](JobSpec& s) {
                      SetShape(s, 2, {1});
                      SetShape(s, 3, {4, 0, 2});
                    },
                    "workload.attached.tensors[3].shape[1]", "must be >= 1, got 0"},
        InvalidCase{"NegativeDim", [](JobSpec& s) { SetShape(s, 0, {-7}); },
                    "workload.attached.tensors[0].shape[0]", "must be >= 1, got -7"},
        InvalidCase{"TensorOverflowingInt64",
                    [](JobSpec& s) {
                      SetShape(s, 1, {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40});
                    },
                    "workload.attached.tensors[1].shape",
                    "more than 17179869184 elements; at most 17179869184 in all"},
        InvalidCase{"TooManyElementsInAll",
                    [](JobSpec& s) {
                      SetShape(s, 0, {int64_t{1} << 33});
                      SetShape(s, 1, {int64_t{1} << 33});
                      SetShape(s, 2, {1});
                    },
                    "workload.attached.tensors",
                    "more than 17179869184 elements in all (the limit is passed at tensors[2])"},
        InvalidCase{"NoWorkers", [](JobSpec& s) { Attached(s).clear_workers(); },
                    "workload.attached.workers", "required"},
        InvalidCase{"BadWorkerName", [](JobSpec& s) { Attached(s).set_workers(1, "Node_A"); },
                    "workload.attached.workers[1]",
                    "\"Node_A\" must be 1 to 63 characters of [a-z0-9-]"},
        InvalidCase{"EmptyWorkerName", [](JobSpec& s) { Attached(s).set_workers(0, ""); },
                    "workload.attached.workers[0]", "must be 1 to 63 characters"},
        InvalidCase{"DuplicateWorker",
                    [](JobSpec& s) {
                      Attached(s).add_workers("node-c");
                      Attached(s).add_workers("node-a");
                    },
                    "workload.attached.workers[3]",
                    "\"node-a\" is also workers[1]; each rank needs a worker of its own"},
        InvalidCase{"TooManyWorkers",
                    [](JobSpec& s) {
                      for (int w = 2; w < 65537; ++w) Attached(s).add_workers(absl::StrCat("n", w));
                    },
                    "workload.attached.workers", "65537 workers; 1 to 65536 are allowed"},
        InvalidCase{
            "Bf16Params", [](JobSpec& s) { s.mutable_precision()->set_param_dtype(v1::BFLOAT16); },
            "precision.param_dtype", "only FLOAT32 is supported for attached models, got BFLOAT16"},
        InvalidCase{
            "UnknownParamDtype",
            [](JobSpec& s) { s.mutable_precision()->set_param_dtype(static_cast<v1::DType>(42)); },
            "precision.param_dtype", "unknown DType value 42"},
        InvalidCase{"MinWorkersNotThePinnedCount", [](JobSpec& s) { s.set_min_workers(1); },
                    "min_workers", "1 must equal the number of workload.attached.workers (2)"},
        InvalidCase{"MaxWorkersNotThePinnedCount", [](JobSpec& s) { s.set_max_workers(3); },
                    "max_workers", "3 must equal the number of workload.attached.workers (2)"},
        InvalidCase{"MinWorkersAboveThePinnedCount",
                    [](JobSpec& s) {
                      s.set_min_workers(3);
                      s.set_max_workers(3);
                    },
                    "min_workers", "3 must equal"},
        InvalidCase{"UnknownDeviceKind",
                    [](JobSpec& s) { s.set_device_kind(static_cast<v1::DeviceKind>(7)); },
                    "device_kind", "unknown DeviceKind value 7; allowed: CPU, CUDA"},
        InvalidCase{"Steps", [](JobSpec& s) { s.set_steps(100); }, "steps",
                    "attached jobs have no fixed step count (they end when their trainers "
                    "finish); leave it unset or 0, got 100"},
        InvalidCase{"NegativeSteps", [](JobSpec& s) { s.set_steps(-1); }, "steps", "got -1"},
        InvalidCase{"GlobalBatch", [](JobSpec& s) { s.set_global_batch(128); }, "global_batch",
                    "does not apply to attached jobs (their trainers load the data); leave it "
                    "unset, got 128"},
        InvalidCase{"ZeroGlobalBatch", [](JobSpec& s) { s.set_global_batch(0); }, "global_batch",
                    "leave it unset, got 0"},
        InvalidCase{"ZeroAttempts", [](JobSpec& s) { s.set_max_attempts(0); }, "max_attempts",
                    "0 is out of range [1, 100]"}),
    [](const ::testing::TestParamInfo<InvalidCase>& info) { return info.param.name; });

TEST(ValidateAttachedSpecTest, BuiltInFieldRulesStillApplyToBuiltInSpecs) {
  // An empty attached message counts as set: it is an attached spec without tensors.
  JobSpec empty_attached = BaseSpec();
  empty_attached.mutable_workload()->clear_preset();
  empty_attached.mutable_workload()->mutable_attached();
  EXPECT_TRUE(absl::StartsWith(ValidateWithDefaults(empty_attached).message(),
                               "workload.attached.tensors: 0 tensors"));
  // A built-in spec still needs steps >= 1 and a batch that a world size divides.
  JobSpec builtin = BaseSpec();
  builtin.set_steps(0);
  EXPECT_TRUE(
      absl::StartsWith(ValidateWithDefaults(builtin).message(), "steps: 0 is out of range"));
  builtin = BaseSpec();
  EXPECT_EQ(WithDefaults(builtin).global_batch(), 128);
  EXPECT_EQ(WithDefaults(builtin).workload().dataset_size(), 1024);
}

TEST(ValidateJobSpecTest, FirstErrorInFieldOrderWins) {
  JobSpec spec = BaseSpec();
  spec.set_max_attempts(0);
  spec.set_steps(0);
  spec.mutable_optimizer()->set_lr(-1);
  spec.set_name("BAD");
  const JobSpec defaulted = WithDefaults(spec);
  EXPECT_TRUE(absl::StartsWith(ValidateJobSpec(defaulted).message(), "name: "));
  spec.set_name("good");
  EXPECT_TRUE(absl::StartsWith(ValidateJobSpec(WithDefaults(spec)).message(), "optimizer.lr: "));
  spec.mutable_optimizer()->set_lr(0.1);
  EXPECT_TRUE(absl::StartsWith(ValidateJobSpec(WithDefaults(spec)).message(), "steps: "));
}

TEST(ValidateJobSpecTest, LongValuesAreNotEchoedWhole) {
  JobSpec spec = BaseSpec();
  spec.set_name(std::string(100000, 'X'));
  const absl::Status status = ValidateWithDefaults(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(status.message().size(), 200u) << status;
}

TEST(ValidateCheckpointPathTest, AcceptsRelativePaths) {
  const std::string accepted[] = {"a", "job-000001", "job-000001/step-100/rank-0.ckpt", "a..b/c.d",
                                  std::string(4096, 'p')};
  for (const std::string& path : accepted) {
    EXPECT_TRUE(ValidateCheckpointPath(path).ok()) << path.substr(0, 40);
  }
}

TEST(ValidateCheckpointPathTest, RejectsPathsOutsideTheRoot) {
  const std::string rejected[] = {"",
                                  "/",
                                  "/abs/x",
                                  "..",
                                  "../a",
                                  "a/..",
                                  "a/b/",
                                  "a//b",
                                  "./a",
                                  "a/./b",
                                  ".",
                                  "a\nb",
                                  std::string("x\0", 2),
                                  std::string(4097, 'p')};
  for (const std::string& path : rejected) {
    const absl::Status status = ValidateCheckpointPath(path);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path.substr(0, 40);
    EXPECT_TRUE(absl::StartsWith(status.message(), "path: ")) << status;
  }
  EXPECT_TRUE(absl::StartsWith(ValidateCheckpointPath("/x", "checkpoint.dir").message(),
                               "checkpoint.dir: \"/x\" is absolute"));
}

}  // namespace
}  // namespace zeroshard::jobspec
