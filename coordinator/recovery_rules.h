// The rules of a job's recovery, as pure functions (like scheduler.h): which worker may take back
// a rank of a generation a restarted coordinator adopts, which ranks an adoption still misses,
// and which members of an ended generation the next one waits for while it regroups. The job
// manager (job_manager.h, "Adoption" and "Regrouping") applies them to its records.
#ifndef ZEROSHARD_COORDINATOR_RECOVERY_RULES_H_
#define ZEROSHARD_COORDINATOR_RECOVERY_RULES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/job_store.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// What a RegisterWorker caller proves about the registration its request names
// (previous_worker_id): replacing or adopting a registration needs proof of being that worker.
struct RegistrationProof {
  // The caller may act for any worker (an admin, or every caller of a coordinator without a
  // token file): it needs no proof.
  bool acts_for_any_worker = true;
  // The worker secret the call carried (metadata zeroshard-worker-secret): the one the previous
  // registration got. Empty: none.
  std::string presented_secret;
};

// ---- Adoption ----

// Whether a restarted coordinator can adopt `job`'s running generation from the RUN assignment
// stored for it (`stored`, null when none was): it is a RUN assignment of that generation and
// world size. FAILED_PRECONDITION saying why not.
absl::Status CheckStoredRunAssignment(const v1::Job& job, const v1::Assignment* stored);
// And whether the job's plan, made again now (`planned_layout_hash`), is the one the workers run.
absl::Status CheckSameLayout(uint64_t planned_layout_hash, const v1::Assignment& stored);

// What the manager knows about the job a re-registering worker names in its status.
struct AdoptionTarget {
  const v1::Job* job = nullptr;
  // The job is adopting its generation (JobManager's JobRecord::adoption is set).
  bool adopting = false;
  // Who held each rank of the generation (by rank; an empty worker_id where none is known).
  const std::vector<RankIdentity>* rank_identities = nullptr;
  // The request's previous_worker_id is registered again already.
  bool previous_id_registered = false;
  // The id of the live registration that holds the request's name, if one does.
  std::optional<std::string> live_name_holder;
};

// Whether the registering worker (`request`, with `proof`) may take back its rank of the
// generation `target` adopts: the generation is the one being adopted, the previous id held that
// rank and is free, the caller proves it is that worker (unless it acts for any worker), and no
// live registration holds its name. OK, or the status naming the first rule it breaks.
absl::Status CheckRankAdoption(const v1::RegisterWorkerRequest& request,
                               const RegistrationProof& proof, const AdoptionTarget& target);

// The ranks of a generation of `world_size` ranks not in `returned`, in rank order.
std::vector<int32_t> MissingRanks(int32_t world_size, const absl::flat_hash_set<int32_t>& returned);

// ---- Regrouping ----

// The ranks a heartbeat's status names lost (status.lost_peer_ranks) that count for a regroup of
// `generation` whose members (rank order) are `members`: only a member's report about that
// generation counts, and only ranks of other members. Empty when the report does not count.
std::vector<int32_t> LostPeersToNote(const std::string& reporter_id, const v1::WorkerStatus& status,
                                     int64_t generation, const std::vector<std::string>& members);

// Whether a member of generation `generation` of `job_id` is still awaited by its job's regroup:
// it is live (IDLE or BUSY; `worker` null when not registered) and still told to ABORT that
// generation. A member named lost, DEAD, LEFT or placed elsewhere is not.
bool IsAwaitedMember(const v1::WorkerInfo* worker, const std::string& job_id, int64_t generation);

// The members still awaited ("id (rank r)", rank order): not in `lost`, and IsAwaitedMember as
// `workers` (by rank: each member's registration, null where it has none) show them.
std::vector<std::string> AwaitedMembers(const std::vector<std::string>& members,
                                        const absl::flat_hash_set<std::string>& lost,
                                        const std::vector<const v1::WorkerInfo*>& workers,
                                        const std::string& job_id, int64_t generation);

// What a regrouping job does at `now`: wait while members are awaited and the deadline has not
// passed; else stop waiting, with every member back or (a NOTICE naming them) without some.
enum class RegroupStep { kWait, kAllBack, kStopWaiting };
RegroupStep NextRegroupStep(bool members_awaited, absl::Time now, absl::Time deadline);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_RECOVERY_RULES_H_
