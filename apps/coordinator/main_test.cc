// Tests of the zeroshard-coordinator binary's flags, run as a real process: SIGHUP reloads
// --token_file, a non-loopback --listen without TLS is refused unless --insecure, a missing
// --checkpoint_root is refused, and reflection describes every service it lists.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/test_rpc_support.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "zeroshard/reflection/server_reflection_v1.grpc.pb.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(20);
constexpr char kOldToken[] = "old-admin-token-0123456789";
constexpr char kNewToken[] = "new-admin-token-0123456789";

std::string Binary() {
  return absl::StrCat(std::getenv("TEST_SRCDIR"),
                      "/zeroshard/apps/coordinator/zeroshard-coordinator");
}

void WriteFile(const std::string& path, const std::string& text) {
  // Replaced whole (rename), as an operator's editor or config tool would.
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
}

// Runs the binary with `flags`, stderr into `log`. Returns the child's pid.
pid_t Spawn(const std::vector<std::string>& flags, const std::string& log) {
  std::vector<std::string> args = {Binary()};
  args.insert(args.end(), flags.begin(), flags.end());
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    if (std::freopen(log.c_str(), "w", stderr) == nullptr) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// The child's exit code once it exits within kDeadline; -1 if it does not (it is then killed).
int AwaitExit(pid_t pid) {
  const absl::Time deadline = absl::Now() + kDeadline;
  int status = 0;
  while (absl::Now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

grpc::StatusCode ListJobsWith(v1::Coordinator::Stub& stub, const std::string& token) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  v1::ListJobsRequest request;
  v1::ListJobsResponse response;
  return stub.ListJobs(&context, request, &response).error_code();
}

TEST(CoordinatorMainTest, SighupReloadsTheTokenFile) {
  const std::string dir = FreshTestDir();
  const std::string tokens = dir + "/tokens.txt";
  WriteFile(tokens, absl::StrCat(kOldToken, " admin ops\n"));
  const std::string port_file = dir + "/ports";
  const std::string log = dir + "/coordinator.log";
  const pid_t pid = Spawn({"--listen=127.0.0.1:0", "--metrics_port=-1", "--state_dir=" + dir,
                           "--port_file=" + port_file, "--token_file=" + tokens},
                          log);
  ASSERT_GT(pid, 0);
  int grpc_port = 0;
  const absl::Time started_by = absl::Now() + kDeadline;
  while (absl::Now() < started_by) {
    std::ifstream ports(port_file);
    int metrics_port = 0;
    if (ports >> grpc_port >> metrics_port && grpc_port > 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GT(grpc_port, 0) << ReadFile(log);
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", grpc_port), grpc::InsecureChannelCredentials()));
  EXPECT_EQ(ListJobsWith(*stub, kOldToken), grpc::StatusCode::OK);
  EXPECT_EQ(ListJobsWith(*stub, kNewToken), grpc::StatusCode::UNAUTHENTICATED);

  WriteFile(tokens, absl::StrCat(kNewToken, " admin ops\n"));
  ASSERT_EQ(kill(pid, SIGHUP), 0);
  const absl::Time reloaded_by = absl::Now() + kDeadline;
  while (absl::Now() < reloaded_by && ListJobsWith(*stub, kNewToken) != grpc::StatusCode::OK) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(ListJobsWith(*stub, kNewToken), grpc::StatusCode::OK);
  EXPECT_EQ(ListJobsWith(*stub, kOldToken), grpc::StatusCode::UNAUTHENTICATED);

  // A broken file keeps the table in use.
  WriteFile(tokens, "this line is not a token entry\n");
  ASSERT_EQ(kill(pid, SIGHUP), 0);
  const absl::Time logged_by = absl::Now() + kDeadline;
  while (absl::Now() < logged_by && !absl::StrContains(ReadFile(log), "not reloaded")) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "token file reloaded: 1 identities"));
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "not reloaded")) << ReadFile(log);
  EXPECT_EQ(ListJobsWith(*stub, kNewToken), grpc::StatusCode::OK);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(AwaitExit(pid), 0) << ReadFile(log);
}

// How often the log says the coordinator serves plaintext on the network.
int CountWarnings(const std::string& log) {
  int count = 0;
  for (size_t at = log.find("serving plaintext gRPC on non-loopback"); at != std::string::npos;
       at = log.find("serving plaintext gRPC on non-loopback", at + 1)) {
    ++count;
  }
  return count;
}

TEST(CoordinatorMainTest, NonLoopbackWithoutTlsIsRefusedUnlessInsecure) {
  const std::string dir = FreshTestDir();
  const std::string log = dir + "/refused.log";
  const pid_t refused =
      Spawn({"--listen=0.0.0.0:0", "--metrics_port=-1", "--state_dir=" + dir}, log);
  ASSERT_GT(refused, 0);
  EXPECT_EQ(AwaitExit(refused), 2);
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "--insecure")) << ReadFile(log);

  // With --insecure it serves, says at once that it is plaintext on the network, and says it
  // again every period (a minute by default) for as long as it serves.
  const std::string port_file = dir + "/ports";
  const std::string insecure_log = dir + "/insecure.log";
  const pid_t served =
      Spawn({"--listen=0.0.0.0:0", "--metrics_port=-1", "--state_dir=" + dir,
             "--port_file=" + port_file, "--insecure", "--insecure_warning_period=200ms"},
            insecure_log);
  ASSERT_GT(served, 0);
  const absl::Time warned_by = absl::Now() + kDeadline;
  while (absl::Now() < warned_by && CountWarnings(ReadFile(insecure_log)) < 3) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(CountWarnings(ReadFile(insecure_log)), 3) << ReadFile(insecure_log);
  ASSERT_EQ(kill(served, SIGTERM), 0);
  EXPECT_EQ(AwaitExit(served), 0) << ReadFile(insecure_log);
}

// Issue 25, item 4: a bad --http_allowed_hosts entry stops the start (exit 2) with an error that
// names the flag and the entry (the flag did not exist before).
TEST(CoordinatorMainTest, ABadHttpAllowedHostIsRefusedNamingTheFlag) {
  const std::string dir = FreshTestDir();
  const std::string log = dir + "/refused.log";
  const pid_t refused = Spawn(
      {"--listen=127.0.0.1:0", "--state_dir=" + dir, "--http_allowed_hosts=dash.example,bad host"},
      log);
  ASSERT_GT(refused, 0);
  EXPECT_EQ(AwaitExit(refused), 2);
  EXPECT_TRUE(absl::StrContains(ReadFile(log), "--http_allowed_hosts: 'bad host'"))
      << ReadFile(log);
}

// Issue 36, row 11. Fails before the fix: the coordinator started with a --checkpoint_root that
// did not exist (or was a file), and every checkpoint's commit then failed while it served.
TEST(CoordinatorMainTest, AMissingOrNonDirectoryCheckpointRootIsRefusedNamingTheFlag) {
  const std::string dir = FreshTestDir();
  const std::string missing = dir + "/no-such-dir";
  const std::string file = dir + "/a-file";
  WriteFile(file, "not a directory\n");
  for (const auto& [root, why] : {std::pair<std::string, std::string>{missing, "does not exist"},
                                  std::pair<std::string, std::string>{file, "not a directory"}}) {
    const std::string log = dir + "/refused.log";
    const pid_t refused = Spawn({"--listen=127.0.0.1:0", "--metrics_port=-1",
                                 "--state_dir=" + dir + "/state", "--checkpoint_root=" + root},
                                log);
    ASSERT_GT(refused, 0);
    EXPECT_EQ(AwaitExit(refused), 2) << ReadFile(log);
    EXPECT_TRUE(absl::StrContains(ReadFile(log), absl::StrCat("--checkpoint_root=", root, ": ")))
        << ReadFile(log);
    EXPECT_TRUE(absl::StrContains(ReadFile(log), why)) << ReadFile(log);
  }
  EXPECT_FALSE(std::filesystem::exists(missing));  // refused, not created
}

// The gRPC port a coordinator wrote to `port_file` once it serves; 0 if it does not within
// kDeadline.
int AwaitGrpcPort(const std::string& port_file) {
  const absl::Time deadline = absl::Now() + kDeadline;
  while (absl::Now() < deadline) {
    std::ifstream ports(port_file);
    int grpc_port = 0;
    int metrics_port = 0;
    if (ports >> grpc_port >> metrics_port && grpc_port > 0) return grpc_port;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return 0;
}

// Issue 36, row 10. Fails before the fix: the binary listed grpc.reflection.v1.ServerReflection
// but answered NOT_FOUND for its descriptor (the generated file that declares it was left out of
// the statically linked binary, so it was not in the descriptor pool), and grpcurl, which asks
// v1 first, could not describe it. Only the real binary shows it: the unit tests link the proto
// libraries dynamically, which registers every file.
TEST(CoordinatorMainTest, ReflectionDescribesEveryServiceItLists) {
  const std::string dir = FreshTestDir();
  const std::string port_file = dir + "/ports";
  const std::string log = dir + "/coordinator.log";
  const pid_t pid = Spawn({"--listen=127.0.0.1:0", "--metrics_port=-1", "--state_dir=" + dir,
                           "--port_file=" + port_file},
                          log);
  ASSERT_GT(pid, 0);
  const int grpc_port = AwaitGrpcPort(port_file);
  ASSERT_GT(grpc_port, 0) << ReadFile(log);
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext context;
  SetDeadline(context);
  auto call =
      grpc::reflection::v1::ServerReflection::NewStub(channel)->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  request.set_list_services("*");
  ASSERT_TRUE(call->Write(request) && call->Read(&response));
  std::vector<std::string> services;
  for (const auto& service : response.list_services_response().service()) {
    services.push_back(service.name());
  }
  EXPECT_EQ(std::count(services.begin(), services.end(), "grpc.reflection.v1.ServerReflection"), 1);
  for (const std::string& service : services) {
    request.set_file_containing_symbol(service);
    ASSERT_TRUE(call->Write(request) && call->Read(&response)) << service;
    ASSERT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0)
        << service << ": " << response.error_response().error_message();
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
    const std::string name(absl::StripPrefix(service, file.package() + "."));
    EXPECT_TRUE(std::any_of(file.service().begin(), file.service().end(),
                            [&](const auto& described) { return described.name() == name; }))
        << service << " is not in " << file.name();
  }
  call->WritesDone();
  EXPECT_TRUE(call->Finish().ok());
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  EXPECT_EQ(AwaitExit(pid), 0) << ReadFile(log);
}

}  // namespace
}  // namespace zeroshard::coordinator
