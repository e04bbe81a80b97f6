// CoordinatorStore: one RPC per call; gRPC status becomes absl::Status at this boundary.
#include "worker/comm/coordinator_store.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "common/grpc_status.h"
#include "grpcpp/client_context.h"

namespace zeroshard::comm {
namespace {

// The coordinator's bound on StoreGetRequest.timeout_ms.
constexpr absl::Duration kLongestServerWait = absl::Minutes(10);

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

}  // namespace

CoordinatorStore::CoordinatorStore(std::shared_ptr<v1::Coordinator::StubInterface> stub,
                                   std::string job_id, int64_t generation,
                                   absl::Duration rpc_timeout, AbortSignal* abort_signal)
    : stub_(std::move(stub)),
      job_id_(std::move(job_id)),
      generation_(generation),
      rpc_timeout_(rpc_timeout),
      abort_signal_(abort_signal) {}

absl::Status CoordinatorStore::Call(grpc::ClientContext& context,
                                    const std::function<grpc::Status()>& rpc) {
  // Registered before the call starts: gRPC applies a TryCancel that comes first once it does.
  std::optional<AbortSignal::Registration> cancel;
  if (abort_signal_ != nullptr) {
    cancel.emplace(abort_signal_->OnAbort([&context] { context.TryCancel(); }));
  }
  return common::FromGrpcStatus(rpc());
}

absl::Status CoordinatorStore::Set(absl::string_view key, absl::string_view value) {
  v1::StoreSetRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::StoreSetResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, rpc_timeout_);
  return Call(context, [&] { return stub_->StoreSet(&context, request, &response); });
}

absl::StatusOr<std::string> CoordinatorStore::Get(absl::string_view key, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + std::max(timeout, absl::ZeroDuration());
  while (true) {
    // Rounded up to whole milliseconds: rounded down, the last moments of a wait would become a
    // request not to wait at all, which the coordinator answers with NOT_FOUND for a missing key.
    const absl::Duration wait =
        std::clamp(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)), absl::ZeroDuration(),
                   kLongestServerWait);
    v1::StoreGetRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_key(std::string(key));
    request.set_timeout_ms(absl::ToInt64Milliseconds(wait));
    v1::StoreGetResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, wait + rpc_timeout_);
    absl::Status status =
        Call(context, [&] { return stub_->StoreGet(&context, request, &response); });
    if (status.ok()) return std::move(*response.mutable_value());
    if (!absl::IsDeadlineExceeded(status) || absl::Now() >= deadline) return status;
  }
}

absl::StatusOr<int64_t> CoordinatorStore::Add(absl::string_view key, int64_t delta) {
  v1::StoreAddRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(std::string(key));
  request.set_delta(delta);
  v1::StoreAddResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, rpc_timeout_);
  absl::Status status =
      Call(context, [&] { return stub_->StoreAdd(&context, request, &response); });
  if (!status.ok()) return status;
  return response.value();
}

absl::StatusOr<bool> CoordinatorStore::Delete(absl::string_view key) {
  v1::StoreDeleteRequest request;
  request.set_job_id(job_id_);
  request.set_generation(generation_);
  request.set_key(std::string(key));
  v1::StoreDeleteResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, rpc_timeout_);
  absl::Status status =
      Call(context, [&] { return stub_->StoreDelete(&context, request, &response); });
  if (!status.ok()) return status;
  return response.deleted();
}

}  // namespace zeroshard::comm
