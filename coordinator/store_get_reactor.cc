// A StoreGet call parked in the rendezvous store.
#include "coordinator/store_get_reactor.h"

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "coordinator/request_parsing.h"

namespace zeroshard::coordinator {

void StoreGetReactor::Park(const v1::StoreGetRequest& request, grpc::ByteBuffer* response) {
  const RendezvousStore::WaiterId id =
      store_->Get(request.job_id(), request.generation(), request.key(),
                  absl::Milliseconds(request.timeout_ms()),
                  [this, response](absl::StatusOr<std::string> value) {
                    absl::Status status = value.status();
                    if (value.ok()) {
                      v1::StoreGetResponse found;
                      found.set_value(*std::move(value));
                      status = SerializeResponse(found, response);
                    }
                    metrics_->RecordRpc("StoreGet", status.code(), absl::Now() - start_);
                    Finish(common::ToGrpcStatus(status));
                  });
  waiter_.store(id);
  if (cancelled_.load()) store_->CancelWait(id);
}

void StoreGetReactor::OnCancel() {
  cancelled_.store(true);
  if (const RendezvousStore::WaiterId id = waiter_.load(); id != 0) store_->CancelWait(id);
}

}  // namespace zeroshard::coordinator
