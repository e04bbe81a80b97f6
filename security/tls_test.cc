// TLS and identities end to end over loopback: a real gRPC server whose one generic method
// answers who the caller is, reached through CreateCoordinatorChannel.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "security/authenticator.h"
#include "security/coordinator_channel.h"
#include "security/identity.h"
#include "security/metadata.h"
#include "security/test_certificates.h"
#include "security/tls_files.h"

namespace zeroshard::security {
namespace {

using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-token-0123456789";

// Finishes every call at once: OK with trailing metadata "identity: name/role" (and the worker
// secret it got, if any), or the authenticator's error.
class WhoAmIReactor final : public grpc::ServerGenericBidiReactor {
 public:
  WhoAmIReactor(grpc::GenericCallbackServerContext* context, const Authenticator* authenticator) {
    absl::StatusOr<Identity> identity = authenticator->Authenticate(*context);
    if (!identity.ok()) {
      Finish(common::ToGrpcStatus(identity.status()));
      return;
    }
    context->AddTrailingMetadata("identity",
                                 absl::StrCat(identity->name, "/", RoleName(identity->role)));
    auto secret = context->client_metadata().find(kWorkerSecretKey);
    if (secret != context->client_metadata().end()) {
      context->AddTrailingMetadata("secret",
                                   std::string(secret->second.data(), secret->second.size()));
    }
    Finish(grpc::Status::OK);
  }
  void OnDone() override { delete this; }
};

class WhoAmIService final : public grpc::CallbackGenericService {
 public:
  explicit WhoAmIService(const Authenticator* authenticator) : authenticator_(authenticator) {}
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new WhoAmIReactor(context, authenticator_);
  }

 private:
  const Authenticator* const authenticator_;
};

struct CallResult {
  grpc::Status status;
  std::string identity;
  std::string secret;
};

CallResult WhoAmI(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  absl::Notification done;
  CallResult result;
  stub.UnaryCall(&context, "/test.WhoAmI/Call", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status status) {
                   result.status = std::move(status);
                   done.Notify();
                 });
  done.WaitForNotification();
  for (const auto& [key, value] : context.GetServerTrailingMetadata()) {
    if (key == "identity") result.identity = std::string(value.data(), value.size());
    if (key == "secret") result.secret = std::string(value.data(), value.size());
  }
  return result;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(std::getenv("TEST_TMPDIR"), "/pki"));
    ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", *dir_).c_str()), 0);
    absl::StatusOr<TestCertificateAuthority> ca = TestCertificateAuthority::Create(*dir_, "ca");
    ASSERT_TRUE(ca.ok()) << ca.status();
    absl::StatusOr<TestCertificateAuthority> other =
        TestCertificateAuthority::Create(*dir_, "other-ca");
    ASSERT_TRUE(other.ok()) << other.status();
    ca_ = new TestCertificateAuthority(*std::move(ca));
    other_ca_ = new TestCertificateAuthority(*std::move(other));
    absl::StatusOr<CertificateFiles> server = ca_->Issue("coordinator");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = new CertificateFiles(*server);
  }

  void WriteTokens(const std::string& text) { std::ofstream(tokens_path_) << text; }

  // Starts the server with `credentials` and an authenticator over tokens_path_.
  void Serve(std::shared_ptr<grpc::ServerCredentials> credentials) {
    if (!std::ifstream(tokens_path_)) {
      WriteTokens(absl::StrCat(kAliceToken, " submitter alice\ncert:worker-7 worker w7\n"));
    }
    absl::StatusOr<std::unique_ptr<Authenticator>> authenticator =
        Authenticator::FromTokenFile(tokens_path_);
    ASSERT_TRUE(authenticator.ok()) << authenticator.status();
    authenticator_ = *std::move(authenticator);
    service_ = std::make_unique<WhoAmIService>(authenticator_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port_);
    builder.RegisterCallbackGenericService(service_.get());
    server_instance_ = builder.BuildAndStart();
    ASSERT_NE(server_instance_, nullptr);
  }

  void ServeTls(bool require_client_cert = false) {
    ServerTlsOptions options;
    options.cert_file = server_->cert;
    options.key_file = server_->key;
    options.client_ca_file = ca_->ca_cert();
    options.require_client_cert = require_client_cert;
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        MakeServerCredentials(options);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    Serve(*credentials);
  }

  std::shared_ptr<grpc::Channel> Channel(const ClientCredentials& credentials,
                                         std::shared_ptr<const WorkerSecret> secret = nullptr) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = CreateCoordinatorChannel(
        absl::StrCat("127.0.0.1:", port_), credentials, grpc::ChannelArguments(), secret);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return channel.ok() ? *channel : nullptr;
  }

  // A TLS channel built with gRPC directly: sends what our own checks would refuse to send.
  std::shared_ptr<grpc::Channel> RawTlsChannel(const std::string& ca, const CertificateFiles* own) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *ReadPemFile("ca", ca);
    if (own != nullptr) {
      ssl.pem_cert_chain = *ReadPemFile("cert", own->cert);
      ssl.pem_private_key = *ReadPemFile("key", own->key);
    }
    return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), grpc::SslCredentials(ssl));
  }

  void TearDown() override {
    if (server_instance_ != nullptr) server_instance_->Shutdown();
  }

  static std::string* dir_;
  static TestCertificateAuthority* ca_;
  static TestCertificateAuthority* other_ca_;
  static CertificateFiles* server_;
  std::string tokens_path_ =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/tokens-",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::unique_ptr<Authenticator> authenticator_;
  std::unique_ptr<WhoAmIService> service_;
  std::unique_ptr<grpc::Server> server_instance_;
  int port_ = 0;
};

std::string* TlsTest::dir_ = nullptr;
TestCertificateAuthority* TlsTest::ca_ = nullptr;
TestCertificateAuthority* TlsTest::other_ca_ = nullptr;
CertificateFiles* TlsTest::server_ = nullptr;

TEST_F(TlsTest, TokenOverTlsIdentifiesTheCaller) {
  ServeTls();
  ClientCredentials credentials;
  credentials.tls.ca_file = ca_->ca_cert();
  credentials.token = kAliceToken;
  CallResult result = WhoAmI(Channel(credentials));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.identity, "alice/submitter");
}

TEST_F(TlsTest, MissingOrUnknownTokensAreUnauthenticated) {
  ServeTls();
  ClientCredentials credentials;
  credentials.tls.ca_file = ca_->ca_cert();
  CallResult none = WhoAmI(Channel(credentials));
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.status.error_message(), HasSubstr("ZEROSHARD_TOKEN"));
  credentials.token = "mallory-token-0123456789";
  CallResult unknown = WhoAmI(Channel(credentials));
  EXPECT_EQ(unknown.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(unknown.status.error_message(), HasSubstr("not in the coordinator's token file"));
  EXPECT_THAT(unknown.status.error_message(), ::testing::Not(HasSubstr("mallory")));
}

TEST_F(TlsTest, AClientThatTrustsAnotherCaIsRefusedAtTheHandshake) {
  ServeTls();
  ClientCredentials credentials;
  credentials.tls.ca_file = other_ca_->ca_cert();
  credentials.token = kAliceToken;
  CallResult result = WhoAmI(Channel(credentials));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(result.identity.empty());
}

TEST_F(TlsTest, PlaintextClientsCannotTalkToATlsServer) {
  ServeTls();
  ClientCredentials credentials;
  credentials.token = kAliceToken;
  EXPECT_EQ(WhoAmI(Channel(credentials)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, ClientCertificateIdentifiesAWorker) {
  ServeTls(/*require_client_cert=*/true);
  absl::StatusOr<CertificateFiles> worker = ca_->Issue("worker-7");
  ASSERT_TRUE(worker.ok()) << worker.status();
  ClientCredentials credentials;
  credentials.tls = {ca_->ca_cert(), worker->cert, worker->key};
  auto secret = std::make_shared<WorkerSecret>();
  std::shared_ptr<grpc::Channel> channel = Channel(credentials, secret);
  CallResult before = WhoAmI(channel);
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  EXPECT_EQ(before.identity, "w7/worker");
  EXPECT_EQ(before.secret, "");
  // The channel sends the secret from the call after the daemon learns it.
  secret->Set("0123abcd");
  EXPECT_EQ(WhoAmI(channel).secret, "0123abcd");
}

TEST_F(TlsTest, ACertificateNotInTheTableIsUnauthenticated) {
  ServeTls(/*require_client_cert=*/true);
  absl::StatusOr<CertificateFiles> stranger = ca_->Issue("stranger");
  ASSERT_TRUE(stranger.ok()) << stranger.status();
  ClientCredentials credentials;
  credentials.tls = {ca_->ca_cert(), stranger->cert, stranger->key};
  CallResult result = WhoAmI(Channel(credentials));
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(result.status.error_message(), HasSubstr("CN 'stranger'"));
}

TEST_F(TlsTest, ExpiredOrForeignClientCertificatesAreRefusedAtTheHandshake) {
  ServeTls(/*require_client_cert=*/true);
  absl::StatusOr<CertificateFiles> expired = ca_->Issue("worker-7", Validity::kExpired);
  ASSERT_TRUE(expired.ok()) << expired.status();
  absl::StatusOr<CertificateFiles> foreign = other_ca_->Issue("worker-7");
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  EXPECT_EQ(WhoAmI(RawTlsChannel(ca_->ca_cert(), &*expired)).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(WhoAmI(RawTlsChannel(ca_->ca_cert(), &*foreign)).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Required means required: no certificate at all is refused too.
  EXPECT_EQ(WhoAmI(RawTlsChannel(ca_->ca_cert(), nullptr)).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // Our own client refuses to send an expired certificate, and says why.
  ClientCredentials credentials;
  credentials.tls = {ca_->ca_cert(), expired->cert, expired->key};
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      CreateCoordinatorChannel(absl::StrCat("127.0.0.1:", port_), credentials);
  ASSERT_FALSE(channel.ok());
  EXPECT_THAT(channel.status().message(), HasSubstr("cert: certificate 1 expired at"));
}

TEST_F(TlsTest, AnExpiredServerCertificateIsRefusedByTheServerAndByClients) {
  absl::StatusOr<CertificateFiles> expired = ca_->Issue("coordinator", Validity::kExpired);
  ASSERT_TRUE(expired.ok()) << expired.status();
  ServerTlsOptions options;
  options.cert_file = expired->cert;
  options.key_file = expired->key;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> refused = MakeServerCredentials(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("tls_cert_file: certificate 1 expired at"));
  // Served anyway (gRPC itself does not check), clients refuse the handshake.
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back(
      {*ReadPemFile("key", expired->key), *ReadPemFile("cert", expired->cert)});
  Serve(grpc::SslServerCredentials(ssl));
  ClientCredentials credentials;
  credentials.tls.ca_file = ca_->ca_cert();
  credentials.token = kAliceToken;
  EXPECT_EQ(WhoAmI(Channel(credentials)).status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, ServerOptionsAreCheckedAndErrorsNameTheOption) {
  ServerTlsOptions no_key;
  no_key.cert_file = server_->cert;
  EXPECT_THAT(MakeServerCredentials(no_key).status().message(), HasSubstr("tls_key_file"));
  absl::StatusOr<CertificateFiles> other = ca_->Issue("other");
  ASSERT_TRUE(other.ok()) << other.status();
  ServerTlsOptions mismatched{server_->cert, other->key, "", false};
  EXPECT_THAT(MakeServerCredentials(mismatched).status().message(),
              HasSubstr("tls_key_file: the key does not belong to the certificate"));
  ServerTlsOptions missing{"/nonexistent.pem", server_->key, "", false};
  EXPECT_THAT(MakeServerCredentials(missing).status().message(),
              HasSubstr("tls_cert_file: cannot read /nonexistent.pem"));
  ServerTlsOptions require_without_ca{server_->cert, server_->key, "", true};
  EXPECT_THAT(MakeServerCredentials(require_without_ca).status().message(),
              HasSubstr("tls_client_ca_file: required"));
  ServerTlsOptions key_without_cert{"", server_->key, "", false};
  EXPECT_THAT(MakeServerCredentials(key_without_cert).status().message(),
              HasSubstr("tls_cert_file: required"));
}

TEST_F(TlsTest, ReloadSwapsTheTableAndKeepsItOnError) {
  ServeTls();
  ClientCredentials alice;
  alice.tls.ca_file = ca_->ca_cert();
  alice.token = kAliceToken;
  ClientCredentials bob = alice;
  bob.token = "bob-token-abcdefghijk";
  ASSERT_EQ(WhoAmI(Channel(alice)).identity, "alice/submitter");
  WriteTokens("bob-token-abcdefghijk admin bob\n");
  ASSERT_TRUE(authenticator_->Reload().ok());
  EXPECT_EQ(WhoAmI(Channel(alice)).status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(WhoAmI(Channel(bob)).identity, "bob/admin");
  WriteTokens("not a valid line at all\n");
  absl::Status reloaded = authenticator_->Reload();
  EXPECT_EQ(reloaded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reloaded.message(), HasSubstr(":1: expected 3 fields"));
  EXPECT_EQ(WhoAmI(Channel(bob)).identity, "bob/admin");
}

TEST_F(TlsTest, DisabledAuthenticationMakesEveryCallerAnAdminNamedByHost) {
  service_ = nullptr;
  std::unique_ptr<Authenticator> disabled = Authenticator::Disabled();
  WhoAmIService service(disabled.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  CallResult result = WhoAmI(Channel(ClientCredentials()));
  ASSERT_TRUE(result.status.ok()) << result.status.error_message();
  EXPECT_EQ(result.identity, "127.0.0.1/admin");
  server->Shutdown();
}

TEST(ClientCredentialsTest, TokenFileOrEnvironmentAndErrorsNameTheFlag) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/my-token");
  std::ofstream(path) << "  alice-token-0123456789  \nignored second line\n";
  ::unsetenv("ZEROSHARD_TOKEN");
  absl::StatusOr<ClientCredentials> from_file = ClientCredentialsFromFlags("", "", "", path);
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(from_file->token, kAliceToken);
  ::setenv("ZEROSHARD_TOKEN", "env-token-0123456789", 1);
  absl::StatusOr<ClientCredentials> from_env = ClientCredentialsFromFlags("", "", "", "");
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->token, "env-token-0123456789");
  // The file wins over the environment.
  EXPECT_EQ(ClientCredentialsFromFlags("", "", "", path)->token, kAliceToken);
  ::setenv("ZEROSHARD_TOKEN", "short", 1);
  EXPECT_THAT(ClientCredentialsFromFlags("", "", "", "").status().message(),
              HasSubstr("ZEROSHARD_TOKEN: token: 16 to 256 printable characters without spaces "
                        "(e.g. `openssl rand -hex 32`); this one is 5 bytes"));
  ::unsetenv("ZEROSHARD_TOKEN");
  EXPECT_THAT(ClientCredentialsFromFlags("", "", "", "/nonexistent").status().message(),
              HasSubstr("token_file: cannot read /nonexistent"));
  absl::StatusOr<std::shared_ptr<grpc::Channel>> no_ca = CreateCoordinatorChannel(
      "127.0.0.1:1", *ClientCredentialsFromFlags("", "c.pem", "k.pem", ""));
  EXPECT_THAT(no_ca.status().message(), HasSubstr("ca: required with cert and key"));
}

// Fails on the code before issue 25 item 5, which made the first channel below. Nothing needs to
// listen at the address: the refusal comes before any connection (client/cli_credentials_test
// sends the token over real connections).
TEST(PlaintextTokenTest, ATokenWithoutTlsGoesOnlyToLoopbackUnlessInsecure) {
  ClientCredentials credentials;
  credentials.token = kAliceToken;
  for (const char* target : {"192.0.2.1:50051", "coordinator.example:50051", "[fd00::2]:1"}) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> refused =
        CreateCoordinatorChannel(target, credentials);
    ASSERT_FALSE(refused.ok()) << target;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.status().message(), HasSubstr(target));
    EXPECT_THAT(refused.status().message(), HasSubstr("--insecure"));
    EXPECT_THAT(refused.status().message(), HasSubstr("ZEROSHARD_INSECURE=1"));
  }
  for (const char* target : {"127.0.0.1:1", "localhost:1", "[::1]:1", "unix:/tmp/zs.sock"}) {
    EXPECT_TRUE(CreateCoordinatorChannel(target, credentials).ok()) << target;
  }
  EXPECT_TRUE(CreateCoordinatorChannel("192.0.2.1:50051", ClientCredentials()).ok());
  ClientCredentials insecure = credentials;
  insecure.insecure = true;
  EXPECT_TRUE(CreateCoordinatorChannel("192.0.2.1:50051", insecure).ok());
  // The environment's switch, for clients without the flag.
  ::unsetenv("ZEROSHARD_TOKEN");
  ::setenv("ZEROSHARD_INSECURE", "1", 1);
  EXPECT_TRUE(ClientCredentialsFromFlags("", "", "", "")->insecure);
  ::setenv("ZEROSHARD_INSECURE", "0", 1);
  EXPECT_FALSE(ClientCredentialsFromFlags("", "", "", "")->insecure);
  ::unsetenv("ZEROSHARD_INSECURE");
}

}  // namespace
}  // namespace zeroshard::security
