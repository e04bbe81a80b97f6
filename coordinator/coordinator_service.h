// gRPC glue for the Coordinator service (callback API): validates each request, calls the
// JobManager or the RendezvousStore, maps Status, and records metrics. No business logic here.
#ifndef ZEROSHARD_COORDINATOR_COORDINATOR_SERVICE_H_
#define ZEROSHARD_COORDINATOR_COORDINATOR_SERVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/authorization.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics.h"
#include "coordinator/rendezvous_store.h"
#include "grpcpp/support/byte_buffer.h"
#include "security/authenticator.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {

struct ServiceOptions {
  // Events a WatchJob stream may have queued before the watcher counts as fallen behind and
  // its stream ends with RESOURCE_EXHAUSTED.
  size_t max_watch_backlog = 4096;
  // Events a WatchJob stream reads from the store at a time while it sends the history (at
  // most max_watch_backlog): its memory, whatever the history's length.
  size_t watch_page_events = 512;
  // ExportCheckpoint streams and VerifyCheckpoint calls reading the checkpoint root at once, in
  // all; another one gets RESOURCE_EXHAUSTED. Each holds a thread; an export also up to one
  // fragment of the checkpoint in memory, a verification a 4 MiB read buffer.
  int max_concurrent_exports = 4;
  // WatchJob streams open at once, in all (flag --max_watch_streams) and per peer host (flag
  // --max_watch_streams_per_peer); one more gets RESOURCE_EXHAUSTED naming the flag.
  int64_t max_watch_streams = 10000;
  int64_t max_watch_streams_per_peer = 1000;
  // Largest reply a unary call sends (flag --max_send_message_bytes); a bigger one gets
  // RESOURCE_EXHAUSTED naming the flag. The server's gRPC limit for streamed messages too.
  int max_send_message_bytes = 4 << 20;
  // Tests: runs on an export's reading thread whenever it must wait for its client to take a
  // chunk (the queue is full), with the bytes of the file queued so far.
  std::function<void(int64_t bytes_queued)> export_waits_for_testing;
};

namespace service_internal {

// WithMethods<Base, A, B, C>::type is A<B<C<Base>>>: the generated per-method wrappers, stacked.
template <typename Base, template <typename> class... Methods>
struct WithMethods {
  using type = Base;
};
template <typename Base, template <typename> class First, template <typename> class... Rest>
struct WithMethods<Base, First, Rest...> {
  using type = First<typename WithMethods<Base, Rest...>::type>;
};

}  // namespace service_internal

// Every method is registered raw: the service parses each request itself (request_parsing.h), so
// a request that does not parse gets INVALID_ARGUMENT saying why. gRPC's typed callback handlers
// answer it UNIMPLEMENTED with an empty message before any service code runs. The streaming
// methods write serialized messages.
using CoordinatorServiceBase = service_internal::WithMethods<
    v1::Coordinator::Service, v1::Coordinator::WithRawCallbackMethod_RegisterWorker,
    v1::Coordinator::WithRawCallbackMethod_Heartbeat,
    v1::Coordinator::WithRawCallbackMethod_LeaveWorker,
    v1::Coordinator::WithRawCallbackMethod_ListWorkers,
    v1::Coordinator::WithRawCallbackMethod_SubmitJob, v1::Coordinator::WithRawCallbackMethod_GetJob,
    v1::Coordinator::WithRawCallbackMethod_ListJobs,
    v1::Coordinator::WithRawCallbackMethod_CancelJob,
    v1::Coordinator::WithRawCallbackMethod_GetShardPlan,
    v1::Coordinator::WithRawCallbackMethod_StoreSet,
    v1::Coordinator::WithRawCallbackMethod_StoreGet,
    v1::Coordinator::WithRawCallbackMethod_StoreAdd,
    v1::Coordinator::WithRawCallbackMethod_StoreDelete,
    v1::Coordinator::WithRawCallbackMethod_ReportProgress,
    v1::Coordinator::WithRawCallbackMethod_CommitCheckpoint,
    v1::Coordinator::WithRawCallbackMethod_RewindJob,
    v1::Coordinator::WithRawCallbackMethod_WatchJob,
    v1::Coordinator::WithRawCallbackMethod_ExportCheckpoint,
    v1::Coordinator::WithRawCallbackMethod_VerifyCheckpoint>::type;

// Thread-safe; handlers run on gRPC's callback threads and never block: StoreGet waits and
// WatchJob streams hold no thread while idle. ExportCheckpoint and VerifyCheckpoint read files on
// a thread of their own per call (at most max_concurrent_exports of them together), never on
// gRPC's threads nor under JobManager's lock; each call finishes only once its thread has ended
// and joins it when done, so the server's shutdown (which waits for every call to be done) waits
// for them.
class CoordinatorService final : public CoordinatorServiceBase {
 public:
  // `authenticator` (not owned, outlives the service) names each caller; every RPC is
  // authenticated (UNAUTHENTICATED), then authorized (PERMISSION_DENIED, authorization.h)
  // before its request is looked at.
  CoordinatorService(JobManager* manager, RendezvousStore* rendezvous, CoordinatorMetrics* metrics,
                     const security::Authenticator* authenticator, ServiceOptions options = {});

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* LeaveWorker(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchJob(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* GetShardPlan(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* StoreDelete(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CommitCheckpoint(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RewindJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportCheckpoint(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* VerifyCheckpoint(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;

  // WatchJob streams admitted and not yet done.
  int64_t OpenWatchStreams() ABSL_LOCKS_EXCLUDED(watches_mu_);
  // Ends each open WatchJob stream whose credential the authenticator no longer grants the
  // identity it was opened as (call after Authenticator::Reload): UNAUTHENTICATED, "token
  // revoked", with the after_sequence to resume from. Returns how many it ended.
  int64_t EndRevokedWatches() ABSL_LOCKS_EXCLUDED(watches_mu_);
  // The same for open ExportCheckpoint streams: each stops reading and ends UNAUTHENTICATED,
  // "token revoked". Returns how many it ended.
  int64_t EndRevokedExports() ABSL_LOCKS_EXCLUDED(exports_mu_);
  // Blocks until exactly `count` streams are open or `timeout` (real time) passes; returns
  // whether they are. Lets a test wait for the server to notice a cancelled stream.
  bool AwaitOpenWatchStreams(int64_t count, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(watches_mu_);

 private:
  // Admits the caller (Admit), parses `request` as a Request, runs `handler(const
  // security::Identity& caller, const Request*, Response*)` (returning absl::Status) on it,
  // serializes the Response into `response` and finishes the call with the
  // first error or OK.
  template <typename Request, typename Response, typename Handler>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, Method method,
                                  const grpc::ByteBuffer* request, grpc::ByteBuffer* response,
                                  Handler handler);
  // Records the call's outcome and finishes it with `status`.
  grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, Method method,
                                        absl::Time start, const absl::Status& status);
  // The caller, authenticated and allowed to call `method` by its role; with `credential`, the
  // credential it authenticated with (security::Authenticator::Authenticate).
  absl::StatusOr<security::Identity> Admit(const grpc::ServerContextBase& context, Method method,
                                           std::string* credential = nullptr) const;
  // A worker-role caller must present the secret of `worker_id`'s registration.
  absl::Status CheckWorkerCaller(const grpc::ServerContextBase& context,
                                 const security::Identity& caller, const std::string& worker_id);
  // A worker-role caller must present the secret of a worker that runs (job_id, generation).
  absl::Status CheckStoreCaller(const grpc::ServerContextBase& context,
                                const security::Identity& caller, const std::string& job_id,
                                int64_t generation);

  JobManager* const manager_;
  RendezvousStore* const rendezvous_;
  CoordinatorMetrics* const metrics_;
  const security::Authenticator* const authenticator_;
  const ServiceOptions options_;

  // One open WatchJob or ExportCheckpoint stream: who opened it, with which credential, and how
  // to end it once that credential is revoked (safe to call after the stream ended).
  struct OpenWatch {
    security::Identity caller;
    std::string credential;
    std::function<void()> revoke;
  };
  // The revoke callbacks of `streams` whose credential the authenticator no longer grants
  // (call with the lock guarding `streams` held; run them after releasing it).
  std::vector<std::function<void()>> RevokedOf(
      const absl::flat_hash_map<uint64_t, OpenWatch>& streams) const;
  // Admits a WatchJob stream from `peer_host` (or says which limit it is over) and counts it
  // and keeps `watch` until ReleaseWatch; `serial` names it there.
  absl::Status AdmitWatch(const std::string& peer_host, OpenWatch watch, uint64_t* serial)
      ABSL_LOCKS_EXCLUDED(watches_mu_);
  void ReleaseWatch(const std::string& peer_host, uint64_t serial) ABSL_LOCKS_EXCLUDED(watches_mu_);

  absl::Mutex watches_mu_;
  int64_t watch_streams_ ABSL_GUARDED_BY(watches_mu_) = 0;
  // The streams counted by watch_streams_, by serial.
  absl::flat_hash_map<uint64_t, OpenWatch> open_watches_ ABSL_GUARDED_BY(watches_mu_);
  uint64_t next_watch_serial_ ABSL_GUARDED_BY(watches_mu_) = 0;
  // Open streams per peer host; a host with none has no entry.
  absl::flat_hash_map<std::string, int64_t> watch_streams_by_peer_ ABSL_GUARDED_BY(watches_mu_);

  // Counts one more call reading the checkpoint root on a thread of its own (an export or a
  // verification; `method` names it in the refusal) until ReleaseCheckpointReader, or
  // RESOURCE_EXHAUSTED when max_concurrent_exports already read.
  absl::Status AdmitCheckpointReader(absl::string_view method) ABSL_LOCKS_EXCLUDED(exports_mu_);
  void ReleaseCheckpointReader() ABSL_LOCKS_EXCLUDED(exports_mu_);

  // Keeps an open ExportCheckpoint stream (its caller, credential and how to end it) until
  // UntrackExport; returns its serial.
  uint64_t TrackExport(OpenWatch stream) ABSL_LOCKS_EXCLUDED(exports_mu_);
  void UntrackExport(uint64_t serial) ABSL_LOCKS_EXCLUDED(exports_mu_);

  absl::Mutex exports_mu_;
  // ExportCheckpoint streams and VerifyCheckpoint calls whose reading thread has not ended.
  int exports_reading_ ABSL_GUARDED_BY(exports_mu_) = 0;
  // Open ExportCheckpoint streams, by serial.
  absl::flat_hash_map<uint64_t, OpenWatch> open_exports_ ABSL_GUARDED_BY(exports_mu_);
  uint64_t next_export_serial_ ABSL_GUARDED_BY(exports_mu_) = 0;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_COORDINATOR_SERVICE_H_
