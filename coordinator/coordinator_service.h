// gRPC glue for the Coordinator service (callback API): validates each request, calls the
// JobManager or the RendezvousStore, maps Status, and records metrics. No business logic here.
#ifndef ZEROSHARD_COORDINATOR_COORDINATOR_SERVICE_H_
#define ZEROSHARD_COORDINATOR_COORDINATOR_SERVICE_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_manager.h"
#include "coordinator/metrics.h"
#include "coordinator/rendezvous_store.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::coordinator {

struct ServiceOptions {
  // Events a WatchJob stream may have queued before the watcher counts as fallen behind and
  // its stream ends with RESOURCE_EXHAUSTED.
  size_t max_watch_backlog = 4096;
  // Events a WatchJob stream reads from the store at a time while it sends the history (at
  // most max_watch_backlog): its memory, whatever the history's length.
  size_t watch_page_events = 512;
  // ExportCheckpoint streams reading the checkpoint root at once; another one gets
  // RESOURCE_EXHAUSTED. Each holds a thread and up to one fragment of the checkpoint in memory.
  int max_concurrent_exports = 4;
  // Tests: runs on an export's reading thread whenever it must wait for its client to take a
  // chunk (the queue is full), with the bytes of the file queued so far.
  std::function<void(int64_t bytes_queued)> export_waits_for_testing;
};

// Thread-safe; handlers run on gRPC's callback threads and never block: StoreGet waits and
// WatchJob streams hold no thread while idle. ExportCheckpoint reads files on a thread of its own
// per stream (at most max_concurrent_exports), never on gRPC's threads.
class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorService(JobManager* manager, RendezvousStore* rendezvous, CoordinatorMetrics* metrics,
                     ServiceOptions options = {});

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* LeaveWorker(grpc::CallbackServerContext* context,
                                        const v1::LeaveWorkerRequest* request,
                                        v1::LeaveWorkerResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request, v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(grpc::CallbackServerContext* context,
                                                   const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* GetShardPlan(grpc::CallbackServerContext* context,
                                         const v1::GetShardPlanRequest* request,
                                         v1::ShardPlan* response) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const v1::StoreSetRequest* request,
                                     v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const v1::StoreGetRequest* request,
                                     v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* StoreAdd(grpc::CallbackServerContext* context,
                                     const v1::StoreAddRequest* request,
                                     v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* StoreDelete(grpc::CallbackServerContext* context,
                                        const v1::StoreDeleteRequest* request,
                                        v1::StoreDeleteResponse* response) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* context,
                                           const v1::ReportProgressRequest* request,
                                           v1::ReportProgressResponse* response) override;
  grpc::ServerUnaryReactor* CommitCheckpoint(grpc::CallbackServerContext* context,
                                             const v1::CommitCheckpointRequest* request,
                                             v1::CommitCheckpointResponse* response) override;
  grpc::ServerWriteReactor<v1::ExportCheckpointChunk>* ExportCheckpoint(
      grpc::CallbackServerContext* context, const v1::ExportCheckpointRequest* request) override;

 private:
  // Runs `handler` (returning absl::Status) and finishes the call with its status.
  template <typename Handler>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* context, const char* method,
                                  Handler handler);

  JobManager* const manager_;
  RendezvousStore* const rendezvous_;
  CoordinatorMetrics* const metrics_;
  const ServiceOptions options_;

  absl::Mutex exports_mu_;
  // ExportCheckpoint streams whose reading thread has not ended.
  int exports_reading_ ABSL_GUARDED_BY(exports_mu_) = 0;
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_COORDINATOR_SERVICE_H_
