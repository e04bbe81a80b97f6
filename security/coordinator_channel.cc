#include "security/coordinator_channel.h"

#include <cstdlib>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_interceptor.h"
#include "security/identity.h"
#include "security/loopback.h"
#include "security/metadata.h"

namespace zeroshard::security {
namespace {

// Adds the caller's credentials to every call's initial metadata.
class CredentialsInterceptor final : public grpc::experimental::Interceptor {
 public:
  CredentialsInterceptor(const std::string* authorization, const WorkerSecret* worker_secret)
      : authorization_(authorization), worker_secret_(worker_secret) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      std::multimap<std::string, std::string>* metadata = methods->GetSendInitialMetadata();
      if (!authorization_->empty()) metadata->emplace(kAuthorizationKey, *authorization_);
      if (worker_secret_ != nullptr) {
        std::string secret = worker_secret_->Get();
        if (!secret.empty()) metadata->emplace(kWorkerSecretKey, std::move(secret));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string* const authorization_;
  const WorkerSecret* const worker_secret_;
};

// Owns what the interceptors point at; lives as long as the channel (the factory is kept by it).
class CredentialsInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  CredentialsInterceptorFactory(std::string token,
                                std::shared_ptr<const WorkerSecret> worker_secret)
      : authorization_(token.empty() ? "" : absl::StrCat(kBearerPrefix, token)),
        worker_secret_(std::move(worker_secret)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new CredentialsInterceptor(&authorization_, worker_secret_.get());
  }

 private:
  const std::string authorization_;
  const std::shared_ptr<const WorkerSecret> worker_secret_;
};

}  // namespace

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  ZS_ASSIGN_OR_RETURN(std::string text, ReadPemFile("token_file", path));
  const size_t newline = text.find('\n');
  std::string token(absl::StripAsciiWhitespace(text.substr(0, newline)));
  ZS_RETURN_IF_ERROR(CheckTokenSyntax(absl::StrCat("token_file ", path, ": "), token));
  return token;
}

absl::StatusOr<ClientCredentials> ClientCredentialsFromFlags(const std::string& ca,
                                                             const std::string& cert,
                                                             const std::string& key,
                                                             const std::string& token_file) {
  ClientCredentials credentials;
  credentials.tls.ca_file = ca;
  credentials.tls.cert_file = cert;
  credentials.tls.key_file = key;
  if (!token_file.empty()) {
    ZS_ASSIGN_OR_RETURN(credentials.token, ReadTokenFile(token_file));
  } else if (const char* env = std::getenv("ZEROSHARD_TOKEN"); env != nullptr && *env != '\0') {
    credentials.token = std::string(absl::StripAsciiWhitespace(env));
    ZS_RETURN_IF_ERROR(CheckTokenSyntax("ZEROSHARD_TOKEN: ", credentials.token));
  }
  const char* insecure = std::getenv(kInsecureEnv);
  credentials.insecure = insecure != nullptr && std::string_view(insecure) == "1";
  return credentials;
}

void WorkerSecret::Set(std::string secret) {
  absl::MutexLock lock(&mu_);
  secret_ = std::move(secret);
}

std::string WorkerSecret::Get() const {
  absl::MutexLock lock(&mu_);
  return secret_;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateCoordinatorChannel(
    const std::string& target, const ClientCredentials& credentials,
    const grpc::ChannelArguments& args, std::shared_ptr<const WorkerSecret> worker_secret) {
  if (!credentials.token.empty() && !credentials.tls.enabled() && !credentials.insecure &&
      !IsLoopbackTarget(target)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to send a token in plaintext to ", target, ", which is not a loopback address (",
        kLoopbackRule, "): connect with TLS (--ca), or pass --insecure (or set ", kInsecureEnv,
        "=1) to send it unencrypted as before (trusted networks only)"));
  }
  ZS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> channel_credentials,
                      MakeChannelCredentials(credentials.tls));
  if (credentials.token.empty() && worker_secret == nullptr) {
    return grpc::CreateCustomChannel(target, channel_credentials, args);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(
      std::make_unique<CredentialsInterceptorFactory>(credentials.token, std::move(worker_secret)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, channel_credentials, args,
                                                                 std::move(factories));
}

}  // namespace zeroshard::security
