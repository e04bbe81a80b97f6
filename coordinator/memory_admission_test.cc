// Admission by memory: jobs against the idle workers' --memory_limit_bytes, with the figures.
#include "coordinator/memory_admission.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "jobspec/job_memory.h"
#include "jobspec/job_spec_defaults.h"

namespace zeroshard::coordinator {
namespace {

v1::JobSpec DeepJob(v1::Mode mode, int64_t max_workers = 4) {
  v1::JobSpec spec;
  spec.set_name("deep");
  spec.mutable_workload()->set_preset("deep");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_mode(mode);
  spec.set_min_workers(1);
  spec.set_max_workers(max_workers);
  spec.set_global_batch(8);
  return jobspec::WithDefaults(spec, "job-000001");
}

v1::WorkerInfo Worker(const std::string& name, int64_t limit, v1::DeviceKind kind = v1::CPU) {
  v1::WorkerInfo worker;
  worker.set_id("worker-" + name);
  worker.set_name(name);
  worker.set_device_kind(kind);
  worker.set_memory_limit_bytes(limit);
  return worker;
}

std::vector<const v1::WorkerInfo*> Pointers(const std::vector<v1::WorkerInfo>& workers) {
  std::vector<const v1::WorkerInfo*> out;
  for (const v1::WorkerInfo& worker : workers) out.push_back(&worker);
  return out;
}

int64_t Need(v1::Mode mode, int64_t world_size) {
  absl::StatusOr<sharding::RankMemoryBytes> need =
      jobspec::JobMemoryNeed(DeepJob(mode), mode, world_size);
  EXPECT_TRUE(need.ok()) << need.status();
  return need.ok() ? need->total : 0;
}

// Fails before the fix: SubmitJob knew nothing of the workers' limits; a job too large for them
// was accepted and failed on every worker it was given.
TEST(MemoryAdmissionTest, RefusesAModeAboveTheSmallestLimitNamingTheFiguresAndTheModeThatFits) {
  const int64_t zero2 = Need(v1::ZERO2, 4);
  const int64_t zero3 = Need(v1::ZERO3, 4);
  ASSERT_LT(zero3, zero2);
  const int64_t limit = (zero2 + zero3) / 2;
  const std::vector<v1::WorkerInfo> workers = {Worker("w0", 0), Worker("w1", limit + (1 << 20)),
                                               Worker("w2", limit + (2 << 20)),
                                               Worker("w3", limit)};
  const absl::Status refused = CheckJobFitsMemoryLimits(DeepJob(v1::ZERO2), Pointers(workers));
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  const std::string message(refused.message());
  EXPECT_NE(message.find("spec.mode: ZERO2 needs " + sharding::FormatMiB(zero2) +
                         " per rank at W=4 (params="),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("optimizer_state="), std::string::npos) << message;
  EXPECT_NE(
      message.find("more than worker w3's --memory_limit_bytes=" + sharding::FormatMiB(limit)),
      std::string::npos)
      << message;
  EXPECT_NE(message.find("ZERO3 would need " + sharding::FormatMiB(zero3)), std::string::npos)
      << message;
  EXPECT_NE(message.find("(fits)"), std::string::npos) << message;
  // zero3 fits the same workers.
  EXPECT_TRUE(CheckJobFitsMemoryLimits(DeepJob(v1::ZERO3), Pointers(workers)).ok());
}

// An attached trainer's model (issue 39): 16 Linear(512, 512) layers, on the two workers it
// names. Fails before the fix: attached jobs were not checked at submission (the worker's
// allocator refused at run time, and the trainer saw its worker close the connection); or when
// the check counts a worker the job does not run on; or when zero3's estimate ignores its own
// default bucket (the model's elements / 32), which a zero2 spec's 4M-element default would make
// a pool of twice the model: no fit.
v1::JobSpec AttachedJob(v1::Mode mode) {
  v1::JobSpec spec;
  spec.set_name("attached");
  v1::AttachedModel& model = *spec.mutable_workload()->mutable_attached();
  for (int layer = 0; layer < 16; ++layer) {
    v1::AttachedTensor& weight = *model.add_tensors();
    weight.set_name("layers." + std::to_string(layer) + ".weight");
    weight.add_shape(512);
    weight.add_shape(512);
  }
  model.add_workers("a");
  model.add_workers("b");
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_mode(mode);
  return jobspec::WithDefaults(spec, "job-000002");
}

TEST(MemoryAdmissionTest, AnAttachedJobIsCheckedAgainstTheWorkersItNames) {
  const v1::JobSpec zero2_job = AttachedJob(v1::ZERO2);
  const v1::JobSpec zero3_job = AttachedJob(v1::ZERO3);
  ASSERT_LT(zero3_job.bucket_elems(), zero2_job.bucket_elems());
  absl::StatusOr<sharding::RankMemoryBytes> zero2 = jobspec::JobMemoryNeed(zero2_job, v1::ZERO2, 2);
  absl::StatusOr<sharding::RankMemoryBytes> zero3 = jobspec::JobMemoryNeed(zero3_job, v1::ZERO3, 2);
  ASSERT_TRUE(zero2.ok() && zero3.ok());
  ASSERT_LT(zero3->total, zero2->total);
  const int64_t limit = (zero2->total + zero3->total) / 2;
  // "c" has a limit nothing fits, but the job does not run there.
  const std::vector<v1::WorkerInfo> workers = {Worker("a", limit), Worker("b", 0),
                                               Worker("c", 1 << 20)};
  const absl::Status refused = CheckJobFitsMemoryLimits(zero2_job, Pointers(workers));
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  const std::string message(refused.message());
  EXPECT_NE(message.find("spec.mode: ZERO2 needs " + sharding::FormatMiB(zero2->total) +
                         " per rank at W=2"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("worker a's --memory_limit_bytes="), std::string::npos) << message;
  EXPECT_NE(message.find("ZERO3 would need " + sharding::FormatMiB(zero3->total) + " (fits)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(fits)"), std::string::npos) << message;
  EXPECT_TRUE(CheckJobFitsMemoryLimits(zero3_job, Pointers(workers)).ok());
}

TEST(MemoryAdmissionTest, NoLimitOrOtherKindsLimitsAdmitEverything) {
  const std::vector<v1::WorkerInfo> unlimited = {Worker("a", 0), Worker("b", 0)};
  EXPECT_TRUE(CheckJobFitsMemoryLimits(DeepJob(v1::DDP), Pointers(unlimited)).ok());
  const std::vector<v1::WorkerInfo> cuda = {Worker("a", 0), Worker("g", 1 << 20, v1::CUDA)};
  EXPECT_TRUE(CheckJobFitsMemoryLimits(DeepJob(v1::DDP), Pointers(cuda)).ok());
  EXPECT_TRUE(CheckJobFitsMemoryLimits(DeepJob(v1::DDP), {}).ok());
}

TEST(MemoryAdmissionTest, TheWorldSizeIsTheSchedulersForTheIdleWorkers) {
  // Two idle workers: W = 2, where zero3 needs more per rank than at W = 4.
  const int64_t at_two = Need(v1::ZERO3, 2);
  const int64_t at_four = Need(v1::ZERO3, 4);
  ASSERT_GT(at_two, at_four);
  const std::vector<v1::WorkerInfo> two = {Worker("a", at_four), Worker("b", at_four)};
  const absl::Status refused = CheckJobFitsMemoryLimits(DeepJob(v1::ZERO3), Pointers(two));
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("at W=2"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("no mode fits at W=2"), absl::string_view::npos) << refused;
  EXPECT_EQ(AdmissionWorldSize(DeepJob(v1::ZERO3), 2), 2);
  EXPECT_EQ(AdmissionWorldSize(DeepJob(v1::ZERO3), 7), 4);
  // Fewer idle than min_workers: the smallest W the job can start on.
  v1::JobSpec spec = DeepJob(v1::ZERO3);
  spec.set_min_workers(3);
  EXPECT_EQ(AdmissionWorldSize(spec, 1), 4);  // 3 does not divide 8
}

}  // namespace
}  // namespace zeroshard::coordinator
