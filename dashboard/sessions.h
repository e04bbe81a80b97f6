// The dashboard's login sessions: a random id (the zeroshard_session cookie) mapped to the
// identity whose token logged in, until it expires. The cookie never holds the token.
#ifndef ZEROSHARD_DASHBOARD_SESSIONS_H_
#define ZEROSHARD_DASHBOARD_SESSIONS_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "security/identity.h"

namespace zeroshard::dashboard {

struct SessionOptions {
  // A session ends this long after its login (flag-free: log in again).
  absl::Duration lifetime = absl::Hours(12);
  // Sessions held at most; a login past it ends the session that would expire first, so a flood
  // of logins costs bounded memory (and can only log out other sessions, never let anyone in).
  size_t max_sessions = 1024;
};

// Thread-safe (one mutex; every call is short): the HTTP thread logs in, looks up and logs out.
class SessionStore {
 public:
  // `clock` (not owned) outlives the store.
  explicit SessionStore(common::Clock* clock, SessionOptions options = {});

  // A new session for `identity`; returns its id: 256 random bits (OpenSSL's generator) as 64
  // hex characters. Only its SHA-256 is kept, so the lookup's timing says nothing of the id.
  std::string Create(const security::Identity& identity) ABSL_LOCKS_EXCLUDED(mu_);
  // The identity of the session `id` while it has not expired; nullopt for an unknown, ended or
  // expired one (an expired one is dropped).
  std::optional<security::Identity> Find(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the session (logout); an unknown id is ignored.
  void Remove(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  // Sessions held, expired ones not yet dropped included.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  const SessionOptions& options() const { return options_; }

 private:
  struct Session {
    security::Identity identity;
    absl::Time expires;
  };
  // Drops the expired sessions, then while at the bound the one that expires first.
  void MakeRoomLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  common::Clock* const clock_;
  const SessionOptions options_;
  mutable absl::Mutex mu_;
  // SHA-256 (hex) of the session id -> session.
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::dashboard

#endif  // ZEROSHARD_DASHBOARD_SESSIONS_H_
