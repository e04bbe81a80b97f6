#include "common/process_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace zeroshard::common {
namespace {

constexpr int64_t kMiB = 1024 * 1024;

// Anonymous memory that is resident once touched and goes back to the kernel when released.
class TouchedMapping {
 public:
  explicit TouchedMapping(int64_t bytes) : bytes_(bytes) {
    data_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data_ != MAP_FAILED) std::memset(data_, 1, bytes_);
  }
  ~TouchedMapping() { Release(); }
  bool ok() const { return data_ != MAP_FAILED; }
  void Release() {
    if (ok()) munmap(data_, bytes_);
    data_ = MAP_FAILED;
  }

 private:
  int64_t bytes_;
  void* data_;
};

TEST(ParseProcessStatusTest, ReadsKilobyteLinesAsBytes) {
  const char* text =
      "Name:\tzeroshard-worker\nVmPeak:\t  900000 kB\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n"
      "Threads:\t7\n";
  absl::StatusOr<ProcessMemory> memory = ParseProcessStatus(text);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ(memory->vmrss_bytes, 10240 * 1024);
  EXPECT_EQ(memory->vmhwm_bytes, 20480 * 1024);
}

TEST(ParseProcessStatusTest, MissingOrMalformedLinesAreErrors) {
  EXPECT_EQ(ParseProcessStatus("VmRSS:\t 10 kB\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcessStatus("VmRSS:\t 10 kB\nVmHWM:\t ten kB\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProcessStatus("VmRSS:\t 10\nVmHWM:\t 10 kB\n").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A longer key that starts like one of ours is not it.
  EXPECT_EQ(ParseProcessStatus("VmRSSx:\t 10 kB\nVmHWM:\t 10 kB\n").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ReadProcessMemoryTest, TouchedMemoryRaisesRssAndPeak) {
  absl::StatusOr<ProcessMemory> before = ReadProcessMemory();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_GT(before->vmrss_bytes, 0);
  EXPECT_GE(before->vmhwm_bytes, before->vmrss_bytes);

  TouchedMapping mapping(64 * kMiB);
  ASSERT_TRUE(mapping.ok());
  absl::StatusOr<ProcessMemory> during = ReadProcessMemory(getpid());
  ASSERT_TRUE(during.ok()) << during.status();
  EXPECT_GE(during->vmrss_bytes, before->vmrss_bytes + 60 * kMiB);
  EXPECT_GE(during->vmhwm_bytes, during->vmrss_bytes);

  mapping.Release();
  absl::StatusOr<ProcessMemory> after = ReadProcessMemory();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LE(after->vmrss_bytes, during->vmrss_bytes - 60 * kMiB);
  // The peak stays (up to the kernel's batching of per-thread RSS counters).
  EXPECT_GE(after->vmhwm_bytes, during->vmrss_bytes - kMiB);
}

TEST(ResetPeakResidentMemoryTest, PeakRestartsFromCurrentRss) {
  {
    TouchedMapping mapping(64 * kMiB);
    ASSERT_TRUE(mapping.ok());
  }
  absl::StatusOr<ProcessMemory> before = ReadProcessMemory();
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_GE(before->vmhwm_bytes, before->vmrss_bytes + 60 * kMiB);
  const absl::Status reset = ResetPeakResidentMemory();
  if (absl::IsUnavailable(reset)) GTEST_SKIP() << "this kernel or sandbox refuses: " << reset;
  ASSERT_TRUE(reset.ok()) << reset;
  absl::StatusOr<ProcessMemory> after = ReadProcessMemory();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->vmhwm_bytes, before->vmhwm_bytes - 50 * kMiB);
  EXPECT_GE(after->vmhwm_bytes, after->vmrss_bytes);
}

}  // namespace
}  // namespace zeroshard::common
