// ForEachRowBlock: every element of a segment is covered once, in flat order, whole rows as
// blocks and cut rows one at a time, for segments starting and ending inside or on row edges.
#include "worker/workloads/row_blocks.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace zeroshard::workloads {
namespace {

// "c<row>:<from>-<to>@<offset>" or "w<first>+<rows>@<offset>" per call.
std::vector<std::string> Calls(int64_t begin, int64_t end, int64_t row_length) {
  std::vector<std::string> calls;
  EXPECT_TRUE(ForEachRowBlock(
                  begin, end, row_length,
                  [&](int64_t row, int64_t from, int64_t to, int64_t offset) {
                    calls.push_back(absl::StrCat("c", row, ":", from, "-", to, "@", offset));
                    return absl::OkStatus();
                  },
                  [&](int64_t first, int64_t rows, int64_t offset) {
                    calls.push_back(absl::StrCat("w", first, "+", rows, "@", offset));
                    return absl::OkStatus();
                  })
                  .ok());
  return calls;
}

TEST(RowBlocksTest, SplitsASegmentIntoCutAndWholeRows) {
  using V = std::vector<std::string>;
  EXPECT_EQ(Calls(0, 30, 10), (V{"w0+3@0"}));                 // row edges on both sides
  EXPECT_EQ(Calls(5, 30, 10), (V{"c0:5-10@0", "w1+2@5"}));    // starts inside a row
  EXPECT_EQ(Calls(0, 27, 10), (V{"w0+2@0", "c2:20-27@20"}));  // ends inside a row
  EXPECT_EQ(Calls(5, 27, 10), (V{"c0:5-10@0", "w1+1@5", "c2:20-27@15"}));
  EXPECT_EQ(Calls(13, 17, 10), (V{"c1:13-17@0"}));              // inside one row
  EXPECT_EQ(Calls(13, 20, 10), (V{"c1:13-20@0"}));              // ends on the row's end
  EXPECT_EQ(Calls(5, 15, 10), (V{"c0:5-10@0", "c1:10-15@5"}));  // two cut rows, none whole
  EXPECT_EQ(Calls(3, 4, 1), (V{"w3+1@0"}));                     // rows of one element
}

TEST(RowBlocksTest, StopsAtTheFirstError) {
  int whole_calls = 0;
  const absl::Status status = ForEachRowBlock(
      5, 30, 10, [](int64_t, int64_t, int64_t, int64_t) { return absl::CancelledError("stop"); },
      [&](int64_t, int64_t, int64_t) {
        ++whole_calls;
        return absl::OkStatus();
      });
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(whole_calls, 0);
}

}  // namespace
}  // namespace zeroshard::workloads
