// Tests for reading job specs from JSON and YAML.
#include "client/job_spec_file.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zeroshard::client {
namespace {

using ::testing::HasSubstr;

TEST(JobSpecFileTest, JsonAndYamlGiveTheSameSpec) {
  auto from_json = ParseJobSpec(R"({"name": "demo", "workload": {"preset": "seed"},
      "optimizer": {"kind": "ADAMW", "lr": 0.01}, "mode": "DDP", "global_batch": 128,
      "min_workers": 4})");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_yaml = ParseJobSpec(R"(
name: demo
workload:
  preset: seed
optimizer:
  kind: ADAMW
  lr: 0.01
mode: DDP
global_batch: 128
min_workers: 4
)");
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  EXPECT_EQ(from_json->SerializeAsString(), from_yaml->SerializeAsString());
  EXPECT_EQ(from_yaml->optimizer().lr(), 0.01);
  EXPECT_TRUE(from_yaml->optimizer().has_lr());
  EXPECT_FALSE(from_yaml->optimizer().has_beta1());
  EXPECT_EQ(from_yaml->mode(), v1::DDP);
}

// Fails before the fix: gather_pool_buckets was no JobSpec field (an unknown field is an error).
TEST(JobSpecFileTest, Zero3AndItsGatherPoolFromJsonAndYaml) {
  auto from_json = ParseJobSpec(R"({"name": "z3", "mode": "ZERO3", "gather_pool_buckets": 6})");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_yaml = ParseJobSpec("name: z3\nmode: ZERO3\ngather_pool_buckets: 6\n");
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  EXPECT_EQ(from_json->SerializeAsString(), from_yaml->SerializeAsString());
  EXPECT_EQ(from_yaml->mode(), v1::ZERO3);
  EXPECT_TRUE(from_yaml->has_gather_pool_buckets());
  EXPECT_EQ(from_yaml->gather_pool_buckets(), 6);
}

// Fails before the fix (issue 38): resume_from was no JobSpec field.
TEST(JobSpecFileTest, ResumeFromFromJsonAndYaml) {
  auto from_json = ParseJobSpec(
      R"({"name": "z3", "mode": "ZERO3", "resume_from": {"job_id": "job-000007", "step": 40}})");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_yaml =
      ParseJobSpec("name: z3\nmode: ZERO3\nresume_from:\n  job_id: job-000007\n  step: 40\n");
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  EXPECT_EQ(from_json->SerializeAsString(), from_yaml->SerializeAsString());
  EXPECT_EQ(from_yaml->resume_from().job_id(), "job-000007");
  EXPECT_EQ(from_yaml->resume_from().step(), 40);
}

TEST(JobSpecFileTest, YamlListsAndQuotes) {
  auto spec = ParseJobSpec("name: \"a\\\"b\"\nworkload:\n  layer_sizes: [10, 32, 10]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "a\"b");
  ASSERT_EQ(spec->workload().layer_sizes_size(), 3);
  EXPECT_EQ(spec->workload().layer_sizes(1), 32);
}

TEST(JobSpecFileTest, ParamGroupsFromJsonAndYaml) {
  auto from_json = ParseJobSpec(R"({"name": "groups", "param_groups": [
      {"patterns": ["*.bias", "0.weight"], "weight_decay": 0},
      {"patterns": ["2.*"], "lr_scale": 0.5}]})");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_yaml = ParseJobSpec(R"(
name: groups
param_groups:
  - patterns: ["*.bias", 0.weight]
    weight_decay: 0
  - patterns:
      - '2.*'
    lr_scale: 0.5
)");
  ASSERT_TRUE(from_yaml.ok()) << from_yaml.status();
  EXPECT_EQ(from_json->SerializeAsString(), from_yaml->SerializeAsString());
  ASSERT_EQ(from_yaml->param_groups_size(), 2);
  const v1::ParamGroup& no_decay = from_yaml->param_groups(0);
  ASSERT_EQ(no_decay.patterns_size(), 2);
  EXPECT_EQ(no_decay.patterns(0), "*.bias");
  EXPECT_EQ(no_decay.patterns(1), "0.weight");
  // An explicit 0 is kept as set: it means "no decay", not "the optimizer's weight decay".
  EXPECT_TRUE(no_decay.has_weight_decay());
  EXPECT_EQ(no_decay.weight_decay(), 0.0);
  EXPECT_FALSE(no_decay.has_lr_scale());
  const v1::ParamGroup& slow = from_yaml->param_groups(1);
  ASSERT_EQ(slow.patterns_size(), 1);
  EXPECT_EQ(slow.patterns(0), "2.*");
  EXPECT_FALSE(slow.has_weight_decay());
  EXPECT_EQ(slow.lr_scale(), 0.5);
}

TEST(JobSpecFileTest, UnquotedStarPatternInYamlSaysToQuoteIt) {
  auto spec = ParseJobSpec("name: x\nparam_groups:\n  - patterns: [*.bias]\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("malformed YAML"), absl::string_view::npos)
      << spec.status();
  EXPECT_NE(spec.status().message().find("quote patterns"), absl::string_view::npos)
      << spec.status();

  auto unknown_group_field = ParseJobSpec(R"({"param_groups": [{"pattern": ["*.bias"]}]})");
  ASSERT_FALSE(unknown_group_field.ok());
  EXPECT_NE(unknown_group_field.status().message().find("param_groups"), absl::string_view::npos)
      << unknown_group_field.status();
}

TEST(JobSpecFileTest, MalformedInputNamesTheProblem) {
  auto bad_yaml = ParseJobSpec("name: [unclosed\n");
  ASSERT_FALSE(bad_yaml.ok());
  EXPECT_NE(bad_yaml.status().message().find("malformed YAML"), absl::string_view::npos);

  auto unknown_field = ParseJobSpec(R"({"name": "x", "optimiser": {}})");
  ASSERT_FALSE(unknown_field.ok());
  EXPECT_NE(unknown_field.status().message().find("optimiser"), absl::string_view::npos);

  auto bad_enum = ParseJobSpec("mode: ZERO9\n");
  ASSERT_FALSE(bad_enum.ok());
  EXPECT_NE(bad_enum.status().message().find("ZERO9"), absl::string_view::npos);

  EXPECT_EQ(ParseJobSpec("- a\n- b\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadJobSpecFile("/nonexistent/spec.yaml").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobSpecFileTest, AliasesWork) {
  auto spec = ParseJobSpec(R"(
name: shared
param_groups:
  - patterns: &no_decay ["*.bias", "*.norm"]
    weight_decay: 0
  - patterns: *no_decay
    lr_scale: 0.5
)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->param_groups_size(), 2);
  EXPECT_EQ(spec->param_groups(1).patterns_size(), 2);
  EXPECT_EQ(spec->param_groups(1).patterns(1), "*.norm");
}

// Each level doubles the one before: 2^30 scalars if expanded (tests/fuzz:job_spec_text_fuzzer
// timed out expanding a shorter chain). Refused after a few thousand nodes.
TEST(JobSpecFileTest, AliasesThatExpandPastTheCapAreRefused) {
  std::string yaml = "a0: &a0 [x, x]\n";
  for (int i = 1; i <= 30; ++i) {
    yaml += absl::StrCat("a", i, ": &a", i, " [*a", i - 1, ", *a", i - 1, "]\n");
  }
  const auto spec = ParseJobSpec(yaml);
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr(absl::StrCat("YAML aliases expand it to more than ",
                                     yaml.size() + kYamlSpecExtraNodes, " nodes")));
}

}  // namespace
}  // namespace zeroshard::client
