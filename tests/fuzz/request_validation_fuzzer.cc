// libFuzzer target for the coordinator's request handling before any state is touched: the first
// input byte picks an RPC, the rest are its request bytes, which go through the service's raw
// parsing (with its diagnosis of unparseable bytes) and then that RPC's validation.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "coordinator/request_parsing.h"
#include "coordinator/request_validation.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "zeroshard/v1/coordinator.pb.h"

namespace zeroshard::coordinator {
namespace {

template <typename Request>
void ParseAndValidate(const grpc::ByteBuffer& bytes,
                      absl::Status (*validate)(const Request& request)) {
  Request request;
  // The results are irrelevant: the fuzzer looks for crashes, hangs and sanitizer reports.
  if (ParseRequest(bytes, &request).ok()) (void)validate(request);
}

// One entry per validated RPC; a seed's first byte is its index here, so append only.
void (*const kRpcs[])(const grpc::ByteBuffer& bytes) = {
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateRegisterWorkerRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateHeartbeatRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateLeaveWorkerRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateListWorkersRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateSubmitJobRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateGetJobRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateListJobsRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateCancelJobRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateWatchJobRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateGetShardPlanRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateStoreSetRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateStoreGetRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateStoreAddRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateStoreDeleteRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateReportProgressRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateCommitCheckpointRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateExportCheckpointRequest); },
    [](const grpc::ByteBuffer& b) { ParseAndValidate(b, &ValidateVerifyCheckpointRequest); },
};
constexpr size_t kRpcCount = sizeof(kRpcs) / sizeof(kRpcs[0]);

}  // namespace
}  // namespace zeroshard::coordinator

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using zeroshard::coordinator::kRpcCount;
  using zeroshard::coordinator::kRpcs;
  if (size == 0) return 0;
  grpc::Slice slice(data + 1, size - 1);
  const grpc::ByteBuffer bytes(&slice, 1);
  kRpcs[data[0] % kRpcCount](bytes);
  return 0;
}
