// Pinning the calling thread: to an allowed CPU, and the refusals.
#include "common/thread_affinity.h"

#include <sched.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

std::vector<int> ThreadCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < kCpuSetSize; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

TEST(ThreadAffinityTest, PinsTheCallingThreadOnly) {
  const std::vector<int> allowed = ThreadCpus();
  ASSERT_FALSE(allowed.empty());
  std::thread([&] {
    ASSERT_TRUE(PinCurrentThreadToCpus({allowed.back()}).ok());
    EXPECT_EQ(ThreadCpus(), std::vector<int>{allowed.back()});
  }).join();
  EXPECT_EQ(ThreadCpus(), allowed);
}

TEST(ThreadAffinityTest, RefusesBadCpus) {
  EXPECT_FALSE(IsValidCpu(-1));
  EXPECT_FALSE(IsValidCpu(kCpuSetSize));
  EXPECT_TRUE(IsValidCpu(0));
  std::thread([] {
    const absl::Status empty = PinCurrentThreadToCpus({});
    EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
    const absl::Status out_of_range = PinCurrentThreadToCpus({kCpuSetSize});
    EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(out_of_range.message().find(absl::StrCat("CPU ", kCpuSetSize)),
              absl::string_view::npos)
        << out_of_range.message();
  }).join();
}

}  // namespace
}  // namespace zeroshard::common
