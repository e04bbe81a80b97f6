// Login sessions kept by the SHA-256 of their random ids, bounded in count (in all and per
// identity) and lifetime.
#include "dashboard/sessions.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace zeroshard::dashboard {
namespace {

// Sessions are counted per name and role: a viewer and an admin of one name are two identities.
std::string IdentityKey(const security::Identity& identity) {
  return absl::StrCat(security::RoleName(identity.role), ":", identity.name);
}

}  // namespace

SessionStore::SessionStore(common::Clock* clock, SessionOptions options)
    : clock_(clock), options_(options) {}

std::string SessionStore::Create(const security::Identity& identity, std::string credential) {
  std::string id = security::RandomSecret();
  const std::string key = security::Sha256Hex(id);
  const std::string identity_key = IdentityKey(identity);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  MakeRoomLocked(now, identity_key);
  const uint64_t serial = next_serial_++;
  sessions_[key] = Session{identity, std::move(credential), now + options_.lifetime, serial};
  by_identity_[identity_key][serial] = key;
  return id;
}

std::optional<security::Identity> SessionStore::Find(absl::string_view id,
                                                     std::string* credential) {
  const std::string key = security::Sha256Hex(id);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  const auto it = sessions_.find(key);
  if (it == sessions_.end()) return std::nullopt;
  if (it->second.expires <= now) {
    EraseLocked(key);
    return std::nullopt;
  }
  if (credential != nullptr) *credential = it->second.credential;
  return it->second.identity;
}

void SessionStore::Remove(absl::string_view id) {
  const std::string key = security::Sha256Hex(id);
  absl::MutexLock lock(&mu_);
  EraseLocked(key);
}

size_t SessionStore::RemoveRevoked(
    const std::function<bool(const security::Identity&, const std::string&)>& revoked) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ended;
  for (const auto& [key, session] : sessions_) {
    if (revoked(session.identity, session.credential)) ended.push_back(key);
  }
  for (const std::string& key : ended) EraseLocked(key);
  return ended.size();
}

size_t SessionStore::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionStore::EraseLocked(const std::string& key) {
  const auto it = sessions_.find(key);
  if (it == sessions_.end()) return;
  const auto own = by_identity_.find(IdentityKey(it->second.identity));
  if (own != by_identity_.end()) {
    own->second.erase(it->second.serial);
    if (own->second.empty()) by_identity_.erase(own);
  }
  sessions_.erase(it);
}

void SessionStore::MakeRoomLocked(absl::Time now, const std::string& identity) {
  const size_t per_identity = std::max<size_t>(1, options_.max_sessions_per_identity);
  if (const auto own = by_identity_.find(identity); own != by_identity_.end()) {
    while (own->second.size() >= per_identity) {
      // Erasing the last one would erase `own` too, so loop only while some remain after it.
      const bool last = own->second.size() == 1;
      EraseLocked(own->second.begin()->second);
      if (last) break;
    }
  }
  if (sessions_.size() < options_.max_sessions) return;
  std::vector<std::string> expired;
  for (const auto& [key, session] : sessions_) {
    if (session.expires <= now) expired.push_back(key);
  }
  for (const std::string& key : expired) EraseLocked(key);
  while (!sessions_.empty() && sessions_.size() >= options_.max_sessions) {
    // The identity holding the most; on a tie the one logging in, so nobody else loses one.
    auto most = by_identity_.end();
    for (auto it = by_identity_.begin(); it != by_identity_.end(); ++it) {
      if (most == by_identity_.end() || it->second.size() > most->second.size() ||
          (it->second.size() == most->second.size() && it->first == identity)) {
        most = it;
      }
    }
    EraseLocked(most->second.begin()->second);
  }
}

}  // namespace zeroshard::dashboard
