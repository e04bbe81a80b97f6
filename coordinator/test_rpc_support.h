// What tests that call a real coordinator over gRPC share: a fresh directory per test, a
// deadline for each call, a small job spec and a progress report's metrics.
#ifndef ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_
#define ZEROSHARD_COORDINATOR_TEST_RPC_SUPPORT_H_

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "zeroshard/v1/job.pb.h"

namespace zeroshard::coordinator {

inline constexpr absl::Duration kRpcDeadline = absl::Seconds(10);

// A fresh, empty directory under TEST_TMPDIR named after the running test (and `suffix`).
inline std::string FreshTestDir(const std::string& suffix = "") {
  const std::string dir =
      absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name(), suffix);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

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
