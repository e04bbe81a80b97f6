// Tests of the role table: the messages, and spot checks of each role's reach.
#include "coordinator/authorization.h"

#include "gtest/gtest.h"

namespace zeroshard::coordinator {
namespace {

using security::Identity;
using security::Role;

TEST(AuthorizationTest, DeniedMessageNamesRoleMethodAndWhoMay) {
  const absl::Status denied = Authorize(Identity{"alice", Role::kViewer}, Method::kSubmitJob);
  EXPECT_EQ(denied.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.message(), "role viewer may not call SubmitJob (submitter, admin may)");
  const absl::Status worker_denied =
      Authorize(Identity{"node-1", Role::kWorker}, Method::kListJobs);
  EXPECT_EQ(worker_denied.message(),
            "role worker may not call ListJobs (viewer, submitter, admin may)");
}

TEST(AuthorizationTest, AdminMayCallEveryMethod) {
  for (int m = 0; m <= static_cast<int>(Method::kVerifyCheckpoint); ++m) {
    const Method method = static_cast<Method>(m);
    EXPECT_TRUE(Authorize(Identity{"root", Role::kAdmin}, method).ok()) << MethodName(method);
  }
}

TEST(AuthorizationTest, WorkerMayCallOnlyTheDaemonsRpcs) {
  const Identity worker{"node-1", Role::kWorker};
  for (Method method :
       {Method::kRegisterWorker, Method::kHeartbeat, Method::kLeaveWorker, Method::kStoreSet,
        Method::kStoreGet, Method::kStoreAdd, Method::kStoreDelete, Method::kReportProgress,
        Method::kCommitCheckpoint, Method::kRewindJob}) {
    EXPECT_TRUE(Authorize(worker, method).ok()) << MethodName(method);
  }
  for (Method method :
       {Method::kSubmitJob, Method::kCancelJob, Method::kGetJob, Method::kWatchJob,
        Method::kExportCheckpoint, Method::kReflection, Method::kVerifyCheckpoint}) {
    EXPECT_EQ(Authorize(worker, method).code(), absl::StatusCode::kPermissionDenied)
        << MethodName(method);
  }
}

TEST(AuthorizationTest, OnlyAnAdminMayVerifyACheckpoint) {
  for (Role role : {Role::kViewer, Role::kSubmitter, Role::kWorker}) {
    EXPECT_EQ(Authorize(Identity{"x", role}, Method::kVerifyCheckpoint).code(),
              absl::StatusCode::kPermissionDenied)
        << security::RoleName(role);
  }
  EXPECT_TRUE(Authorize(Identity{"root", Role::kAdmin}, Method::kVerifyCheckpoint).ok());
  EXPECT_EQ(Authorize(Identity{"v", Role::kViewer}, Method::kVerifyCheckpoint).message(),
            "role viewer may not call VerifyCheckpoint (admin may)");
  EXPECT_EQ(MethodName(Method::kVerifyCheckpoint), "VerifyCheckpoint");
}

TEST(AuthorizationTest, ViewerReadsAndSubmitterAlsoSubmits) {
  const Identity viewer{"v", Role::kViewer};
  const Identity submitter{"s", Role::kSubmitter};
  for (Method method : {Method::kListWorkers, Method::kGetJob, Method::kListJobs, Method::kWatchJob,
                        Method::kGetShardPlan, Method::kExportCheckpoint, Method::kReflection}) {
    EXPECT_TRUE(Authorize(viewer, method).ok()) << MethodName(method);
    EXPECT_TRUE(Authorize(submitter, method).ok()) << MethodName(method);
  }
  for (Method method : {Method::kSubmitJob, Method::kCancelJob}) {
    EXPECT_EQ(Authorize(viewer, method).code(), absl::StatusCode::kPermissionDenied);
    EXPECT_TRUE(Authorize(submitter, method).ok()) << MethodName(method);
  }
  for (Method method : {Method::kRegisterWorker, Method::kReportProgress, Method::kStoreSet}) {
    EXPECT_EQ(Authorize(submitter, method).code(), absl::StatusCode::kPermissionDenied);
  }
}

}  // namespace
}  // namespace zeroshard::coordinator
