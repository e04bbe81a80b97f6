// The CLI's credential flags against an in-process coordinator serving TLS (with optional and with
// required client certificates): the right CA connects, a wrong CA or plaintext is refused with
// exit 4, unusable credential flags exit 2 naming the flag, each as one line on stderr. And a
// plaintext coordinator: a token goes to it only over loopback or with --insecure. The TLS files
// may come from ZEROSHARD_CA, ZEROSHARD_CERT and ZEROSHARD_KEY instead (issue 27).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "apps/coordinator/coordinator_server.h"
#include "gtest/gtest.h"
#include "security/test_certificates.h"

namespace zeroshard::client {
namespace {

constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 4;

// An IPv4 address of this machine that is not loopback (e.g. eth0's), or "" when it has none.
std::string NonLoopbackLocalAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* entry = list; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    const in_addr address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr;
    if ((ntohl(address.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    if (inet_ntop(AF_INET, &address, text, sizeof(text)) != nullptr) found = text;
  }
  freeifaddrs(list);
  return found;
}

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class CliCredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(base_);
    std::filesystem::create_directories(base_ + "/ca");
    std::filesystem::create_directories(base_ + "/other");
    absl::StatusOr<security::TestCertificateAuthority> ca =
        security::TestCertificateAuthority::Create(base_ + "/ca", "cli-test-ca");
    ASSERT_TRUE(ca.ok()) << ca.status();
    absl::StatusOr<security::TestCertificateAuthority> other =
        security::TestCertificateAuthority::Create(base_ + "/other", "other-ca");
    ASSERT_TRUE(other.ok()) << other.status();
    absl::StatusOr<security::CertificateFiles> server = ca->Issue("coordinator");
    ASSERT_TRUE(server.ok()) << server.status();
    absl::StatusOr<security::CertificateFiles> client = ca->Issue("cli-user");
    ASSERT_TRUE(client.ok()) << client.status();
    ca_ = ca->ca_cert();
    other_ca_ = other->ca_cert();
    server_files_ = *server;
    client_files_ = *client;
    token_file_ = base_ + "/token";
    std::ofstream(token_file_) << "0123456789abcdef0123456789abcdef\n";
    // The coordinator's table: the token above and the client certificate's CN.
    server_tokens_ = base_ + "/tokens";
    std::ofstream(server_tokens_) << "0123456789abcdef0123456789abcdef admin cli-admin\n"
                                  << "cert:cli-user viewer cli-user\n";
  }

  // A coordinator with our token table on `listen_address`, in plaintext.
  std::unique_ptr<coordinator::CoordinatorServer> StartPlaintextServer(
      const std::string& listen_address) {
    coordinator::CoordinatorServerOptions options;
    options.listen_address = listen_address;
    options.metrics_port = -1;
    options.state_dir = absl::StrCat(base_, "/state-plaintext");
    options.token_file = server_tokens_;
    absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
        coordinator::CoordinatorServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  std::unique_ptr<coordinator::CoordinatorServer> StartServer(bool require_client_cert) {
    coordinator::CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = -1;
    options.state_dir = absl::StrCat(base_, "/state-", require_client_cert);
    options.tls.cert_file = server_files_.cert;
    options.tls.key_file = server_files_.key;
    options.tls.client_ca_file = ca_;
    options.tls.require_client_cert = require_client_cert;
    options.token_file = server_tokens_;
    absl::StatusOr<std::unique_ptr<coordinator::CoordinatorServer>> server =
        coordinator::CoordinatorServer::Start(options);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // `zeroshard --coordinator=<target> <args>`, with `env` ("NAME=value ") before it and no other
  // variable the CLI reads.
  CliResult Run(const std::string& target, const std::string& args, const std::string& env = "") {
    const std::string out = base_ + "/stdout";
    const std::string err = base_ + "/stderr";
    const std::string command = absl::StrCat(
        "env -u ZEROSHARD_TOKEN -u ZEROSHARD_CA -u ZEROSHARD_CERT -u ZEROSHARD_KEY ",
        "-u ZEROSHARD_COORDINATOR -u ZEROSHARD_INSECURE ", env,
        " client/zeroshard --coordinator=", target, " ", args, " > '", out, "' 2> '", err, "'");
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadWhole(out), ReadWhole(err)};
  }

  static void ExpectOneLine(const CliResult& result) {
    EXPECT_EQ(std::count(result.err.begin(), result.err.end(), '\n'), 1) << result.err;
  }

  std::string base_, ca_, other_ca_, token_file_, server_tokens_;
  security::CertificateFiles server_files_, client_files_;
};

TEST_F(CliCredentialsTest, TheRightCaConnectsAndListsSubmitters) {
  std::unique_ptr<coordinator::CoordinatorServer> server = StartServer(false);
  ASSERT_NE(server, nullptr);
  CliResult listed = Run(server->grpc_target(),
                         absl::StrCat("--ca=", ca_, " --token_file=", token_file_, " jobs"));
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_TRUE(absl::StrContains(listed.out, "SUBMITTER")) << listed.out;
  // The token may come from the environment instead.
  CliResult from_env = Run(server->grpc_target(), absl::StrCat("--ca=", ca_, " jobs"),
                           "ZEROSHARD_TOKEN=0123456789abcdef0123456789abcdef");
  EXPECT_EQ(from_env.exit_code, 0) << from_env.err;
}

TEST_F(CliCredentialsTest, AWrongCaOrPlaintextIsRefusedAsUnreachable) {
  std::unique_ptr<coordinator::CoordinatorServer> server = StartServer(false);
  ASSERT_NE(server, nullptr);
  for (const std::string& flags : {absl::StrCat("--ca=", other_ca_), std::string()}) {
    SCOPED_TRACE(flags);
    CliResult refused = Run(server->grpc_target(), flags + " jobs");
    EXPECT_EQ(refused.exit_code, kExitUnreachable) << refused.err;
    EXPECT_TRUE(absl::StartsWith(refused.err, "zeroshard: error: UNAVAILABLE: ")) << refused.err;
    ExpectOneLine(refused);
  }
}

TEST_F(CliCredentialsTest, RequiredClientCertificates) {
  std::unique_ptr<coordinator::CoordinatorServer> server = StartServer(true);
  ASSERT_NE(server, nullptr);
  CliResult with_cert =
      Run(server->grpc_target(), absl::StrCat("--ca=", ca_, " --cert=", client_files_.cert,
                                              " --key=", client_files_.key, " workers"));
  EXPECT_EQ(with_cert.exit_code, 0) << with_cert.err;
  CliResult without = Run(server->grpc_target(), absl::StrCat("--ca=", ca_, " workers"));
  EXPECT_EQ(without.exit_code, kExitUnreachable) << without.err;
  ExpectOneLine(without);
}

// Issue 27: the variables the Python client reads stand in for --ca, --cert and --key, and a
// flag given wins over its variable: --cert= --key= present no certificate, another --ca is used.
TEST_F(CliCredentialsTest, TheEnvironmentStandsInForTheTlsFlags) {
  std::unique_ptr<coordinator::CoordinatorServer> server = StartServer(true);
  ASSERT_NE(server, nullptr);
  const std::string env = absl::StrCat("ZEROSHARD_CA=", ca_, " ZEROSHARD_CERT=", client_files_.cert,
                                       " ZEROSHARD_KEY=", client_files_.key);
  CliResult from_env = Run(server->grpc_target(), "workers", env);
  EXPECT_EQ(from_env.exit_code, 0) << from_env.err;
  CliResult no_cert = Run(server->grpc_target(), "--cert= --key= workers", env);
  EXPECT_EQ(no_cert.exit_code, kExitUnreachable) << no_cert.err;
  ExpectOneLine(no_cert);
  CliResult other_ca =
      Run(server->grpc_target(), absl::StrCat("--ca=", other_ca_, " workers"), env);
  EXPECT_EQ(other_ca.exit_code, kExitUnreachable) << other_ca.err;
  ExpectOneLine(other_ca);
}

TEST_F(CliCredentialsTest, UnusableCredentialFlagsNameTheFlag) {
  // Checked before any connection: no coordinator is needed.
  const std::string target = "127.0.0.1:1";
  struct Case {
    std::string args;
    std::string env;
    std::string names;
  };
  const Case cases[] = {
      {absl::StrCat("--ca=", base_, "/missing.pem jobs"), "", "ca"},
      {absl::StrCat("--token_file=", base_, "/missing-token jobs"), "", "token_file"},
      {absl::StrCat("--ca=", ca_, " --cert=", client_files_.cert, " jobs"), "", "key"},
      {"jobs", "ZEROSHARD_TOKEN=short", "ZEROSHARD_TOKEN"},
  };
  for (const Case& bad : cases) {
    SCOPED_TRACE(bad.args + " " + bad.env);
    CliResult result = Run(target, bad.args, bad.env);
    EXPECT_EQ(result.exit_code, kExitUsage) << result.err;
    EXPECT_TRUE(absl::StrContains(result.err, bad.names)) << result.err;
    ExpectOneLine(result);
  }
}

// Fails on the code before issue 25 item 5, which sent the token in plaintext to any address: the
// first call below was not refused (it dialled 192.0.2.1, exit 4, not 2), and the call without
// --insecure to this machine's own non-loopback address listed the jobs (exit 0).
TEST_F(CliCredentialsTest, ATokenGoesInPlaintextOnlyToLoopbackOrWithInsecure) {
  const std::string token = absl::StrCat(" --token_file=", token_file_, " jobs");
  // Refused before any connection: nothing needs to listen there (TEST-NET-1).
  CliResult refused = Run("192.0.2.1:1", token);
  EXPECT_EQ(refused.exit_code, kExitUsage) << refused.err;
  EXPECT_TRUE(
      absl::StrContains(refused.err, "refusing to send a token in plaintext to 192.0.2.1:1"))
      << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "--insecure")) << refused.err;
  EXPECT_TRUE(absl::StrContains(refused.err, "ZEROSHARD_INSECURE=1")) << refused.err;
  ExpectOneLine(refused);
  CliResult from_env =
      Run("192.0.2.1:1", "jobs", "ZEROSHARD_TOKEN=0123456789abcdef0123456789abcdef");
  EXPECT_EQ(from_env.exit_code, kExitUsage) << from_env.err;

  // A real coordinator on every address: over loopback the token is sent as before.
  std::unique_ptr<coordinator::CoordinatorServer> server = StartPlaintextServer("0.0.0.0:0");
  ASSERT_NE(server, nullptr);
  const std::string port = server->grpc_target().substr(server->grpc_target().rfind(':') + 1);
  for (const std::string& loopback : {"127.0.0.1:", "localhost:"}) {
    CliResult listed = Run(loopback + port, token);
    EXPECT_EQ(listed.exit_code, 0) << loopback << ": " << listed.err;
  }
  const std::string address = NonLoopbackLocalAddress();
  if (address.empty()) {
    GTEST_SKIP() << "this machine has no non-loopback IPv4 address: --insecure over the network "
                    "not exercised (the refusal above was)";
  }
  const std::string target = absl::StrCat(address, ":", port);
  CliResult plain = Run(target, token);
  EXPECT_EQ(plain.exit_code, kExitUsage) << plain.err;
  EXPECT_TRUE(absl::StrContains(plain.err, "--insecure")) << plain.err;
  // Without a token nothing secret is sent: the call goes out and is unauthenticated (exit 3).
  EXPECT_EQ(Run(target, "jobs").exit_code, 3);
  CliResult insecure = Run(target, "--insecure" + token);
  EXPECT_EQ(insecure.exit_code, 0) << insecure.err;
  EXPECT_TRUE(absl::StrContains(insecure.out, "SUBMITTER")) << insecure.out;
  CliResult insecure_env = Run(target, token, "ZEROSHARD_INSECURE=1");
  EXPECT_EQ(insecure_env.exit_code, 0) << insecure_env.err;
}

}  // namespace
}  // namespace zeroshard::client
