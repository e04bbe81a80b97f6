// Job life cycle and membership (see job_manager.h).
#include "coordinator/job_manager.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "checkpoint/manifest.h"
#include "common/log_escape.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/job_state_table.h"
#include "coordinator/memory_admission.h"
#include "coordinator/recovery_rules.h"
#include "coordinator/scheduler.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "jobspec/job_memory.h"
#include "jobspec/job_plan.h"
#include "jobspec/job_spec_defaults.h"
#include "jobspec/job_spec_validation.h"
#include "security/identity.h"
#include "security/metadata.h"

namespace zeroshard::coordinator {
namespace {

using ::google::protobuf::util::TimeUtil;

// Bytes a repeated message field adds per item beyond the item's own size: its tag and length.
constexpr size_t kListItemFramingBytes = 8;

// Admits a listing's items while they fit a PageRequest's item and byte bounds.
class PageFiller {
 public:
  explicit PageFiller(const PageRequest& page) : page_(page) {}

  // Whether `item` goes into the page (counting it if so). The first item always does.
  bool Fits(const google::protobuf::Message& item) {
    const size_t size = item.ByteSizeLong() + kListItemFramingBytes;
    if (items_ > 0 && (items_ >= page_.max_items || bytes_ + size > page_.max_bytes)) return false;
    ++items_;
    bytes_ += size;
    return true;
  }

 private:
  const PageRequest& page_;
  int64_t items_ = 0;
  size_t bytes_ = 0;
};

google::protobuf::Timestamp ToTimestamp(absl::Time t) {
  return TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixNanos(TimeUtil::TimestampToNanoseconds(t));
}

bool IsFinal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

// The checkpoint the job's next generation starts from: its latest committed one, else the
// other job's that spec.resume_from named; null to start from step 0.
const v1::CheckpointRecord* ResumePointOf(const v1::Job& job) {
  if (job.has_latest_checkpoint()) return &job.latest_checkpoint();
  if (job.has_resumed_from()) return &job.resumed_from();
  return nullptr;
}

bool IsPending(v1::JobState state) { return state == v1::PENDING || state == v1::RECOVERING; }

// A worker-role call without the worker secret RegisterWorker returned.
absl::Status NoWorkerSecretSent() {
  return absl::PermissionDeniedError(absl::StrCat(
      "worker secret: none sent; the worker role must send the secret RegisterWorker returned "
      "(metadata ",
      security::kWorkerSecretKey, ")"));
}

v1::Assignment IdleAssignment() {
  v1::Assignment assignment;
  assignment.set_kind(v1::ASSIGNMENT_IDLE);
  return assignment;
}

// The socket a rank's trainer attaches to: its worker's own, for an attached job.
std::string AttachSocketFor(const v1::JobSpec& spec, const v1::WorkerInfo& worker) {
  return spec.workload().has_attached() ? worker.attach_socket() : std::string();
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(common::Clock* clock,
                                                               std::unique_ptr<JobStore> store,
                                                               RendezvousStore* rendezvous,
                                                               JobManagerOptions options) {
  ZS_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, store->LoadJobs());
  ZS_ASSIGN_OR_RETURN(std::vector<v1::Assignment> run_assignments, store->LoadRunAssignments());
  absl::flat_hash_map<std::string, v1::Assignment> run_assignment_by_job;
  for (v1::Assignment& assignment : run_assignments) {
    const std::string job_id = assignment.job_id();
    run_assignment_by_job[job_id] = std::move(assignment);
  }
  ZS_ASSIGN_OR_RETURN(std::vector<RankIdentity> identities, store->LoadRankIdentities());
  absl::flat_hash_map<std::string, std::vector<RankIdentity>> identities_by_job;
  for (RankIdentity& identity : identities) {
    identities_by_job[identity.job_id].push_back(std::move(identity));
  }
  ZS_ASSIGN_OR_RETURN(std::vector<WorkerNameHolder> names, store->LoadWorkerNames());
  std::unique_ptr<JobManager> manager(
      new JobManager(clock, std::move(store), rendezvous, std::move(options)));
  absl::MutexLock lock(&manager->mu_);
  // Membership is soft state, names are not: every name known before the restart stays its
  // holder's, who may have been live until the coordinator stopped, for a retention from now.
  for (WorkerNameHolder& stored : names) {
    NameHolder& holder = manager->name_holders_[stored.name];
    holder.worker_id = std::move(stored.worker_id);
    holder.secret_sha256 = stored.secret_sha256;
    holder.gone_since = clock->Now();
  }
  std::vector<JobRecord*> changed;
  for (v1::Job& job : jobs) {
    const std::string id = job.id();
    ZS_ASSIGN_OR_RETURN(const JobStore::EventCount stored, manager->store_->CountEvents(id));
    JobRecord& record = manager->jobs_[id];
    record.job = std::move(job);
    // In id order, so a directory two old jobs named stays the first one's.
    manager->checkpoint_dir_claims_.Claim(record.job.spec().checkpoint().dir(), id);
    if (!record.job.spec().run_key().empty()) {
      manager->jobs_by_run_key_.emplace(
          std::make_pair(record.job.submitter(), record.job.spec().run_key()), id);
    }
    manager->events_.AddJob(id, stored.last_sequence, stored.events);
    record.pending_since = clock->Now();
    record.submitter = record.job.submitter();
    if (record.job.state() == v1::PENDING && !record.submitter.empty()) {
      ++manager->pending_jobs_by_submitter_[record.submitter];
    }
    if (const std::optional<int64_t> number = ParseJobId(id)) {
      manager->next_job_number_ = std::max(manager->next_job_number_, *number + 1);
    }
    if (record.job.state() == v1::RUNNING) {
      // Who held each rank, for the adoption's proofs and name reservations.
      record.rank_identities.resize(record.job.worker_ids_size());
      for (RankIdentity& identity : identities_by_job[id]) {
        if (identity.generation == record.job.generation() && identity.rank >= 0 &&
            identity.rank < record.job.worker_ids_size() &&
            identity.worker_id == record.job.worker_ids(identity.rank)) {
          record.rank_identities[identity.rank] = std::move(identity);
        }
      }
      // The workers train on: adopt their generation when they re-register.
      const auto stored = run_assignment_by_job.find(id);
      const absl::Status adopting = manager->BeginAdoptionLocked(
          record, stored == run_assignment_by_job.end() ? nullptr : &stored->second);
      if (!adopting.ok()) {
        const bool retry = record.job.attempts() < record.job.spec().max_attempts();
        ZS_RETURN_IF_ERROR(manager->SetStateLocked(
            record, retry ? v1::RECOVERING : v1::FAILED,
            absl::StrCat("generation ", record.job.generation(),
                         " ended: coordinator restarted; cannot adopt it: ", adopting.message(),
                         retry ? "" : "; no attempts left")));
        record.job.clear_worker_ids();
      }
      changed.push_back(&record);
    }
  }
  manager->PersistLocked(changed);
  manager->ReserveWorkerNumbersLocked();
  return manager;
}

JobManager::JobManager(common::Clock* clock, std::unique_ptr<JobStore> store,
                       RendezvousStore* rendezvous, JobManagerOptions options)
    : clock_(clock),
      options_(std::move(options)),
      rendezvous_(rendezvous),
      committer_(options_.checkpoint_root, options_.storage_hooks_for_testing),
      store_(std::move(store)),
      events_(clock, store_.get(), options_.max_events_per_job),
      workers_(options_.lease) {}

// ---- Workers ----

absl::StatusOr<v1::RegisterWorkerResponse> JobManager::RegisterWorker(
    const v1::RegisterWorkerRequest& request, const RegistrationProof& proof) {
  absl::MutexLock lock(&mu_);
  ReserveWorkerNumbersLocked();
  v1::RegisterWorkerResponse response;
  response.set_heartbeat_period_ms(absl::ToInt64Milliseconds(options_.lease.heartbeat_period));
  response.set_lease_ms(absl::ToInt64Milliseconds(options_.lease.lease()));
  const std::string& previous = request.previous_worker_id();
  if (!request.status().job_id().empty()) {
    absl::StatusOr<JobRecord*> adoptable = FindAdoptableRankLocked(request, proof);
    if (adoptable.ok()) {
      if (absl::Status named = CheckNameProofLocked(request, proof); !named.ok()) {
        adoptable = named;
      }
    }
    absl::StatusOr<v1::WorkerInfo*> worker =
        adoptable.ok() ? workers_.RegisterAs(request, previous, clock_->Now()) : adoptable.status();
    if (worker.ok()) {
      // The secret first: the adoption stores the rank's identity with it. A worker that proved
      // itself with its secret keeps it: its run's calls in flight carry it, and a new one would
      // refuse those that reach the coordinator before the daemon has the new secret. (Admins'
      // calls are bound to no secret.)
      if (proof.acts_for_any_worker) {
        response.set_worker_secret(workers_.NewSecret((*worker)->id()));
      } else {
        workers_.SetSecret((*worker)->id(), security::Sha256(proof.presented_secret));
        response.set_worker_secret(proof.presented_secret);
      }
      BindNameLocked(**worker);
      AdoptRankLocked(**adoptable, **worker, request.status());
      response.set_worker_id((*worker)->id());
      response.set_adopted(true);
      return response;
    }
    ZS_LOG(WARNING) << "worker " << common::EscapeForLog(previous) << " (name=" << request.name()
                    << ") registers running " << common::EscapeForLog(request.status().job_id())
                    << " generation " << request.status().generation() << " rank "
                    << request.status().rank()
                    << ", which cannot be adopted: " << worker.status().message()
                    << "; it gets a new id and aborts that run";
  }
  // Only the worker that held `previous` may replace that registration.
  const bool proven =
      !previous.empty() &&
      (proof.acts_for_any_worker || workers_.SecretMatches(previous, proof.presented_secret));
  if (const v1::WorkerInfo* holder = workers_.FindLiveByName(request.name())) {
    if (!proven || holder->id() != previous) {
      return absl::AlreadyExistsError(
          absl::StrCat("name: worker name ", request.name(), " is held by the live registration ",
                       holder->id(), " (host ", holder->host(),
                       "); a name is bound to its worker until that worker is DEAD or LEFT"));
    }
    // That worker registers again while its registration is live: the old one is over.
    ZS_RETURN_IF_ERROR(LeaveLocked(holder->id(), "registered again"));
  }
  ZS_RETURN_IF_ERROR(CheckNameNotReservedLocked(request, proof));
  ZS_RETURN_IF_ERROR(CheckNameProofLocked(request, proof));
  if (proven) {
    // The registration it replaces no longer acts for it.
    workers_.RevokeSecret(previous);
  } else if (!previous.empty() && workers_.Find(previous) != nullptr) {
    ZS_LOG(WARNING) << "a registration names previous_worker_id "
                    << common::EscapeForLog(previous.substr(0, 64))
                    << " without that worker's secret: registered as a new worker; "
                    << common::EscapeForLog(previous.substr(0, 64)) << " keeps its registration";
  }
  const v1::WorkerInfo& worker = workers_.Register(request, clock_->Now());
  response.set_worker_id(worker.id());
  response.set_worker_secret(workers_.NewSecret(worker.id()));
  BindNameLocked(worker);
  ZS_LOG(INFO) << "worker " << worker.id() << " registered: name=" << request.name()
               << " host=" << request.host()
               << (request.attach_socket().empty()
                       ? ""
                       : absl::StrCat(" attach_socket=", request.attach_socket()))
               << (proven ? absl::StrCat(" (was ", previous, ")") : "");
  ScheduleLocked();
  return response;
}

absl::Status JobManager::CheckNameProofLocked(const v1::RegisterWorkerRequest& request,
                                              const RegistrationProof& proof) {
  const auto it = name_holders_.find(request.name());
  if (it == name_holders_.end() || proof.acts_for_any_worker) return absl::OkStatus();
  const NameHolder& holder = it->second;
  // Digests are compared, never the secrets themselves.
  if (!proof.presented_secret.empty() && request.previous_worker_id() == holder.worker_id &&
      security::Sha256(proof.presented_secret) == holder.secret_sha256) {
    return absl::OkStatus();
  }
  const absl::Time now = clock_->Now();
  // A live holder was refused before this (FindLiveByName); one not marked gone is taken as gone
  // from now.
  const absl::Time gone_since = holder.gone_since.value_or(now);
  const absl::Time free_at = gone_since + options_.forget_gone_workers_after;
  if (now >= free_at) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "name: worker name ", request.name(), " belongs to ", holder.worker_id,
      ", which is not live; a name is held by proof: registering it again needs "
      "previous_worker_id ",
      holder.worker_id,
      " and that worker's secret (a restarted daemon keeps them with --identity_file), or it is "
      "free once ",
      holder.worker_id, " has been gone for --dead_worker_retention (",
      absl::FormatDuration(options_.forget_gone_workers_after), "): in ",
      absl::FormatDuration(absl::Ceil(free_at - now, absl::Seconds(1)))));
}

void JobManager::BindNameLocked(const v1::WorkerInfo& worker) {
  const std::optional<security::Sha256Digest> digest = workers_.SecretDigest(worker.id());
  if (!digest.has_value()) return;
  NameHolder& holder = name_holders_[worker.name()];
  holder.worker_id = worker.id();
  holder.secret_sha256 = *digest;
  holder.gone_since.reset();
  // Durable before the secret is handed out, so that a restarted coordinator still knows whose
  // name it is.
  const WorkerNameHolder stored{worker.name(), worker.id(), *digest};
  if (absl::Status saved = store_->SaveWorkerNames({stored}); !saved.ok()) {
    // Registration goes on; only a restart before the next successful write could forget it.
    ZS_LOG(ERROR) << "state store: cannot store the holder of worker name " << worker.name() << ": "
                  << saved;
  }
}

void JobManager::NoteNameHolderGoneLocked(const std::string& worker_id) {
  const v1::WorkerInfo* worker = workers_.Find(worker_id);
  if (worker == nullptr) return;
  const auto it = name_holders_.find(worker->name());
  if (it == name_holders_.end() || it->second.worker_id != worker_id) return;
  if (!it->second.gone_since.has_value()) it->second.gone_since = clock_->Now();
}

void JobManager::ForgetGoneNamesLocked(absl::Time horizon) {
  std::vector<std::string> forgotten;
  for (auto it = name_holders_.begin(); it != name_holders_.end();) {
    if (it->second.gone_since.has_value() && *it->second.gone_since < horizon) {
      forgotten.push_back(it->first);
      name_holders_.erase(it++);
    } else {
      ++it;
    }
  }
  if (forgotten.empty()) return;
  if (absl::Status saved = store_->SaveWorkerNames({}, forgotten); !saved.ok()) {
    // Forgotten here; a restart before the next write holds the names a retention longer.
    ZS_LOG(ERROR) << "state store: cannot forget worker names: " << saved;
  }
}

const RankIdentity* JobManager::FindUnadoptedRankLocked(
    const std::function<bool(const RankIdentity&)>& matches) {
  // Adoptions begin only when the coordinator starts: past their windows none is under way, and
  // registrations (the load bench's thousands) skip the scan of every job.
  if (clock_->Now() >= adoption_windows_end_) return nullptr;
  for (const auto& [id, record] : jobs_) {
    if (!record.adoption.has_value()) continue;
    for (int32_t rank = 0; rank < static_cast<int32_t>(record.rank_identities.size()); ++rank) {
      const RankIdentity& identity = record.rank_identities[rank];
      if (!identity.worker_id.empty() && record.adoption->returned_ranks.count(rank) == 0 &&
          matches(identity)) {
        return &identity;
      }
    }
  }
  return nullptr;
}

absl::Status JobManager::CheckNameNotReservedLocked(const v1::RegisterWorkerRequest& request,
                                                    const RegistrationProof& proof) {
  const RankIdentity* reserved = FindUnadoptedRankLocked([&](const RankIdentity& identity) {
    if (identity.worker_name != request.name()) return false;
    // The reservation is that worker's own (its run could not be adopted): no one else's.
    const bool is_holder = request.previous_worker_id() == identity.worker_id &&
                           (proof.acts_for_any_worker ||
                            identity.secret_sha256 == security::Sha256(proof.presented_secret));
    return !is_holder;
  });
  if (reserved == nullptr) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "name: worker name ", request.name(), " is reserved for ", reserved->worker_id,
      ", which held rank ", reserved->rank, " of ", reserved->job_id, " generation ",
      reserved->generation, " and may re-register until the coordinator's adoption window ends"));
}

absl::Status JobManager::CheckWorkerSecret(const std::string& worker_id, absl::string_view secret) {
  if (secret.empty()) return NoWorkerSecretSent();
  absl::MutexLock lock(&mu_);
  const absl::Status checked = workers_.CheckSecret(worker_id, secret);
  if (!absl::IsNotFound(checked)) return checked;
  // A rank of a generation being adopted calls before its daemon re-registered (rank 0's
  // reports, a checkpoint commit): it proves the rank with the secret stored for it, and is
  // served as it would be without tokens.
  const security::Sha256Digest digest = security::Sha256(secret);
  if (FindUnadoptedRankLocked([&](const RankIdentity& identity) {
        return identity.worker_id == worker_id && identity.secret_sha256 == digest;
      }) != nullptr) {
    return absl::OkStatus();
  }
  // Not a refusal: a restarted coordinator does not know the worker yet, which registers
  // again with its id and secret as proof (or a worker forgotten after its retention).
  return checked;
}

absl::Status JobManager::CheckStoreSecret(absl::string_view secret, const std::string& job_id,
                                          int64_t generation) {
  if (secret.empty()) return NoWorkerSecretSent();
  absl::MutexLock lock(&mu_);
  const absl::Status checked = workers_.CheckSecretRuns(secret, job_id, generation);
  if (!absl::IsNotFound(checked)) return checked;
  // As in CheckWorkerSecret: a rank being adopted, before its daemon re-registered.
  const security::Sha256Digest digest = security::Sha256(secret);
  if (FindUnadoptedRankLocked([&](const RankIdentity& identity) {
        return identity.secret_sha256 == digest && identity.job_id == job_id &&
               identity.generation == generation;
      }) != nullptr) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(checked.message());
}

absl::StatusOr<v1::HeartbeatResponse> JobManager::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  ZS_ASSIGN_OR_RETURN(v1::WorkerInfo * worker, workers_.Renew(request.worker_id(), clock_->Now()));
  const v1::Assignment& assignment = worker->assignment();
  // A rank whose run failed ends its generation: its peers would otherwise wait for it forever.
  if (assignment.kind() == v1::ASSIGNMENT_RUN && !request.status().run_error().empty() &&
      request.status().job_id() == assignment.job_id() &&
      request.status().generation() == assignment.generation()) {
    ZS_RETURN_IF_ERROR(HandleLostWorkerLocked(
        request.worker_id(), absl::StrCat("failed: ", request.status().run_error())));
  }
  // After the failure that ended the generation (this one's or an earlier one's), so that its
  // regroup exists.
  NoteLostPeersLocked(request.worker_id(), request.status());
  // An aborting worker that no longer runs the aborted generation is free again.
  if (assignment.kind() == v1::ASSIGNMENT_ABORT &&
      (request.status().job_id() != assignment.job_id() ||
       request.status().generation() != assignment.generation())) {
    workers_.Assign(*worker, IdleAssignment());
    ScheduleLocked();
  }
  v1::HeartbeatResponse response;
  *response.mutable_assignment() = worker->assignment();
  return response;
}

absl::Status JobManager::LeaveWorker(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  if (workers_.Find(worker_id) == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker_id: ", worker_id, " is not registered"));
  }
  ZS_RETURN_IF_ERROR(LeaveLocked(worker_id, "left"));
  ZS_LOG(INFO) << "worker " << worker_id << " left";
  return absl::OkStatus();
}

absl::Status JobManager::LeaveLocked(const std::string& worker_id, const std::string& why) {
  // End its generation first: that reads the assignment Leave clears.
  ZS_RETURN_IF_ERROR(HandleLostWorkerLocked(worker_id, why));
  NoteNameHolderGoneLocked(worker_id);
  return workers_.Leave(worker_id).status();
}

std::vector<v1::WorkerInfo> JobManager::ListWorkers(v1::WorkerState state) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  for (const v1::WorkerInfo* worker : workers_.List(state)) out.push_back(*worker);
  return out;
}

Page<v1::WorkerInfo> JobManager::ListWorkersPage(v1::WorkerState state, const PageRequest& page) {
  absl::MutexLock lock(&mu_);
  Page<v1::WorkerInfo> out;
  PageFiller filler(page);
  for (const v1::WorkerInfo* worker :
       workers_.ListAfter(state, page.after.value_or(std::numeric_limits<int64_t>::min()))) {
    if (!filler.Fits(*worker)) {
      out.next_after = ParseWorkerId(out.items.back().id());
      break;
    }
    out.items.push_back(*worker);
  }
  return out;
}

// ---- Jobs ----

absl::StatusOr<v1::Job> JobManager::SubmitJob(const v1::JobSpec& submitted,
                                              const std::string& submitter, bool may_name_any_job) {
  // Another job's checkpoint is found on the volume before the lock is taken.
  std::optional<v1::CheckpointRecord> resumed_from;
  if (submitted.has_resume_from()) {
    const v1::JobSpec provisional = jobspec::WithDefaults(submitted, FormatJobId(0));
    ZS_RETURN_IF_ERROR(jobspec::ValidateJobSpec(provisional));
    ZS_ASSIGN_OR_RETURN(resumed_from, ResolveResumeFrom(provisional, submitter, may_name_any_job));
  }
  absl::MutexLock lock(&mu_);
  if (!submitter.empty()) {
    auto pending = pending_jobs_by_submitter_.find(submitter);
    if (pending != pending_jobs_by_submitter_.end() &&
        pending->second >= options_.max_pending_jobs_per_submitter) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "max_pending_jobs_per_submitter: ", pending->second,
          " jobs of this submitter are PENDING, the most it may queue; submit again once one "
          "has started or ended"));
    }
  }
  const std::string id = FormatJobId(next_job_number_);
  v1::JobSpec spec = jobspec::WithDefaults(submitted, id);
  ZS_RETURN_IF_ERROR(jobspec::ValidateJobSpec(spec));
  // The plan must exist for every allowed world size; check the smallest (the catalog and the
  // planner's own limits).
  ZS_RETURN_IF_ERROR(jobspec::PlanForJob(spec, spec.min_workers()).status());
  // A job the idle workers' --memory_limit_bytes cannot hold is refused now, with the figures,
  // rather than failing on every worker it is given.
  ZS_RETURN_IF_ERROR(CheckJobFitsMemoryLimits(spec, workers_.IdleWorkers(spec.device_kind())));
  ZS_RETURN_IF_ERROR(CheckCheckpointDirLocked(submitted, spec, submitter, may_name_any_job));
  if (!spec.run_key().empty()) {
    const auto taken = jobs_by_run_key_.find(std::make_pair(submitter, spec.run_key()));
    if (taken != jobs_by_run_key_.end()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "run_key: \"", spec.run_key(), "\" is already the key of your job ", taken->second));
    }
  }

  JobRecord record;
  record.job.set_id(id);
  *record.job.mutable_spec() = std::move(spec);
  record.job.set_state(v1::PENDING);
  *record.job.mutable_create_time() = ToTimestamp(clock_->Now());
  record.pending_since = clock_->Now();
  record.submitter = submitter;
  record.job.set_submitter(submitter);
  if (resumed_from.has_value()) *record.job.mutable_resumed_from() = *std::move(resumed_from);
  v1::JobEvent submitted_event;
  submitted_event.set_job_id(id);
  submitted_event.set_sequence(1);
  *submitted_event.mutable_time() = record.job.create_time();
  submitted_event.set_type(v1::STATE_CHANGED);
  submitted_event.set_state(v1::PENDING);
  submitted_event.set_message("submitted");
  const v1::Job* to_save[] = {&record.job};
  // Durable before it is acknowledged: a job the client saw is never lost.
  if (absl::Status saved = store_->Save(to_save, {submitted_event}); !saved.ok()) {
    return absl::UnavailableError(absl::StrCat("state store: job not accepted: ", saved.message()));
  }
  events_.AddJob(id, /*last_sequence=*/1, /*stored_events=*/1);
  ++next_job_number_;
  checkpoint_dir_claims_.Claim(record.job.spec().checkpoint().dir(), id);
  if (!record.job.spec().run_key().empty()) {
    jobs_by_run_key_.emplace(std::make_pair(submitter, record.job.spec().run_key()), id);
  }
  if (!submitter.empty()) ++pending_jobs_by_submitter_[submitter];
  jobs_.emplace(id, std::move(record));
  ZS_LOG(INFO) << "job " << id << " submitted";
  ScheduleLocked();
  return jobs_[id].job;
}

absl::StatusOr<v1::CheckpointRecord> JobManager::ResolveResumeFrom(const v1::JobSpec& spec,
                                                                   const std::string& submitter,
                                                                   bool may_name_any_job) {
  const v1::ResumeFrom& from = spec.resume_from();
  absl::StatusOr<v1::Job> found = GetJob(from.job_id());
  if (!found.ok()) {
    return absl::NotFoundError(absl::StrCat("resume_from.job_id: there is no job \"",
                                            common::EscapeForLog(from.job_id()), "\""));
  }
  const v1::Job& source = *found;
  if (!may_name_any_job && source.submitter() != submitter) {
    return absl::PermissionDeniedError(absl::StrCat(
        "resume_from.job_id: ", source.id(),
        " is another submitter's job; only its submitter or an admin may resume from it"));
  }
  if (!IsFinal(source.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "resume_from.job_id: ", source.id(), " is ", v1::JobState_Name(source.state()),
        "; resume from a job that has ended (a running job prunes its older checkpoints)"));
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(source.spec().workload(),
                                                          spec.workload())) {
    return absl::FailedPreconditionError(
        absl::StrCat("workload: ", source.id(), " (resume_from) trains another model: {",
                     source.spec().workload().ShortDebugString(), "}, this job {",
                     spec.workload().ShortDebugString(), "}"));
  }
  if (source.spec().optimizer().kind() != spec.optimizer().kind()) {
    return absl::FailedPreconditionError(
        absl::StrCat("optimizer.kind: ", source.id(), " (resume_from) holds ",
                     v1::OptimizerKind_Name(source.spec().optimizer().kind()),
                     " state, this job uses ", v1::OptimizerKind_Name(spec.optimizer().kind())));
  }
  if (source.spec().precision().param_dtype() != spec.precision().param_dtype()) {
    return absl::FailedPreconditionError(
        absl::StrCat("precision.param_dtype: ", source.id(), " (resume_from) stores ",
                     v1::DType_Name(source.spec().precision().param_dtype()),
                     " parameters, this job ", v1::DType_Name(spec.precision().param_dtype())));
  }
  absl::StatusOr<CommittedCheckpointSource> committed = committer_.FindCommitted(
      source, from.has_step() ? std::optional<int64_t>(from.step()) : std::nullopt);
  if (!committed.ok()) {
    // Its messages name "step" or "job_id": here they are resume_from's.
    return absl::Status(committed.status().code(),
                        absl::StrCat("resume_from.", committed.status().message()));
  }
  if (spec.steps() <= committed->record.step()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "steps: ", spec.steps(), " is not above step ", committed->record.step(), " of ",
        source.id(), "'s checkpoint (resume_from), so nothing would be trained"));
  }
  v1::CheckpointRecord record = committed->record;
  record.set_job_id(source.id());
  return record;
}

absl::Status JobManager::CheckCheckpointDirLocked(const v1::JobSpec& submitted,
                                                  const v1::JobSpec& spec,
                                                  const std::string& submitter,
                                                  bool may_name_any_job) {
  const std::string& dir = spec.checkpoint().dir();
  // Job ids are the default directories: a job named later must find its own free.
  if (!submitted.checkpoint().dir().empty()) {
    const absl::string_view first = absl::string_view(dir).substr(0, dir.find('/'));
    if (ParseJobId(first).has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint.dir: \"", common::EscapeForLog(dir),
                       "\" starts with a job id; those are the jobs' default directories (leave "
                       "checkpoint.dir unset to get this job's own)"));
    }
  }
  const std::optional<std::string> owner = checkpoint_dir_claims_.OwnerOf(dir);
  if (!owner.has_value()) return absl::OkStatus();
  const auto it = jobs_.find(*owner);
  const bool may_name = may_name_any_job || (it != jobs_.end() && !submitter.empty() &&
                                             it->second.submitter == submitter);
  return absl::InvalidArgumentError(
      absl::StrCat("checkpoint.dir: \"", common::EscapeForLog(dir),
                   "\" is, lies inside or contains the checkpoint directory of ",
                   may_name ? *owner : "another job",
                   "; a directory belongs to the first job that named it: choose another"));
}

absl::StatusOr<v1::Job> JobManager::GetJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  ZS_ASSIGN_OR_RETURN(JobRecord * record, FindJobLocked(job_id));
  return record->job;
}

absl::StatusOr<v1::Job> JobManager::FindJobByRunKey(const std::string& submitter,
                                                    const std::string& run_key) {
  absl::MutexLock lock(&mu_);
  const auto found = jobs_by_run_key_.find(std::make_pair(submitter, run_key));
  if (found == jobs_by_run_key_.end()) {
    return absl::NotFoundError(
        absl::StrCat("run_key: you submitted no job with run key \"", run_key, "\""));
  }
  ZS_ASSIGN_OR_RETURN(JobRecord * record, FindJobLocked(found->second));
  return record->job;
}

Page<v1::Job> JobManager::ListJobs(v1::JobState state, const PageRequest& page) {
  absl::MutexLock lock(&mu_);
  Page<v1::Job> out;
  PageFiller filler(page);
  // Newest first: from the end, or from the last job older than page.after.
  auto it = page.after.has_value() ? std::make_reverse_iterator(jobs_.lower_bound(
                                         FormatJobId(std::max<int64_t>(*page.after, 0))))
                                   : jobs_.rbegin();
  for (; it != jobs_.rend(); ++it) {
    const v1::Job& job = it->second.job;
    if (state != v1::JOB_STATE_UNSPECIFIED && job.state() != state) continue;
    if (!filler.Fits(job)) {
      out.next_after = ParseJobId(out.items.back().id());
      break;
    }
    out.items.push_back(job);
  }
  return out;
}

absl::StatusOr<v1::Job> JobManager::CancelJob(const std::string& job_id, const std::string& reason,
                                              const std::optional<std::string>& only_submitter) {
  absl::MutexLock lock(&mu_);
  ZS_ASSIGN_OR_RETURN(JobRecord * record, FindJobLocked(job_id));
  if (only_submitter.has_value() && record->job.submitter() != *only_submitter) {
    return absl::PermissionDeniedError(
        absl::StrCat("job_id: ", job_id,
                     " was submitted by another submitter; a submitter may "
                     "cancel only its own jobs (an admin may cancel any)"));
  }
  if (IsFinal(record->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job_id: ", job_id, " already ended (",
                                                      v1::JobState_Name(record->job.state()), ")"));
  }
  const std::string message = reason.empty() ? "cancelled" : absl::StrCat("cancelled: ", reason);
  if (record->job.state() == v1::RUNNING) {
    ZS_RETURN_IF_ERROR(EndGenerationLocked(*record, v1::CANCELLED, message));
  } else {
    ZS_RETURN_IF_ERROR(SetStateLocked(*record, v1::CANCELLED, message));
  }
  JobRecord* changed[] = {record};
  PersistLocked(changed);
  ScheduleLocked();
  return record->job;
}

namespace {

absl::StatusOr<v1::ShardPlan> RankViewOfPlan(const sharding::ShardPlan& plan,
                                             const v1::GetShardPlanRequest& request,
                                             int64_t generation) {
  if (request.rank() >= plan.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", request.rank(), " is out of range [0, ", plan.world_size(), ")"));
  }
  ZS_ASSIGN_OR_RETURN(v1::ShardPlan view,
                      jobspec::PlanToProto(plan, request.rank(), request.include_layout()));
  view.set_job_id(request.job_id());
  view.set_generation(generation);
  return view;
}

bool IsEnded(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

}  // namespace

absl::StatusOr<v1::ShardPlan> JobManager::GetShardPlan(const v1::GetShardPlanRequest& request) {
  v1::JobSpec ended_spec;
  int64_t ended_world_size = 0;
  int64_t generation = 0;
  {
    absl::MutexLock lock(&mu_);
    ZS_ASSIGN_OR_RETURN(JobRecord * record, FindJobLocked(request.job_id()));
    generation = record->job.generation();
    if (request.generation() != 0 && request.generation() != generation) {
      return absl::FailedPreconditionError(absl::StrCat(
          "generation: ", request.generation(), " is not current (current is ", generation, ")"));
    }
    if (record->plan.has_value()) return RankViewOfPlan(*record->plan, request, generation);
    // An ended job's last generation keeps no plan in memory; it is recomputed from the spec
    // (planning is deterministic), outside the lock, so that the dashboard can show it.
    if (!IsEnded(record->job.state()) || generation == 0 || record->job.worker_ids_size() == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("job_id: ", request.job_id(), " has no running generation (",
                       v1::JobState_Name(record->job.state()), ")"));
    }
    ended_spec = record->job.spec();
    ended_world_size = record->job.worker_ids_size();
  }
  absl::StatusOr<sharding::ShardPlan> plan = jobspec::PlanForJob(ended_spec, ended_world_size);
  if (!plan.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job_id: ", request.job_id(), " cannot be planned again: ", plan.status().message()));
  }
  return RankViewOfPlan(*plan, request, generation);
}

absl::StatusOr<JobManager::WatchPosition> JobManager::WatchPage(
    const std::string& job_id, int64_t after_sequence, int64_t max_events,
    std::shared_ptr<JobEventSink> sink) {
  absl::MutexLock lock(&mu_);
  ZS_ASSIGN_OR_RETURN(const JobRecord* record, FindJobLocked(job_id));
  return events_.WatchPage(job_id, after_sequence, max_events, IsFinal(record->job.state()),
                           std::move(sink));
}

void JobManager::Unwatch(const std::string& job_id, const JobEventSink* sink) {
  absl::MutexLock lock(&mu_);
  events_.Unwatch(job_id, sink);
}

absl::Status JobManager::Watch(const std::string& job_id, int64_t after_sequence,
                               std::shared_ptr<JobEventSink> sink) {
  constexpr int64_t kPageEvents = 512;
  WatchPosition position;
  position.last_sequence = after_sequence;
  while (!position.following) {
    const int64_t before = position.last_sequence;
    ZS_ASSIGN_OR_RETURN(position, WatchPage(job_id, before, kPageEvents, sink));
    // A closed sink stopped the page short.
    if (!position.following && position.last_sequence == before) break;
  }
  return absl::OkStatus();
}

// ---- From workers ----

absl::StatusOr<v1::ReportProgressResponse> JobManager::ReportProgress(
    const v1::ReportProgressRequest& request) {
  absl::MutexLock lock(&mu_);
  v1::ReportProgressResponse response;
  absl::StatusOr<JobRecord*> found =
      FindRankLocked(request.worker_id(), request.job_id(), request.generation(), request.rank());
  if (!found.ok()) {
    // A stale generation is not an error for the worker: it is told to stop.
    if (found.status().code() == absl::StatusCode::kFailedPrecondition) return response;
    return found.status();
  }
  JobRecord& record = **found;
  // Step 0 is no step: notice-only reports carry no metrics.
  const int64_t step = request.metrics().step();
  const int64_t steps = record.job.spec().steps();
  // An attached job (steps 0) has no fixed step count to check against.
  if (steps > 0 && step > steps) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics.step: ", step, " is past the job's ", steps, " steps"));
  }
  auto last_step = record.rank_steps.find(request.rank());
  const int64_t recorded = last_step == record.rank_steps.end() ? 0 : last_step->second;
  if (step > 0 && step < recorded) {
    return absl::FailedPreconditionError(absl::StrCat(
        "metrics.step: rank ", request.rank(), " reported step ", recorded,
        " already in generation ", request.generation(), "; step ", step, " would go back"));
  }
  // A generation resumed from a checkpoint starts at its step: a rank resumed from the job's
  // last step runs no step and finishes with no metrics of its own.
  const int64_t reached = std::max({step, recorded, record.run_assignment.start_step()});
  if (request.finished() && steps > 0 && reached != steps) {
    return absl::FailedPreconditionError(absl::StrCat(
        "finished: rank ", request.rank(), " finished at step ", reached, " of ", steps));
  }
  if (step > recorded) record.rank_steps[request.rank()] = step;
  // A job stored before rank_progress existed, adopted by this coordinator, gets its entries now.
  while (record.job.rank_progress_size() < record.job.worker_ids_size()) {
    record.job.add_rank_progress();
  }
  // In memory until the job is next written: the other ranks' reports cost no durable write.
  if (step > 0 && step >= record.job.rank_progress(request.rank()).step()) {
    *record.job.mutable_rank_progress(request.rank()) = request.metrics();
  }
  response.set_continue_running(true);
  bool changed_job = false;
  if (!request.notice().empty()) {
    v1::JobEvent event =
        Notice(request.generation(), absl::StrCat("rank ", request.rank(), ": ", request.notice()));
    changed_job = AddWorkerNoticeLocked(record, std::move(event));
  }
  // Workers resend a report whose answer they did not get (the coordinator restarted, or the
  // call timed out), so a step already recorded may come again: it is recorded once.
  if (request.rank() == 0 && request.metrics().step() > record.job.progress().step()) {
    *record.job.mutable_progress() = request.metrics();
    v1::JobEvent event;
    event.set_type(v1::PROGRESS);
    event.set_generation(request.generation());
    *event.mutable_progress() = request.metrics();
    AddEventLocked(record, std::move(event));
    changed_job = true;
  }
  if (request.finished() && record.finished_ranks.insert(request.rank()).second) {
    ZS_RETURN_IF_ERROR(SucceedIfAllFinishedLocked(record));
    changed_job = true;
  }
  // Only rank 0's new reports and finishes change the job: the other ranks' per-step reports
  // cost no durable (fsync'd) write.
  if (changed_job) {
    JobRecord* changed[] = {&record};
    PersistLocked(changed);
  }
  return response;
}

absl::StatusOr<v1::CommitCheckpointResponse> JobManager::CommitCheckpoint(
    const v1::CommitCheckpointRequest& request) {
  std::optional<ManifestToWrite> todo;
  {
    absl::MutexLock lock(&mu_);
    v1::CommitCheckpointResponse response;
    ZS_ASSIGN_OR_RETURN(todo, BeginCommitLocked(request, &response));
    if (!todo.has_value()) return response;
  }
  // The volume's work, outside the lock (heartbeats do not wait behind a slow shared volume),
  // one job's commits at a time: the manifest, then (once recorded) pruning.
  absl::MutexLock volume(todo->job_volume_mu.get());
  // From the trusted root, no link followed below it (checkpoint/directory.h).
  const absl::StatusOr<checkpoint::Directory> root = committer_.WriteManifest(*todo);
  const absl::Status written = root.status();
  v1::CommitCheckpointResponse response;
  bool recorded = false;
  {
    absl::MutexLock lock(&mu_);
    response = FinishCommitLocked(*todo, written, &recorded);
  }
  if (!recorded) return response;
  // Recorded, so written: `root` is open.
  if (const std::optional<std::string> problem = committer_.Prune(*root, *todo)) {
    absl::MutexLock lock(&mu_);
    if (auto it = jobs_.find(todo->job_id); it != jobs_.end()) {
      v1::JobEvent notice = Notice(todo->generation, *problem);
      if (AddWorkerNoticeLocked(it->second, std::move(notice))) {
        JobRecord* changed[] = {&it->second};
        PersistLocked(changed);
      }
    }
  }
  return response;
}

absl::StatusOr<v1::RewindJobResponse> JobManager::RewindJob(const v1::RewindJobRequest& request) {
  const int64_t step = request.step();
  std::string policy_dir;
  std::shared_ptr<absl::Mutex> volume_mu;
  {
    absl::MutexLock lock(&mu_);
    ZS_ASSIGN_OR_RETURN(JobRecord * record, FindRankLocked(request.worker_id(), request.job_id(),
                                                           request.generation(), request.rank()));
    ZS_RETURN_IF_ERROR(CheckRewindLocked(*record, request));
    if (absl::Status forgotten =
            store_->DeleteCheckpointCommits(request.job_id(), request.generation(), step).status();
        !forgotten.ok()) {
      return absl::UnavailableError(absl::StrCat("state store: ", forgotten.message()));
    }
    policy_dir = record->job.spec().checkpoint().dir();
    volume_mu = record->volume_mu;
  }
  v1::RewindJobResponse response;
  std::optional<v1::CheckpointRecord> latest;
  if (committer_.enabled()) {
    absl::MutexLock volume(volume_mu.get());
    ZS_ASSIGN_OR_RETURN(const RewoundCheckpoints rewound,
                        committer_.SupersedeAfter(policy_dir, request, clock_->Now()));
    response.mutable_superseded_steps()->Add(rewound.superseded_steps.begin(),
                                             rewound.superseded_steps.end());
    latest = rewound.latest;
  }
  absl::MutexLock lock(&mu_);
  ZS_ASSIGN_OR_RETURN(JobRecord * record, FindRankLocked(request.worker_id(), request.job_id(),
                                                         request.generation(), request.rank()));
  if (latest.has_value()) {
    *record->job.mutable_latest_checkpoint() = *latest;
    *response.mutable_latest_checkpoint() = *latest;
  } else if (committer_.enabled()) {
    record->job.clear_latest_checkpoint();
  }
  // The reports of the steps after `step` come again, and are taken.
  if (record->job.progress().step() > step) {
    record->job.clear_progress();
    record->job.mutable_progress()->set_step(step);
  }
  for (v1::StepMetrics& progress : *record->job.mutable_rank_progress()) {
    if (progress.step() <= step) continue;
    progress.Clear();
    progress.set_step(step);
  }
  for (auto& [rank, reported] : record->rank_steps) reported = std::min(reported, step);
  std::string retired = "no checkpoint was superseded";
  if (response.superseded_steps_size() > 0) {
    retired =
        absl::StrCat("the checkpoints of steps ", absl::StrJoin(response.superseded_steps(), ", "),
                     " are superseded (kept aside, marked so)");
  }
  v1::JobEvent event =
      Notice(request.generation(),
             absl::StrCat("rank ", request.rank(), ": the job went back to step ", step,
                          request.reason().empty() ? "" : " (", request.reason(),
                          request.reason().empty() ? "" : ")", "; ", retired));
  AddWorkerNoticeLocked(*record, std::move(event));
  JobRecord* changed[] = {record};
  PersistLocked(changed);
  return response;
}

absl::Status JobManager::CheckRewindLocked(const JobRecord& record,
                                           const v1::RewindJobRequest& request) const {
  const v1::Job& job = record.job;
  // A built-in job's steps are its workers' own: no trainer loads a state into it.
  if (!job.spec().workload().has_attached()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job_id: ", job.id(),
        " is not an attached job; RewindJob takes back only an attached job (workload.attached), "
        "whose trainers loaded a state"));
  }
  // Rank 0 speaks for the job's load (every rank loads the same state); no other rank may move
  // the whole job.
  if (request.rank() != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("rank: ", request.rank(), " may not call RewindJob for ", job.id(),
                     "; only the job's rank 0 takes the job back to a loaded state's step"));
  }
  // Back, never forward: only to a step the job has reached as the coordinator recorded it (rank
  // 0's reports, or the step its generation resumed from).
  const int64_t reached = std::max(job.progress().step(), record.run_assignment.start_step());
  if (request.step() > reached) {
    return absl::FailedPreconditionError(
        absl::StrCat("step: ", request.step(), " is past ", job.id(), "'s progress (step ", reached,
                     "); RewindJob takes a job back to a step it has reached, never forward"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<ManifestToWrite>> JobManager::BeginCommitLocked(
    const v1::CommitCheckpointRequest& request, v1::CommitCheckpointResponse* response) {
  ZS_ASSIGN_OR_RETURN(JobRecord * record, FindRankLocked(request.worker_id(), request.job_id(),
                                                         request.generation(), request.rank()));
  if (request.outcome() != v1::CHECKPOINT_WRITTEN) {
    // Nothing is committed: the step's checkpoint cannot complete. The owner hears why.
    v1::JobEvent event =
        Notice(request.generation(),
               absl::StrCat("checkpoint at step ", request.step(),
                            request.outcome() == v1::CHECKPOINT_SKIPPED ? " skipped" : " failed",
                            " on rank ", request.rank(), ": ", request.message()));
    if (AddWorkerNoticeLocked(*record, std::move(event))) {
      JobRecord* changed[] = {record};
      PersistLocked(changed);
    }
    return std::nullopt;
  }
  ZS_RETURN_IF_ERROR(committer_.CheckRankFile(request, record->job.spec().checkpoint().dir(),
                                              record->job.worker_ids_size()));
  if (absl::Status saved = store_->SaveCheckpointCommit(request); !saved.ok()) {
    return absl::UnavailableError(absl::StrCat("state store: ", saved.message()));
  }
  ZS_ASSIGN_OR_RETURN(
      std::vector<v1::CommitCheckpointRequest> commits,
      store_->LoadCheckpointCommits(request.job_id(), request.generation(), request.step()));
  if (static_cast<int>(commits.size()) < record->job.worker_ids_size()) return std::nullopt;
  response->set_complete(true);
  // A repeated commit of a complete step, or a late one for an older step, must not emit the
  // event again or move the job's latest checkpoint back.
  if (IsRecordedLocked(*record, request.generation(), request.step(), response)) {
    return std::nullopt;
  }
  // Every rank's file is durable: the manifest, written last, makes the checkpoint exist.
  std::optional<uint64_t> layout_hash;
  if (record->plan.has_value()) layout_hash = record->plan->layout_hash();
  return committer_.BuildManifest(record->job, request.generation(), request.step(), layout_hash,
                                  std::move(commits), clock_->Now(), record->volume_mu);
}

bool JobManager::IsRecordedLocked(const JobRecord& record, int64_t generation, int64_t step,
                                  v1::CommitCheckpointResponse* response) const {
  const v1::CheckpointRecord& latest = record.job.latest_checkpoint();
  if (!record.job.has_latest_checkpoint() ||
      checkpoint::CheckpointOrder(latest.generation(), latest.step()) <
          checkpoint::CheckpointOrder(generation, step)) {
    return false;
  }
  if (latest.generation() == generation && latest.step() == step) {
    *response->mutable_checkpoint() = latest;
  }
  return true;
}

v1::CommitCheckpointResponse JobManager::FinishCommitLocked(const ManifestToWrite& todo,
                                                            const absl::Status& written,
                                                            bool* recorded) {
  *recorded = false;
  v1::CommitCheckpointResponse response;
  auto it = jobs_.find(todo.job_id);
  if (it == jobs_.end()) return response;
  JobRecord& record = it->second;
  if (!written.ok()) {
    v1::JobEvent event =
        Notice(todo.generation, absl::StrCat("checkpoint at step ", todo.step,
                                             " could not be committed: ", written.message()));
    // What the workers left on the volume decides this: bounded as their notices are.
    if (AddWorkerNoticeLocked(record, std::move(event))) {
      JobRecord* changed[] = {&record};
      PersistLocked(changed);
    }
    return response;
  }
  response.set_complete(true);
  // The manifest was written without the lock: meanwhile a twin commit may have recorded it, or
  // the job may have ended. A checkpoint of a generation that ended since is still a complete,
  // valid checkpoint of the job: it is recorded if it is newer, by (generation, step), than the
  // job's latest, unless the job has ended (then it is dropped: nothing resumes any more, and
  // pruning is for running jobs).
  if (IsRecordedLocked(record, todo.generation, todo.step, &response) ||
      IsFinal(record.job.state())) {
    return response;
  }
  const v1::CheckpointRecord checkpoint = CheckpointCommitter::RecordOf(todo);
  *record.job.mutable_latest_checkpoint() = checkpoint;
  v1::JobEvent event;
  event.set_type(v1::CHECKPOINT_COMMITTED);
  event.set_generation(todo.generation);
  *event.mutable_checkpoint() = checkpoint;
  AddEventLocked(record, std::move(event));
  JobRecord* changed[] = {&record};
  PersistLocked(changed);
  *response.mutable_checkpoint() = checkpoint;
  *recorded = true;
  return response;
}

absl::StatusOr<ExportSource> JobManager::FindExportCheckpoint(const std::string& job_id,
                                                              std::optional<int64_t> step) {
  ZS_ASSIGN_OR_RETURN(const v1::Job job, GetJob(job_id));
  return committer_.FindExport(job, step);
}

absl::StatusOr<CommittedCheckpointSource> JobManager::FindCommittedCheckpoint(
    const std::string& job_id, std::optional<int64_t> step) {
  ZS_ASSIGN_OR_RETURN(const v1::Job job, GetJob(job_id));
  return committer_.FindCommitted(job, step);
}

// ---- Periodic work ----

void JobManager::Tick() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  for (const std::string& worker_id : workers_.ExpireLeases(now)) {
    ZS_LOG(WARNING) << "worker " << worker_id << " missed its heartbeats: lease expired";
    NoteNameHolderGoneLocked(worker_id);
    if (absl::Status ended = HandleLostWorkerLocked(worker_id, "lease expired"); !ended.ok()) {
      ZS_LOG(ERROR) << "worker " << worker_id << ": its generation did not end: " << ended;
    }
  }
  EndExpiredAdoptionsLocked();
  workers_.ForgetGone(now - options_.forget_gone_workers_after);
  ForgetGoneNamesLocked(now - options_.forget_gone_workers_after);
  ScheduleLocked();
}

ManagerStats JobManager::Stats() {
  absl::MutexLock lock(&mu_);
  ManagerStats stats;
  const absl::Time now = clock_->Now();
  for (const v1::WorkerInfo* worker : workers_.List(v1::WORKER_STATE_UNSPECIFIED)) {
    ++stats.workers_by_state[worker->state()];
    if (worker->state() == v1::IDLE || worker->state() == v1::BUSY) {
      stats.max_heartbeat_lag =
          std::max(stats.max_heartbeat_lag, now - FromTimestamp(worker->last_heartbeat_time()));
    }
  }
  for (const auto& [id, record] : jobs_) {
    ++stats.jobs_by_state[record.job.state()];
  }
  stats.watchers = events_.watchers();
  return stats;
}

// ---- Internals ----

absl::StatusOr<JobManager::JobRecord*> JobManager::FindJobLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("job_id: no job ", job_id));
  }
  return &it->second;
}

absl::StatusOr<JobManager::JobRecord*> JobManager::FindRankLocked(const std::string& worker_id,
                                                                  const std::string& job_id,
                                                                  int64_t generation,
                                                                  int32_t rank) {
  ZS_ASSIGN_OR_RETURN(JobRecord * record, FindJobLocked(job_id));
  if (record->job.state() != v1::RUNNING || generation != record->job.generation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "generation: ", generation, " of ", job_id, " is not running (job is ",
        v1::JobState_Name(record->job.state()), " in generation ", record->job.generation(), ")"));
  }
  if (rank >= record->job.worker_ids_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " is out of range [0, ", record->job.worker_ids_size(), ")"));
  }
  if (record->job.worker_ids(rank) != worker_id) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker_id: ", worker_id, " does not hold rank ", rank, " of ", job_id));
  }
  return record;
}

v1::JobEvent& JobManager::AddEventLocked(JobRecord& record, v1::JobEvent event) {
  return events_.Add(record.job.id(), std::move(event));
}

absl::Status JobManager::CheckStateEdgeLocked(const JobRecord& record, v1::JobState state) {
  const bool allowed = IsAllowedJobStateEdge(record.job.state(), state);
  // RUNNING -> RUNNING (11) is an adoption's end, and nothing else.
  const bool adopts = record.job.state() != state || record.adoption.has_value();
  if (allowed && adopts) return absl::OkStatus();
  absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
      "job ", record.job.id(), ": ", v1::JobState_Name(record.job.state()), " -> ",
      v1::JobState_Name(state),
      allowed ? " is taken only when an adopted generation's last rank is back, and this job is "
                "adopting none"
              : " is not a transition of the job state machine"));
  ZS_LOG(ERROR) << refused;
  return refused;
}

absl::Status JobManager::SetStateLocked(JobRecord& record, v1::JobState state,
                                        const std::string& message) {
  ZS_RETURN_IF_ERROR(CheckStateEdgeLocked(record, state));
  if (record.job.state() == v1::PENDING && state != v1::PENDING && !record.submitter.empty()) {
    auto pending = pending_jobs_by_submitter_.find(record.submitter);
    if (pending != pending_jobs_by_submitter_.end() && --pending->second <= 0) {
      pending_jobs_by_submitter_.erase(pending);
    }
  }
  record.job.set_state(state);
  record.job.set_message(message);
  if (IsFinal(state)) *record.job.mutable_end_time() = ToTimestamp(clock_->Now());
  if (IsPending(state)) record.pending_since = clock_->Now();
  // Only a RECOVERING job regroups; EndGenerationLocked sets it up after this edge.
  record.regroup.reset();
  v1::JobEvent event;
  event.set_type(v1::STATE_CHANGED);
  event.set_state(state);
  event.set_generation(record.job.generation());
  event.set_message(message);
  AddEventLocked(record, std::move(event));
  ZS_LOG(INFO) << "job " << record.job.id() << " -> " << v1::JobState_Name(state) << ": "
               << message;
  return absl::OkStatus();
}

void JobManager::ReserveWorkerNumbersLocked() {
  // One durable write per block keeps registration cheap.
  constexpr int64_t kBlock = 100000;
  if (!workers_.NeedsNumberBlock()) return;
  absl::StatusOr<int64_t> first = store_->ReserveWorkerNumbers(kBlock);
  if (!first.ok()) {
    // Registration goes on; only ids handed out after a later restart could repeat these.
    ZS_LOG(ERROR) << "state store: cannot reserve worker ids: " << first.status();
    return;
  }
  workers_.UseNumberBlock(*first, kBlock);
}

void JobManager::PersistLocked(absl::Span<JobRecord* const> records) {
  std::vector<const v1::Job*> jobs;
  std::vector<const v1::Assignment*> run_assignments;
  std::vector<RankIdentity> rank_identities;
  for (JobRecord* record : records) {
    jobs.push_back(&record->job);
    if (record->run_assignment_unsaved) run_assignments.push_back(&record->run_assignment);
    for (int32_t rank : record->unsaved_identity_ranks) {
      rank_identities.push_back(record->rank_identities[rank]);
    }
  }
  absl::Status saved = store_->Save(jobs, events_.unpersisted(), run_assignments, rank_identities);
  if (!saved.ok()) {
    // Keep the events for the next attempt; the in-memory state stays authoritative.
    ZS_LOG(ERROR) << "state store write failed (will retry with the next change): " << saved;
    return;
  }
  // Durable now: watchers may see them, and the sinks of jobs that ended are ended.
  absl::flat_hash_set<std::string> ended_jobs;
  for (const v1::JobEvent& event : events_.unpersisted()) {
    auto it = jobs_.find(event.job_id());
    if (it != jobs_.end() && IsFinal(it->second.job.state())) ended_jobs.insert(event.job_id());
  }
  events_.Persisted(ended_jobs);
  for (JobRecord* record : records) {
    record->run_assignment_unsaved = false;
    record->unsaved_identity_ranks.clear();
  }
}

absl::Status JobManager::StartGenerationLocked(JobRecord& record,
                                               const std::vector<std::string>& worker_ids,
                                               sharding::ShardPlan plan) {
  ZS_RETURN_IF_ERROR(CheckStateEdgeLocked(record, v1::RUNNING));
  const int64_t world_size = static_cast<int64_t>(worker_ids.size());
  v1::Job& job = record.job;
  job.set_generation(job.generation() + 1);
  job.set_attempts(job.attempts() + 1);
  job.clear_worker_ids();
  for (const std::string& id : worker_ids) job.add_worker_ids(id);
  job.clear_progress();
  job.clear_rank_progress();
  for (int64_t rank = 0; rank < world_size; ++rank) job.add_rank_progress();
  if (!job.has_start_time()) *job.mutable_start_time() = ToTimestamp(clock_->Now());
  record.finished_ranks.clear();
  record.rank_steps.clear();
  record.generation_notices = 0;
  record.generation_dropped_notices = 0;
  rendezvous_->OpenNamespace(job.id(), job.generation());

  v1::Assignment assignment;
  assignment.set_kind(v1::ASSIGNMENT_RUN);
  assignment.set_job_id(job.id());
  assignment.set_generation(job.generation());
  assignment.set_world_size(static_cast<int32_t>(world_size));
  assignment.set_plan_layout_hash(plan.layout_hash());
  *assignment.mutable_spec() = job.spec();
  // A generation after the first resumes from the latest committed checkpoint, if any; until
  // the job has one, from the other job's that spec.resume_from named.
  if (const v1::CheckpointRecord* from = ResumePointOf(job); from != nullptr) {
    *assignment.mutable_resume_from() = *from;
    assignment.set_start_step(from->step());
  }
  record.run_assignment = assignment;
  record.run_assignment_unsaved = true;
  for (int32_t rank = 0; rank < world_size; ++rank) {
    v1::WorkerInfo& worker = *workers_.FindLive(worker_ids[rank]);
    assignment.set_rank(rank);
    assignment.set_attach_socket(AttachSocketFor(job.spec(), worker));
    workers_.Assign(worker, assignment);
  }
  RecordRankIdentitiesLocked(record);
  record.plan.emplace(std::move(plan));

  v1::JobEvent event;
  event.set_type(v1::GENERATION_STARTED);
  event.set_generation(job.generation());
  *event.mutable_worker_ids() = job.worker_ids();
  AddEventLocked(record, std::move(event));
  return SetStateLocked(
      record, v1::RUNNING,
      absl::StrCat("generation ", job.generation(), " on ", world_size, " workers"));
}

bool JobManager::AddWorkerNoticeLocked(JobRecord& record, v1::JobEvent event) {
  const int64_t bound = options_.max_notices_per_generation;
  if (record.generation_notices < bound) {
    ++record.generation_notices;
    AddEventLocked(record, std::move(event));
    return true;
  }
  ++record.generation_dropped_notices;
  record.job.set_dropped_notices(record.job.dropped_notices() + 1);
  if (record.generation_notices > bound) return false;
  // The first one past the bound says so instead of its own message.
  ++record.generation_notices;
  v1::JobEvent notice = Notice(
      event.generation(),
      absl::StrCat(
          "the workers of generation ", event.generation(), " sent ", bound,
          " notices, the most stored per generation (--max_notices_per_generation); later ones are "
          "counted in dropped_notices, not stored"));
  AddEventLocked(record, std::move(notice));
  return true;
}

void JobManager::CloseWorkerNoticesLocked(JobRecord& record) {
  if (record.generation_dropped_notices > 0) {
    v1::JobEvent notice =
        Notice(record.job.generation(), absl::StrCat("generation ", record.job.generation(),
                                                     " dropped ", record.generation_dropped_notices,
                                                     " notices from its workers past the bound of ",
                                                     options_.max_notices_per_generation));
    AddEventLocked(record, std::move(notice));
  }
  record.generation_notices = 0;
  record.generation_dropped_notices = 0;
}

void JobManager::RecordRankIdentitiesLocked(JobRecord& record) {
  const v1::Job& job = record.job;
  record.rank_identities.assign(job.worker_ids_size(), RankIdentity());
  record.unsaved_identity_ranks.clear();
  for (int32_t rank = 0; rank < job.worker_ids_size(); ++rank) {
    const v1::WorkerInfo* worker = workers_.Find(job.worker_ids(rank));
    const std::optional<security::Sha256Digest> digest =
        workers_.SecretDigest(job.worker_ids(rank));
    if (worker == nullptr || !digest.has_value()) continue;
    RankIdentity& identity = record.rank_identities[rank];
    identity.job_id = job.id();
    identity.generation = job.generation();
    identity.rank = rank;
    identity.worker_id = worker->id();
    identity.worker_name = worker->name();
    identity.secret_sha256 = *digest;
    record.unsaved_identity_ranks.push_back(rank);
  }
}

absl::Status JobManager::EndGenerationLocked(JobRecord& record, v1::JobState next_state,
                                             const std::string& message) {
  ZS_RETURN_IF_ERROR(CheckStateEdgeLocked(record, next_state));
  v1::Job& job = record.job;
  v1::Assignment abort;
  abort.set_kind(v1::ASSIGNMENT_ABORT);
  abort.set_job_id(job.id());
  abort.set_generation(job.generation());
  for (const std::string& worker_id : job.worker_ids()) {
    if (v1::WorkerInfo* worker = workers_.FindLive(worker_id)) workers_.Assign(*worker, abort);
  }
  rendezvous_->DropNamespace(job.id(), job.generation());
  record.plan.reset();
  record.adoption.reset();
  CloseWorkerNoticesLocked(record);
  ZS_RETURN_IF_ERROR(SetStateLocked(record, next_state, message));
  // An attached job waits for its pinned workers anyway.
  if (next_state == v1::RECOVERING && !job.spec().workload().has_attached()) {
    JobRecord::Regroup regroup;
    regroup.generation = job.generation();
    regroup.members.assign(job.worker_ids().begin(), job.worker_ids().end());
    regroup.ended = clock_->Now();
    regroup.deadline = regroup.ended + options_.RegroupWait();
    record.regroup = std::move(regroup);
  }
  return absl::OkStatus();
}

void JobManager::NoteLostPeersLocked(const std::string& worker_id, const v1::WorkerStatus& status) {
  if (status.lost_peer_ranks().empty()) return;
  auto it = jobs_.find(status.job_id());
  if (it == jobs_.end() || !it->second.regroup.has_value()) return;
  JobRecord::Regroup& regroup = *it->second.regroup;
  for (int32_t rank : LostPeersToNote(worker_id, status, regroup.generation, regroup.members)) {
    if (regroup.lost.insert(regroup.members[rank]).second) {
      ZS_LOG(INFO) << "job " << status.job_id() << ": rank " << status.rank() << " of generation "
                   << regroup.generation << " (" << worker_id << ") saw rank " << rank << " ("
                   << regroup.members[rank] << ") die; the next generation does not wait for it";
    }
  }
}

bool JobManager::StillRegroupingLocked(JobRecord& record, bool* noticed) {
  *noticed = false;
  JobRecord::Regroup& regroup = *record.regroup;
  if (!regroup.waiting) return false;
  std::vector<const v1::WorkerInfo*> member_workers;
  for (const std::string& id : regroup.members) member_workers.push_back(workers_.Find(id));
  const std::vector<std::string> awaited = AwaitedMembers(
      regroup.members, regroup.lost, member_workers, record.job.id(), regroup.generation);
  const absl::Time now = clock_->Now();
  switch (NextRegroupStep(!awaited.empty(), now, regroup.deadline)) {
    case RegroupStep::kWait:
      return true;
    case RegroupStep::kAllBack:
      regroup.waiting = false;
      ZS_LOG(INFO) << "job " << record.job.id() << ": the survivors of generation "
                   << regroup.generation << " are back "
                   << absl::FormatDuration(now - regroup.ended) << " after its end";
      return false;
    case RegroupStep::kStopWaiting:
      regroup.waiting = false;
      break;
  }
  v1::JobEvent event =
      Notice(regroup.generation,
             absl::StrCat("stopped waiting for ", absl::StrJoin(awaited, ", "), " of generation ",
                          regroup.generation, ": not back within ",
                          absl::FormatDuration(options_.RegroupWait()), " of its end"));
  ZS_LOG(WARNING) << "job " << record.job.id() << ": " << event.message();
  AddEventLocked(record, std::move(event));
  *noticed = true;
  return false;
}

absl::Status JobManager::HandleLostWorkerLocked(const std::string& worker_id,
                                                const std::string& why) {
  const v1::WorkerInfo* worker = workers_.Find(worker_id);
  if (worker == nullptr || worker->assignment().kind() != v1::ASSIGNMENT_RUN) {
    return absl::OkStatus();
  }
  auto it = jobs_.find(worker->assignment().job_id());
  if (it == jobs_.end()) return absl::OkStatus();
  JobRecord& record = it->second;
  if (record.job.state() != v1::RUNNING ||
      record.job.generation() != worker->assignment().generation()) {
    return absl::OkStatus();
  }
  const bool retry = record.job.attempts() < record.job.spec().max_attempts();
  ZS_RETURN_IF_ERROR(EndGenerationLocked(
      record, retry ? v1::RECOVERING : v1::FAILED,
      absl::StrCat("generation ", record.job.generation(), " ended: worker ", worker_id, " ", why,
                   retry ? (ResumePointOf(record.job) != nullptr
                                ? absl::StrCat("; resuming from the checkpoint at step ",
                                               ResumePointOf(record.job)->step())
                                : std::string("; restarting from step 0"))
                         : absl::StrCat("; no attempts left (max_attempts ",
                                        record.job.spec().max_attempts(), ")"))));
  JobRecord* changed[] = {&record};
  PersistLocked(changed);
  return absl::OkStatus();
}

absl::Status JobManager::SucceedIfAllFinishedLocked(JobRecord& record) {
  if (static_cast<int>(record.finished_ranks.size()) != record.job.worker_ids_size()) {
    return absl::OkStatus();
  }
  CloseWorkerNoticesLocked(record);
  ZS_RETURN_IF_ERROR(SetStateLocked(record, v1::SUCCEEDED, "all ranks finished"));
  for (const std::string& worker_id : record.job.worker_ids()) {
    if (v1::WorkerInfo* worker = workers_.FindLive(worker_id)) {
      workers_.Assign(*worker, IdleAssignment());
    }
  }
  rendezvous_->DropNamespace(record.job.id(), record.job.generation());
  record.plan.reset();
  record.adoption.reset();
  ScheduleLocked();
  return absl::OkStatus();
}

absl::Status JobManager::BeginAdoptionLocked(JobRecord& record, const v1::Assignment* stored) {
  const v1::Job& job = record.job;
  ZS_RETURN_IF_ERROR(CheckStoredRunAssignment(job, stored));
  absl::StatusOr<sharding::ShardPlan> plan = jobspec::PlanForJob(job.spec(), job.worker_ids_size());
  if (!plan.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot plan: ", plan.status().message()));
  }
  ZS_RETURN_IF_ERROR(CheckSameLayout(plan->layout_hash(), *stored));
  record.plan.emplace(*std::move(plan));
  record.run_assignment = *stored;
  const absl::Duration window = options_.AdoptionWindow();
  record.adoption.emplace();
  record.adoption->deadline = clock_->Now() + window;
  adoption_windows_end_ = std::max(adoption_windows_end_, record.adoption->deadline);
  // The ring is connected already and needs no store; the namespace lets the generation use it
  // again (what it held before the restart is gone).
  rendezvous_->OpenNamespace(job.id(), job.generation());
  v1::JobEvent event =
      Notice(job.generation(),
             absl::StrCat("coordinator restarted: adopting generation ", job.generation(),
                          " from its ", job.worker_ids_size(), " workers, which have ",
                          absl::FormatDuration(window), " to re-register"));
  AddEventLocked(record, std::move(event));
  ZS_LOG(INFO) << "job " << job.id() << ": adopting generation " << job.generation() << " (workers "
               << absl::StrJoin(job.worker_ids(), ", ") << ") within " << window;
  return absl::OkStatus();
}

absl::StatusOr<JobManager::JobRecord*> JobManager::FindAdoptableRankLocked(
    const v1::RegisterWorkerRequest& request, const RegistrationProof& proof) {
  const v1::WorkerStatus& status = request.status();
  auto it = jobs_.find(status.job_id());
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", status.job_id()));
  }
  JobRecord& record = it->second;
  AdoptionTarget target;
  target.job = &record.job;
  target.adopting = record.adoption.has_value();
  target.rank_identities = &record.rank_identities;
  target.previous_id_registered = workers_.Find(request.previous_worker_id()) != nullptr;
  if (const v1::WorkerInfo* holder = workers_.FindLiveByName(request.name())) {
    target.live_name_holder = holder->id();
  }
  ZS_RETURN_IF_ERROR(CheckRankAdoption(request, proof, target));
  return &record;
}

void JobManager::AdoptRankLocked(JobRecord& record, v1::WorkerInfo& worker,
                                 const v1::WorkerStatus& status) {
  v1::Assignment assignment = record.run_assignment;
  assignment.set_rank(status.rank());
  assignment.set_attach_socket(AttachSocketFor(record.job.spec(), worker));
  workers_.Assign(worker, assignment);
  record.adoption->returned_ranks.insert(status.rank());
  // Its new secret proves the rank from now on (another restart adopts with it).
  if (status.rank() < static_cast<int>(record.rank_identities.size())) {
    RankIdentity& identity = record.rank_identities[status.rank()];
    identity.job_id = record.job.id();
    identity.generation = record.job.generation();
    identity.rank = status.rank();
    identity.worker_id = worker.id();
    identity.worker_name = worker.name();
    identity.secret_sha256 = workers_.SecretDigest(worker.id()).value_or(security::Sha256Digest{});
    record.unsaved_identity_ranks.push_back(status.rank());
  }
  // This coordinator keeps no finished ranks from before its restart: the worker says so.
  if (status.finished()) record.finished_ranks.insert(status.rank());
  const v1::Job& job = record.job;
  ZS_LOG(INFO) << "worker " << worker.id() << " is back: " << job.id() << " generation "
               << job.generation() << " rank " << status.rank() << " at step " << status.step()
               << (status.finished() ? " (finished)" : "") << "; "
               << record.adoption->returned_ranks.size() << " of " << job.worker_ids_size()
               << " ranks adopted";
  if (static_cast<int>(record.adoption->returned_ranks.size()) == job.worker_ids_size()) {
    // Neither can be refused: the job is RUNNING and adopting.
    absl::Status adopted = SetStateLocked(
        record, v1::RUNNING,
        absl::StrCat("generation ", job.generation(), " adopted after a coordinator restart"));
    record.adoption.reset();
    if (adopted.ok()) adopted = SucceedIfAllFinishedLocked(record);
    if (!adopted.ok()) ZS_LOG(ERROR) << "job " << job.id() << ": " << adopted;
  }
  JobRecord* changed[] = {&record};
  PersistLocked(changed);
}

void JobManager::EndExpiredAdoptionsLocked() {
  const absl::Time now = clock_->Now();
  std::vector<JobRecord*> changed;
  for (auto& [id, record] : jobs_) {
    if (!record.adoption.has_value() || now < record.adoption->deadline) continue;
    const std::vector<int32_t> missing =
        MissingRanks(record.job.worker_ids_size(), record.adoption->returned_ranks);
    const bool retry = record.job.attempts() < record.job.spec().max_attempts();
    const absl::Status ended = EndGenerationLocked(
        record, retry ? v1::RECOVERING : v1::FAILED,
        absl::StrCat("generation ", record.job.generation(),
                     " ended: coordinator restarted: ranks ", absl::StrJoin(missing, ", "),
                     " did not come back within ", absl::FormatDuration(options_.AdoptionWindow()),
                     retry ? ""
                           : absl::StrCat("; no attempts left (max_attempts ",
                                          record.job.spec().max_attempts(), ")")));
    if (!ended.ok()) {
      ZS_LOG(ERROR) << "job " << id << ": adoption window ended, generation not ended: " << ended;
      record.adoption.reset();
      continue;
    }
    changed.push_back(&record);
  }
  if (!changed.empty()) PersistLocked(changed);
}

void JobManager::ScheduleLocked() {
  std::vector<PendingJob> pending;
  std::vector<JobRecord*> changed;
  // Built once per pass, and only when an attached job is pending.
  std::optional<absl::flat_hash_map<std::string, const v1::WorkerInfo*>> live_by_name;
  for (auto& [id, record] : jobs_) {
    if (!IsPending(record.job.state())) continue;
    const v1::JobSpec& spec = record.job.spec();
    PendingJob job{id,
                   spec.device_kind(),
                   spec.min_workers(),
                   spec.max_workers(),
                   spec.global_batch(),
                   record.pending_since};
    if (spec.workload().has_attached()) {
      if (!live_by_name.has_value()) live_by_name = workers_.LiveWorkersByName();
      absl::StatusOr<std::vector<std::string>> pinned = PinnedWorkerIds(spec, *live_by_name);
      if (!pinned.ok()) {
        // PENDING and RECOVERING may always fail.
        const absl::Status failed = SetStateLocked(
            record, v1::FAILED,
            absl::StrCat("cannot run on its pinned workers: ", pinned.status().message()));
        if (failed.ok()) changed.push_back(&record);
        continue;
      }
      job.pinned_worker_ids = *std::move(pinned);
    } else {
      // The scheduler asks only when a free worker has a limit; the record outlives the pass.
      job.memory_need_bytes = [&spec](int64_t world_size) -> int64_t {
        absl::StatusOr<sharding::RankMemoryBytes> need =
            jobspec::JobMemoryNeed(spec, spec.mode(), world_size);
        // A job that cannot be planned fails where the placement plans it.
        return need.ok() ? need->total : 0;
      };
      if (record.regroup.has_value()) {
        bool noticed = false;
        job.regrouping = StillRegroupingLocked(record, &noticed);
        if (noticed) changed.push_back(&record);
        // The scheduler ignores those that are not free.
        job.preferred_worker_ids = record.regroup->members;
      }
    }
    pending.push_back(std::move(job));
  }
  std::vector<FreeWorker> free_workers;
  LiveWorkerCounts live_workers;
  if (!pending.empty()) {
    for (v1::DeviceKind kind : {v1::CPU, v1::CUDA}) {
      for (const v1::WorkerInfo* worker : workers_.IdleWorkers(kind)) {
        free_workers.push_back({worker->id(), worker->host(), kind, worker->memory_limit_bytes()});
      }
    }
    for (const v1::WorkerInfo* worker : workers_.List(v1::WORKER_STATE_UNSPECIFIED)) {
      if (worker->state() == v1::IDLE || worker->state() == v1::BUSY) {
        ++live_workers[worker->device_kind()];
      }
    }
  }
  const ScheduleResult scheduled =
      Schedule(pending, free_workers, live_workers, clock_->Now(), options_.scheduler);
  absl::flat_hash_map<std::string, const std::string*> unschedulable_reasons;
  for (const UnschedulableJob& job : scheduled.unschedulable) {
    unschedulable_reasons[job.job_id] = &job.reason;
  }
  for (const PendingJob& job : pending) {
    JobRecord& record = jobs_[job.job_id];
    const auto it = unschedulable_reasons.find(job.job_id);
    const std::string reason = it == unschedulable_reasons.end() ? "" : *it->second;
    if (SetUnschedulableReasonLocked(record, reason) && !absl::c_linear_search(changed, &record)) {
      changed.push_back(&record);
    }
  }
  for (const Placement& placement : scheduled.placements) {
    JobRecord& record = jobs_[placement.job_id];
    absl::StatusOr<sharding::ShardPlan> plan =
        jobspec::PlanForJob(record.job.spec(), static_cast<int64_t>(placement.worker_ids.size()));
    const absl::Status changed_state =
        plan.ok() ? StartGenerationLocked(record, placement.worker_ids, *std::move(plan))
                  : SetStateLocked(record, v1::FAILED,
                                   absl::StrCat("cannot plan: ", plan.status().message()));
    if (!changed_state.ok()) {
      // The scheduler places only PENDING and RECOVERING jobs, which may start or fail: a
      // refusal here is a bug, and the job is left for the next pass.
      ZS_LOG(ERROR) << "scheduler: job " << placement.job_id
                    << " left as it was: " << changed_state;
      continue;
    }
    if (!absl::c_linear_search(changed, &record)) changed.push_back(&record);
  }
  if (!changed.empty()) PersistLocked(changed);
}

bool JobManager::SetUnschedulableReasonLocked(JobRecord& record, const std::string& reason) {
  if (reason == record.unschedulable_reason) return false;
  if (record.unschedulable_reason.empty()) {
    // After a restart the stored message may still end in an old reason: it is not kept.
    const std::string& message = record.job.message();
    const size_t old_reason = message.find(kUnschedulablePrefix);
    record.message_before_unschedulable =
        old_reason == std::string::npos
            ? message
            : std::string(absl::StripSuffix(message.substr(0, old_reason), "; "));
  }
  record.unschedulable_reason = reason;
  // No event: the reason changes with the live workers (a restarted coordinator sees none at
  // first), and what the job's owner should know is why it waits now.
  const std::string& before = record.message_before_unschedulable;
  record.job.set_message(reason.empty() || before.empty() ? before + reason
                                                          : absl::StrCat(before, "; ", reason));
  ZS_LOG(INFO) << "job " << record.job.id() << ": "
               << (reason.empty() ? "schedulable again: enough workers are live" : reason);
  return true;
}

}  // namespace zeroshard::coordinator
