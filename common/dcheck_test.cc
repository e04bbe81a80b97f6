// Tests for ZS_DCHECK: with checks on, a false condition aborts naming itself and a true one does
// nothing; under NDEBUG (bazel test -c opt) conditions are not even evaluated.
#include "common/dcheck.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

// Returns `value`, counting the calls, so a test sees whether a condition was evaluated.
bool CountedBool(bool value, int* evaluations) {
  ++*evaluations;
  return value;
}

int64_t CountedInt(int64_t value, int* evaluations) {
  ++*evaluations;
  return value;
}

TEST(DcheckTest, TrueConditionsLetExecutionContinue) {
  int evaluations = 0;
  ZS_DCHECK(CountedBool(true, &evaluations)) << "not streamed when the check passes";
  ZS_DCHECK_EQ(CountedInt(3, &evaluations), 3);
  ZS_DCHECK_NE(CountedInt(3, &evaluations), 4);
  ZS_DCHECK_LT(CountedInt(3, &evaluations), 4);
  ZS_DCHECK_LE(CountedInt(4, &evaluations), 4);
  ZS_DCHECK_GT(CountedInt(5, &evaluations), 4);
  ZS_DCHECK_GE(CountedInt(4, &evaluations), 4);
  // On: each condition ran exactly once (a passing comparison does not re-evaluate for a
  // message). Off: none ran.
  EXPECT_EQ(evaluations, ZS_DCHECK_IS_ON() ? 7 : 0);
}

TEST(DcheckTest, IsAStatementInAnUnbracedIfElse) {
  int taken = 0;
  const bool flag = true;
  if (flag)
    ZS_DCHECK(flag);
  else
    taken = 2;
  if (!flag)
    ZS_DCHECK(!flag);
  else
    taken = 1;
  EXPECT_EQ(taken, 1);
}

TEST(DcheckDeathTest, FalseConditionAbortsWithItsText) {
  if (!ZS_DCHECK_IS_ON()) GTEST_SKIP() << "NDEBUG build: checks are compiled out";
  const int buckets = 3;
  EXPECT_DEATH(ZS_DCHECK(buckets > 4) << "while retiring bucket " << 7,
               "F[0-9]{4} [0-9:.]+ dcheck_test\\.cc:[0-9]+\\] DCHECK failed: buckets > 4 while "
               "retiring bucket 7");
}

TEST(DcheckDeathTest, FailedComparisonShowsBothOperands) {
  if (!ZS_DCHECK_IS_ON()) GTEST_SKIP() << "NDEBUG build: checks are compiled out";
  const int64_t in_flight = 3;
  const int64_t pool = 2;
  EXPECT_DEATH(ZS_DCHECK_LE(in_flight, pool), "DCHECK failed: in_flight <= pool \\(3 vs\\. 2\\)");
  EXPECT_DEATH(ZS_DCHECK_EQ(in_flight + 1, pool * 3),
               "in_flight \\+ 1 == pool \\* 3 \\(4 vs\\. 6\\)");
}

TEST(DcheckTest, OffChecksNeitherEvaluateNorAbort) {
  if (ZS_DCHECK_IS_ON()) GTEST_SKIP() << "checks are on in this build (no NDEBUG)";
  int evaluations = 0;
  ZS_DCHECK(CountedBool(false, &evaluations)) << CountedInt(1, &evaluations);
  ZS_DCHECK_EQ(CountedInt(1, &evaluations), CountedInt(2, &evaluations));
  EXPECT_EQ(evaluations, 0);
}

}  // namespace
}  // namespace zeroshard::common
