// The shared field checks: how values appear in messages, and each check's verdicts.
#include "jobspec/job_spec_validation_checks.h"

#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::jobspec {
namespace {

TEST(FormatDoubleTest, ShowsValuesReadably) {
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatDouble(std::numeric_limits<double>::infinity()), "Inf");
  EXPECT_EQ(FormatDouble(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatDouble(0), "0");
  EXPECT_EQ(FormatDouble(-0.1), "-0.1");
  EXPECT_EQ(FormatDouble(16777216), "16777216");
  EXPECT_EQ(FormatDouble(1e-8), "1e-08");
  EXPECT_EQ(FormatDouble(10.000000000000002), "10.000000000000002");
}

TEST(QuoteTest, EscapesAndTruncates) {
  EXPECT_EQ(Quote("abc"), "\"abc\"");
  EXPECT_EQ(Quote(std::string("a\"\n", 3)), "\"a\\\"\\n\"");
  EXPECT_EQ(Quote(std::string(1000, 'x')), "\"" + std::string(64, 'x') + "\"... (1000 bytes)");
}

TEST(CheckDoubleInRangeTest, HonoursOpenAndClosedEnds) {
  EXPECT_TRUE(CheckDoubleInRange("f", 1, 0, Bound::kOpen, 1, Bound::kClosed).ok());
  EXPECT_FALSE(CheckDoubleInRange("f", 0, 0, Bound::kOpen, 1, Bound::kClosed).ok());
  EXPECT_TRUE(CheckDoubleInRange("f", 0, 0, Bound::kClosed, 1, Bound::kOpen).ok());
  EXPECT_EQ(CheckDoubleInRange("f", 1, 0, Bound::kClosed, 1, Bound::kOpen).message(),
            "f: 1 is out of range [0, 1)");
  EXPECT_EQ(CheckDoubleInRange("f", std::numeric_limits<double>::quiet_NaN(), 0, Bound::kClosed, 1,
                               Bound::kClosed)
                .message(),
            "f: NaN is not allowed (must be a finite number)");
}

TEST(CheckFiniteNonNegativeTest, RejectsNegativeAndNonFinite) {
  EXPECT_TRUE(CheckFiniteNonNegative("t", 0).ok());
  EXPECT_EQ(CheckFiniteNonNegative("t", -2).message(), "t: -2 is negative (must be >= 0)");
  EXPECT_EQ(CheckFiniteNonNegative("t", std::numeric_limits<double>::infinity()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CheckIntInRangeTest, IsInclusive) {
  EXPECT_TRUE(CheckIntInRange("n", 1, 1, 3).ok());
  EXPECT_TRUE(CheckIntInRange("n", 3, 1, 3).ok());
  EXPECT_EQ(CheckIntInRange("n", 4, 1, 3).message(), "n: 4 is out of range [1, 3]");
}

TEST(CheckNameTest, AllowsLowerCaseDigitsAndDashes) {
  EXPECT_TRUE(CheckName("name", "a").ok());
  EXPECT_TRUE(CheckName("name", "mlp-7-" + std::string(57, 'z')).ok());
  EXPECT_FALSE(CheckName("name", "").ok());
  EXPECT_FALSE(CheckName("name", std::string(64, 'a')).ok());
  EXPECT_FALSE(CheckName("name", "a.b").ok());
  EXPECT_FALSE(CheckName("name", "A").ok());
  EXPECT_FALSE(CheckName("name", "a_b").ok());
}

TEST(CheckEnumInTest, DistinguishesUnknownRequiredAndUnsupported) {
  const google::protobuf::EnumDescriptor& mode = *v1::Mode_descriptor();
  EXPECT_TRUE(CheckEnumIn("mode", mode, v1::DDP, {v1::DDP, v1::ZERO1}).ok());
  EXPECT_EQ(CheckEnumIn("mode", mode, 99, {v1::DDP, v1::ZERO1}).message(),
            "mode: unknown Mode value 99; allowed: DDP, ZERO1");
  EXPECT_EQ(CheckEnumIn("mode", mode, 0, {v1::DDP, v1::ZERO1}).message(),
            "mode: required; allowed: DDP, ZERO1");
  EXPECT_EQ(CheckEnumIn("mode", mode, v1::ZERO2, {v1::DDP, v1::ZERO1}).message(),
            "mode: ZERO2 is not supported; allowed: DDP, ZERO1");
  EXPECT_EQ(CheckEnumIn("mode", mode, v1::ZERO2, {v1::DDP}).message(),
            "mode: only DDP is supported, got ZERO2");
  EXPECT_TRUE(CheckEnumIn("mode", mode, 0, {0, v1::DDP}).ok());
}

TEST(CheckMaxBytesTest, CountsBytes) {
  EXPECT_TRUE(CheckMaxBytes("k", "abc", 3).ok());
  EXPECT_EQ(CheckMaxBytes("k", "abcd", 3).message(), "k: 4 bytes is longer than the limit of 3");
}

}  // namespace
}  // namespace zeroshard::jobspec
