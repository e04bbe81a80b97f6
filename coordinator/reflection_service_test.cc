// The coordinator's server reflection over real gRPC on loopback (listing, descriptors with their
// dependencies, errors, authentication, limits), and the protocol's answers from a pool of ours.
#include "coordinator/reflection_service.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "apps/coordinator/coordinator_server.h"
#include "common/clock.h"
#include "coordinator/test_rpc_support.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/descriptor_database.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "security/authenticator.h"
#include "zeroshard/reflection/server_reflection_v1.grpc.pb.h"
#include "zeroshard/reflection/server_reflection_v1alpha.grpc.pb.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {
namespace {

using google::protobuf::FileDescriptorProto;
using grpc::reflection::v1alpha::ServerReflection;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

constexpr char kViewerToken[] = "viewer-token-0123456789";
constexpr char kSubmitterToken[] = "submitter-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";
constexpr char kWorkerToken[] = "worker-token-0123456789";

ServerReflectionRequest ListServices() {
  ServerReflectionRequest request;
  request.set_list_services("*");
  return request;
}

ServerReflectionRequest Symbol(const std::string& name) {
  ServerReflectionRequest request;
  request.set_file_containing_symbol(name);
  return request;
}

std::set<std::string> ServiceNames(const ServerReflectionResponse& response) {
  std::set<std::string> names;
  for (const auto& service : response.list_services_response().service()) {
    names.insert(service.name());
  }
  return names;
}

// The file names of a FileDescriptorResponse, in order; fails the test on an unparseable entry.
std::vector<std::string> FileNames(const ServerReflectionResponse& response) {
  std::vector<std::string> names;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    FileDescriptorProto file;
    EXPECT_TRUE(file.ParseFromString(bytes));
    names.push_back(file.name());
  }
  return names;
}

// The service as this binary knows it (the server's generated pool).
const google::protobuf::ServiceDescriptor* CoordinatorDescriptor() {
  return google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      "zeroshard.v1.Coordinator");
}

class ReflectionServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(CoordinatorDescriptor(), nullptr);
    dir_ = FreshTestDir();
  }

  void StartServer(bool authenticate, ReflectionOptions reflection = {}) {
    CoordinatorServerOptions options;
    options.listen_address = "127.0.0.1:0";
    options.metrics_port = -1;
    options.state_dir = dir_ + "/state";
    options.reflection = reflection;
    if (authenticate) {
      options.token_file = dir_ + "/tokens.txt";
      FILE* f = std::fopen(options.token_file.c_str(), "w");
      ASSERT_NE(f, nullptr);
      std::fprintf(f, "%s viewer vera\n%s submitter sam\n%s admin ada\n%s worker node\n",
                   kViewerToken, kSubmitterToken, kAdminToken, kWorkerToken);
      ASSERT_EQ(std::fclose(f), 0);
    }
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start(options, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(server_->grpc_target(), grpc::InsecureChannelCredentials());
  }

  // One stream of the v1alpha service.
  struct Stream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReaderWriter<ServerReflectionRequest, ServerReflectionResponse>>
        call;
  };

  std::unique_ptr<Stream> Open(const std::string& token = "") {
    auto stream = std::make_unique<Stream>();
    SetDeadline(stream->context);
    if (!token.empty()) stream->context.AddMetadata("authorization", "Bearer " + token);
    stream->call = ServerReflection::NewStub(channel_)->ServerReflectionInfo(&stream->context);
    return stream;
  }

  // Sends `request` on `stream` and reads its answer; false when the stream ended instead.
  static bool Ask(Stream& stream, const ServerReflectionRequest& request,
                  ServerReflectionResponse* response) {
    return stream.call->Write(request) && stream.call->Read(response);
  }

  // The status a stream ends with after the client half-closes.
  static grpc::Status Close(Stream& stream) {
    stream.call->WritesDone();
    ServerReflectionResponse ignored;
    while (stream.call->Read(&ignored)) {
    }
    return stream.call->Finish();
  }

  // One list_services call with `token`: the stream's status, and the services when served.
  grpc::Status ListWith(const std::string& token, std::set<std::string>* services) {
    std::unique_ptr<Stream> stream = Open(token);
    ServerReflectionResponse response;
    if (Ask(*stream, ListServices(), &response)) *services = ServiceNames(response);
    return Close(*stream);
  }

  std::string dir_;
  common::FakeClock clock_;
  std::unique_ptr<CoordinatorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ReflectionServiceTest, ListsEveryRegisteredServiceWithoutATokenFile) {
  StartServer(/*authenticate=*/false);
  std::unique_ptr<Stream> stream = Open();
  ServerReflectionRequest request = ListServices();
  request.set_host("coordinator.example:50051");
  ServerReflectionResponse response;
  ASSERT_TRUE(Ask(*stream, request, &response));
  EXPECT_EQ(ServiceNames(response),
            (std::set<std::string>{"zeroshard.v1.Coordinator", "grpc.health.v1.Health",
                                   "grpc.reflection.v1alpha.ServerReflection",
                                   "grpc.reflection.v1.ServerReflection"}));
  EXPECT_EQ(response.valid_host(), "coordinator.example:50051");
  EXPECT_EQ(response.original_request().SerializeAsString(), request.SerializeAsString());
  EXPECT_TRUE(Close(*stream).ok());
}

TEST_F(ReflectionServiceTest, TheV1ServiceAnswersLikeV1Alpha) {
  StartServer(/*authenticate=*/false);
  grpc::ClientContext context;
  SetDeadline(context);
  auto call =
      grpc::reflection::v1::ServerReflection::NewStub(channel_)->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_file_containing_symbol("zeroshard.v1.Coordinator.SubmitJob");
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(call->Write(request));
  ASSERT_TRUE(call->Read(&response));
  ASSERT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0);
  FileDescriptorProto first;
  ASSERT_TRUE(first.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(first.name(), CoordinatorDescriptor()->file()->name());
  call->WritesDone();
  EXPECT_TRUE(call->Finish().ok());
}

TEST_F(ReflectionServiceTest, CoordinatorDescriptorsBuildAPoolWithEveryMethod) {
  StartServer(/*authenticate=*/false);
  std::unique_ptr<Stream> stream = Open();
  ServerReflectionResponse response;
  ASSERT_TRUE(Ask(*stream, Symbol("zeroshard.v1.Coordinator"), &response));
  ASSERT_TRUE(response.has_file_descriptor_response()) << response.error_response().error_message();
  const std::vector<std::string> names = FileNames(response);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size())
      << "a file sent twice";

  google::protobuf::SimpleDescriptorDatabase database;
  for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
    FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(bytes));
    ASSERT_TRUE(database.Add(file)) << file.name();
  }
  // Only what the response carried: a missing dependency leaves a type unresolved below.
  google::protobuf::DescriptorPool fresh(&database);
  const google::protobuf::ServiceDescriptor* expected = CoordinatorDescriptor();
  const google::protobuf::ServiceDescriptor* service =
      fresh.FindServiceByName(expected->full_name());
  ASSERT_NE(service, nullptr);
  ASSERT_EQ(service->method_count(), expected->method_count());
  for (int m = 0; m < expected->method_count(); ++m) {
    const google::protobuf::MethodDescriptor* method =
        service->FindMethodByName(expected->method(m)->name());
    ASSERT_NE(method, nullptr) << expected->method(m)->name();
    EXPECT_EQ(method->input_type()->full_name(), expected->method(m)->input_type()->full_name());
    EXPECT_EQ(method->output_type()->full_name(), expected->method(m)->output_type()->full_name());
    EXPECT_EQ(method->client_streaming(), expected->method(m)->client_streaming());
    EXPECT_EQ(method->server_streaming(), expected->method(m)->server_streaming());
  }
  EXPECT_TRUE(Close(*stream).ok());
}

// Failed before issue 25 item 6 (NOT_FOUND: gRPC's health service is upb code with no descriptors
// in the generated pool), which is why grpcurl could not call grpc.health.v1.Health/Check.
TEST_F(ReflectionServiceTest, DescribesTheHealthService) {
  StartServer(/*authenticate=*/false);
  std::unique_ptr<Stream> stream = Open();
  ServerReflectionResponse response;
  ASSERT_TRUE(Ask(*stream, Symbol("grpc.health.v1.Health"), &response));
  ASSERT_TRUE(response.has_file_descriptor_response()) << response.error_response().error_message();
  ASSERT_EQ(response.file_descriptor_response().file_descriptor_proto_size(), 1);
  FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.name(), "grpc/health/v1/health.proto");
  EXPECT_EQ(file.package(), "grpc.health.v1");
  ASSERT_EQ(file.service_size(), 1);
  ASSERT_EQ(file.service(0).method_size(), 2);
  EXPECT_EQ(file.service(0).method(0).name(), "Check");
  EXPECT_EQ(file.service(0).method(1).name(), "Watch");
  EXPECT_TRUE(file.service(0).method(1).server_streaming());
  EXPECT_TRUE(Close(*stream).ok());
}

TEST_F(ReflectionServiceTest, FindsTheFileOfEveryKindOfSymbol) {
  StartServer(/*authenticate=*/false);
  // One symbol of each kind, found in the coordinator's own descriptors rather than written out.
  std::vector<std::pair<std::string, const google::protobuf::FileDescriptor*>> symbols;
  const google::protobuf::ServiceDescriptor* service = CoordinatorDescriptor();
  symbols.emplace_back(service->full_name(), service->file());
  symbols.emplace_back(service->method(0)->full_name(), service->file());
  const google::protobuf::Descriptor* message = service->method(0)->input_type();
  symbols.emplace_back(message->full_name(), message->file());
  ASSERT_GT(message->field_count(), 0);
  symbols.emplace_back(message->field(0)->full_name(), message->file());
  const google::protobuf::Descriptor* nested = nullptr;
  const google::protobuf::EnumDescriptor* enumeration = nullptr;
  std::vector<const google::protobuf::FileDescriptor*> files = {service->file()};
  for (size_t i = 0; i < files.size(); ++i) {
    for (int d = 0; d < files[i]->dependency_count(); ++d) files.push_back(files[i]->dependency(d));
    if (enumeration == nullptr && files[i]->enum_type_count() > 0) {
      enumeration = files[i]->enum_type(0);
    }
    for (int t = 0; nested == nullptr && t < files[i]->message_type_count(); ++t) {
      if (files[i]->message_type(t)->nested_type_count() > 0) {
        nested = files[i]->message_type(t)->nested_type(0);
      }
    }
  }
  ASSERT_NE(enumeration, nullptr);
  ASSERT_NE(nested, nullptr);
  symbols.emplace_back(enumeration->full_name(), enumeration->file());
  symbols.emplace_back(nested->full_name(), nested->file());

  std::unique_ptr<Stream> stream = Open();
  for (const auto& [symbol, file] : symbols) {
    ServerReflectionResponse response;
    ASSERT_TRUE(Ask(*stream, Symbol(symbol), &response)) << symbol;
    const std::vector<std::string> names = FileNames(response);
    ASSERT_FALSE(names.empty()) << symbol << ": " << response.error_response().error_message();
    EXPECT_EQ(names.front(), file->name()) << symbol;
  }

  ServerReflectionRequest by_name;
  by_name.set_file_by_filename(service->file()->name());
  ServerReflectionResponse response;
  ASSERT_TRUE(Ask(*stream, by_name, &response));
  const std::vector<std::string> names = FileNames(response);
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.front(), service->file()->name());
  EXPECT_EQ(names.size(), 1 + std::set<std::string>(names.begin() + 1, names.end()).size());
  EXPECT_TRUE(Close(*stream).ok());
}

TEST_F(ReflectionServiceTest, ErrorsAreAnsweredAndTheStreamStaysUsable) {
  StartServer(/*authenticate=*/false);
  std::unique_ptr<Stream> stream = Open();
  ServerReflectionResponse response;

  ASSERT_TRUE(Ask(*stream, Symbol("zeroshard.v1.NoSuchThing"), &response));
  EXPECT_EQ(response.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_EQ(response.original_request().file_containing_symbol(), "zeroshard.v1.NoSuchThing");

  ASSERT_TRUE(Ask(*stream, ServerReflectionRequest(), &response));
  EXPECT_EQ(response.error_response().error_code(),
            static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));

  ServerReflectionRequest missing_file;
  missing_file.set_file_by_filename("zeroshard/v1/missing.proto");
  ASSERT_TRUE(Ask(*stream, missing_file, &response));
  EXPECT_EQ(response.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  ServerReflectionRequest missing_type;
  missing_type.set_all_extension_numbers_of_type("zeroshard.v1.NoSuchMessage");
  ASSERT_TRUE(Ask(*stream, missing_type, &response));
  EXPECT_EQ(response.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  ServerReflectionRequest missing_extension;
  missing_extension.mutable_file_containing_extension()->set_containing_type(
      v1::SubmitJobRequest::descriptor()->full_name());
  missing_extension.mutable_file_containing_extension()->set_extension_number(1000);
  ASSERT_TRUE(Ask(*stream, missing_extension, &response));
  EXPECT_EQ(response.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  // Still serving after the errors.
  ASSERT_TRUE(Ask(*stream, Symbol("zeroshard.v1.Coordinator"), &response));
  EXPECT_FALSE(FileNames(response).empty());
  EXPECT_TRUE(Close(*stream).ok());
}

TEST_F(ReflectionServiceTest, WithATokenFileReadersAreServedAndOthersRefused) {
  StartServer(/*authenticate=*/true);
  for (const char* token : {kViewerToken, kSubmitterToken, kAdminToken}) {
    std::set<std::string> services;
    const grpc::Status status = ListWith(token, &services);
    EXPECT_TRUE(status.ok()) << token << ": " << status.error_message();
    EXPECT_EQ(services.count("zeroshard.v1.Coordinator"), 1u) << token;
    EXPECT_EQ(services.count("grpc.health.v1.Health"), 1u) << token;
  }
  std::set<std::string> services;
  EXPECT_EQ(ListWith("", &services).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(ListWith("not-a-token-0123456789", &services).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const grpc::Status worker = ListWith(kWorkerToken, &services);
  EXPECT_EQ(worker.error_code(), grpc::StatusCode::PERMISSION_DENIED) << worker.error_message();
  EXPECT_TRUE(services.empty());
}

TEST_F(ReflectionServiceTest, AStreamAnswersAtMostItsRequestCap) {
  ReflectionOptions limits;
  limits.max_requests_per_stream = 3;
  StartServer(/*authenticate=*/false, limits);
  std::unique_ptr<Stream> stream = Open();
  ServerReflectionResponse response;
  for (int i = 0; i < limits.max_requests_per_stream; ++i) {
    ASSERT_TRUE(Ask(*stream, ListServices(), &response)) << i;
  }
  EXPECT_FALSE(Ask(*stream, ListServices(), &response));
  const grpc::Status status = stream->call->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("max_reflection_requests_per_stream"), std::string::npos)
      << status.error_message();
}

TEST_F(ReflectionServiceTest, OpenStreamsAreCapped) {
  ReflectionOptions limits;
  limits.max_open_streams = 1;
  StartServer(/*authenticate=*/false, limits);
  std::unique_ptr<Stream> first = Open();
  ServerReflectionResponse response;
  // Answered, so the first stream is open on the server.
  ASSERT_TRUE(Ask(*first, ListServices(), &response));
  std::unique_ptr<Stream> second = Open();
  EXPECT_FALSE(Ask(*second, ListServices(), &response));
  const grpc::Status refused = second->call->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  ASSERT_TRUE(Ask(*first, ListServices(), &response));
  EXPECT_TRUE(Close(*first).ok());
}

// Issue 36, row 10. Fails before the fix: a stream was admitted once, at its start, and then
// answered every request, so a stream opened with a token that the token file no longer holds
// kept being served. Here the authenticator reloads without the coordinator's ReloadTokens (which
// also ends idle streams: token_revocation_test), so only the per-request check can end it.
TEST(ReflectionServiceRevocationTest, EveryRequestIsAnsweredOnlyWhileItsTokenHolds) {
  const std::string dir = FreshTestDir();
  const std::string token_file = dir + "/tokens.txt";
  auto write_tokens = [&](const std::string& text) {
    const std::string tmp = token_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    ASSERT_EQ(std::fclose(f), 0);
    std::filesystem::rename(tmp, token_file);
  };
  write_tokens(absl::StrCat(kViewerToken, " viewer vera\n", kAdminToken, " admin ada\n"));
  absl::StatusOr<std::unique_ptr<security::Authenticator>> authenticator =
      security::Authenticator::FromTokenFile(token_file);
  ASSERT_TRUE(authenticator.ok()) << authenticator.status();
  ReflectionService reflection(authenticator->get());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  reflection.AddTo(&builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  auto channel =
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto open = [&](grpc::ClientContext& context, const std::string& token) {
    SetDeadline(context);
    context.AddMetadata("authorization", "Bearer " + token);
    return ServerReflection::NewStub(channel)->ServerReflectionInfo(&context);
  };
  grpc::ClientContext vera_context;
  auto vera = open(vera_context, kViewerToken);
  grpc::ClientContext ada_context;
  auto ada = open(ada_context, kAdminToken);
  ServerReflectionResponse response;
  ASSERT_TRUE(vera->Write(ListServices()) && vera->Read(&response));
  ASSERT_TRUE(ada->Write(ListServices()) && ada->Read(&response));

  write_tokens(absl::StrCat(kAdminToken, " admin ada\n"));
  ASSERT_TRUE((*authenticator)->Reload().ok());
  vera->Write(ListServices());  // may already fail: the answer is what counts
  EXPECT_FALSE(vera->Read(&response)) << "answered after its token was revoked";
  const grpc::Status status = vera->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
  EXPECT_EQ(status.error_message().rfind("reflection: token revoked", 0), 0u)
      << status.error_message();

  ASSERT_TRUE(ada->Write(ListServices()) && ada->Read(&response));
  EXPECT_GT(response.list_services_response().service_size(), 0);
  ada->WritesDone();
  EXPECT_TRUE(ada->Finish().ok());
  server->Shutdown();
}

// A pool with an extension, which the coordinator's own protos do not declare.
TEST(AnswerReflectionRequestTest, AnswersExtensionQueriesFromThePool) {
  google::protobuf::DescriptorPool pool;
  FileDescriptorProto base;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(name: "base.proto"
           package: "test"
           syntax: "proto2"
           message_type {
             name: "Base"
             extension_range { start: 100 end: 200 }
           })pb",
      &base));
  FileDescriptorProto extending;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(name: "extending.proto"
           package: "test"
           syntax: "proto2"
           dependency: "base.proto"
           extension {
             name: "seven"
             number: 107
             label: LABEL_OPTIONAL
             type: TYPE_INT32
             extendee: ".test.Base"
           }
           extension {
             name: "nine"
             number: 109
             label: LABEL_OPTIONAL
             type: TYPE_STRING
             extendee: ".test.Base"
           })pb",
      &extending));
  ASSERT_NE(pool.BuildFile(base), nullptr);
  ASSERT_NE(pool.BuildFile(extending), nullptr);
  const std::vector<std::string> no_services;

  ServerReflectionRequest numbers;
  numbers.set_all_extension_numbers_of_type("test.Base");
  ServerReflectionResponse response = AnswerReflectionRequest(numbers, pool, no_services, {});
  EXPECT_EQ(response.all_extension_numbers_response().base_type_name(), "test.Base");
  const auto& found = response.all_extension_numbers_response().extension_number();
  EXPECT_EQ(std::set<int>(found.begin(), found.end()), (std::set<int>{107, 109}));

  ServerReflectionRequest extension;
  extension.mutable_file_containing_extension()->set_containing_type("test.Base");
  extension.mutable_file_containing_extension()->set_extension_number(109);
  response = AnswerReflectionRequest(extension, pool, no_services, {});
  EXPECT_EQ(FileNames(response), (std::vector<std::string>{"extending.proto", "base.proto"}));

  extension.mutable_file_containing_extension()->set_extension_number(108);
  response = AnswerReflectionRequest(extension, pool, no_services, {});
  EXPECT_EQ(response.error_response().error_code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  ServerReflectionRequest symbol = Symbol("test.seven");
  response = AnswerReflectionRequest(symbol, pool, no_services, {});
  EXPECT_EQ(FileNames(response), (std::vector<std::string>{"extending.proto", "base.proto"}));

  ReflectionOptions tiny;
  tiny.max_response_bytes = 16;
  response = AnswerReflectionRequest(symbol, pool, no_services, tiny);
  EXPECT_EQ(response.error_response().error_code(),
            static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
}

}  // namespace
}  // namespace zeroshard::coordinator
