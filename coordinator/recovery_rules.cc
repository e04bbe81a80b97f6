// Adoption and regroup rules: pure functions over the job and worker records they are given.
#include "coordinator/recovery_rules.h"

#include "absl/strings/str_cat.h"
#include "security/identity.h"

namespace zeroshard::coordinator {

absl::Status CheckStoredRunAssignment(const v1::Job& job, const v1::Assignment* stored) {
  if (stored == nullptr || stored->kind() != v1::ASSIGNMENT_RUN ||
      stored->generation() != job.generation() || stored->world_size() != job.worker_ids_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no RUN assignment of generation ", job.generation(), " was stored"));
  }
  return absl::OkStatus();
}

absl::Status CheckSameLayout(uint64_t planned_layout_hash, const v1::Assignment& stored) {
  if (planned_layout_hash != stored.plan_layout_hash()) {
    return absl::FailedPreconditionError(absl::StrCat("its plan's layout hash is now ",
                                                      planned_layout_hash, ", the workers run ",
                                                      stored.plan_layout_hash()));
  }
  return absl::OkStatus();
}

absl::Status CheckRankAdoption(const v1::RegisterWorkerRequest& request,
                               const RegistrationProof& proof, const AdoptionTarget& target) {
  const v1::WorkerStatus& status = request.status();
  const v1::Job& job = *target.job;
  if (!target.adopting) {
    return absl::FailedPreconditionError(
        absl::StrCat(status.job_id(), " is not adopting a generation (it is ",
                     v1::JobState_Name(job.state()), " in generation ", job.generation(), ")"));
  }
  if (status.generation() != job.generation()) {
    return absl::FailedPreconditionError(absl::StrCat("generation ", status.generation(),
                                                      " is not the one being adopted (",
                                                      job.generation(), ")"));
  }
  if (status.rank() >= job.worker_ids_size() ||
      job.worker_ids(status.rank()) != request.previous_worker_id()) {
    return absl::PermissionDeniedError(
        absl::StrCat(request.previous_worker_id(), " did not hold rank ", status.rank()));
  }
  if (target.previous_id_registered) {
    return absl::AlreadyExistsError(
        absl::StrCat(request.previous_worker_id(), " has registered again already"));
  }
  if (!proof.acts_for_any_worker) {
    const std::vector<RankIdentity>& identities = *target.rank_identities;
    const RankIdentity* identity =
        status.rank() < static_cast<int>(identities.size()) ? &identities[status.rank()] : nullptr;
    if (identity == nullptr || identity->worker_id.empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "no identity was stored for rank ", status.rank(),
          " (a generation started by an older coordinator), so no worker can prove it held it"));
    }
    if (identity->secret_sha256 != security::Sha256(proof.presented_secret)) {
      return absl::PermissionDeniedError(absl::StrCat("worker secret: not the one of ",
                                                      request.previous_worker_id(),
                                                      ", which held rank ", status.rank()));
    }
  }
  if (target.live_name_holder.has_value()) {
    return absl::AlreadyExistsError(absl::StrCat("worker name ", request.name(),
                                                 " is held by the live registration ",
                                                 *target.live_name_holder));
  }
  return absl::OkStatus();
}

std::vector<int32_t> MissingRanks(int32_t world_size,
                                  const absl::flat_hash_set<int32_t>& returned) {
  std::vector<int32_t> missing;
  for (int32_t rank = 0; rank < world_size; ++rank) {
    if (returned.count(rank) == 0) missing.push_back(rank);
  }
  return missing;
}

std::vector<int32_t> LostPeersToNote(const std::string& reporter_id, const v1::WorkerStatus& status,
                                     int64_t generation, const std::vector<std::string>& members) {
  const int count = static_cast<int>(members.size());
  if (generation != status.generation() || status.rank() >= count ||
      members[status.rank()] != reporter_id) {
    return {};
  }
  std::vector<int32_t> lost;
  for (int32_t rank : status.lost_peer_ranks()) {
    if (rank >= count || rank == status.rank()) continue;
    lost.push_back(rank);
  }
  return lost;
}

bool IsAwaitedMember(const v1::WorkerInfo* worker, const std::string& job_id, int64_t generation) {
  if (worker == nullptr || (worker->state() != v1::IDLE && worker->state() != v1::BUSY)) {
    return false;
  }
  // Still aborting that generation: the ABORT is replaced once it no longer runs it.
  const v1::Assignment& assignment = worker->assignment();
  return assignment.kind() == v1::ASSIGNMENT_ABORT && assignment.job_id() == job_id &&
         assignment.generation() == generation;
}

std::vector<std::string> AwaitedMembers(const std::vector<std::string>& members,
                                        const absl::flat_hash_set<std::string>& lost,
                                        const std::vector<const v1::WorkerInfo*>& workers,
                                        const std::string& job_id, int64_t generation) {
  std::vector<std::string> awaited;
  for (int rank = 0; rank < static_cast<int>(members.size()); ++rank) {
    const std::string& id = members[rank];
    if (lost.contains(id)) continue;
    const v1::WorkerInfo* worker =
        rank < static_cast<int>(workers.size()) ? workers[rank] : nullptr;
    if (IsAwaitedMember(worker, job_id, generation)) {
      awaited.push_back(absl::StrCat(id, " (rank ", rank, ")"));
    }
  }
  return awaited;
}

RegroupStep NextRegroupStep(bool members_awaited, absl::Time now, absl::Time deadline) {
  if (members_awaited && now < deadline) return RegroupStep::kWait;
  return members_awaited ? RegroupStep::kStopWaiting : RegroupStep::kAllBack;
}

}  // namespace zeroshard::coordinator
