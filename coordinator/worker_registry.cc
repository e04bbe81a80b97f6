// Worker membership with leases.
#include "coordinator/worker_registry.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/log_escape.h"
#include "coordinator/ids.h"
#include "google/protobuf/util/time_util.h"

namespace zeroshard::coordinator {
namespace {

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

std::string DigestKey(const security::Sha256Digest& digest) {
  return std::string(digest.begin(), digest.end());
}

bool IsLive(const v1::WorkerInfo& info) {
  return info.state() == v1::IDLE || info.state() == v1::BUSY;
}

}  // namespace

WorkerRegistry::WorkerRegistry(LeaseOptions options) : options_(options) {}

const v1::WorkerInfo& WorkerRegistry::Register(const v1::RegisterWorkerRequest& request,
                                               absl::Time now) {
  return Add(next_number_++, request, now);
}

absl::StatusOr<v1::WorkerInfo*> WorkerRegistry::RegisterAs(const v1::RegisterWorkerRequest& request,
                                                           const std::string& worker_id,
                                                           absl::Time now) {
  const std::optional<int64_t> number = ParseWorkerId(worker_id);
  if (!number.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_id: ", worker_id, " is not a worker id"));
  }
  if (workers_.count(*number) > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker_id: ", worker_id, " is in use (or was, since this coordinator started)"));
  }
  SkipToNumber(*number + 1);
  return &Add(*number, request, now);
}

v1::WorkerInfo& WorkerRegistry::Add(int64_t number, const v1::RegisterWorkerRequest& request,
                                    absl::Time now) {
  Entry& entry = workers_[number];
  v1::WorkerInfo& info = entry.info;
  info.set_id(FormatWorkerId(number));
  info.set_name(request.name());
  info.set_host(request.host());
  info.set_device_kind(request.device_kind());
  info.set_device_memory_bytes(request.device_memory_bytes());
  info.set_memory_limit_bytes(request.memory_limit_bytes());
  *info.mutable_labels() = request.labels();
  info.set_attach_socket(request.attach_socket());
  info.set_state(v1::IDLE);
  *info.mutable_register_time() = ToTimestamp(now);
  *info.mutable_last_heartbeat_time() = ToTimestamp(now);
  info.mutable_assignment()->set_kind(v1::ASSIGNMENT_IDLE);
  entry.lease_end = now + options_.lease();
  number_by_id_[info.id()] = number;
  int64_t& live = live_number_by_name_.try_emplace(info.name(), number).first->second;
  live = std::max(live, number);
  return info;
}

void WorkerRegistry::DropLiveName(int64_t number, const v1::WorkerInfo& info) {
  auto it = live_number_by_name_.find(info.name());
  if (it == live_number_by_name_.end() || it->second != number) return;
  live_number_by_name_.erase(it);
}

const v1::WorkerInfo* WorkerRegistry::FindLiveByName(const std::string& name) const {
  auto it = live_number_by_name_.find(name);
  if (it == live_number_by_name_.end()) return nullptr;
  return &workers_.at(it->second).info;
}

absl::StatusOr<v1::WorkerInfo*> WorkerRegistry::Renew(const std::string& worker_id,
                                                      absl::Time now) {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end() || !IsLive(workers_[it->second].info)) {
    return absl::NotFoundError(absl::StrCat("worker_id: ", worker_id,
                                            " is not registered (or its lease ended); "
                                            "register again"));
  }
  Entry& entry = workers_[it->second];
  entry.lease_end = now + options_.lease();
  *entry.info.mutable_last_heartbeat_time() = ToTimestamp(now);
  return &entry.info;
}

absl::StatusOr<v1::WorkerInfo*> WorkerRegistry::Leave(const std::string& worker_id) {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("worker_id: ", worker_id, " is not registered"));
  }
  v1::WorkerInfo& info = workers_[it->second].info;
  if (IsLive(info)) DropLiveName(it->second, info);
  info.set_state(v1::LEFT);
  info.mutable_assignment()->Clear();
  info.mutable_assignment()->set_kind(v1::ASSIGNMENT_IDLE);
  return &info;
}

std::vector<std::string> WorkerRegistry::ExpireLeases(absl::Time now) {
  std::vector<std::string> expired;
  for (auto& [number, entry] : workers_) {
    if (IsLive(entry.info) && entry.lease_end < now) {
      DropLiveName(number, entry.info);
      entry.info.set_state(v1::DEAD);
      expired.push_back(entry.info.id());
    }
  }
  return expired;
}

v1::WorkerInfo* WorkerRegistry::FindLive(const std::string& worker_id) {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end()) return nullptr;
  v1::WorkerInfo& info = workers_[it->second].info;
  return IsLive(info) ? &info : nullptr;
}

const v1::WorkerInfo* WorkerRegistry::Find(const std::string& worker_id) const {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end()) return nullptr;
  return &workers_.at(it->second).info;
}

std::vector<const v1::WorkerInfo*> WorkerRegistry::IdleWorkers(v1::DeviceKind kind) const {
  std::vector<const v1::WorkerInfo*> idle;
  for (const auto& [number, entry] : workers_) {
    if (entry.info.state() == v1::IDLE && entry.info.device_kind() == kind &&
        entry.info.assignment().kind() != v1::ASSIGNMENT_ABORT) {
      idle.push_back(&entry.info);
    }
  }
  return idle;
}

absl::flat_hash_map<std::string, const v1::WorkerInfo*> WorkerRegistry::LiveWorkersByName() const {
  absl::flat_hash_map<std::string, const v1::WorkerInfo*> by_name;
  // Numbers ascend, so a later entry of a name is the newer one.
  for (const auto& [number, entry] : workers_) {
    if (IsLive(entry.info)) by_name[entry.info.name()] = &entry.info;
  }
  return by_name;
}

std::vector<const v1::WorkerInfo*> WorkerRegistry::List(v1::WorkerState state) const {
  return ListAfter(state, std::numeric_limits<int64_t>::min());
}

std::vector<const v1::WorkerInfo*> WorkerRegistry::ListAfter(v1::WorkerState state,
                                                             int64_t after_number) const {
  std::vector<const v1::WorkerInfo*> out;
  for (auto it = workers_.upper_bound(after_number); it != workers_.end(); ++it) {
    const v1::WorkerInfo& info = it->second.info;
    if (state == v1::WORKER_STATE_UNSPECIFIED || info.state() == state) out.push_back(&info);
  }
  return out;
}

void WorkerRegistry::Assign(v1::WorkerInfo& worker, const v1::Assignment& assignment) {
  *worker.mutable_assignment() = assignment;
  if (IsLive(worker)) {
    worker.set_state(assignment.kind() == v1::ASSIGNMENT_RUN ? v1::BUSY : v1::IDLE);
  }
}

void WorkerRegistry::UseNumberBlock(int64_t first, int64_t count) {
  SkipToNumber(first);
  reserved_end_ = first + count;
}

std::string WorkerRegistry::NewSecret(const std::string& worker_id) {
  std::string secret = security::RandomSecret();
  SetSecret(worker_id, security::Sha256(secret));
  return secret;
}

absl::Status WorkerRegistry::CheckSecret(const std::string& worker_id,
                                         absl::string_view secret) const {
  if (Find(worker_id) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("worker_id: ", common::EscapeForLog(worker_id.substr(0, 64)),
                     " is not registered; register again"));
  }
  if (!SecretMatches(worker_id, secret)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker secret: not the one RegisterWorker gave worker_id ",
        common::EscapeForLog(worker_id.substr(0, 64)), " (or that registration was replaced)"));
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckSecretRuns(absl::string_view secret, const std::string& job_id,
                                             int64_t generation) const {
  const v1::WorkerInfo* worker = FindBySecret(secret);
  if (worker == nullptr) {
    return absl::NotFoundError("worker secret: not one RegisterWorker gave a current registration");
  }
  const v1::Assignment& assignment = worker->assignment();
  if (worker->state() != v1::BUSY || assignment.kind() != v1::ASSIGNMENT_RUN ||
      assignment.job_id() != job_id || assignment.generation() != generation) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", worker->id(), " is not assigned to ", common::EscapeForLog(job_id.substr(0, 64)),
        " generation ", generation, ", so it may not use that generation's store"));
  }
  return absl::OkStatus();
}

void WorkerRegistry::SetSecret(const std::string& worker_id, const security::Sha256Digest& digest) {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end()) return;
  RevokeSecret(worker_id);
  workers_[it->second].secret_digest = digest;
  number_by_secret_digest_[DigestKey(digest)] = it->second;
}

void WorkerRegistry::RevokeSecret(const std::string& worker_id) {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end()) return;
  std::optional<security::Sha256Digest>& digest = workers_[it->second].secret_digest;
  if (!digest.has_value()) return;
  number_by_secret_digest_.erase(DigestKey(*digest));
  digest.reset();
}

bool WorkerRegistry::SecretMatches(const std::string& worker_id, absl::string_view secret) const {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end()) return false;
  const std::optional<security::Sha256Digest>& digest = workers_.at(it->second).secret_digest;
  // Digests are compared, never the secret itself, so the comparison's timing tells nothing.
  return digest.has_value() && *digest == security::Sha256(secret);
}

const v1::WorkerInfo* WorkerRegistry::FindBySecret(absl::string_view secret) const {
  auto it = number_by_secret_digest_.find(DigestKey(security::Sha256(secret)));
  if (it == number_by_secret_digest_.end()) return nullptr;
  return &workers_.at(it->second).info;
}

std::optional<security::Sha256Digest> WorkerRegistry::SecretDigest(
    const std::string& worker_id) const {
  auto it = number_by_id_.find(worker_id);
  if (it == number_by_id_.end()) return std::nullopt;
  return workers_.at(it->second).secret_digest;
}

void WorkerRegistry::ForgetGone(absl::Time horizon) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    const v1::WorkerInfo& info = it->second.info;
    if (!IsLive(info) && it->second.lease_end < horizon) {
      if (it->second.secret_digest.has_value()) {
        number_by_secret_digest_.erase(DigestKey(*it->second.secret_digest));
      }
      number_by_id_.erase(info.id());
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace zeroshard::coordinator
