// Login sessions kept by the SHA-256 of their random ids, bounded in count and lifetime.
#include "dashboard/sessions.h"

#include <utility>

namespace zeroshard::dashboard {

SessionStore::SessionStore(common::Clock* clock, SessionOptions options)
    : clock_(clock), options_(options) {}

std::string SessionStore::Create(const security::Identity& identity) {
  std::string id = security::RandomSecret();
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  MakeRoomLocked(now);
  sessions_[security::Sha256Hex(id)] = Session{identity, now + options_.lifetime};
  return id;
}

std::optional<security::Identity> SessionStore::Find(absl::string_view id) {
  const std::string key = security::Sha256Hex(id);
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  const auto it = sessions_.find(key);
  if (it == sessions_.end()) return std::nullopt;
  if (it->second.expires <= now) {
    sessions_.erase(it);
    return std::nullopt;
  }
  return it->second.identity;
}

void SessionStore::Remove(absl::string_view id) {
  const std::string key = security::Sha256Hex(id);
  absl::MutexLock lock(&mu_);
  sessions_.erase(key);
}

size_t SessionStore::size() const {
  absl::MutexLock lock(&mu_);
  return sessions_.size();
}

void SessionStore::MakeRoomLocked(absl::Time now) {
  if (sessions_.size() < options_.max_sessions) return;
  absl::erase_if(sessions_, [now](const auto& entry) { return entry.second.expires <= now; });
  while (!sessions_.empty() && sessions_.size() >= options_.max_sessions) {
    auto first = sessions_.begin();
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->second.expires < first->second.expires) first = it;
    }
    sessions_.erase(first);
  }
}

}  // namespace zeroshard::dashboard
