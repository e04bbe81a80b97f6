// Page tokens: what MakePageToken writes parses back to the id's number, and anything else is
// refused naming page_token.
#include "coordinator/page_token.h"

#include <limits>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "coordinator/ids.h"
#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

TEST(PageTokenTest, RoundTripsWorkerAndJobIds) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{600}, int64_t{1234567},
                    std::numeric_limits<int64_t>::max()}) {
    absl::StatusOr<int64_t> worker = ParseWorkerPageToken(MakePageToken(FormatWorkerId(n)));
    ASSERT_TRUE(worker.ok()) << worker.status();
    EXPECT_EQ(*worker, n);
    absl::StatusOr<int64_t> job = ParseJobPageToken(MakePageToken(FormatJobId(n)));
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(*job, n);
  }
}

TEST(PageTokenTest, TokensAreNotPlainIds) {
  EXPECT_NE(MakePageToken(FormatWorkerId(5)), FormatWorkerId(5));
  EXPECT_FALSE(ParseWorkerPageToken(FormatWorkerId(5)).ok());
}

TEST(PageTokenTest, RefusesTokensOfTheOtherListing) {
  EXPECT_EQ(ParseWorkerPageToken(MakePageToken(FormatJobId(3))).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseJobPageToken(MakePageToken(FormatWorkerId(3))).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PageTokenTest, RefusesGarbageNamingPageToken) {
  const std::string too_long(200, 'A');
  for (const std::string& token :
       {std::string("!!!not base64!!!"), absl::WebSafeBase64Escape("worker-42"),
        absl::WebSafeBase64Escape("job-000001 "), too_long, std::string("\xff\xfe", 2)}) {
    absl::StatusOr<int64_t> worker = ParseWorkerPageToken(token);
    EXPECT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_EQ(worker.status().message(),
              "page_token: not a token from a previous ListWorkers reply");
    absl::StatusOr<int64_t> job = ParseJobPageToken(token);
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_EQ(job.status().message(), "page_token: not a token from a previous ListJobs reply");
  }
}

}  // namespace
}  // namespace zeroshard::coordinator
