// Channels to the coordinator that carry the caller's credentials: TLS from ClientTlsOptions,
// and on every call the bearer token and, for workers, the secret RegisterWorker returned.
// The CLI, the worker daemon and the benchmarks make their channels here.
#ifndef ZEROSHARD_SECURITY_COORDINATOR_CHANNEL_H_
#define ZEROSHARD_SECURITY_COORDINATOR_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "security/tls_files.h"

namespace zeroshard::security {

struct ClientCredentials {
  ClientTlsOptions tls;
  // Sent as "authorization: Bearer <token>" on every call; empty sends none.
  std::string token;
  // Send the token even in plaintext to a target that is not loopback (--insecure,
  // $ZEROSHARD_INSECURE=1). Without it CreateCoordinatorChannel refuses such a channel.
  bool insecure = false;
};

// The flags' meaning, shared by every client: --ca, --cert, --key and --token_file (a file whose
// first line is the token). Without --token_file the token comes from $ZEROSHARD_TOKEN, if set.
// `insecure` is true when $ZEROSHARD_INSECURE is 1 (callers OR in their --insecure flag).
// Errors name the flag.
absl::StatusOr<ClientCredentials> ClientCredentialsFromFlags(const std::string& ca,
                                                             const std::string& cert,
                                                             const std::string& key,
                                                             const std::string& token_file);

// The first line of `path`, trimmed: a token (16 to 256 printable characters).
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

// The worker secret a daemon got from RegisterWorker, shared with its channel's interceptor.
// Thread-safe.
class WorkerSecret {
 public:
  void Set(std::string secret) ABSL_LOCKS_EXCLUDED(mu_);
  std::string Get() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  std::string secret_ ABSL_GUARDED_BY(mu_);
};

// A channel to `target` with `credentials`. `worker_secret`, when given, is read on every call
// and sent while it is not empty. A token without TLS is sent only to a loopback target
// (IsLoopbackTarget) unless `credentials.insecure`: otherwise FAILED_PRECONDITION naming --ca,
// --insecure and ZEROSHARD_INSECURE=1.
absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateCoordinatorChannel(
    const std::string& target, const ClientCredentials& credentials,
    const grpc::ChannelArguments& args = grpc::ChannelArguments(),
    std::shared_ptr<const WorkerSecret> worker_secret = nullptr);

}  // namespace zeroshard::security

#endif  // ZEROSHARD_SECURITY_COORDINATOR_CHANNEL_H_
