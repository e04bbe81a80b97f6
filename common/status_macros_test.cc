// Tests for ZS_RETURN_IF_ERROR and ZS_ASSIGN_OR_RETURN.
#include "common/status_macros.h"

#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

absl::Status FailIf(bool fail) {
  return fail ? absl::InvalidArgumentError("field: bad") : absl::OkStatus();
}

absl::StatusOr<int> Twice(absl::StatusOr<int> in) {
  ZS_ASSIGN_OR_RETURN(int value, in);
  return 2 * value;
}

absl::Status Chain(bool fail, int* reached) {
  ZS_RETURN_IF_ERROR(FailIf(fail));
  *reached = 1;
  return absl::OkStatus();
}

TEST(StatusMacrosTest, ReturnIfErrorStopsOnError) {
  int reached = 0;
  absl::Status status = Chain(true, &reached);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "field: bad");
  EXPECT_EQ(reached, 0);
  EXPECT_TRUE(Chain(false, &reached).ok());
  EXPECT_EQ(reached, 1);
}

TEST(StatusMacrosTest, AssignOrReturnPassesValueOrStatus) {
  EXPECT_EQ(*Twice(21), 42);
  absl::StatusOr<int> failed = Twice(absl::NotFoundError("job"));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace zeroshard::common
