// Tests of the coordinator benchmarks' own logic: the --security flag, the quantile, and that
// the certificates and token file they make give a TLS coordinator the simulated workers reach.
#include "tests/bench/coordinator_load_lib.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "apps/coordinator/coordinator_server.h"
#include "gtest/gtest.h"
#include "security/identity.h"

namespace zeroshard::bench {
namespace {

TEST(ParseSecurityFlagTest, AcceptsTheThreeConfigurationsOnly) {
  EXPECT_EQ(*ParseSecurityFlag("plaintext"), std::vector<Security>{Security::kPlaintext});
  EXPECT_EQ(*ParseSecurityFlag("tls_tokens"), std::vector<Security>{Security::kTlsTokens});
  EXPECT_EQ(*ParseSecurityFlag("both"),
            (std::vector<Security>{Security::kPlaintext, Security::kTlsTokens}));
  EXPECT_FALSE(ParseSecurityFlag("tls").ok());
}

TEST(QuantileTest, PicksByRank) {
  EXPECT_EQ(Quantile({}, 0.5), 0);
  EXPECT_EQ(Quantile({5, 1, 3, 2, 4}, 0.5), 3);
  EXPECT_EQ(Quantile({5, 1, 3, 2, 4}, 1.0), 5);
  EXPECT_EQ(Quantile({5, 1, 3, 2, 4}, 0.0), 1);
}

class SecuredCoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Each test its own directory: the tests share TEST_TMPDIR.
    const std::string base =
        absl::StrCat(getenv("TEST_TMPDIR"), "/",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(mkdir(base.c_str(), 0700), 0);
    dir_ = absl::StrCat(base, "/pki");
    ASSERT_EQ(mkdir(dir_.c_str(), 0700), 0);
    absl::StatusOr<BenchCredentials> credentials = MakeTlsAndTokens(dir_);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    credentials_ = *credentials;
    coordinator::CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = -1;
    options.state_dir = absl::StrCat(base, "/state");
    options.tls = credentials_.server_tls;
    options.token_file = credentials_.token_file;
    absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
        coordinator::CoordinatorServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  std::string dir_;
  BenchCredentials credentials_;
  std::unique_ptr<coordinator::CoordinatorServer> server_;
};

TEST_F(SecuredCoordinatorTest, TokenFileHoldsAWorkerAndAnAdmin) {
  ASSERT_TRUE(server_->tls_enabled());
  ASSERT_TRUE(server_->authenticator()->enabled());
  EXPECT_EQ(server_->authenticator()->entries(), 2u);
  EXPECT_NE(credentials_.worker.token, credentials_.admin.token);
}

TEST_F(SecuredCoordinatorTest, WorkersRegisterAndBeatOverTlsWithTheirToken) {
  absl::StatusOr<std::unique_ptr<LoadBench>> bench =
      LoadBench::Create(server_->grpc_target(), credentials_.worker, credentials_.admin, 2);
  ASSERT_TRUE(bench.ok()) << bench.status();
  EXPECT_EQ((*bench)->RegisterWorkers(3), 0);
  CallLog log;
  (*bench)->PeriodicHeartbeats(absl::Milliseconds(20), absl::Milliseconds(60), 1, log);
  EXPECT_GT(log.count(), 0);
  EXPECT_EQ(log.errors(), 0);
  absl::StatusOr<LoadBench::Scheduled> job = (*bench)->SubmitAndAwaitRunning("two", 2);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_GE((*bench)->IndexOf(job->job.worker_ids(0)), 0);
}

TEST_F(SecuredCoordinatorTest, CredentialsMadeAgainInTheSameDirectoryWork) {
  // Every benchmark round makes fresh credentials in one directory; the second CA must not trip
  // over the first one's serials.
  absl::StatusOr<BenchCredentials> again = MakeTlsAndTokens(dir_);
  ASSERT_TRUE(again.ok()) << again.status();
  coordinator::CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_port = -1;
  options.state_dir = absl::StrCat(dir_, "/../second-state");
  options.tls = again->server_tls;
  options.token_file = again->token_file;
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> second =
      coordinator::CoordinatorServer::Start(options);
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<std::unique_ptr<LoadBench>> bench =
      LoadBench::Create((*second)->grpc_target(), again->worker, again->admin, 1);
  ASSERT_TRUE(bench.ok()) << bench.status();
  EXPECT_EQ((*bench)->RegisterWorkers(2), 0);
  (*second)->Shutdown();
}

TEST_F(SecuredCoordinatorTest, PlaintextWorkersAreRefused) {
  absl::StatusOr<std::unique_ptr<LoadBench>> bench = LoadBench::Create(
      server_->grpc_target(), security::ClientCredentials(), security::ClientCredentials(), 1);
  ASSERT_TRUE(bench.ok()) << bench.status();
  EXPECT_EQ((*bench)->RegisterWorkers(2), 2);
}

TEST_F(SecuredCoordinatorTest, EnforcementCheckPassesWhenIdentitiesAreEnforced) {
  absl::StatusOr<std::unique_ptr<LoadBench>> bench =
      LoadBench::Create(server_->grpc_target(), credentials_.worker, credentials_.admin, 2);
  ASSERT_TRUE(bench.ok()) << bench.status();
  ASSERT_EQ((*bench)->RegisterWorkers(2), 0);
  EXPECT_TRUE((*bench)->CheckEnforcement(server_->grpc_target(), credentials_.worker).ok());
}

TEST_F(SecuredCoordinatorTest, EnforcementCheckFailsWithoutATokenFile) {
  // The same TLS, no token file: every caller is an admin, so nothing is refused.
  coordinator::CoordinatorServerOptions options;
  options.listen_address = "127.0.0.1:0";
  options.metrics_port = -1;
  options.state_dir = absl::StrCat(dir_, "/../open-state");
  options.tls = credentials_.server_tls;
  absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> open =
      coordinator::CoordinatorServer::Start(options);
  ASSERT_TRUE(open.ok()) << open.status();
  absl::StatusOr<std::unique_ptr<LoadBench>> bench =
      LoadBench::Create((*open)->grpc_target(), credentials_.worker, credentials_.admin, 1);
  ASSERT_TRUE(bench.ok()) << bench.status();
  ASSERT_EQ((*bench)->RegisterWorkers(2), 0);
  const absl::Status checked =
      (*bench)->CheckEnforcement((*open)->grpc_target(), credentials_.worker);
  EXPECT_EQ(checked.code(), absl::StatusCode::kFailedPrecondition) << checked;
  (*open)->Shutdown();
}

}  // namespace
}  // namespace zeroshard::bench
