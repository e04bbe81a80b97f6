// Server reflection answered from a descriptor pool, behind the coordinator's authentication.
#include "coordinator/reflection_service.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/log_escape.h"
#include "coordinator/authorization.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/health/v1/health.pb.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/impl/server_initializer.h"

namespace zeroshard::coordinator {
namespace {

using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

// Error messages quote at most this much of a client's value (docs/api.md, "Limits").
constexpr size_t kMaxQuotedBytes = 64;

std::string Quoted(const std::string& value) {
  return absl::StrCat("'", common::EscapeForLog(value.substr(0, kMaxQuotedBytes)),
                      value.size() > kMaxQuotedBytes ? "...'" : "'");
}

void SetError(absl::StatusCode code, std::string message, ServerReflectionResponse* response) {
  response->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response->mutable_error_response()->set_error_message(std::move(message));
}

// `file` first, then the files it imports, transitively, each once: enough for a client to build
// a pool of its own that resolves every type `file` names.
void SetFileWithDependencies(const google::protobuf::FileDescriptor* file,
                             const ReflectionOptions& options, ServerReflectionResponse* response) {
  std::vector<const google::protobuf::FileDescriptor*> files = {file};
  absl::flat_hash_set<const google::protobuf::FileDescriptor*> seen = {file};
  auto* out = response->mutable_file_descriptor_response();
  for (size_t i = 0; i < files.size(); ++i) {
    google::protobuf::FileDescriptorProto proto;
    files[i]->CopyTo(&proto);
    out->add_file_descriptor_proto(proto.SerializeAsString());
    for (int d = 0; d < files[i]->dependency_count(); ++d) {
      const google::protobuf::FileDescriptor* dependency = files[i]->dependency(d);
      if (seen.insert(dependency).second) files.push_back(dependency);
    }
  }
  if (static_cast<int64_t>(out->ByteSizeLong()) > options.max_response_bytes) {
    SetError(absl::StatusCode::kResourceExhausted,
             absl::StrCat("max_send_message_bytes: ", file->name(), " and its dependencies take ",
                          out->ByteSizeLong(), " bytes, more than ", options.max_response_bytes),
             response);
  }
}

}  // namespace

ServerReflectionResponse AnswerReflectionRequest(const ServerReflectionRequest& request,
                                                 const google::protobuf::DescriptorPool& pool,
                                                 const std::vector<std::string>& services,
                                                 const ReflectionOptions& options) {
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kFileByFilename: {
      const google::protobuf::FileDescriptor* file =
          pool.FindFileByName(request.file_by_filename());
      if (file == nullptr) {
        SetError(absl::StatusCode::kNotFound,
                 absl::StrCat("file ", Quoted(request.file_by_filename()), " not found"),
                 &response);
      } else {
        SetFileWithDependencies(file, options, &response);
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingSymbol: {
      const google::protobuf::FileDescriptor* file =
          pool.FindFileContainingSymbol(request.file_containing_symbol());
      if (file == nullptr) {
        SetError(absl::StatusCode::kNotFound,
                 absl::StrCat("symbol ", Quoted(request.file_containing_symbol()), " not found"),
                 &response);
      } else {
        SetFileWithDependencies(file, options, &response);
      }
      break;
    }
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& extension = request.file_containing_extension();
      const google::protobuf::Descriptor* type =
          pool.FindMessageTypeByName(extension.containing_type());
      const google::protobuf::FieldDescriptor* field =
          type == nullptr ? nullptr
                          : pool.FindExtensionByNumber(type, extension.extension_number());
      if (type == nullptr) {
        SetError(absl::StatusCode::kNotFound,
                 absl::StrCat("message type ", Quoted(extension.containing_type()), " not found"),
                 &response);
      } else if (field == nullptr) {
        SetError(absl::StatusCode::kNotFound,
                 absl::StrCat("extension ", extension.extension_number(), " of ",
                              Quoted(extension.containing_type()), " not found"),
                 &response);
      } else {
        SetFileWithDependencies(field->file(), options, &response);
      }
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const google::protobuf::Descriptor* type =
          pool.FindMessageTypeByName(request.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(absl::StatusCode::kNotFound,
                 absl::StrCat("message type ", Quoted(request.all_extension_numbers_of_type()),
                              " not found"),
                 &response);
        break;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool.FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(type->full_name());
      for (const google::protobuf::FieldDescriptor* extension : extensions) {
        numbers->add_extension_number(extension->number());
      }
      break;
    }
    case ServerReflectionRequest::kListServices: {
      auto* list = response.mutable_list_services_response();
      for (const std::string& service : services) list->add_service()->set_name(service);
      break;
    }
    case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
      SetError(absl::StatusCode::kInvalidArgument,
               "the request sets none of file_by_filename, file_containing_symbol, "
               "file_containing_extension, all_extension_numbers_of_type, list_services",
               &response);
      break;
  }
  return response;
}

// One ServerReflectionInfo stream of either package (both use v1alpha's messages). Reads and
// writes alternate (a read starts only when the previous answer is written). Its callbacks and
// Revoke (from a token reload) take mu_; StartRead, StartWrite and Finish are called with it
// held, which is safe because gRPC never runs a reaction inline with the call that starts it.
class ReflectionService::Stream final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  Stream(ReflectionService* service, grpc::CallbackServerContext* context) : service_(service) {
    const absl::Status admitted = service_->OpenStream(*context, &caller_, &credential_);
    if (!admitted.ok()) {
      this->Finish(common::ToGrpcStatus(admitted));
      return;
    }
    serial_ = service_->Register(this);
    counted_ = true;
    absl::MutexLock lock(&mu_);
    // A reload between OpenStream and Register found no stream to end: the table it swapped in is
    // the one in use now, so asking again here leaves no gap.
    if (revoked_ || Revoked()) {
      FinishLocked(RevokedStatus());
      return;
    }
    StartReadLocked();
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (finished_) return;  // revoked while waiting for this request
    // Not ok: the client half-closed (or the call ended); every request has had its answer.
    if (!ok) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    if (++requests_ > service_->options_.max_requests_per_stream) {
      FinishLocked(grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("max_reflection_requests_per_stream: this stream sent more than ",
                       service_->options_.max_requests_per_stream,
                       " requests; open another stream")));
      return;
    }
    // Every request, not only the first: the stream may have outlived its token.
    if (revoked_ || Revoked()) {
      FinishLocked(RevokedStatus());
      return;
    }
    response_ = AnswerReflectionRequest(request_, *service_->pool_, service_->Services(),
                                        service_->options_);
    this->StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the reflection stream ended"));
      return;
    }
    if (revoked_) {
      FinishLocked(RevokedStatus());
      return;
    }
    StartReadLocked();
  }

  void OnDone() override {
    if (counted_) service_->StreamClosed(serial_);
    delete this;
  }

  // Whether the authenticator no longer grants the stream's credential its identity.
  bool Revoked() const { return service_->authenticator_->Revoked(credential_, caller_); }

  // Its credential was revoked: ends the stream now if it waits for the client's next request,
  // else as soon as it would read one (the answer being written is written first). Only while
  // the stream is registered (streams_mu_ held).
  void Revoke() {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    revoked_ = true;
    if (reading_) FinishLocked(RevokedStatus());
  }

 private:
  static grpc::Status RevokedStatus() {
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        "reflection: token revoked: the token (or client certificate) this stream was opened "
        "with left the coordinator's token file, or now names another identity or role, at its "
        "reload (SIGHUP); open another stream with a current token");
  }

  void StartReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    reading_ = true;
    this->StartRead(&request_);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    this->Finish(status);
  }

  ReflectionService* const service_;
  // Set before the stream is registered or reads, constant after.
  security::Identity caller_;
  std::string credential_;
  uint64_t serial_ = 0;
  bool counted_ = false;
  absl::Mutex mu_;
  // Finish was called; nothing more starts.
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // A read is pending: the stream waits for its client, and Revoke may finish it at once.
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  // Revoke came while no read was pending: the stream ends instead of starting the next one.
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  int64_t requests_ ABSL_GUARDED_BY(mu_) = 0;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
};

class ReflectionService::V1AlphaService final
    : public grpc::reflection::v1alpha::ServerReflection::CallbackService {
 public:
  explicit V1AlphaService(ReflectionService* service) : service_(service) {}

  grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>* ServerReflectionInfo(
      grpc::CallbackServerContext* context) override {
    return new Stream(service_, context);
  }

 private:
  ReflectionService* const service_;
};

class ReflectionService::V1Service final
    : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  explicit V1Service(ReflectionService* service) : service_(service) {}

  grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>* ServerReflectionInfo(
      grpc::CallbackServerContext* context) override {
    return new Stream(service_, context);
  }

 private:
  ReflectionService* const service_;
};

// Learns the server's service list: gRPC hands it only to builder plugins.
class ReflectionService::ServiceListPlugin final : public grpc::ServerBuilderPlugin {
 public:
  explicit ServiceListPlugin(ReflectionService* service) : service_(service) {}

  std::string name() override { return "zeroshard_reflection_service_list"; }
  // Runs before the server starts; the health service is appended to the same list at start.
  void InitServer(grpc::ServerInitializer* initializer) override {
    service_->services_.store(initializer->GetServiceList());
  }
  void Finish(grpc::ServerInitializer*) override {}
  void ChangeArguments(const std::string&, void*) override {}

 private:
  ReflectionService* const service_;
};

// The way into one builder's plugin list without a process-wide plugin factory.
class ReflectionService::ServiceListOption final : public grpc::ServerBuilderOption {
 public:
  explicit ServiceListOption(ReflectionService* service) : service_(service) {}

  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->push_back(std::make_unique<ServiceListPlugin>(service_));
  }

 private:
  ReflectionService* const service_;
};

ReflectionService::ReflectionService(const security::Authenticator* authenticator,
                                     ReflectionOptions options,
                                     const google::protobuf::DescriptorPool* pool)
    : authenticator_(authenticator),
      options_(options),
      pool_(pool),
      v1alpha_(std::make_unique<V1AlphaService>(this)),
      v1_(std::make_unique<V1Service>(this)) {
  // gRPC's own health service (EnableDefaultHealthCheckService) is upb code that puts no
  // descriptors in the generated pool; naming ours links proto/grpc/health/v1 in, so reflection
  // describes grpc.health.v1.Health and grpcurl can call it.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
}

ReflectionService::~ReflectionService() = default;

void ReflectionService::AddTo(grpc::ServerBuilder* builder) {
  builder->RegisterService(v1alpha_.get());
  builder->RegisterService(v1_.get());
  builder->SetOption(std::make_unique<ServiceListOption>(this));
}

std::vector<std::string> ReflectionService::Services() const {
  const std::vector<std::string>* services = services_.load();
  if (services == nullptr) return {};
  return *services;
}

absl::Status ReflectionService::OpenStream(const grpc::ServerContextBase& context,
                                           security::Identity* caller, std::string* credential) {
  absl::StatusOr<security::Identity> authenticated =
      authenticator_->Authenticate(context, credential);
  if (!authenticated.ok()) return authenticated.status();
  if (absl::Status allowed = Authorize(*authenticated, Method::kReflection); !allowed.ok()) {
    return allowed;
  }
  *caller = *std::move(authenticated);
  if (open_streams_.fetch_add(1) >= options_.max_open_streams) {
    open_streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(
        absl::StrCat("max_reflection_streams: ", options_.max_open_streams,
                     " reflection streams are open, the most this coordinator serves at once"));
  }
  return absl::OkStatus();
}

uint64_t ReflectionService::Register(Stream* stream) {
  absl::MutexLock lock(&streams_mu_);
  const uint64_t serial = next_serial_++;
  streams_.emplace(serial, stream);
  return serial;
}

void ReflectionService::StreamClosed(uint64_t serial) {
  {
    absl::MutexLock lock(&streams_mu_);
    streams_.erase(serial);
  }
  open_streams_.fetch_sub(1);
}

int64_t ReflectionService::EndRevokedStreams() {
  // Under streams_mu_ throughout: a registered stream is not deleted while it is held, and
  // Revoke takes only the stream's own lock (the documented order).
  absl::MutexLock lock(&streams_mu_);
  int64_t ended = 0;
  for (const auto& [serial, stream] : streams_) {
    if (stream->Revoked()) {
      stream->Revoke();
      ++ended;
    }
  }
  return ended;
}

}  // namespace zeroshard::coordinator
