// Revoked tokens over real gRPC: a token reload (SIGHUP's ReloadTokens) ends the open WatchJob,
// ExportCheckpoint and server reflection streams whose token left the token file or now names
// another identity or role, and keeps the others open.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/clock.h"
#include "coordinator/test_checkpointed_job.h"
#include "coordinator/test_rpc_support.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "security/coordinator_channel.h"
#include "zeroshard/reflection/server_reflection_v1.grpc.pb.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {
namespace {

constexpr char kViewerToken[] = "viewer-token-0123456789";
constexpr char kRotatedViewerToken[] = "rotated-viewer-token-0123456789";
constexpr char kDemotedToken[] = "demoted-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";
// Longer than the test waits for anything: a stream that outlives a reload of its revoked
// token ends only at this deadline (DEADLINE_EXCEEDED), as it did before issue 25.
constexpr absl::Duration kWatchDeadline = absl::Seconds(60);

// One open WatchJob stream with its own context.
struct Watch {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> reader;
};

class TokenRevocationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir();
    token_file_ = dir_ + "/tokens.txt";
    WriteTokens(absl::StrCat(kViewerToken, " viewer vera\n", kDemotedToken, " viewer vic\n",
                             kAdminToken, " admin ada\n"));
    CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = -1;
    options.state_dir = dir_ + "/state";
    options.token_file = token_file_;
    checkpoint_root_ = dir_ + "/checkpoints";
    std::filesystem::create_directories(checkpoint_root_);
    options.manager.checkpoint_root = checkpoint_root_;
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials()));
  }

  // Replaced whole (rename), as an operator's editor would.
  void WriteTokens(const std::string& text) {
    const std::string tmp = token_file_ + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    ASSERT_EQ(std::fclose(f), 0);
    std::filesystem::rename(tmp, token_file_);
  }

  std::string SubmitJob() {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = Spec("watched", 2);
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
    const grpc::Status status = stub_->SubmitJob(&context, request, &job);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return job.id();
  }

  // Opens a WatchJob stream of `job_id` with `token` and reads its first event (the stream is
  // then open on the server).
  Watch OpenWatch(const std::string& job_id, const std::string& token) {
    Watch watch;
    watch.context = std::make_unique<grpc::ClientContext>();
    SetDeadline(*watch.context, kWatchDeadline);
    watch.context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
    v1::WatchJobRequest request;
    request.set_job_id(job_id);
    watch.reader = stub_->WatchJob(watch.context.get(), request);
    v1::JobEvent event;
    EXPECT_TRUE(watch.reader->Read(&event)) << "the stream of " << token << " sent nothing";
    return watch;
  }

  std::string dir_;
  std::string token_file_;
  std::string checkpoint_root_;
  common::FakeClock clock_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// Issue 25, item 7. Fails on the code before it: a reload swapped the table but left every
// open stream alone, so the revoked streams' reads below blocked until kWatchDeadline and ended
// DEADLINE_EXCEEDED, not UNAUTHENTICATED.
TEST_F(TokenRevocationTest, AReloadEndsTheWatchStreamsOfRevokedTokens) {
  const std::string job_id = SubmitJob();
  ASSERT_FALSE(job_id.empty());
  Watch removed = OpenWatch(job_id, kViewerToken);
  Watch demoted = OpenWatch(job_id, kDemotedToken);
  Watch kept = OpenWatch(job_id, kAdminToken);
  ASSERT_TRUE(server_->service()->AwaitOpenWatchStreams(3, absl::Seconds(10)));

  // A broken file keeps the table in use, and every stream with it.
  WriteTokens("this line is not a token entry\n");
  EXPECT_FALSE(server_->ReloadTokens().ok());
  EXPECT_EQ(server_->service()->OpenWatchStreams(), 3);

  // vera's token is rotated (a new token of the same identity), vic's now names a worker, ada's
  // stays.
  WriteTokens(absl::StrCat(kRotatedViewerToken, " viewer vera\n", kDemotedToken, " worker vic\n",
                           kAdminToken, " admin ada\n"));
  const absl::Time reloaded = absl::Now();
  ASSERT_TRUE(server_->ReloadTokens().ok());
  for (Watch* ended : {&removed, &demoted}) {
    v1::JobEvent event;
    while (ended->reader->Read(&event)) {
    }
    const grpc::Status status = ended->reader->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
    EXPECT_TRUE(absl::StartsWith(status.error_message(), "watch: token revoked"))
        << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), "after_sequence="))
        << status.error_message();
  }
  EXPECT_LT(absl::Now() - reloaded, kWatchDeadline / 2);
  ASSERT_TRUE(server_->service()->AwaitOpenWatchStreams(1, absl::Seconds(10)));

  // The kept stream still follows the job: cancelling it sends the stream its last events.
  {
    v1::CancelJobRequest request;
    request.set_job_id(job_id);
    v1::Job job;
    grpc::ClientContext context;
    SetDeadline(context);
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
    ASSERT_TRUE(stub_->CancelJob(&context, request, &job).ok());
  }
  v1::JobEvent event;
  int kept_events = 0;
  while (kept.reader->Read(&event)) ++kept_events;
  EXPECT_GT(kept_events, 0);
  const grpc::Status kept_status = kept.reader->Finish();
  EXPECT_TRUE(kept_status.ok()) << kept_status.error_message();

  // A new stream with the rotated token opens; the removed token opens none.
  Watch rotated = OpenWatch(job_id, kRotatedViewerToken);
  while (rotated.reader->Read(&event)) {
  }
  EXPECT_TRUE(rotated.reader->Finish().ok());
  grpc::ClientContext context;
  SetDeadline(context);
  context.AddMetadata("authorization", absl::StrCat("Bearer ", kViewerToken));
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  std::unique_ptr<grpc::ClientReader<v1::JobEvent>> refused = stub_->WatchJob(&context, request);
  EXPECT_FALSE(refused->Read(&event));
  EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// A stub whose every call carries `token` (the clients' own channel, on plaintext loopback);
// `slow` gives it a connection of its own with a fixed 64 KiB flow-control window, so that a
// stream it stops reading stalls on the server.
std::unique_ptr<v1::Coordinator::Stub> StubWithToken(const std::string& target,
                                                     const std::string& token, bool slow) {
  grpc::ChannelArguments args;
  if (slow) {
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt("zeroshard.test_channel", 1);
  }
  security::ClientCredentials credentials;
  credentials.token = token;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      security::CreateCoordinatorChannel(target, credentials, args);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? v1::Coordinator::NewStub(*channel) : nullptr;
}

// Issue 25, item 7, for the other long stream: an ExportCheckpoint stream whose client stopped
// reading (the server's reading thread waits for it) ends UNAUTHENTICATED at the reload that
// revokes its token. Before, it held its export slot until the client's deadline.
TEST_F(TokenRevocationTest, AReloadEndsTheExportStreamsOfRevokedTokens) {
  std::unique_ptr<v1::Coordinator::Stub> admin =
      StubWithToken(server_->grpc_target(), kAdminToken, /*slow=*/false);
  testing::CheckpointedJobOptions options;
  options.name = "large";
  options.layer_sizes = {2048, 2048, 16};  // 16.8 MB exported
  options.checkpoint_steps = {4};
  options.states = {{"param", v1::FLOAT32}};
  absl::StatusOr<v1::Job> job = testing::RunCheckpointedJob(*admin, checkpoint_root_, options);
  ASSERT_TRUE(job.ok()) << job.status();

  std::unique_ptr<v1::Coordinator::Stub> vera =
      StubWithToken(server_->grpc_target(), kViewerToken, /*slow=*/true);
  v1::ExportCheckpointRequest request;
  request.set_job_id(job->id());
  grpc::ClientContext context;
  SetDeadline(context, kWatchDeadline);
  std::unique_ptr<grpc::ClientReader<v1::ExportCheckpointChunk>> stalled =
      vera->ExportCheckpoint(&context, request);
  v1::ExportCheckpointChunk chunk;
  ASSERT_TRUE(stalled->Read(&chunk));  // open, and now not read

  WriteTokens(absl::StrCat(kAdminToken, " admin ada\n"));
  const absl::Time reloaded = absl::Now();
  ASSERT_TRUE(server_->ReloadTokens().ok());
  int64_t chunks = 1;
  while (stalled->Read(&chunk)) ++chunks;  // what was already on its way
  const grpc::Status status = stalled->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "export: token revoked"))
      << status.error_message();
  EXPECT_LT(chunks, 16);  // the 17 chunks were not all sent
  EXPECT_LT(absl::Now() - reloaded, kWatchDeadline / 2);

  // The admin's export still runs to its end.
  grpc::ClientContext admin_context;
  SetDeadline(admin_context, kWatchDeadline);
  std::unique_ptr<grpc::ClientReader<v1::ExportCheckpointChunk>> whole =
      admin->ExportCheckpoint(&admin_context, request);
  int64_t bytes = 0;
  while (whole->Read(&chunk)) bytes += static_cast<int64_t>(chunk.data().size());
  const grpc::Status whole_status = whole->Finish();
  EXPECT_TRUE(whole_status.ok()) << whole_status.error_message();
  EXPECT_GT(bytes, 16 << 20);
}

// Issue 36, row 10. Fails before the fix: a reload left reflection streams alone, so the revoked
// stream below, waiting for its client's next request, stayed open until its deadline
// (DEADLINE_EXCEEDED after kWatchDeadline) and would have answered that request.
TEST_F(TokenRevocationTest, AReloadEndsTheReflectionStreamsOfRevokedTokens) {
  using grpc::reflection::v1alpha::ServerReflectionRequest;
  using grpc::reflection::v1alpha::ServerReflectionResponse;
  auto channel = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
  struct Reflection {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>>
        call;
  };
  ServerReflectionRequest list;
  list.set_list_services("*");
  ServerReflectionResponse response;
  // v1 for vera (what grpcurl opens), v1alpha for ada: both services end revoked streams.
  Reflection removed;
  SetDeadline(removed.context, kWatchDeadline);
  removed.context.AddMetadata("authorization", absl::StrCat("Bearer ", kViewerToken));
  removed.call = grpc::reflection::v1::ServerReflection::NewStub(channel)->ServerReflectionInfo(
      &removed.context);
  ASSERT_TRUE(removed.call->Write(list) && removed.call->Read(&response));
  Reflection kept;
  SetDeadline(kept.context, kWatchDeadline);
  kept.context.AddMetadata("authorization", absl::StrCat("Bearer ", kAdminToken));
  kept.call = grpc::reflection::v1alpha::ServerReflection::NewStub(channel)->ServerReflectionInfo(
      &kept.context);
  ASSERT_TRUE(kept.call->Write(list) && kept.call->Read(&response));

  WriteTokens(absl::StrCat(kAdminToken, " admin ada\n"));
  const absl::Time reloaded = absl::Now();
  ASSERT_TRUE(server_->ReloadTokens().ok());
  // Ended while idle: the client sends nothing more and reads the end.
  EXPECT_FALSE(removed.call->Read(&response));
  const grpc::Status status = removed.call->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_TRUE(absl::StartsWith(status.error_message(), "reflection: token revoked"))
      << status.error_message();
  EXPECT_LT(absl::Now() - reloaded, kWatchDeadline / 2);

  // ada's stream still answers.
  ASSERT_TRUE(kept.call->Write(list) && kept.call->Read(&response));
  EXPECT_GT(response.list_services_response().service_size(), 0);
  kept.call->WritesDone();
  EXPECT_TRUE(kept.call->Finish().ok());
}

}  // namespace
}  // namespace zeroshard::coordinator
