// Durable job state in SQLite (WAL): jobs with their specs and state, their event histories, the
// RUN assignment of each job's current generation, checkpoint commits, and who holds each worker
// name. Survives kill -9 of the coordinator.
#ifndef ZEROSHARD_COORDINATOR_JOB_STORE_H_
#define ZEROSHARD_COORDINATOR_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "security/identity.h"
#include "zeroshard/v1/coordinator.pb.h"
#include "zeroshard/v1/job.pb.h"
#include "zeroshard/v1/worker.pb.h"

struct sqlite3;

namespace zeroshard::coordinator {

// Who holds one rank of a running generation, kept so that a restarted coordinator adopts the
// rank only from the worker that held it: the holder proves it with the secret whose SHA-256 this
// is (docs/api.md, "Identities and roles"). Only the digest is stored, never the secret.
struct RankIdentity {
  std::string job_id;
  int64_t generation = 0;
  int32_t rank = 0;
  std::string worker_id;
  std::string worker_name;
  security::Sha256Digest secret_sha256{};
};

// Who holds a worker name (docs/api.md, "Identities and roles"): the registration that last took
// it, proved by the secret whose SHA-256 this is. Kept so that a restarted coordinator, whose
// membership is soft state, still gives a known name only to its holder (or, past
// --dead_worker_retention, to anyone). Only the digest is stored, never the secret.
struct WorkerNameHolder {
  std::string name;
  std::string worker_id;
  security::Sha256Digest secret_sha256{};
};

// Not thread-safe: the owner (JobManager) serializes calls. Every Save* is one transaction,
// committed with synchronous=FULL before it returns.
class JobStore {
 public:
  // Opens (creating if needed) `state_dir`/zeroshard.db.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& state_dir);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  // Writes the jobs (insert or replace), appends the events, writes each job's current
  // generation's RUN assignment (insert or replace, keyed by its job_id) and its rank identities
  // (insert or replace, keyed by job and rank; a job's rows of other generations are deleted),
  // atomically.
  absl::Status Save(absl::Span<const v1::Job* const> jobs, absl::Span<const v1::JobEvent> events,
                    absl::Span<const v1::Assignment* const> run_assignments = {},
                    absl::Span<const RankIdentity> rank_identities = {});

  // Reserves `count` worker numbers that no earlier call (in this or an earlier coordinator
  // process) returned, and returns the first of them: [first, first + count). Worker ids must
  // not repeat across restarts, or a stale worker's heartbeat would pass for a new worker's.
  absl::StatusOr<int64_t> ReserveWorkerNumbers(int64_t count);

  // Writes the name holders (insert or replace, keyed by name) and deletes the names in
  // `forgotten`, atomically.
  absl::Status SaveWorkerNames(absl::Span<const WorkerNameHolder> holders,
                               absl::Span<const std::string> forgotten = {});
  // Every stored name holder, by name.
  absl::StatusOr<std::vector<WorkerNameHolder>> LoadWorkerNames();

  // Every job, in id order.
  absl::StatusOr<std::vector<v1::Job>> LoadJobs();
  // A job's events after `after_sequence` in sequence order, at most `limit` of them (-1: all).
  // Watchers page through a long history with it, keyed by sequence.
  absl::StatusOr<std::vector<v1::JobEvent>> LoadEvents(const std::string& job_id,
                                                       int64_t after_sequence = 0,
                                                       int64_t limit = -1);
  struct EventCount {
    // Events stored for the job.
    int64_t events = 0;
    // The highest sequence stored (0 when none is).
    int64_t last_sequence = 0;
  };
  absl::StatusOr<EventCount> CountEvents(const std::string& job_id);
  // One thinning pass over the job's stored events: of the PROGRESS events among the oldest
  // half (the first count/2 by sequence), deletes every second one (the 2nd, 4th, ...). Every
  // other event type is kept. Returns how many events it deleted.
  absl::StatusOr<int64_t> ThinProgressEvents(const std::string& job_id);
  // The last RUN assignment saved for each job (a restarted coordinator adopts a running
  // generation with it), in job id order.
  absl::StatusOr<std::vector<v1::Assignment>> LoadRunAssignments();
  // Every stored rank identity, by job id, then rank.
  absl::StatusOr<std::vector<RankIdentity>> LoadRankIdentities();

  // Records one rank's checkpoint commit (idempotent per job, generation, step and rank).
  absl::Status SaveCheckpointCommit(const v1::CommitCheckpointRequest& commit);
  // The ranks that committed `step` of `generation`.
  absl::StatusOr<std::vector<v1::CommitCheckpointRequest>> LoadCheckpointCommits(
      const std::string& job_id, int64_t generation, int64_t step);
  // Forgets the commits of `generation`'s steps at or after `from_step` (the job went back: those
  // steps will be checkpointed again, and an old commit must not complete a new checkpoint).
  // Returns how many it deleted.
  absl::StatusOr<int64_t> DeleteCheckpointCommits(const std::string& job_id, int64_t generation,
                                                  int64_t from_step);

 private:
  explicit JobStore(sqlite3* db);
  absl::Status Exec(const char* sql);
  // Commits the open transaction; on failure rolls it back if it is still open.
  absl::Status Commit();

  sqlite3* db_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_JOB_STORE_H_
