// Test credentials for local clusters (see cluster_credentials.h).
#include "tests/integration/cluster_credentials.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "security/coordinator_channel.h"
#include "security/identity.h"
#include "security/test_certificates.h"

namespace zeroshard::testing {

absl::StatusOr<ClusterCredentials> MakeClusterCredentials(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir + "/ca", error);
  if (error) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", error.message()));
  ZS_ASSIGN_OR_RETURN(security::TestCertificateAuthority ca,
                      security::TestCertificateAuthority::Create(dir + "/ca", "zeroshard-test-ca"));
  ZS_ASSIGN_OR_RETURN(security::CertificateFiles server, ca.Issue("coordinator"));
  ClusterCredentials credentials;
  credentials.ca_file = ca.ca_cert();
  credentials.admin_token = security::RandomSecret();
  credentials.submitter_token = security::RandomSecret();
  credentials.worker_token = security::RandomSecret();
  const std::string token_file = dir + "/tokens";
  std::ofstream(token_file) << "# token role name\n"
                            << credentials.admin_token << " admin root\n"
                            << credentials.submitter_token << " submitter bob\n"
                            << credentials.worker_token << " worker pool\n";
  const std::string worker_token_file = dir + "/worker.token";
  std::ofstream(worker_token_file) << credentials.worker_token << "\n";
  LocalClusterSecurity& security = credentials.security;
  security.tls_cert_file = server.cert;
  security.tls_key_file = server.key;
  security.token_file = token_file;
  security.ca_file = credentials.ca_file;
  security.client_token = credentials.admin_token;
  security.worker_token_file = worker_token_file;
  return credentials;
}

std::unique_ptr<v1::Coordinator::Stub> CallerStub(const ClusterCredentials& credentials,
                                                  const std::string& target,
                                                  const std::string& token,
                                                  const std::string& worker_secret) {
  security::ClientCredentials client;
  client.tls.ca_file = credentials.ca_file;
  client.token = token;
  std::shared_ptr<security::WorkerSecret> secret;
  if (!worker_secret.empty()) {
    secret = std::make_shared<security::WorkerSecret>();
    secret->Set(worker_secret);
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      security::CreateCoordinatorChannel(target, client, grpc::ChannelArguments(), secret);
  if (!channel.ok()) return nullptr;
  return v1::Coordinator::NewStub(*channel);
}

}  // namespace zeroshard::testing
