// Worker membership: registration, leases renewed by heartbeats, expiry, and each worker's
// desired assignment (level-triggered: repeated on every heartbeat reply).
#ifndef ZEROSHARD_COORDINATOR_WORKER_REGISTRY_H_
#define ZEROSHARD_COORDINATOR_WORKER_REGISTRY_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "security/identity.h"
#include "zeroshard/v1/coordinator.pb.h"
#include "zeroshard/v1/worker.pb.h"

namespace zeroshard::coordinator {

struct LeaseOptions {
  absl::Duration heartbeat_period = absl::Seconds(1);
  // A worker is dead after this many periods without a heartbeat.
  int missed_heartbeats = 3;
  absl::Duration lease() const { return heartbeat_period * missed_heartbeats; }
};

// The workers the coordinator knows. Not thread-safe: its owner (JobManager) serializes access.
// Membership is soft state: nothing here is persisted.
class WorkerRegistry {
 public:
  explicit WorkerRegistry(LeaseOptions options);

  const LeaseOptions& options() const { return options_; }

  // Registers a new worker (a re-registering worker gets a new id) with a lease from `now`.
  // The request must be validated already. The WorkerInfo takes the request's fields (name,
  // host, device, labels, attach_socket), so each registration states them afresh.
  const v1::WorkerInfo& Register(const v1::RegisterWorkerRequest& request, absl::Time now);
  // Registers a worker under `worker_id`, the id an earlier coordinator gave it (adoption after a
  // restart), with a lease from `now`. FAILED_PRECONDITION when this registry knows the id
  // already (live, dead or departed), INVALID_ARGUMENT when it is not a worker id. New ids
  // continue above it, so none can collide with it.
  absl::StatusOr<v1::WorkerInfo*> RegisterAs(const v1::RegisterWorkerRequest& request,
                                             const std::string& worker_id, absl::Time now);

  // The number the next registered worker's id gets; numbers only grow.
  int64_t next_number() const { return next_number_; }
  // Continues numbering at `number` (ignored unless it is above next_number()).
  void SkipToNumber(int64_t number) { next_number_ = std::max(next_number_, number); }
  // Worker ids never repeat across coordinator restarts: the owner reserves blocks of numbers in
  // its durable store and the registry numbers within them. Whether next_number() lies outside
  // every block reserved so far (then the owner reserves one before registering).
  bool NeedsNumberBlock() const { return next_number_ >= reserved_end_; }
  // Numbers from the reserved block [first, first + count) from now on.
  void UseNumberBlock(int64_t first, int64_t count);

  // Renews the lease of a live worker. NOT_FOUND for unknown, dead or departed ids (the worker
  // must register again).
  absl::StatusOr<v1::WorkerInfo*> Renew(const std::string& worker_id, absl::Time now);

  // Marks a worker departed. NOT_FOUND for unknown ids.
  absl::StatusOr<v1::WorkerInfo*> Leave(const std::string& worker_id);

  // Marks every live worker whose lease ended before `now` dead and returns their ids.
  std::vector<std::string> ExpireLeases(absl::Time now);

  // A live (IDLE or BUSY) worker, or nullptr.
  v1::WorkerInfo* FindLive(const std::string& worker_id);
  const v1::WorkerInfo* Find(const std::string& worker_id) const;

  // Idle workers of `kind`, in registration order.
  std::vector<const v1::WorkerInfo*> IdleWorkers(v1::DeviceKind kind) const;

  // The live worker of each name. Where live workers share a name (a restarted worker registered
  // again before its old lease ended), the one with the newest (highest) id.
  absl::flat_hash_map<std::string, const v1::WorkerInfo*> LiveWorkersByName() const;
  // The live worker named `name`, or nullptr. (JobManager refuses a second live registration of
  // a name, so there is at most one.)
  const v1::WorkerInfo* FindLiveByName(const std::string& name) const;

  // Workers (optionally only those in `state`), in registration order.
  std::vector<const v1::WorkerInfo*> List(v1::WorkerState state) const;
  // The same, only those whose number (in their id) is above `after_number`.
  std::vector<const v1::WorkerInfo*> ListAfter(v1::WorkerState state, int64_t after_number) const;

  // Sets a worker's assignment and the state that follows from it (RUN -> BUSY, else IDLE).
  void Assign(v1::WorkerInfo& worker, const v1::Assignment& assignment);

  // Worker secrets (docs/api.md, "Identities and roles"): only their SHA-256 is kept. Setting a
  // worker's secret replaces the one it had; a worker's secret goes with the worker.
  void SetSecret(const std::string& worker_id, const security::Sha256Digest& digest);
  // Gives the worker a new random secret (replacing its old one) and returns it; the caller hands
  // it to the worker, which proves itself with it from then on.
  std::string NewSecret(const std::string& worker_id);
  // The worker's secret stops working (it registered again under another id).
  void RevokeSecret(const std::string& worker_id);
  // Whether `secret` is the secret of `worker_id` (known, live or not).
  bool SecretMatches(const std::string& worker_id, absl::string_view secret) const;
  // OK when `secret` is the secret of the registered worker `worker_id`; NOT_FOUND when no
  // registration has that id (it registers again), PERMISSION_DENIED when the secret is not its.
  absl::Status CheckSecret(const std::string& worker_id, absl::string_view secret) const;
  // OK when `secret` is the secret of a worker that runs (RUN, BUSY) `generation` of `job_id`;
  // NOT_FOUND when no registration has that secret, PERMISSION_DENIED when its worker runs
  // something else.
  absl::Status CheckSecretRuns(absl::string_view secret, const std::string& job_id,
                               int64_t generation) const;
  // The worker whose secret `secret` is, or nullptr.
  const v1::WorkerInfo* FindBySecret(absl::string_view secret) const;
  // The SHA-256 of the worker's secret; nullopt for unknown ids and workers without one.
  std::optional<security::Sha256Digest> SecretDigest(const std::string& worker_id) const;

  // Forgets dead and departed workers whose lease ended (last heartbeat + lease) before
  // `horizon`; a dead worker died when its lease ended.
  void ForgetGone(absl::Time horizon);

 private:
  struct Entry {
    v1::WorkerInfo info;
    absl::Time lease_end;
    // The SHA-256 of its secret, once set.
    std::optional<security::Sha256Digest> secret_digest;
  };

  // Adds a live, idle worker numbered `number` (not in use).
  v1::WorkerInfo& Add(int64_t number, const v1::RegisterWorkerRequest& request, absl::Time now);

  LeaseOptions options_;
  int64_t next_number_ = 1;
  // Numbers below this lie in a block reserved by the owner (UseNumberBlock).
  int64_t reserved_end_ = 0;
  // Ordered by registration number, so listings and scheduling are deterministic.
  std::map<int64_t, Entry> workers_;
  absl::flat_hash_map<std::string, int64_t> number_by_id_;
  // Marks the worker no longer live (DEAD or LEFT) in the name index.
  void DropLiveName(int64_t number, const v1::WorkerInfo& info);

  // The newest live worker's number by name: kept by Add, Leave and ExpireLeases.
  absl::flat_hash_map<std::string, int64_t> live_number_by_name_;
  // Worker number by secret digest, for the secrets set.
  absl::flat_hash_map<std::string, int64_t> number_by_secret_digest_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_WORKER_REGISTRY_H_
