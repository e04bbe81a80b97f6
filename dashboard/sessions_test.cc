// SessionStore: random ids that map to their identity until they expire, logout, and the bound.
#include "dashboard/sessions.h"

#include <string>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace zeroshard::dashboard {
namespace {

security::Identity Viewer(const std::string& name) {
  return security::Identity{name, security::Role::kViewer};
}

TEST(SessionStoreTest, AnIdFindsItsIdentityUntilItExpiresOrLogsOut) {
  common::FakeClock clock;
  SessionStore sessions(&clock, SessionOptions{absl::Hours(1), 16});
  const std::string alice = sessions.Create(Viewer("alice"));
  const std::string bob = sessions.Create(Viewer("bob"));
  EXPECT_EQ(alice.size(), 64u);
  EXPECT_NE(alice, bob);
  ASSERT_TRUE(sessions.Find(alice).has_value());
  EXPECT_EQ(sessions.Find(alice)->name, "alice");
  EXPECT_EQ(sessions.Find(bob)->name, "bob");
  // A forged id (another id's characters changed) finds nothing.
  std::string forged = alice;
  forged[0] = forged[0] == 'a' ? 'b' : 'a';
  EXPECT_FALSE(sessions.Find(forged).has_value());
  EXPECT_FALSE(sessions.Find("").has_value());

  sessions.Remove(bob);
  EXPECT_FALSE(sessions.Find(bob).has_value());
  clock.Advance(absl::Minutes(59));
  EXPECT_TRUE(sessions.Find(alice).has_value());
  clock.Advance(absl::Minutes(1));
  EXPECT_FALSE(sessions.Find(alice).has_value());
  EXPECT_EQ(sessions.size(), 0u);
}

TEST(SessionStoreTest, PastTheBoundTheSessionThatExpiresFirstEnds) {
  common::FakeClock clock;
  SessionStore sessions(&clock, SessionOptions{absl::Hours(1), 3});
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(sessions.Create(Viewer("v")));
    clock.Advance(absl::Seconds(1));
  }
  const std::string newest = sessions.Create(Viewer("w"));
  EXPECT_EQ(sessions.size(), 3u);
  EXPECT_FALSE(sessions.Find(ids[0]).has_value());
  EXPECT_TRUE(sessions.Find(ids[1]).has_value());
  EXPECT_TRUE(sessions.Find(ids[2]).has_value());
  EXPECT_EQ(sessions.Find(newest)->name, "w");
}

}  // namespace
}  // namespace zeroshard::dashboard
