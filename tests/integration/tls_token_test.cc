// End to end with transport security and identities, all real processes: a coordinator serving
// TLS with a token file (viewer, submitter, admin and worker entries), one worker holding a worker
// token and one authenticating by client certificate (mTLS), the CLI with each role's token.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "security/identity.h"
#include "security/test_certificates.h"
#include "tests/integration/local_cluster.h"
#include "tests/integration/subprocess.h"

namespace zeroshard::testing {
namespace {

// The CLI's exit codes for a refused caller and an unreachable coordinator (client/main.cc).
constexpr int kExitNotAllowed = 3;
constexpr int kExitUnreachable = 4;

struct Pki {
  std::string dir;
  security::CertificateFiles server;
  security::CertificateFiles worker;  // CN worker-mtls, listed as `cert:worker-mtls worker ...`
  std::string ca;
  std::string other_ca;  // a CA the coordinator's certificate does not come from
};

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

class TlsTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki");
    std::filesystem::create_directories(dir + "/ca");
    std::filesystem::create_directories(dir + "/other");
    absl::StatusOr<security::TestCertificateAuthority> ca =
        security::TestCertificateAuthority::Create(dir + "/ca", "zeroshard-test-ca");
    ASSERT_TRUE(ca.ok()) << ca.status();
    absl::StatusOr<security::TestCertificateAuthority> other =
        security::TestCertificateAuthority::Create(dir + "/other", "other-ca");
    ASSERT_TRUE(other.ok()) << other.status();
    absl::StatusOr<security::CertificateFiles> server = ca->Issue("coordinator");
    ASSERT_TRUE(server.ok()) << server.status();
    absl::StatusOr<security::CertificateFiles> worker = ca->Issue("worker-mtls");
    ASSERT_TRUE(worker.ok()) << worker.status();
    pki_ = {dir, *server, *worker, ca->ca_cert(), other->ca_cert()};

    viewer_token_ = security::RandomSecret();
    submitter_token_ = security::RandomSecret();
    admin_token_ = security::RandomSecret();
    worker_token_ = security::RandomSecret();
    // The admin's token is listed hashed, as an operator who keeps no plaintext copy would.
    token_file_ = WriteFile(dir + "/tokens",
                            absl::StrCat("# token role name\n",                         //
                                         viewer_token_, " viewer alice\n",              //
                                         submitter_token_, " submitter bob\n",          //
                                         "sha256:", security::Sha256Hex(admin_token_),  //
                                         " admin root\n",                               //
                                         worker_token_, " worker pool\n",               //
                                         "cert:worker-mtls worker worker-mtls\n"));
    viewer_file_ = WriteFile(dir + "/viewer.token", viewer_token_ + "\n");
    submitter_file_ = WriteFile(dir + "/submitter.token", submitter_token_ + "\n");
    worker_file_ = WriteFile(dir + "/worker.token", worker_token_ + "\n");
  }

  LocalClusterOptions ClusterOptions() const {
    LocalClusterOptions options;
    options.security.tls_cert_file = pki_.server.cert;
    options.security.tls_key_file = pki_.server.key;
    options.security.tls_client_ca_file = pki_.ca;
    options.security.token_file = token_file_;
    options.security.ca_file = pki_.ca;
    options.security.client_token = admin_token_;
    return options;
  }

  absl::StatusOr<CommandResult> Cli(const LocalCluster& cluster,
                                    const std::vector<std::string>& credentials,
                                    const std::vector<std::string>& args) const {
    std::vector<std::string> argv = {LocalCluster::RunfilePath("client/zeroshard"),
                                     "--coordinator=" + cluster.coordinator_target()};
    argv.insert(argv.end(), credentials.begin(), credentials.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, absl::Minutes(3));
  }

  Pki pki_;
  std::string viewer_token_, submitter_token_, admin_token_, worker_token_;
  std::string token_file_, viewer_file_, submitter_file_, worker_file_;
};

TEST_F(TlsTokenTest, RolesTokensAndCertificatesEndToEnd) {
  LocalCluster cluster(ClusterOptions());
  LogTailsOnFailure tails(cluster);
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  // One worker with the worker token, one with its client certificate (and no token).
  ASSERT_TRUE(cluster.StartWorker("worker-0", {"--token_file=" + worker_file_}, {}).ok());
  ASSERT_TRUE(
      cluster
          .StartWorker("worker-1", {"--cert=" + pki_.worker.cert, "--key=" + pki_.worker.key}, {})
          .ok());
  ASSERT_TRUE(cluster.WaitForIdleWorkers(2, absl::Seconds(60)).ok()) << cluster.LogTails();

  const std::vector<std::string> as_viewer = {"--ca=" + pki_.ca, "--token_file=" + viewer_file_};
  const std::vector<std::string> as_submitter = {"--ca=" + pki_.ca,
                                                 "--token_file=" + submitter_file_};

  // The submitter's job runs on both workers to the end.
  absl::StatusOr<CommandResult> submitted =
      Cli(cluster, as_submitter,
          {"submit", "--name=secure", "--preset=seed", "--optimizer=adamw", "--lr=0.01",
           "--workers=2", "--steps=20", "--mode=zero1"});
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_EQ(submitted->exit_code(), 0) << submitted->stderr_text;
  const std::string job_id(absl::StripSuffix(submitted->stdout_text, "\n"));
  ASSERT_TRUE(absl::StartsWith(job_id, "job-")) << submitted->stdout_text;

  // The viewer follows it to SUCCEEDED (watch exits 0 only then).
  absl::StatusOr<CommandResult> watched = Cli(cluster, as_viewer, {"watch", job_id});
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->exit_code(), 0) << watched->stdout_text << watched->stderr_text;
  absl::StatusOr<v1::Job> job = cluster.client().GetJob(job_id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::SUCCEEDED) << job->ShortDebugString();
  EXPECT_EQ(job->worker_ids_size(), 2);

  // The job records who submitted it, and `get` shows it. [part A fills Job.submitter]
  EXPECT_EQ(job->submitter(), "bob");
  absl::StatusOr<CommandResult> got = Cli(cluster, as_viewer, {"get", job_id});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->exit_code(), 0) << got->stderr_text;
  EXPECT_TRUE(absl::StrContains(got->stdout_text, "submitter=bob")) << got->stdout_text;

  // A viewer may not submit. [part A enforces roles]
  absl::StatusOr<CommandResult> refused = Cli(cluster, as_viewer,
                                              {"submit", "--name=viewer-job", "--preset=seed",
                                               "--optimizer=sgd", "--lr=0.1", "--workers=1"});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->exit_code(), kExitNotAllowed) << refused->stderr_text;
  EXPECT_TRUE(absl::StrContains(refused->stderr_text, "PERMISSION_DENIED")) << refused->stderr_text;

  // Without a token, nothing but the health service. [part A authenticates]
  absl::StatusOr<CommandResult> anonymous = Cli(cluster, {"--ca=" + pki_.ca}, {"jobs"});
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  EXPECT_EQ(anonymous->exit_code(), kExitNotAllowed) << anonymous->stderr_text;
  EXPECT_TRUE(absl::StrContains(anonymous->stderr_text, "UNAUTHENTICATED"))
      << anonymous->stderr_text;

  // A client trusting another CA does not get past the handshake, whatever its token.
  absl::StatusOr<CommandResult> wrong_ca =
      Cli(cluster, {"--ca=" + pki_.other_ca, "--token_file=" + submitter_file_}, {"jobs"});
  ASSERT_TRUE(wrong_ca.ok()) << wrong_ca.status();
  EXPECT_EQ(wrong_ca->exit_code(), kExitUnreachable) << wrong_ca->stderr_text;
  EXPECT_TRUE(absl::StrContains(wrong_ca->stderr_text, "UNAVAILABLE")) << wrong_ca->stderr_text;

  // A worker without credentials cannot register: it gives up at once. [part A authenticates]
  absl::StatusOr<int> anonymous_worker = cluster.StartWorker("worker-2");
  ASSERT_TRUE(anonymous_worker.ok()) << anonymous_worker.status();
  absl::StatusOr<int> exit_status = cluster.WaitForWorkerExit(*anonymous_worker, absl::Seconds(30));
  ASSERT_TRUE(exit_status.ok()) << exit_status.status();
  EXPECT_TRUE(WIFEXITED(*exit_status) && WEXITSTATUS(*exit_status) != 0);
  EXPECT_FALSE(cluster.FindWorker("worker-2").ok());

  // The anonymous worker's failure is expected: StopAll would count it.
  for (int index : {0, 1}) ASSERT_TRUE(cluster.KillWorker(index, SIGTERM).ok());
  for (int index : {0, 1}) {
    absl::StatusOr<int> stopped = cluster.WaitForWorkerExit(index, absl::Seconds(30));
    ASSERT_TRUE(stopped.ok()) << stopped.status();
    EXPECT_TRUE(WIFEXITED(*stopped) && WEXITSTATUS(*stopped) == 0) << index;
  }
  EXPECT_TRUE(cluster.StopCoordinator().ok());
}

}  // namespace
}  // namespace zeroshard::testing
