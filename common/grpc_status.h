// One-to-one mapping between absl::Status and grpc::Status (code and message).
#ifndef ZEROSHARD_COMMON_GRPC_STATUS_H_
#define ZEROSHARD_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace zeroshard::common {

// Both enums share gRPC's canonical numbering, so codes map one to one.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace zeroshard::common

#endif  // ZEROSHARD_COMMON_GRPC_STATUS_H_
