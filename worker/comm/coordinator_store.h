// CoordinatorStore: the Store a worker uses in production, backed by the coordinator's store
// RPCs (StoreSet/StoreGet/StoreAdd/StoreDelete) and scoped to one job and generation.
#ifndef ZEROSHARD_WORKER_COMM_COORDINATOR_STORE_H_
#define ZEROSHARD_WORKER_COMM_COORDINATOR_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "worker/comm/store.h"
#include "zeroshard/v1/coordinator.grpc.pb.h"

namespace zeroshard::comm {

// Every call names (job_id, generation); the coordinator refuses a stale generation with
// FAILED_PRECONDITION, which is returned unchanged (codes map one to one, common/grpc_status.h).
// Each RPC gets a deadline of `rpc_timeout` (plus, for Get, the time it asks the coordinator to
// wait). A Get longer than the coordinator's 600 s per-request limit is split into several.
//
// Thread contract: thread-safe (gRPC stubs are); `stub` is shared with its other users.
class CoordinatorStore : public Store {
 public:
  CoordinatorStore(std::shared_ptr<v1::Coordinator::StubInterface> stub, std::string job_id,
                   int64_t generation, absl::Duration rpc_timeout = absl::Seconds(30));

  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Delete(absl::string_view key) override;

 private:
  const std::shared_ptr<v1::Coordinator::StubInterface> stub_;
  const std::string job_id_;
  const int64_t generation_;
  const absl::Duration rpc_timeout_;
};

}  // namespace zeroshard::comm

#endif  // ZEROSHARD_WORKER_COMM_COORDINATOR_STORE_H_
