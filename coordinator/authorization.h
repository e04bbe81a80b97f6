// Which role may call which Coordinator RPC: the role table of docs/api.md ("Identities and
// roles") as code, in one place. Binding a worker to its own registration is the service's part.
#ifndef ZEROSHARD_COORDINATOR_AUTHORIZATION_H_
#define ZEROSHARD_COORDINATOR_AUTHORIZATION_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "security/identity.h"

namespace zeroshard::coordinator {

// The RPCs the role table covers. The health service is open to everyone and not listed.
enum class Method {
  kRegisterWorker,
  kHeartbeat,
  kLeaveWorker,
  kListWorkers,
  kSubmitJob,
  kGetJob,
  kListJobs,
  kCancelJob,
  kWatchJob,
  kGetShardPlan,
  kStoreSet,
  kStoreGet,
  kStoreAdd,
  kStoreDelete,
  kReportProgress,
  kCommitCheckpoint,
  kRewindJob,
  kExportCheckpoint,
  kReflection,
  kVerifyCheckpoint,
};

// The RPC's name as gRPC spells it ("SubmitJob"; "ServerReflectionInfo" for reflection).
absl::string_view MethodName(Method method);

// The roles that may call `method`, in the order viewer, submitter, admin, worker.
std::vector<security::Role> RolesAllowed(Method method);

// OK when `caller`'s role may call `method`; else PERMISSION_DENIED naming the role, the method
// and the roles that may ("role viewer may not call SubmitJob (submitter, admin may)").
// Thread-safe (reads a constant table).
absl::Status Authorize(const security::Identity& caller, Method method);

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_AUTHORIZATION_H_
