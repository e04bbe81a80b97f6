// Tests for raw request parsing: valid bytes parse, and each kind of unparseable request gets
// INVALID_ARGUMENT naming the type and the reason, without quoting the request.
#include "coordinator/request_parsing.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {
namespace {

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string FromByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// A length-delimited field: tag, one-byte length, bytes (shorter than 128 bytes).
std::string LengthDelimited(int number, const std::string& value) {
  std::string out;
  out.push_back(static_cast<char>(number << 3 | 2));
  out.push_back(static_cast<char>(value.size()));
  return out + value;
}

TEST(RequestParsingTest, AValidRequestParses) {
  v1::CancelJobRequest sent;
  sent.set_job_id("job-000042");
  sent.set_reason("no longer needed");
  v1::CancelJobRequest parsed;
  parsed.set_reason("left over from an earlier call");
  ASSERT_TRUE(ParseRequest(ToByteBuffer(sent.SerializeAsString()), &parsed).ok());
  EXPECT_EQ(parsed.job_id(), "job-000042");
  EXPECT_EQ(parsed.reason(), "no longer needed");
}

TEST(RequestParsingTest, GarbageIsNotWireFormat) {
  v1::CancelJobRequest parsed;
  // Field 15, wire type 7 (there is no wire type 7).
  const absl::Status status = ParseRequest(ToByteBuffer("\x7f\xff\xff garbage"), &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "request: not a valid zeroshard.v1.CancelJobRequest: the bytes are not protobuf wire "
            "format");
}

TEST(RequestParsingTest, InvalidUtf8IsNamedByField) {
  v1::CancelJobRequest parsed;
  const std::string bytes =
      LengthDelimited(1, "job-000042") + LengthDelimited(2, "bad \xff\xfe reason");
  const absl::Status status = ParseRequest(ToByteBuffer(bytes), &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "request: not a valid zeroshard.v1.CancelJobRequest: reason: holds invalid UTF-8 "
            "(string fields must be UTF-8)");
  EXPECT_FALSE(absl::StrContains(status.message(), "bad "));
}

TEST(RequestParsingTest, InvalidUtf8InANestedMessageOrMapIsNamedByPath) {
  // SubmitJobRequest.spec (1) -> JobSpec.workload (2) -> WorkloadSpec.preset (1).
  const std::string preset = LengthDelimited(1,
                                             "se\xc0\xaf"
                                             "ed");
  const std::string spec = LengthDelimited(2, preset);
  v1::SubmitJobRequest submit;
  absl::Status status = ParseRequest(ToByteBuffer(LengthDelimited(1, spec)), &submit);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), ": spec.workload.preset: holds invalid UTF-8"))
      << status;

  // RegisterWorkerRequest.labels (5): a map entry with key (1) and value (2).
  const std::string entry = LengthDelimited(1, "zone") + LengthDelimited(2, "\xff");
  v1::RegisterWorkerRequest register_worker;
  status = ParseRequest(ToByteBuffer(LengthDelimited(5, entry)), &register_worker);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), ": labels.value: holds invalid UTF-8")) << status;
}

TEST(RequestParsingTest, ANestedMessageThatIsNotWireFormatIsNamed) {
  v1::SubmitJobRequest submit;
  const absl::Status status =
      ParseRequest(ToByteBuffer(LengthDelimited(1, "\x7f\xff\xff")), &submit);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(status.message(), ": spec: not protobuf wire format")) << status;
}

TEST(RequestParsingTest, SerializedResponsesReadBack) {
  v1::StoreGetResponse response;
  response.set_value(std::string("\0\x01\xff", 3));
  grpc::ByteBuffer buffer;
  ASSERT_TRUE(SerializeResponse(response, &buffer).ok());
  v1::StoreGetResponse read_back;
  ASSERT_TRUE(read_back.ParseFromString(FromByteBuffer(buffer)));
  EXPECT_EQ(read_back.value(), response.value());
}

}  // namespace
}  // namespace zeroshard::coordinator
