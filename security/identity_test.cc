#include "security/identity.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace zeroshard::security {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAliceToken[] = "alice-token-0123456789";

TEST(RoleTest, NamesRoundTrip) {
  for (Role role : {Role::kViewer, Role::kSubmitter, Role::kAdmin, Role::kWorker}) {
    EXPECT_EQ(ParseRole(RoleName(role)), role);
  }
  EXPECT_EQ(ParseRole("root"), std::nullopt);
  EXPECT_EQ(ParseRole("Admin"), std::nullopt);
}

TEST(Sha256Test, MatchesTheStandardVector) {
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(RandomSecretTest, IsSixtyFourHexDigitsAndFresh) {
  const std::string a = RandomSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, RandomSecret());
}

TEST(TokenTableTest, FindsTokensHashesAndCertificates) {
  const std::string text =
      absl::StrCat("# people\n", kAliceToken,
                   " submitter alice\n\n  sha256:", Sha256Hex("bob-token-abcdefghijk"),
                   "\tviewer bob@example.org\ncert:worker-7 worker w7\n");
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, "tokens");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 3u);
  std::optional<Identity> alice = table->FindToken(kAliceToken);
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->role, Role::kSubmitter);
  std::optional<Identity> bob = table->FindToken("bob-token-abcdefghijk");
  ASSERT_TRUE(bob.has_value());
  EXPECT_EQ(bob->name, "bob@example.org");
  EXPECT_EQ(bob->role, Role::kViewer);
  std::optional<Identity> worker = table->FindCertificate("worker-7");
  ASSERT_TRUE(worker.has_value());
  EXPECT_EQ(worker->role, Role::kWorker);
  // A certificate name is not a token, and a token's prefix is not the token.
  EXPECT_FALSE(table->FindToken("cert:worker-7").has_value());
  EXPECT_FALSE(table->FindToken("alice-token-012345678").has_value());
  EXPECT_FALSE(table->FindCertificate("worker-8").has_value());
}

TEST(TokenTableTest, ErrorsNameTheLineAndNeverQuoteTheToken) {
  struct Case {
    std::string text;
    std::string error;
  };
  const Case cases[] = {
      {"only-two-fields-0123456 admin\n", "tokens:1: expected 3 fields"},
      {"\n\nshort admin root\n", "tokens:3: token: 16 to 256"},
      {"a-long-enough-token-1 superuser root\n", "tokens:1: role 'superuser' is not one of"},
      {"a-long-enough-token-1 admin ro/ot\n", "tokens:1: name: 1 to 64"},
      {"sha256:abcd admin root\n", "tokens:1: sha256: needs 64 hex digits"},
      {"cert: worker w\n", "tokens:1: cert: names no common name"},
      {"a-long-enough-token-1 admin a\na-long-enough-token-1 viewer b\n",
       "tokens:2: this token is listed twice"},
      {"cert:x worker a\ncert:x worker b\n", "tokens:2: certificate name 'x' is listed twice"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<TokenTable> table = TokenTable::Parse(c.text, "tokens");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr(c.error));
    EXPECT_THAT(table.status().message(), Not(HasSubstr("a-long-enough-token")));
  }
}

TEST(TokenTableTest, LoadNamesAMissingFile) {
  absl::StatusOr<TokenTable> table = TokenTable::Load("/nonexistent/tokens.txt");
  ASSERT_FALSE(table.ok());
  EXPECT_THAT(table.status().message(), HasSubstr("token_file: cannot read /nonexistent/tokens"));
}

}  // namespace
}  // namespace zeroshard::security
