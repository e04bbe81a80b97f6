// Every canonical code maps one to one between absl::Status and grpc::Status.
#include "common/grpc_status.h"

#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

TEST(GrpcStatusTest, EveryCodeRoundTripsBothWays) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status absl_status(static_cast<absl::StatusCode>(code),
                                   code == 0 ? "" : "field x: message");
    const grpc::Status grpc_status = ToGrpcStatus(absl_status);
    EXPECT_EQ(static_cast<int>(grpc_status.error_code()), code);
    EXPECT_EQ(grpc_status.error_message(), std::string(absl_status.message()));
    EXPECT_EQ(FromGrpcStatus(grpc_status), absl_status);

    const grpc::Status from_grpc(static_cast<grpc::StatusCode>(code), code == 0 ? "" : "other");
    const absl::Status back = FromGrpcStatus(from_grpc);
    EXPECT_EQ(static_cast<int>(back.code()), code);
    EXPECT_EQ(ToGrpcStatus(back).error_code(), from_grpc.error_code());
    EXPECT_EQ(ToGrpcStatus(back).error_message(), from_grpc.error_message());
  }
}

TEST(GrpcStatusTest, NamedCodesAgree) {
  EXPECT_EQ(ToGrpcStatus(absl::InvalidArgumentError("m")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(ToGrpcStatus(absl::FailedPreconditionError("m")).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(ToGrpcStatus(absl::UnauthenticatedError("m")).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "m")).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace zeroshard::common
