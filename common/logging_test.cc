// Tests for the leveled logger: filtering by level and the line format.
#include "common/logging.h"

#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

int CountingValue(int* evaluations) {
  ++*evaluations;
  return 1;
}

TEST(LoggingTest, DisabledLevelsDoNotEvaluateTheirArguments) {
  SetMinLogLevel(LogLevel::kWarning);
  int evaluations = 0;
  ZS_LOG(INFO) << CountingValue(&evaluations);
  EXPECT_EQ(evaluations, 0);
  testing::internal::CaptureStderr();
  ZS_LOG(ERROR) << "value " << CountingValue(&evaluations);
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluations, 1);
  EXPECT_EQ(out.front(), 'E');
  EXPECT_NE(out.find("logging_test.cc:"), std::string::npos);
  EXPECT_NE(out.find("] value 1\n"), std::string::npos);
  SetMinLogLevel(LogLevel::kInfo);
}

TEST(LoggingTest, AMessageWithNewlinesIsOneEscapedLine) {
  const std::string reason = "done\nE1130 12:00:00.000000 job_manager.cc:1] FAKE\\";
  testing::internal::CaptureStderr();
  ZS_LOG(INFO) << "cancelled: " << reason;
  const std::string out = testing::internal::GetCapturedStderr();
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out.find('\n'), out.size() - 1) << out;
  EXPECT_NE(out.find("] cancelled: done\\nE1130 12:00:00.000000 job_manager.cc:1] FAKE\\\\\n"),
            std::string::npos)
      << out;
}

TEST(LoggingTest, FatalAborts) { EXPECT_DEATH(ZS_LOG(FATAL) << "boom", "boom"); }

}  // namespace
}  // namespace zeroshard::common
