// Tests for reading job specs from JSON and YAML.
#include "client/job_spec_file.h"

#include "gtest/gtest.h"

namespace zeroshard::client {
namespace {

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

TEST(JobSpecFileTest, YamlListsAndQuotes) {
  auto spec = ParseJobSpec("name: \"a\\\"b\"\nworkload:\n  layer_sizes: [10, 32, 10]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "a\"b");
  ASSERT_EQ(spec->workload().layer_sizes_size(), 3);
  EXPECT_EQ(spec->workload().layer_sizes(1), 32);
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

}  // namespace
}  // namespace zeroshard::client
