// The reactor of a StoreGet call that waits in the rendezvous store without holding a thread.
#ifndef ZEROSHARD_COORDINATOR_STORE_GET_REACTOR_H_
#define ZEROSHARD_COORDINATOR_STORE_GET_REACTOR_H_

#include <atomic>

#include "absl/time/time.h"
#include "coordinator/metrics.h"
#include "coordinator/rendezvous_store.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {

// A StoreGet call parked in the rendezvous store. Finishes exactly once (the store calls back
// exactly once); a client that goes away cancels its wait.
// Thread contract: Park runs on the handler's thread, OnCancel on gRPC's, the store's callback on
// whichever thread resolves the wait; they meet only through the atomics waiter_ and cancelled_.
class StoreGetReactor final : public grpc::ServerUnaryReactor {
 public:
  StoreGetReactor(RendezvousStore* store, CoordinatorMetrics* metrics, absl::Time start)
      : store_(store), metrics_(metrics), start_(start) {}

  // `response` receives the serialized StoreGetResponse before the call finishes.
  void Park(const v1::StoreGetRequest& request, grpc::ByteBuffer* response);

  void OnCancel() override;

  void OnDone() override { delete this; }

 private:
  RendezvousStore* const store_;
  CoordinatorMetrics* const metrics_;
  const absl::Time start_;
  std::atomic<RendezvousStore::WaiterId> waiter_{0};
  std::atomic<bool> cancelled_{false};
};

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_STORE_GET_REACTOR_H_
