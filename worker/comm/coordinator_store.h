// CoordinatorStore: the Store a worker uses in production, backed by the coordinator's store
// RPCs (StoreSet/StoreGet/StoreAdd/StoreDelete) and scoped to one job and generation.
#ifndef ZEROSHARD_WORKER_COMM_COORDINATOR_STORE_H_
#define ZEROSHARD_WORKER_COMM_COORDINATOR_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "worker/comm/abort_signal.h"
#include "worker/comm/store.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::comm {

// Every call names (job_id, generation); the coordinator refuses a stale generation with
// FAILED_PRECONDITION, which is returned unchanged (codes map one to one, common/grpc_status.h).
// Each RPC gets a deadline of `rpc_timeout` (plus, for Get, the time it asks the coordinator to
// wait). A Get longer than the coordinator's 600 s per-request limit is split into several.
// Aborting `abort_signal` (optional; it must outlive the store) cancels the RPC in flight, and
// every call from then on fails at once, with CANCELLED.
//
// Thread contract: thread-safe (gRPC stubs are); `stub` is shared with its other users.
class CoordinatorStore : public Store {
 public:
  CoordinatorStore(std::shared_ptr<v1::Coordinator::StubInterface> stub, std::string job_id,
                   int64_t generation, absl::Duration rpc_timeout = absl::Seconds(30),
                   AbortSignal* abort_signal = nullptr);

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;

 private:
  // Runs `rpc`, which uses `context`, cancelling it if the abort signal is (or gets) aborted.
  absl::Status Call(grpc::ClientContext& context, const std::function<grpc::Status()>& rpc);

  const std::shared_ptr<v1::Coordinator::StubInterface> stub_;
  const std::string job_id_;
  const int64_t generation_;
  const absl::Duration rpc_timeout_;
  AbortSignal* const abort_signal_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_COORDINATOR_STORE_H_
