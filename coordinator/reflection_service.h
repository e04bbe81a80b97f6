// gRPC server reflection (grpc.reflection.v1alpha and v1) served by the coordinator itself, so a
// reflection call is authenticated and authorized like every other RPC (Method::kReflection).
#ifndef ZEROSHARD_COORDINATOR_REFLECTION_SERVICE_H_
#define ZEROSHARD_COORDINATOR_REFLECTION_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/server_builder.h"
#include "security/authenticator.h"
#include "zeroshard/reflection/server_reflection_v1.grpc.pb.h"
#include "zeroshard/reflection/server_reflection_v1alpha.grpc.pb.h"

namespace zeroshard::coordinator {

struct ReflectionOptions {
  // Requests one stream may send; the stream then ends with RESOURCE_EXHAUSTED. A client that
  // needs more opens another stream.
  int64_t max_requests_per_stream = 4096;
  // Reflection streams open at once; more are refused with RESOURCE_EXHAUSTED.
  int64_t max_open_streams = 64;
  // A FileDescriptorResponse larger than this (the file and its dependencies) is answered with an
  // error_response RESOURCE_EXHAUSTED instead; the coordinator uses --max_send_message_bytes.
  int64_t max_response_bytes = 4 << 20;
};

// Answers one reflection request from `pool` with `services` as the list_services answer. Pure:
// the protocol's semantics, without a stream (the services below and tests use it).
grpc::reflection::v1alpha::ServerReflectionResponse AnswerReflectionRequest(
    const grpc::reflection::v1alpha::ServerReflectionRequest& request,
    const google::protobuf::DescriptorPool& pool, const std::vector<std::string>& services,
    const ReflectionOptions& options);

// Serves ServerReflectionInfo under both package names. Each stream is admitted (authenticated,
// then authorized for Method::kReflection) before its first request is read; each request is
// answered before the next is read, so a stream holds one request and one response at most.
// A stream lives only as long as its credential: every request is answered only while the
// authenticator still grants the identity the stream was opened as, and EndRevokedStreams (at a
// token reload) ends the streams whose credential it no longer grants, idle ones included.
//
// Thread contract: thread-safe. Streams run on gRPC's callback threads and never block; they
// share the open stream count (atomic), the registry of open streams (streams_mu_, taken before
// a stream's own lock, never after), and the server's service list, which gRPC fills before the
// server starts and never changes afterwards.
class ReflectionService {
 public:
  // `authenticator` (not owned) and `pool` (not owned; the generated pool by default) outlive
  // every server this service is added to.
  explicit ReflectionService(const security::Authenticator* authenticator,
                             ReflectionOptions options = {},
                             const google::protobuf::DescriptorPool* pool =
                                 google::protobuf::DescriptorPool::generated_pool());
  ~ReflectionService();

  ReflectionService(const ReflectionService&) = delete;
  ReflectionService& operator=(const ReflectionService&) = delete;

  // Registers both reflection services with `builder`, and a builder plugin through which the
  // service learns every service the built server registers (health included). Call once,
  // before BuildAndStart.
  void AddTo(grpc::ServerBuilder* builder);

  // The fully qualified services of the server this was added to; empty before it is built.
  // Reads the server's own list, so only while that server exists.
  std::vector<std::string> Services() const;

  // Streams open now (tests).
  int64_t open_streams() const { return open_streams_.load(); }

  // Ends each open stream whose credential the authenticator no longer grants the identity it
  // was opened as (call after Authenticator::Reload): UNAUTHENTICATED, "reflection: token
  // revoked". A stream waiting for its client's next request ends at once; one writing an answer
  // ends when that write completes. Returns how many it ended.
  int64_t EndRevokedStreams() ABSL_LOCKS_EXCLUDED(streams_mu_);

 private:
  class Stream;
  class V1AlphaService;
  class V1Service;
  class ServiceListPlugin;
  class ServiceListOption;

  // OK when the stream of `context` may be served: caller admitted, under the stream cap; sets
  // `caller` and `credential` (security::Authenticator::Authenticate). On OK the stream counts as
  // open until StreamClosed.
  absl::Status OpenStream(const grpc::ServerContextBase& context, security::Identity* caller,
                          std::string* credential);
  // Keeps `stream` (open, not yet reading) where EndRevokedStreams finds it, until StreamClosed;
  // returns its serial there.
  uint64_t Register(Stream* stream) ABSL_LOCKS_EXCLUDED(streams_mu_);
  // The stream of `serial` is done (it is about to be deleted).
  void StreamClosed(uint64_t serial) ABSL_LOCKS_EXCLUDED(streams_mu_);

  const security::Authenticator* const authenticator_;
  const ReflectionOptions options_;
  const google::protobuf::DescriptorPool* const pool_;
  std::atomic<int64_t> open_streams_{0};
  absl::Mutex streams_mu_;
  // The registered streams, by serial. A stream leaves before it is deleted (StreamClosed), so a
  // pointer read under streams_mu_ is valid while it is held.
  absl::flat_hash_map<uint64_t, Stream*> streams_ ABSL_GUARDED_BY(streams_mu_);
  uint64_t next_serial_ ABSL_GUARDED_BY(streams_mu_) = 0;
  // The server's own list (grpc::ServerInitializer::GetServiceList); set before the server
  // starts and read-only after that, so reads need no lock.
  std::atomic<const std::vector<std::string>*> services_{nullptr};
  std::unique_ptr<V1AlphaService> v1alpha_;
  std::unique_ptr<V1Service> v1_;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_REFLECTION_SERVICE_H_
