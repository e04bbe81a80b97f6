// The dashboard's login sessions: a random id (the zeroshard_session cookie) mapped to the
// identity whose token logged in, until it expires, its token is revoked or its identity logs in
// too often. The cookie never holds the token.
#ifndef ZEROSHARD_DASHBOARD_SESSIONS_H_
#define ZEROSHARD_DASHBOARD_SESSIONS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
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
  // Sessions held at most; a login past it ends the oldest session of the identity that holds
  // the most, so a flood of logins costs bounded memory and ends only the flooder's sessions
  // (unless more than max_sessions / max_sessions_per_identity identities hold sessions).
  size_t max_sessions = 1024;
  // Sessions one identity (name and role) holds at most, at least 1; its next login ends its
  // own oldest session, never another identity's.
  size_t max_sessions_per_identity = 16;
};

// Thread-safe (one mutex; every call is short): the HTTP thread logs in, looks up and logs out.
class SessionStore {
 public:
  // `clock` (not owned) outlives the store.
  explicit SessionStore(common::Clock* clock, SessionOptions options = {});

  // A new session for `identity`, logged in with `credential` (security::Authenticator's name
  // for the token, so that a reload can tell whether it was revoked); returns its id: 256 random
  // bits (OpenSSL's generator) as 64 hex characters. Only its SHA-256 is kept, so the lookup's
  // timing says nothing of the id.
  std::string Create(const security::Identity& identity, std::string credential = "")
      ABSL_LOCKS_EXCLUDED(mu_);
  // The identity of the session `id` while it has not expired; nullopt for an unknown, ended or
  // expired one (an expired one is dropped). With `credential`, sets it to the session's.
  std::optional<security::Identity> Find(absl::string_view id, std::string* credential = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the session (logout); an unknown id is ignored.
  void Remove(absl::string_view id) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends every session for which `revoked(identity, credential)` is true (their tokens left the
  // token file at a reload); returns how many. `revoked` runs with the store's lock held.
  size_t RemoveRevoked(
      const std::function<bool(const security::Identity&, const std::string&)>& revoked)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Sessions held, expired ones not yet dropped included.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  const SessionOptions& options() const { return options_; }

 private:
  struct Session {
    security::Identity identity;
    std::string credential;
    absl::Time expires;
    // Order of creation: the smallest of an identity's is its oldest.
    uint64_t serial = 0;
  };
  // Makes room for one more session of `identity`: past its own bound its oldest ends; past
  // the store's, the expired ones, then the oldest of the identity holding the most.
  void MakeRoomLocked(absl::Time now, const std::string& identity)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the session whose id hashes to `key`, in both maps.
  void EraseLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  common::Clock* const clock_;
  const SessionOptions options_;
  mutable absl::Mutex mu_;
  // SHA-256 (hex) of the session id -> session.
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(mu_);
  // Identity key (IdentityKey) -> serial -> SHA-256 of the id: the same sessions as sessions_,
  // each identity's oldest first. An identity without sessions has no entry.
  absl::flat_hash_map<std::string, std::map<uint64_t, std::string>> by_identity_
      ABSL_GUARDED_BY(mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace zeroshard::dashboard

#endif  // ZEROSHARD_DASHBOARD_SESSIONS_H_
