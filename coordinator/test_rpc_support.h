// What tests that call a real coordinator over gRPC share: a deadline for each call and a small
// job spec.
#ifndef ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_
#define ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_

#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::coordinator {

inline constexpr absl::Duration kRpcDeadline = absl::Seconds(10);

inline void SetDeadline(grpc::ClientContext& context, absl::Duration timeout = kRpcDeadline) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

// The seed preset with SGD on exactly `workers` workers, global batch 128.
inline v1::JobSpec Spec(const std::string& name, int workers) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_workload()->set_preset("seed");
  spec.mutable_optimizer()->set_kind(v1::SGD);
  spec.set_min_workers(workers);
  spec.set_max_workers(workers);
  spec.set_global_batch(128);
  return spec;
}

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_
