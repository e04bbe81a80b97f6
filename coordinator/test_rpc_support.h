// What tests that call a real coordinator over gRPC share: a deadline for each call, a small job
// spec and a progress report's metrics.
#ifndef ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_
#define ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_

#include <cstdint>
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

// Metrics of a rank's report at `step` (fixed loss and timings).
inline v1::StepMetrics Metrics(int64_t step) {
  v1::StepMetrics metrics;
  metrics.set_step(step);
  metrics.set_loss(0.5);
  metrics.set_step_ms(1.0);
  metrics.set_loss_scale(1.0);
  return metrics;
}

}  // namespace zeroshard::coordinator

#endif  // ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_
