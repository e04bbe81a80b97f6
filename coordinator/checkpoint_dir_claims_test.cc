// A checkpoint directory belongs to its first job: equal, nested and enclosing paths all meet
// the claim; siblings and names that merely share a prefix do not.
#include "coordinator/checkpoint_dir_claims.h"

#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

TEST(CheckpointDirClaimsTest, EqualNestedAndEnclosingDirectoriesMeetTheClaim) {
  CheckpointDirClaims claims;
  claims.Claim("team/run", "job-000001");
  EXPECT_EQ(claims.OwnerOf("team/run"), "job-000001");
  EXPECT_EQ(claims.OwnerOf("team/run/inner"), "job-000001");
  EXPECT_EQ(claims.OwnerOf("team/run/inner/deeper"), "job-000001");
  EXPECT_EQ(claims.OwnerOf("team"), "job-000001");
  // Siblings and names sharing a prefix (not a component) are free.
  EXPECT_EQ(claims.OwnerOf("team/run2"), std::nullopt);
  EXPECT_EQ(claims.OwnerOf("team/ru"), std::nullopt);
  EXPECT_EQ(claims.OwnerOf("team/other"), std::nullopt);
  EXPECT_EQ(claims.OwnerOf("tea"), std::nullopt);
  EXPECT_EQ(claims.OwnerOf("run"), std::nullopt);
}

TEST(CheckpointDirClaimsTest, AClaimedDirectoryKeepsItsFirstOwner) {
  CheckpointDirClaims claims;
  claims.Claim("a", "job-000001");
  claims.Claim("a", "job-000002");
  EXPECT_EQ(claims.OwnerOf("a"), "job-000001");
  // "a-b" sorts between "a" and "a/": it must not hide a claim below "a".
  claims.Claim("b-c", "job-000003");
  claims.Claim("b/c", "job-000004");
  EXPECT_EQ(claims.OwnerOf("b"), "job-000004");
  EXPECT_EQ(claims.OwnerOf("b-c/d"), "job-000003");
}

}  // namespace
}  // namespace zeroshard::coordinator
