// The life of every job and the membership it runs on: submission, gang scheduling into
// generations, level-triggered worker assignments, progress, cancellation, lost workers and
// restarts, with every job change written to the durable JobStore before it is acknowledged.
#ifndef ZEROSHARD_COORDINATOR_JOB_MANAGER_H_
#define ZEROSHARD_COORDINATOR_JOB_MANAGER_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpoint/directory.h"
#include "checkpoint/export.h"
#include "checkpoint/manifest.h"
#include "common/clock.h"
#include "coordinator/checkpoint_committer.h"
#include "coordinator/checkpoint_dir_claims.h"
#include "coordinator/ids.h"
#include "coordinator/job_event_log.h"
#include "coordinator/job_store.h"
#include "coordinator/recovery_rules.h"
#include "coordinator/rendezvous_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/worker_registry.h"
#include "sharding/shard_planner.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

struct JobManagerOptions {
  LeaseOptions lease;
  SchedulerOptions scheduler;
  // Dead and departed workers are listed for this long after their lease ended, then forgotten
  // (--dead_worker_retention); their names are held for them as long (see "Identities").
  absl::Duration forget_gone_workers_after = absl::Minutes(10);
  // The checkpoint root the workers write into (a directory the coordinator sees too): a
  // checkpoint is committed by writing its manifest here once every rank committed its file.
  // Empty: checkpoints cannot be committed (CommitCheckpoint refuses WRITTEN commits).
  std::string checkpoint_root;
  // Tests only: sees every file-system operation on the checkpoint root (checkpoint/directory.h,
  // StorageHooks; checkpoint/test_storage_hooks.h holds one that blocks or fails them), e.g. to
  // hold a commit in its manifest write while a heartbeat is answered. Null in production.
  std::shared_ptr<checkpoint::StorageHooks> storage_hooks_for_testing;
  // After a restart, how long a generation that was running waits for its workers to
  // re-register and be adopted. Unset: 2 leases (a worker notices the restart on its next
  // heartbeat, within one period, and re-registers at once).
  std::optional<absl::Duration> adoption_window;
  absl::Duration AdoptionWindow() const { return adoption_window.value_or(2 * lease.lease()); }
  // After a lost worker ended a generation, how long the job's next generation waits at most
  // for the generation's survivors to come back (see "Regrouping" in JobManager). Unset: one
  // heartbeat period (survivors abort their runs in-process and heartbeat at once: they are back
  // within a few hundred milliseconds).
  std::optional<absl::Duration> regroup_wait;
  absl::Duration RegroupWait() const { return regroup_wait.value_or(lease.heartbeat_period); }
  // Events stored per job before old PROGRESS events are thinned: whenever a write takes a job
  // past it, JobStore::ThinProgressEvents deletes every second PROGRESS event of the oldest half
  // of its stored events. Every other event is kept. A job below it keeps every event. When a
  // pass leaves more than this (few PROGRESS events to thin), the next one waits until the job
  // has this/4 more events.
  int64_t max_events_per_job = 100000;
  // PENDING jobs one submitter may have at once (flag --max_pending_jobs_per_submitter); its
  // next SubmitJob gets RESOURCE_EXHAUSTED until one of them starts or ends.
  int64_t max_pending_jobs_per_submitter = 1000;
  // NOTICE events a generation's workers may add (ReportProgress notices, skipped or failed
  // checkpoint commits; flag --max_notices_per_generation). The one that reaches the bound is
  // replaced by a NOTICE saying so; later ones are only counted (Job.dropped_notices), and a
  // NOTICE when the generation ends says how many were dropped. Each stored NOTICE is a durable
  // (fsync'd) write, so a worker must not be able to add them without end.
  int64_t max_notices_per_generation = 100;
};

// Which part of a listing (JobManager::ListWorkersPage, ListJobs) to return.
struct PageRequest {
  // Continue after the item with this number (the number in its id); unset: the first page.
  std::optional<int64_t> after;
  int64_t max_items = std::numeric_limits<int64_t>::max();
  // The page ends before an item that would take the items' encoded size (plus a few bytes each
  // for framing) past this; it holds at least one item.
  size_t max_bytes = std::numeric_limits<size_t>::max();
};

// One page of a listing.
template <typename Item>
struct Page {
  std::vector<Item> items;
  // Set when more items follow: the number of the last item, to pass as PageRequest::after.
  std::optional<int64_t> next_after;
};

struct ManagerStats {
  absl::flat_hash_map<int, int64_t> workers_by_state;  // v1::WorkerState -> count
  absl::flat_hash_map<int, int64_t> jobs_by_state;     // v1::JobState -> count
  // Longest time since a live worker's last heartbeat.
  absl::Duration max_heartbeat_lag;
  // Watchers following a job (JobEventSinks held), over all jobs.
  int64_t watchers = 0;
};

// The job state machine. Every edge is in kJobStateEdges (coordinator/job_state_table.h), in this
// numbering; SetStateLocked refuses any other change with FAILED_PRECONDITION.
//
//                +------------------------------------------------------------+
//                |                         CANCELLED                          |
//                +------------------------------------------------------------+
//                      ^                         ^                         ^
//                    3 |                       7 |                      10 |
//                      |                         |                         |
//  SubmitJob --> +-----------+      1      +-----------+      5      +------------+
//                |  PENDING  |------------>|  RUNNING  |------------>| RECOVERING |
//                +-----------+             +-----------+<------------+------------+
//                      |                     | |  ^ |         8            |
//                    2 |                   6 | +--+ | 4                  9 |
//                      |                     |  11  v                      |
//                      |                     |  +-----------+              |
//                      |                     |  | SUCCEEDED |              |
//                      |                     |  +-----------+              |
//                      v                     v                             v
//                +------------------------------------------------------------+
//                |                           FAILED                           |
//                +------------------------------------------------------------+
//
// SubmitJob creates a job in PENDING; that is not a state change. SUCCEEDED, FAILED and
// CANCELLED are final: no edge leaves them.
//
// (1)  PENDING -> RUNNING: StartGenerationLocked (from ScheduleLocked), when the scheduler finds
//      enough idle workers of the job's device kind (an attached job: its pinned workers, see
//      "Attached jobs" below). Generation and attempts go up by one.
// (2)  PENDING -> FAILED: ScheduleLocked, when the shard plan for the chosen world size cannot
//      be built ("cannot plan: ..."), or an attached job's pinned worker cannot run its rank
//      ("cannot run on its pinned workers: ...").
// (3)  PENDING -> CANCELLED: CancelJob.
// (4)  RUNNING -> SUCCEEDED: ReportProgress, when every rank of the generation reported finished.
// (5)  RUNNING -> RECOVERING: EndGenerationLocked (from HandleLostWorkerLocked), when a rank's
//      worker is lost (Tick: lease expired; LeaveWorker; Heartbeat with a run_error for its
//      generation) and attempts < spec.max_attempts. Also, after a coordinator restart, Tick
//      when an adoption window ends with ranks missing ("coordinator restarted: ranks ... did
//      not come back"), and Create for a job stored RUNNING that cannot be adopted (no stored
//      RUN assignment of its generation, or its plan no longer has that layout hash).
// (6)  RUNNING -> FAILED: as (5), when attempts >= spec.max_attempts ("no attempts left").
// (7)  RUNNING -> CANCELLED: CancelJob, through EndGenerationLocked (the workers get ABORT).
// (8)  RECOVERING -> RUNNING: StartGenerationLocked (from ScheduleLocked), as (1): the next
//      generation, from the job's latest committed checkpoint (Assignment.resume_from), else
//      from step 0, once the job has regrouped (see "Regrouping" below).
// (9)  RECOVERING -> FAILED: ScheduleLocked, as (2).
// (10) RECOVERING -> CANCELLED: CancelJob.
// (11) RUNNING -> RUNNING: AdoptRankLocked (from RegisterWorker), when the last rank of a
//      generation being adopted is back ("generation G adopted after a coordinator restart").
//      Only an adopting job takes it: for any other job CheckStateEdgeLocked refuses it.
//
// Adoption. The coordinator is not in the data path: workers train on while it is down. Create
// keeps a job stored RUNNING as RUNNING, "adopting" (JobRecord::adoption, a NOTICE event says
// so), for options.adoption_window. A worker that re-registers presenting its previous id and a
// status naming (job, generation, rank) of that generation, where the job's worker_ids[rank] is
// that id and the id is free, gets the id back and the stored RUN assignment for its rank; once
// every rank is back, edge (11). Reports and checkpoint commits of an adopting generation are
// accepted as for any running one. When the window ends first, edge (5) or (6), and the ranks
// that came back get ABORT. Adopting is a flag rather than a JobState of its own because nothing
// about the job changes for its owner: it runs, at the same generation, throughout.
//
// Regrouping. The next generation forms from the survivors of the one that ended plus idle
// spares. The survivors come back IDLE one at a time (each aborts its run in-process; its daemon
// heartbeats at once when its run ended and again when it stopped it), and each return runs the
// scheduler, so a job that may run on fewer workers would start on the first one back. Instead,
// when edge (5) is taken from a running generation (EndGenerationLocked), the job remembers that
// generation's members (JobRecord::regroup) and the scheduler holds it back while any member is
// still awaited: live, still told to ABORT that generation, and named lost by no survivor's report
// (WorkerStatus.lost_peer_ranks in a heartbeat about that generation from one of its members;
// ranks map to workers through the generation's worker_ids). A member that is DEAD or LEFT, or
// was placed elsewhere, is not awaited either, so a worker lost without any report (its lease
// expired, it left) costs no wait. The wait ends at the latest options.RegroupWait() after the
// generation ended; then a NOTICE names the members still missing and the job starts without
// them. Meanwhile the members already back are held for the job (no job after it in the FIFO
// order gets them), and when it starts its former members are placed before any other idle
// worker. An attached job does not regroup: it waits for its pinned workers anyway. The regroup
// is not stored: after a coordinator restart a RECOVERING job starts on the workers idle then.
//
// Attached jobs (spec.workload.attached). Rank r runs on the live worker named
// attached.workers[r] (the newest id where live workers share a name), and its RUN assignment
// carries that worker's attach_socket. The job starts only when every one of those workers is
// IDLE; until then it stays PENDING (or RECOVERING), also while one of them is DEAD, LEFT or not
// registered at all, since a worker may register again under its name with a new id. It FAILS
// instead (edge 2 or 9) as soon as a pinned worker is live but cannot run its rank: registered
// without an attach_socket, or with another device kind. That would not change by waiting: a
// worker states both when it registers, and the trainer that submitted the job expects that
// daemon. A generation ends as any other's (a lost worker, a run_error, max_attempts apply), and
// the next one needs the same workers, by name, again. An attached job has no fixed step count
// (spec.steps 0): it SUCCEEDS when every rank reported finished.
//
// Identities. A worker's registration is bound to a secret (RegisterWorker's reply; only its
// SHA-256 is kept) and to its name: while a registration is live, another registration of its
// name is refused with ALREADY_EXISTS. A name, like a rank, is held by proof: once its holder is
// DEAD or LEFT, a registration of the name must present the holder's id (previous_worker_id) and
// secret, until the holder has been gone for --dead_worker_retention; only then is the name
// anyone's (CheckNameProofLocked). The holders are stored (JobStore::SaveWorkerNames) before the
// secret is handed out, so a restarted coordinator, which knows no live worker at first, holds
// every known name for its holder for a retention from its start: a worker token that wins the
// race after a restart gets no name a worker held before it (an unknown name is first come). A
// registration that names a previous_worker_id replaces that registration only with proof of being
// it (RegistrationProof: its secret, unless the caller acts for any worker); without proof it is
// registered as a new worker and the named one keeps its registration and secret. A generation's
// ranks are stored with their workers' names and secret digests (JobStore's RankIdentity), so that
// after a restart only the worker that held a rank, presenting that rank's secret, adopts it; while
// a generation is being adopted, the names of its ranks not back yet are reserved for them.
//
// Collaborators, called downward only: JobStore (durable state), JobEventLog (events, their
// sequence numbers and watchers), WorkerRegistry (membership, leases, secrets, id blocks), the
// pure rules of scheduler.h (placement) and recovery_rules.h (adoption, regrouping), and
// CheckpointCommitter (everything on the checkpoint root). The manager keeps the lock, the job
// records, the state machine and the orchestration between them.
//
// Thread-safe: every public method takes the one mutex, so each is atomic with respect to the
// others (CommitCheckpoint and RewindJob release it for their work on the checkpoint root, which
// runs under the job's volume mutex; see CheckpointCommitter). Inputs must already be validated for
// shape (coordinator/request_validation.h); the manager checks them against state (ids,
// generations, ranks) and validates job specs itself.
class JobManager {
 public:
  // Loads the durable state. Jobs that were RUNNING when the coordinator stopped are adopted
  // from their workers (see "Adoption" above) or, when that cannot be, end their generation as
  // a lost worker would (RECOVERING, or FAILED when out of attempts).
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(common::Clock* clock,
                                                            std::unique_ptr<JobStore> store,
                                                            RendezvousStore* rendezvous,
                                                            JobManagerOptions options);

  // Workers.
  // Registers a worker (see "Identities" above). ALREADY_EXISTS (naming the holder's id) when
  // another live registration holds the name, or a generation being adopted reserves it.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const RegistrationProof& proof = {});
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  absl::Status LeaveWorker(const std::string& worker_id);
  // Workers (only those in `state` unless it is unspecified), in registration order.
  std::vector<v1::WorkerInfo> ListWorkers(v1::WorkerState state);
  // One page of that listing.
  Page<v1::WorkerInfo> ListWorkersPage(v1::WorkerState state, const PageRequest& page);

  // Jobs.
  // `submitter` names who submitted it, for max_pending_jobs_per_submitter; empty: nobody
  // (in-process callers), not limited. INVALID_ARGUMENT ("checkpoint.dir: ...") when the spec's
  // checkpoint directory is, lies inside, or contains another job's (CheckpointDirClaims); the
  // message names that job only when `may_name_any_job` (an admin) or it has the same submitter.
  // With spec.resume_from, the named job's checkpoint is resolved now (ResolveResumeFrom) and
  // kept as job.resumed_from.
  absl::StatusOr<v1::Job> SubmitJob(const v1::JobSpec& spec, const std::string& submitter = "",
                                    bool may_name_any_job = true);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // The job `submitter` submitted with JobSpec.run_key `run_key`: an exact lookup. NOT_FOUND
  // naming the key when there is none (another submitter's job with the key is not found).
  absl::StatusOr<v1::Job> FindJobByRunKey(const std::string& submitter, const std::string& run_key);
  // Jobs (only those in `state` unless it is unspecified), newest first: a page after job N
  // holds jobs older than N.
  Page<v1::Job> ListJobs(v1::JobState state, const PageRequest& page);
  // With `only_submitter`, PERMISSION_DENIED unless the job's submitter is that name (a
  // submitter cancels only its own jobs).
  absl::StatusOr<v1::Job> CancelJob(
      const std::string& job_id, const std::string& reason,
      const std::optional<std::string>& only_submitter = std::nullopt);
  absl::StatusOr<v1::ShardPlan> GetShardPlan(const v1::GetShardPlanRequest& request);
  // Sends `sink` one page of the job's history: its durable events after `after_sequence`, at
  // most `max_events` of them, read from the store. When the page reaches the newest durable
  // event, the sink follows the job from then on, in the same step (under the lock, so no event
  // is missed or sent twice): it gets each new event, and OnJobEnded once the job has ended (at
  // once when it already has). Otherwise the caller asks for the next page after the last
  // sequence sent, so a watcher holds one page at a time, whatever the history's length. Sinks
  // get an event only once it is durable, so no watcher sees one that a coordinator restart
  // could lose (and whose sequence number the next coordinator would give to another).
  using WatchPosition = coordinator::WatchPosition;
  absl::StatusOr<WatchPosition> WatchPage(const std::string& job_id, int64_t after_sequence,
                                          int64_t max_events, std::shared_ptr<JobEventSink> sink);
  // WatchPage until the sink follows: the sink gets the whole history at once (for sinks that
  // keep it, such as tests'; the gRPC service pages).
  absl::Status Watch(const std::string& job_id, int64_t after_sequence,
                     std::shared_ptr<JobEventSink> sink);
  // Stops sending `sink` the job's events: its watcher went away. Without it a closed sink of a
  // quiet job stays held until the job's next event.
  void Unwatch(const std::string& job_id, const JobEventSink* sink);

  // Worker secrets (docs/api.md, "Identities and roles"); both PERMISSION_DENIED ("worker
  // secret: ...", never quoting the secret) when the secret does not fit.
  // OK when `secret` is the one RegisterWorker gave `worker_id`'s current registration, or the
  // one stored for `worker_id`'s rank of a generation being adopted that it has not re-registered
  // for yet (its calls go on meanwhile); NOT_FOUND when this coordinator knows no `worker_id`
  // otherwise (it restarted, or forgot the worker): the worker registers again, presenting its
  // id and secret.
  absl::Status CheckWorkerSecret(const std::string& worker_id, absl::string_view secret);
  // OK when `secret` belongs to a worker that runs (job_id, generation) now (or is stored for a
  // rank of that generation being adopted).
  absl::Status CheckStoreSecret(absl::string_view secret, const std::string& job_id,
                                int64_t generation);

  // From workers.
  // Within a generation each rank's metrics.step never goes down (an equal one is a resend and
  // changes nothing); a step past spec.steps is INVALID_ARGUMENT; `finished` needs the rank at
  // spec.steps (its report's step, its last one, or the step the generation resumed from; jobs
  // with steps 0, attached ones, have no such checks but monotonicity).
  absl::StatusOr<v1::ReportProgressResponse> ReportProgress(
      const v1::ReportProgressRequest& request);
  // Records a rank's commit; once every rank committed, writes the manifest and prunes outside
  // the lock (one job's commits at a time), then records the checkpoint under it.
  absl::StatusOr<v1::CommitCheckpointResponse> CommitCheckpoint(
      const v1::CommitCheckpointRequest& request) ABSL_LOCKS_EXCLUDED(mu_);

  // RewindJob (coordinator.proto): the job went back to request.step (an attached trainer loaded
  // a state). Checks the rank as CommitCheckpoint does, and the rewind's rules
  // (CheckRewindLocked: an attached job's rank 0, back to a step it reached), and forgets the
  // generation's commits from that step on (JobStore::DeleteCheckpointCommits: an old rank's commit
  // must not complete a new checkpoint); then, outside the lock under the job's volume lock,
  // retires (checkpoint::SupersedeCheckpoint, newest first) every committed checkpoint of the job
  // after the step, and the one at the step unless it is the checkpoint loaded (request's
  // loaded_job_id and loaded_checkpoint: job, step, generation and commit time); then the job's
  // latest checkpoint becomes the newest one left (or none), and its progress and every rank's
  // reported step go back to the step, so that the steps' reports are taken again; a NOTICE says
  // so (bounded as the workers' notices are). Without a checkpoint root nothing is retired. A
  // retirement that fails is returned as it is (the job keeps its older checkpoints; the ones
  // retired before stay retired, and the latest checkpoint is left as it was).
  absl::StatusOr<v1::RewindJobResponse> RewindJob(const v1::RewindJobRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Checkpoints, for people.
  // The committed checkpoint of the job at `step`, or without one its final checkpoint: the job
  // SUCCEEDED and its latest checkpoint is at spec.steps. An attached job, with no fixed step
  // count, exports its latest committed checkpoint (the newest of the listing, ordered as
  // checkpoint::IsNewerCheckpoint orders them), final once the job SUCCEEDED. Lists the job's
  // checkpoint directory (checkpoint::ListCheckpoints) after releasing the lock, so slow storage
  // delays no other call.
  // NOT_FOUND for an unknown job, or no committed checkpoint at `step` (listing the committed
  // steps) or, for an attached job, none at all; FAILED_PRECONDITION without a checkpoint root
  // ("checkpoint_root: ..."), or without `step` when a built-in job has no final checkpoint
  // (listing the committed steps); the listing's
  // I/O errors.
  absl::StatusOr<ExportSource> FindExportCheckpoint(const std::string& job_id,
                                                    std::optional<int64_t> step);
  // The committed checkpoint of the job at `step`, or without one the job's latest committed
  // checkpoint (latest_checkpoint: the one a recovery resumes from), opened for VerifyCheckpoint.
  // Opens it (checkpoint::OpenCommittedCheckpoint) after releasing the lock. NOT_FOUND for an
  // unknown job, a job without a committed checkpoint, or no committed checkpoint at `step`
  // (listing the committed steps); FAILED_PRECONDITION without a checkpoint root
  // ("checkpoint_root: ..."), for a manifest of another job (naming it) or a link on the way
  // (naming it); DATA_LOSS naming a manifest that is not valid; I/O errors.
  absl::StatusOr<CommittedCheckpointSource> FindCommittedCheckpoint(const std::string& job_id,
                                                                    std::optional<int64_t> step)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& checkpoint_root() const { return options_.checkpoint_root; }

  // Expires leases (ending the generations of lost workers) and schedules pending jobs. The
  // service calls it periodically; tests call it after moving a fake clock.
  void Tick();

  ManagerStats Stats();

 private:
  // Tests reach SetStateLocked through it to check that edges outside the table are refused.
  friend class JobManagerTestPeer;

  struct JobRecord {
    v1::Job job;
    // Its events, sequence numbers and watchers are in events_ (JobEventLog).
    absl::Time pending_since;
    // Who submitted it (SubmitJob's `submitter`, also job.submitter, so it survives a restart).
    std::string submitter;
    // The current generation's plan (RUNNING only).
    std::optional<sharding::ShardPlan> plan;
    absl::flat_hash_set<int32_t> finished_ranks;
    // The current generation's highest step reported by each rank (ranks that reported one).
    absl::flat_hash_map<int32_t, int64_t> rank_steps;
    // The current generation's RUN assignment as rank 0 got it, without an attach_socket (each
    // rank gets it with its own rank and, for an attached job, its worker's attach_socket).
    // Stored with the job, so that a restarted coordinator hands out the same one.
    v1::Assignment run_assignment;
    bool run_assignment_unsaved = false;
    // Who holds each rank of the current generation (by rank; an empty worker_id where none is
    // known, e.g. a generation stored by an older coordinator), stored with it. The ranks whose
    // entry changed since it was last stored.
    std::vector<RankIdentity> rank_identities;
    std::vector<int32_t> unsaved_identity_ranks;
    // Serializes the job's checkpoint work on the volume (manifest writes, pruning), which runs
    // outside mu_. Shared, so a commit keeps it while the lock is released.
    std::shared_ptr<absl::Mutex> volume_mu = std::make_shared<absl::Mutex>();
    // The current generation's worker NOTICE events: added (the bound's own notice included)
    // and dropped.
    int64_t generation_notices = 0;
    int64_t generation_dropped_notices = 0;
    // Set while a restarted coordinator adopts the running generation from its workers.
    struct Adoption {
      absl::Time deadline;
      absl::flat_hash_set<int32_t> returned_ranks;
    };
    std::optional<Adoption> adoption;
    // Set while a RECOVERING job regroups after a lost worker (see "Regrouping").
    struct Regroup {
      // The generation that ended, and its members in rank order.
      int64_t generation = 0;
      std::vector<std::string> members;
      // Members a survivor's report named lost: not awaited.
      absl::flat_hash_set<std::string> lost;
      absl::Time ended;
      absl::Time deadline;
      // Cleared once no member is awaited or the deadline passed; the members are still
      // preferred when the job starts.
      bool waiting = true;
    };
    std::optional<Regroup> regroup;
    // Set while the scheduler reports this pending job unschedulable (more workers needed than
    // are live): the reason, added to the job's message, and the message before it, which is
    // all the message says again once enough workers are live.
    std::string unschedulable_reason;
    std::string message_before_unschedulable;
  };

  JobManager(common::Clock* clock, std::unique_ptr<JobStore> store, RendezvousStore* rendezvous,
             JobManagerOptions options);

  absl::StatusOr<JobRecord*> FindJobLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that (job, generation, rank) is the current generation and that `worker_id` holds
  // that rank.
  absl::StatusOr<JobRecord*> FindRankLocked(const std::string& worker_id, const std::string& job_id,
                                            int64_t generation, int32_t rank)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends an event to the job's log (JobEventLog::Add). PersistLocked sends it to the sinks
  // once it is durable.
  v1::JobEvent& AddEventLocked(JobRecord& record, v1::JobEvent event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION (logged at ERROR) when the job's current state -> `state` is not an
  // edge of kJobStateEdges.
  absl::Status CheckStateEdgeLocked(const JobRecord& record, v1::JobState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes an edge of the state machine, with its STATE_CHANGED event. Refuses (as
  // CheckStateEdgeLocked) any other change, and then changes nothing.
  absl::Status SetStateLocked(JobRecord& record, v1::JobState state, const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Persists the records' jobs and the events added since the last persist, then publishes
  // those events (JobEventLog::Persisted).
  void PersistLocked(absl::Span<JobRecord* const> records) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the next generation of a pending or recovering job on `workers` (rank order) with
  // `plan`. Changes nothing when the job may not become RUNNING.
  absl::Status StartGenerationLocked(JobRecord& record, const std::vector<std::string>& workers,
                                     sharding::ShardPlan plan) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current generation of a running job: its live workers are told to abort it. The job
  // becomes `next_state` (RECOVERING retries if attempts remain, else FAILED; or CANCELLED).
  // Changes nothing when the job may not become `next_state`.
  absl::Status EndGenerationLocked(JobRecord& record, v1::JobState next_state,
                                   const std::string& message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Heartbeat: notes the ranks a member of a regrouping job's ended generation reports lost
  // (status.lost_peer_ranks); ignores reports about any other generation and from non-members.
  void NoteLostPeersLocked(const std::string& worker_id, const v1::WorkerStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ScheduleLocked: whether a regrouping job still waits for members of its ended generation.
  // Ends the wait (for good) once no member is awaited or at its deadline, with a NOTICE naming
  // the members still missing then; returns whether it added one in `noticed`.
  bool StillRegroupingLocked(JobRecord& record, bool* noticed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the generation whose rank `worker_id` holds, if that generation is still running.
  absl::Status HandleLostWorkerLocked(const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running job's generation has finished when every rank reported `finished`: then the job
  // SUCCEEDED (edge 4) and its workers are idle. Does nothing before that.
  absl::Status SucceedIfAllFinishedLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Create: starts adopting the running generation of a job stored RUNNING, whose RUN assignment
  // was stored as `stored` (null when none was). FAILED_PRECONDITION, changing nothing, when it
  // cannot be adopted.
  absl::Status BeginAdoptionLocked(JobRecord& record, const v1::Assignment* stored)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The adopting job whose rank the registering worker may take back (see "Adoption"), or why it
  // may not.
  absl::StatusOr<JobRecord*> FindAdoptableRankLocked(const v1::RegisterWorkerRequest& request,
                                                     const RegistrationProof& proof)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RewindJob's rules (docs/api.md): only an attached job, only its rank 0, and only back to a
  // step at or below the job's recorded progress (or the step its generation resumed from).
  // FAILED_PRECONDITION ("job_id: ...", "step: ...") or PERMISSION_DENIED ("rank: ...").
  absl::Status CheckRewindLocked(const JobRecord& record, const v1::RewindJobRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // CommitCheckpoint's part under the lock: checks and records the rank's commit; returns the
  // manifest to write once every rank committed and the step is not recorded yet, else nullopt
  // (with `response` filled).
  absl::StatusOr<std::optional<ManifestToWrite>> BeginCommitLocked(
      const v1::CommitCheckpointRequest& request, v1::CommitCheckpointResponse* response)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the job's latest checkpoint is (generation, step) or newer; fills `response`'s
  // checkpoint when it is that one.
  bool IsRecordedLocked(const JobRecord& record, int64_t generation, int64_t step,
                        v1::CommitCheckpointResponse* response) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the manifest write (`written`): records the checkpoint as the job's latest, if the job
  // is still there, not ended, and it is newer (see the .cc); `recorded` says whether it did.
  v1::CommitCheckpointResponse FinishCommitLocked(const ManifestToWrite& todo,
                                                  const absl::Status& written, bool* recorded)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a NOTICE a worker caused (`event`, type and message set) within the generation's bound
  // (options.max_notices_per_generation); returns whether the job changed (an event added).
  bool AddWorkerNoticeLocked(JobRecord& record, v1::JobEvent event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At the end of a generation: a NOTICE with the count of its dropped worker notices, if any.
  void CloseWorkerNoticesLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SubmitJob with spec.resume_from (`spec` validated, defaults applied): the other job's committed
  // checkpoint, read on the volume (so called without mu_). NOT_FOUND for no such job or step,
  // PERMISSION_DENIED for another submitter's job (unless `may_name_any_job`),
  // FAILED_PRECONDITION for a job that has not ended or trains another model, optimizer or
  // param_dtype, INVALID_ARGUMENT for `steps` not above the checkpoint's step; each names the
  // field.
  absl::StatusOr<v1::CheckpointRecord> ResolveResumeFrom(const v1::JobSpec& spec,
                                                         const std::string& submitter,
                                                         bool may_name_any_job)
      ABSL_LOCKS_EXCLUDED(mu_);
  // SubmitJob: INVALID_ARGUMENT when `spec`'s checkpoint directory (defaults applied; `submitted`
  // as the caller sent it) names a job id it was not given by default, or meets another job's
  // claim (see SubmitJob).
  absl::Status CheckCheckpointDirLocked(const v1::JobSpec& submitted, const v1::JobSpec& spec,
                                        const std::string& submitter, bool may_name_any_job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK when no generation being adopted waits for a rank whose worker is named like the
  // registration, or the registration proves it is that worker; else ALREADY_EXISTS naming the
  // job, rank and worker id.
  absl::Status CheckNameNotReservedLocked(const v1::RegisterWorkerRequest& request,
                                          const RegistrationProof& proof)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A name is held by proof (see "Identities"): OK when no registration holds the name, the
  // caller acts for any worker, the request proves it is the name's holder (previous_worker_id
  // and that worker's secret), or the holder has been gone for options.forget_gone_workers_after
  // (--dead_worker_retention); else ALREADY_EXISTS ("name: ...") naming the holder, the rule and
  // when the name frees by itself. A live holder is refused before this (RegisterWorker).
  absl::Status CheckNameProofLocked(const v1::RegisterWorkerRequest& request,
                                    const RegistrationProof& proof)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes `worker` (registered, its secret set) the holder of its name, stored durably.
  void BindNameLocked(const v1::WorkerInfo& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker's lease ended or it left: if it holds its name, the name's retention starts.
  void NoteNameHolderGoneLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the names whose holders have been gone since before `horizon`.
  void ForgetGoneNamesLocked(absl::Time horizon) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The first rank of a generation being adopted, its worker not back yet, that `matches`, or
  // nullptr.
  const RankIdentity* FindUnadoptedRankLocked(
      const std::function<bool(const RankIdentity&)>& matches) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // LeaveWorker's work: ends the worker's generation (`why`), then marks it LEFT.
  absl::Status LeaveLocked(const std::string& worker_id, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // StartGenerationLocked: records who holds each rank (to be stored with the generation).
  void RecordRankIdentitiesLocked(JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives `worker` (registered under its previous id) its rank of the generation being adopted;
  // takes edge (11) when it was the last one missing.
  void AdoptRankLocked(JobRecord& record, v1::WorkerInfo& worker, const v1::WorkerStatus& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tick: ends the generations whose adoption window passed with ranks missing.
  void EndExpiredAdoptionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shows `reason` (empty: schedulable) at the end of a pending job's message. Returns whether
  // the job changed.
  bool SetUnschedulableReasonLocked(JobRecord& record, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes sure the registry's next worker number lies in a block reserved in the durable store,
  // so worker ids never repeat across coordinator restarts.
  void ReserveWorkerNumbersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  common::Clock* const clock_;
  const JobManagerOptions options_;
  RendezvousStore* const rendezvous_;
  // The checkpoint root's side of commits, rewinds, exports and verifications; thread-safe, used
  // outside mu_ (under a job's volume_mu where it touches the job's directories).
  const CheckpointCommitter committer_;

  absl::Mutex mu_;
  std::unique_ptr<JobStore> store_ ABSL_GUARDED_BY(mu_);
  // Every job's events: sequence numbers, durable-then-publish, thinning, watchers. Reads and
  // thins store_.
  JobEventLog events_ ABSL_GUARDED_BY(mu_);
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  // Every job's checkpoint directory, claimed when it was submitted (and again from the stored
  // jobs at start).
  CheckpointDirClaims checkpoint_dir_claims_ ABSL_GUARDED_BY(mu_);
  // Who holds each known worker name (see "Identities"), stored in the JobStore (only the
  // holder and its secret's digest; gone_since is soft: a restarted coordinator counts every
  // holder gone from its start). Invariant: the holder of a name a live registration has is that
  // registration (gone_since unset).
  struct NameHolder {
    std::string worker_id;
    security::Sha256Digest secret_sha256{};
    // When the holder's lease ended or it left; unset while it is live.
    std::optional<absl::Time> gone_since;
  };
  absl::flat_hash_map<std::string, NameHolder> name_holders_ ABSL_GUARDED_BY(mu_);
  // (submitter, JobSpec.run_key) -> job id, for every job that has a run key.
  absl::flat_hash_map<std::pair<std::string, std::string>, std::string> jobs_by_run_key_
      ABSL_GUARDED_BY(mu_);
  // The latest end of an adoption window (adoptions begin only in Create); past it no generation
  // is being adopted.
  absl::Time adoption_windows_end_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Canonical job ids ordered by their number: a longer id has the larger number ("job-1000000"
  // after "job-999999"), and ids of one length compare as strings.
  struct JobIdOrder {
    bool operator()(const std::string& a, const std::string& b) const {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    }
  };
  // Keyed by job id, in submission order (ListJobs and the scheduler's FIFO rely on it).
  std::map<std::string, JobRecord, JobIdOrder> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_number_ ABSL_GUARDED_BY(mu_) = 1;
  // PENDING jobs per non-empty submitter; a submitter with none has no entry.
  absl::flat_hash_map<std::string, int64_t> pending_jobs_by_submitter_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_JOB_MANAGER_H_
