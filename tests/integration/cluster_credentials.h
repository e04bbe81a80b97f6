// TLS and tokens for a LocalCluster, the way clusters run (docs/operations.md, "TLS and
// tokens"): a throwaway CA, the coordinator's certificate, and a token file with an admin (the
// harness's client), a submitter and a worker entry, every worker holding the worker token.
#ifndef ZEROSHARD_TESTS_INTEGRATION_CLUSTER_CREDENTIALS_H_
#define ZEROSHARD_TESTS_INTEGRATION_CLUSTER_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tests/integration/local_cluster.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::testing {

struct ClusterCredentials {
  // For LocalClusterOptions::security: TLS, the token file, the admin's token for the harness's
  // client and the worker token file for every worker.
  LocalClusterSecurity security;
  std::string ca_file;
  std::string admin_token;
  std::string submitter_token;
  std::string worker_token;
};

// Makes them under `dir` (created if missing).
absl::StatusOr<ClusterCredentials> MakeClusterCredentials(const std::string& dir);

// A stub of the coordinator at `target` over TLS (trusting `credentials.ca_file`) that sends
// `token`, and `worker_secret` as the worker secret when not empty, on every call: an outside
// caller holding that token (and secret).
std::unique_ptr<v1::Coordinator::Stub> CallerStub(const ClusterCredentials& credentials,
                                                  const std::string& target,
                                                  const std::string& token,
                                                  const std::string& worker_secret = "");

}  // namespace zeroshard::testing

#endif  // ZEROSHARD_TESTS_INTEGRATION_CLUSTER_CREDENTIALS_H_
