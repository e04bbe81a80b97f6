// The role table of docs/api.md ("Identities and roles").
#include "coordinator/authorization.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace zeroshard::coordinator {
namespace {

using security::Role;

struct Grant {
  bool viewer;
  bool submitter;
  bool admin;
  bool worker;
};

// viewer reads; submitter reads and submits (CancelJob only of its own jobs, which the service
// checks against the job); admin may call everything, and alone the operators' RPCs; worker only
// the daemons' RPCs (bound to its own registration and assignment by the service).
constexpr Grant kReader{true, true, true, false};
constexpr Grant kSubmitter{false, true, true, false};
constexpr Grant kWorker{false, false, true, true};
constexpr Grant kAdminOnly{false, false, true, false};

Grant GrantOf(Method method) {
  switch (method) {
    case Method::kListWorkers:
    case Method::kGetJob:
    case Method::kListJobs:
    case Method::kWatchJob:
    case Method::kGetShardPlan:
    case Method::kExportCheckpoint:
    case Method::kReflection:
      return kReader;
    case Method::kSubmitJob:
    case Method::kCancelJob:
      return kSubmitter;
    case Method::kRegisterWorker:
    case Method::kHeartbeat:
    case Method::kLeaveWorker:
    case Method::kStoreSet:
    case Method::kStoreGet:
    case Method::kStoreAdd:
    case Method::kStoreDelete:
    case Method::kReportProgress:
    case Method::kCommitCheckpoint:
    case Method::kRewindJob:
      return kWorker;
    // Reads whole checkpoints from the volume: an operator's tool, not a reader's.
    case Method::kVerifyCheckpoint:
      return kAdminOnly;
  }
  // An enum value outside the table grants nothing.
  return Grant{false, false, false, false};
}

bool Allows(const Grant& grant, Role role) {
  switch (role) {
    case Role::kViewer:
      return grant.viewer;
    case Role::kSubmitter:
      return grant.submitter;
    case Role::kAdmin:
      return grant.admin;
    case Role::kWorker:
      return grant.worker;
  }
  return false;
}

}  // namespace

absl::string_view MethodName(Method method) {
  switch (method) {
    case Method::kRegisterWorker:
      return "RegisterWorker";
    case Method::kHeartbeat:
      return "Heartbeat";
    case Method::kLeaveWorker:
      return "LeaveWorker";
    case Method::kListWorkers:
      return "ListWorkers";
    case Method::kSubmitJob:
      return "SubmitJob";
    case Method::kGetJob:
      return "GetJob";
    case Method::kListJobs:
      return "ListJobs";
    case Method::kCancelJob:
      return "CancelJob";
    case Method::kWatchJob:
      return "WatchJob";
    case Method::kGetShardPlan:
      return "GetShardPlan";
    case Method::kStoreSet:
      return "StoreSet";
    case Method::kStoreGet:
      return "StoreGet";
    case Method::kStoreAdd:
      return "StoreAdd";
    case Method::kStoreDelete:
      return "StoreDelete";
    case Method::kReportProgress:
      return "ReportProgress";
    case Method::kCommitCheckpoint:
      return "CommitCheckpoint";
    case Method::kRewindJob:
      return "RewindJob";
    case Method::kExportCheckpoint:
      return "ExportCheckpoint";
    case Method::kReflection:
      return "ServerReflectionInfo";
    case Method::kVerifyCheckpoint:
      return "VerifyCheckpoint";
  }
  return "unknown method";
}

std::vector<Role> RolesAllowed(Method method) {
  const Grant grant = GrantOf(method);
  std::vector<Role> roles;
  for (Role role : {Role::kViewer, Role::kSubmitter, Role::kAdmin, Role::kWorker}) {
    if (Allows(grant, role)) roles.push_back(role);
  }
  return roles;
}

absl::Status Authorize(const security::Identity& caller, Method method) {
  if (Allows(GrantOf(method), caller.role)) return absl::OkStatus();
  std::vector<std::string> allowed;
  for (Role role : RolesAllowed(method)) allowed.emplace_back(security::RoleName(role));
  return absl::PermissionDeniedError(absl::StrCat("role ", security::RoleName(caller.role),
                                                  " may not call ", MethodName(method), " (",
                                                  absl::StrJoin(allowed, ", "), " may)"));
}

}  // namespace zeroshard::coordinator
