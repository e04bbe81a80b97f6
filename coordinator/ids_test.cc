// Job and worker ids: formatting, and parsing that accepts only the canonical form.
#include "coordinator/ids.h"

#include <limits>

#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

TEST(IdsTest, FormatsWithSixOrMoreDigits) {
  EXPECT_EQ(FormatJobId(42), "job-000042");
  EXPECT_EQ(FormatWorkerId(7), "worker-000007");
  EXPECT_EQ(FormatJobId(0), "job-000000");
  EXPECT_EQ(FormatJobId(1234567), "job-1234567");
  EXPECT_EQ(FormatWorkerId(std::numeric_limits<int64_t>::max()), "worker-9223372036854775807");
}

TEST(IdsTest, ParsesWhatItFormats) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{999999}, int64_t{1000000},
                    std::numeric_limits<int64_t>::max()}) {
    EXPECT_EQ(ParseJobId(FormatJobId(n)), n);
    EXPECT_EQ(ParseWorkerId(FormatWorkerId(n)), n);
    EXPECT_TRUE(IsValidJobId(FormatJobId(n)));
    EXPECT_FALSE(IsValidWorkerId(FormatJobId(n)));
    EXPECT_FALSE(IsValidJobId(FormatWorkerId(n)));
  }
}

TEST(IdsTest, RejectsNonCanonicalForms) {
  for (const char* id : {"", "job-", "job-42", "job-0000042", "job-+00042", "job--00042",
                         "job-000042 ", " job-000042", "JOB-000042", "job-00004x",
                         "job-99999999999999999999", "job_000042", "worker-000042"}) {
    EXPECT_FALSE(IsValidJobId(id)) << id;
  }
  EXPECT_FALSE(IsValidWorkerId("worker-7"));
  EXPECT_FALSE(IsValidWorkerId(std::string("worker-000007\0", 14)));
}

TEST(IdsDeathTest, NegativeNumbersAreProgrammerErrors) {
  EXPECT_DEATH(FormatJobId(-1), "id numbers are >= 0");
}

}  // namespace
}  // namespace zeroshard::coordinator
