// Tests for the JSON form of checkpoint records: proto field names, every field printed, exact
// round trips, unknown fields ignored, garbage refused.
#include "checkpoint/proto_json.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "zeroshard/v1/checkpoint.pb.h"

namespace zeroshard::checkpoint {
namespace {

TEST(ProtoJsonTest, PrintsProtoNamesAndZeroFields) {
  v1::ShardFragment fragment;
  fragment.set_state("exp_avg");
  fragment.set_tensor("0.weight");
  fragment.set_end(4096);
  fragment.set_crc32c(0xFFFFFFFFu);
  const std::string json = ToJson(fragment);
  EXPECT_EQ(json,
            "{\"state\":\"exp_avg\",\"tensor\":\"0.weight\",\"begin\":\"0\",\"end\":\"4096\","
            "\"dtype\":\"DTYPE_UNSPECIFIED\",\"crc32c\":4294967295}");
  EXPECT_TRUE(absl::StrContains(ToJson(fragment, JsonStyle::kIndented), "\n"));
}

TEST(ProtoJsonTest, RoundTripsExactly) {
  v1::ShardHeader header;
  header.set_job_id("job-000001");
  header.set_layout_hash(0xFEDCBA9876543210ull);  // beyond double precision
  header.set_loss_scale(0.1 + 0.2);               // not a short decimal
  header.set_optimizer_step(int64_t{1} << 60);
  header.add_states("param");
  v1::CheckpointTensor* tensor = header.add_tensors();
  tensor->set_name("0.weight");
  tensor->add_shape(3);
  v1::ShardHeader parsed;
  ASSERT_TRUE(FromJson(ToJson(header), "header", &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), header.SerializeAsString());
  EXPECT_EQ(parsed.loss_scale(), 0.1 + 0.2);
}

TEST(ProtoJsonTest, UnknownFieldsAreIgnoredAndGarbageIsDataLoss) {
  v1::CheckpointFile file;
  ASSERT_TRUE(FromJson(R"({"rank":3,"future_field":{"x":1}})", "file", &file).ok());
  EXPECT_EQ(file.rank(), 3);
  const absl::Status status = FromJson(R"({"rank":"three"})", "manifest.json", &file);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StartsWith(status.message(), "manifest.json: ")) << status;
  EXPECT_EQ(FromJson("{", "x", &file).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace zeroshard::checkpoint
