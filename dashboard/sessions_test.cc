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

// Issue 25, item 4: one identity's logins end only its own sessions (before, past the bound the
// session that expired first ended, whoever's it was: here the admin's).
TEST(SessionStoreTest, OneIdentityPastItsCapEndsOnlyItsOwnOldest) {
  common::FakeClock clock;
  SessionStore sessions(&clock, SessionOptions{absl::Hours(1), 8, 3});
  const std::string admin = sessions.Create(security::Identity{"ada", security::Role::kAdmin});
  clock.Advance(absl::Seconds(1));
  std::vector<std::string> viewer;
  for (int i = 0; i < 20; ++i) viewer.push_back(sessions.Create(Viewer("vera")));
  EXPECT_EQ(sessions.size(), 4u);
  EXPECT_TRUE(sessions.Find(admin).has_value());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(sessions.Find(viewer[i]).has_value(), i >= 17) << i;
  // The same name with another role is another identity.
  const std::string vera_admin =
      sessions.Create(security::Identity{"vera", security::Role::kAdmin});
  EXPECT_TRUE(sessions.Find(viewer[17]).has_value());
  EXPECT_TRUE(sessions.Find(vera_admin).has_value());

  // Past the store's bound, the identity holding the most loses its oldest.
  std::vector<std::string> others;
  for (const char* name : {"a", "b", "c"}) others.push_back(sessions.Create(Viewer(name)));
  EXPECT_EQ(sessions.size(), 8u);
  const std::string last = sessions.Create(Viewer("d"));
  EXPECT_EQ(sessions.size(), 8u);
  EXPECT_FALSE(sessions.Find(viewer[17]).has_value());
  EXPECT_TRUE(sessions.Find(admin).has_value());
  EXPECT_TRUE(sessions.Find(last).has_value());
  for (const std::string& other : others) EXPECT_TRUE(sessions.Find(other).has_value());
}

TEST(SessionStoreTest, RemoveRevokedEndsTheSessionsItNames) {
  common::FakeClock clock;
  SessionStore sessions(&clock);
  const std::string kept = sessions.Create(Viewer("vera"), "token:kept");
  const std::string revoked = sessions.Create(Viewer("vera"), "token:gone");
  std::string credential;
  ASSERT_TRUE(sessions.Find(revoked, &credential).has_value());
  EXPECT_EQ(credential, "token:gone");
  EXPECT_EQ(sessions.RemoveRevoked([](const security::Identity&, const std::string& used) {
    return used == "token:gone";
  }),
            1u);
  EXPECT_FALSE(sessions.Find(revoked).has_value());
  EXPECT_TRUE(sessions.Find(kept).has_value());
  EXPECT_EQ(sessions.size(), 1u);
}

}  // namespace
}  // namespace zeroshard::dashboard
