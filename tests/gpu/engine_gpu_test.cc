// GPU check of the engine's CUDA path (a plain main, no gtest): the CUDA teacher-student MLP's
// loss and gradients against the CPU MLP's (fp32, bf16 and fp16 parameters), and W=1 engine
// steps with CudaDeviceOps and an NcclCommunicator against the CPU engine on the same inputs.
// README.md states the tolerances.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "numerics/dtype.h"
#include "sharding/model_catalog.h"
#include "sharding/shard_planner.h"
#include "worker/comm/communicator.h"
#include "worker/comm/in_memory_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/testing/identity_communicator.h"
#include "worker/engine/cuda_device_ops.h"
#include "worker/engine/engine.h"
#include "worker/workloads/cuda_teacher_student_mlp.h"
#include "worker/workloads/teacher_student_mlp.h"

namespace zeroshard::engine {
namespace {

using engine::CudaDeviceOps;
using engine::Engine;
using engine::EngineConfig;
using engine::EngineMode;
using numerics::DType;
using workloads::TeacherStudentMlpOptions;

int g_failures = 0;

void Report(bool pass, const std::string& what) {
  std::printf("%s %s\n", pass ? "PASS" : "FAIL", what.c_str());
  if (!pass) ++g_failures;
}

bool Check(const absl::Status& status, const std::string& what) {
  if (!status.ok()) Report(false, absl::StrCat(what, ": ", status.ToString()));
  return status.ok();
}

// A world of one rank: every collective leaves its buffer as it is, which is exact for W = 1.
using SingleRankCommunicator = comm::testing::IdentityCommunicator;

// Host parameters for the CPU MLP, stored in `dtype` (fp32 values, or their bf16/fp16 bits), and
// the same bytes in device memory for the CUDA one.
class HostParameters final : public workloads::ParameterSource {
 public:
  HostParameters(const std::vector<std::vector<float>>& values, DType dtype) : dtype_(dtype) {
    for (const std::vector<float>& tensor : values) {
      std::vector<char> bytes(tensor.size() * numerics::DTypeSize(dtype));
      for (size_t k = 0; k < tensor.size(); ++k) {
        if (dtype == DType::kFloat32) {
          std::memcpy(bytes.data() + 4 * k, &tensor[k], 4);
          continue;
        }
        const uint16_t bits = dtype == DType::kBFloat16 ? numerics::FloatToBFloat16(tensor[k])
                                                        : numerics::FloatToHalf(tensor[k]);
        std::memcpy(bytes.data() + 2 * k, &bits, 2);
      }
      sizes_.push_back(static_cast<int64_t>(tensor.size()));
      bytes_.push_back(std::move(bytes));
    }
  }
  absl::StatusOr<workloads::StoredParameters> Parameters(int64_t tensor) override {
    return workloads::StoredParameters{bytes_[tensor].data(), dtype_, sizes_[tensor]};
  }
  const std::vector<std::vector<char>>& bytes() const { return bytes_; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  DType dtype() const { return dtype_; }

 private:
  const DType dtype_;
  std::vector<int64_t> sizes_;
  std::vector<std::vector<char>> bytes_;
};

class DeviceParameters final : public workloads::ParameterSource {
 public:
  DeviceParameters(CudaDeviceOps& device, const HostParameters& host)
      : device_(device), dtype_(host.dtype()), sizes_(host.sizes()) {
    for (const std::vector<char>& tensor : host.bytes()) {
      void* data = device.AllocateZeroed(std::max<int64_t>(1, tensor.size()));
      if (data != nullptr) {
        Check(device.CopyFromHost(data, tensor.data(), tensor.size()),
              "copy parameters to the device");
      }
      arrays_.push_back(data);
    }
  }
  ~DeviceParameters() override {
    for (void* array : arrays_) device_.Free(array);
  }
  absl::StatusOr<workloads::StoredParameters> Parameters(int64_t tensor) override {
    return workloads::StoredParameters{arrays_[tensor], dtype_, sizes_[tensor]};
  }

 private:
  CudaDeviceOps& device_;
  const DType dtype_;
  const std::vector<int64_t> sizes_;
  std::vector<void*> arrays_;
};

// Records each gradient on the host. Segments end every kSegment elements (as bucket boundaries
// cut them); a device workload writes them into a device scratch, copied to the host on
// GradWritten (on the compute stream).
class RecordingSink final : public workloads::GradientSink {
 public:
  static constexpr int64_t kSegment = 1000;
  RecordingSink(CudaDeviceOps* device, const std::vector<sharding::TensorSpec>& tensors)
      : device_(device) {
    for (const sharding::TensorSpec& tensor : tensors) gradients_.emplace_back(tensor.num_elements);
    if (device_ != nullptr) {
      scratch_ = static_cast<float*>(device_->AllocateZeroed(kSegment * sizeof(float)));
    }
  }
  ~RecordingSink() override {
    if (scratch_ != nullptr) device_->Free(scratch_);
  }
  double loss_scale() const override { return 1.0; }
  int64_t GradSegmentEnd(int64_t tensor, int64_t begin) const override {
    return std::min<int64_t>(gradients_[tensor].size(), (begin / kSegment + 1) * kSegment);
  }
  absl::StatusOr<absl::Span<float>> GradBuffer(int64_t tensor, int64_t begin,
                                               int64_t end) override {
    if (device_ == nullptr) return absl::MakeSpan(gradients_[tensor]).subspan(begin, end - begin);
    if (scratch_ == nullptr) return absl::ResourceExhaustedError("no device scratch");
    return absl::MakeSpan(scratch_, end - begin);
  }
  absl::Status GradWritten(int64_t tensor, int64_t begin, int64_t end) override {
    if (device_ == nullptr) return absl::OkStatus();
    return device_->CopyToHost(gradients_[tensor].data() + begin, scratch_,
                               (end - begin) * sizeof(float));
  }
  const std::vector<std::vector<float>>& gradients() const { return gradients_; }

 private:
  CudaDeviceOps* const device_;
  float* scratch_ = nullptr;
  std::vector<std::vector<float>> gradients_;
};

// Hands `gradient` (device memory) to a CUDA engine segment by segment, copying on the device.
absl::Status CopyDeviceGradientToSink(CudaDeviceOps& device, workloads::GradientSink& sink,
                                      int64_t tensor, absl::Span<const float> gradient) {
  return workloads::ForEachGradSegment(sink, tensor, static_cast<int64_t>(gradient.size()),
                                       [&](int64_t begin, int64_t end, absl::Span<float> out) {
                                         return device.ConvertElements(
                                             gradient.data() + begin, DType::kFloat32, out.data(),
                                             DType::kFloat32, end - begin);
                                       });
}

// Largest |gpu - cpu| relative to the tensor's largest |cpu| (at least 1e-6); the largest
// ||gpu - cpu|| / ||cpu|| over tensors (the norm-wise error, which one element's cancellation
// does not dominate); and how many elements are bitwise equal.
struct Difference {
  double worst_relative = 0.0;
  double worst_norm_relative = 0.0;
  int64_t elements = 0;
  int64_t bitwise_equal = 0;
};

Difference Compare(const std::vector<std::vector<float>>& cpu,
                   const std::vector<std::vector<float>>& gpu) {
  Difference difference;
  for (size_t t = 0; t < cpu.size(); ++t) {
    double scale = 1e-6;
    for (float value : cpu[t]) scale = std::max(scale, std::fabs(static_cast<double>(value)));
    double error_squares = 0.0;
    double value_squares = 0.0;
    for (size_t k = 0; k < cpu[t].size(); ++k) {
      const double gpu_value = t < gpu.size() && k < gpu[t].size() ? gpu[t][k] : NAN;
      const double delta = std::fabs(gpu_value - cpu[t][k]) / scale;
      difference.worst_relative =
          std::isnan(delta) ? INFINITY : std::max(difference.worst_relative, delta);
      error_squares += (gpu_value - cpu[t][k]) * (gpu_value - cpu[t][k]);
      value_squares += static_cast<double>(cpu[t][k]) * cpu[t][k];
      ++difference.elements;
      if (gpu_value == cpu[t][k]) ++difference.bitwise_equal;
    }
    const double norm_relative = std::sqrt(error_squares / std::max(value_squares, 1e-30));
    difference.worst_norm_relative = std::isnan(norm_relative)
                                         ? INFINITY
                                         : std::max(difference.worst_norm_relative, norm_relative);
  }
  return difference;
}

std::vector<std::vector<float>> InitialValues(const workloads::Workload& workload,
                                              const std::vector<sharding::TensorSpec>& tensors) {
  std::vector<std::vector<float>> values;
  for (size_t t = 0; t < tensors.size(); ++t) {
    values.emplace_back(tensors[t].num_elements);
    Check(workload.InitialParameters(t, absl::MakeSpan(values.back())), "initial parameters");
  }
  return values;
}

// 1. The CUDA MLP's loss and gradients against the CPU MLP's, at the initial parameters stored
//    in `dtype`. fp32: cuBLAS sgemm against OpenBLAS sgemm; every element within
//    `gradient_tolerance` of its tensor's largest value. bf16/fp16: cublasGemmEx rounds the
//    activation or delta operand to the parameter dtype, the CPU keeps it fp32. That rounding
//    (2^-9 bf16, 2^-12 fp16) is amplified where values cancel: the output's error is
//    (student - teacher), much smaller than the outputs whose rounding it inherits, and single
//    gradient elements are sums that cancel. The first GPU runs saw, per tensor, worst elements
//    at 7-9% (bf16) and 1-5% (fp16) of the tensor's largest value and norm-wise errors
//    ||gpu - cpu|| / ||cpu|| of 3.9-4.4% (bf16) and 0.24-1.1% (fp16). So these dtypes are
//    checked norm-wise within `gradient_tolerance`, a few times what was seen and far below the
//    O(1) of a wrong shape or transposition (their losses agree within 6e-5).
enum class GradientCheck { kElementWise, kNormWise };

void CheckMlpGradients(CudaDeviceOps& device, const std::vector<int64_t>& sizes, DType dtype,
                       double loss_tolerance, GradientCheck check, double gradient_tolerance) {
  TeacherStudentMlpOptions options;
  options.layer_sizes = sizes;
  options.seed = 7;
  options.global_batch = 64;
  const std::string name =
      absl::StrCat("mlp gradients (", sizes.size() - 1, " layers, ", sizes.front(), "->",
                   sizes.back(), ", ", numerics::DTypeName(dtype), " parameters)");
  absl::StatusOr<std::unique_ptr<workloads::TeacherStudentMlp>> cpu =
      workloads::TeacherStudentMlp::Create(options);
  absl::StatusOr<std::unique_ptr<workloads::CudaTeacherStudentMlp>> gpu =
      workloads::CudaTeacherStudentMlp::Create(options, device.stream());
  if (!Check(cpu.status(), name) || !Check(gpu.status(), name)) return;
  HostParameters host(InitialValues(**cpu, (*cpu)->tensors()), dtype);
  DeviceParameters on_device(device, host);
  for (int64_t step : {0, 3}) {
    RecordingSink cpu_sink(nullptr, (*cpu)->tensors());
    RecordingSink gpu_sink(&device, (*cpu)->tensors());
    absl::StatusOr<double> cpu_loss = (*cpu)->ForwardBackward(step, host, cpu_sink);
    absl::StatusOr<double> gpu_loss = (*gpu)->ForwardBackward(step, on_device, gpu_sink);
    if (!Check(cpu_loss.status(), name) || !Check(gpu_loss.status(), name)) return;
    const double loss_error = std::fabs(*gpu_loss - *cpu_loss) / std::max(1e-12, *cpu_loss);
    const Difference difference = Compare(cpu_sink.gradients(), gpu_sink.gradients());
    const bool element_wise = check == GradientCheck::kElementWise;
    const double gradient_error =
        element_wise ? difference.worst_relative : difference.worst_norm_relative;
    Report(loss_error <= loss_tolerance && gradient_error <= gradient_tolerance,
           absl::StrCat(name, " step ", step, ": loss cpu ", *cpu_loss, " gpu ", *gpu_loss,
                        " (rel ", loss_error, " <= ", loss_tolerance, "), gradients ",
                        element_wise ? "worst element" : "norm-wise", " rel ", gradient_error,
                        " <= ", gradient_tolerance, " (worst element ", difference.worst_relative,
                        ", norm-wise ", difference.worst_norm_relative, "), ",
                        difference.bitwise_equal, "/", difference.elements, " bitwise equal"));
  }
}

// A gradient for (step, tensor, element) that every engine receives: multiples of 1/128 in
// [-0.0625, 0.0625], exact in every dtype.
float SyntheticGradient(int64_t step, int64_t tensor, int64_t k) {
  return static_cast<float>((k * 7 + tensor * 13 + step * 5) % 17 - 8) / 128.0f;
}

std::vector<std::vector<float>> HostParametersOf(Engine& engine) {
  std::vector<std::vector<float>> values;
  for (int64_t t = 0; t < engine.plan().num_tensors(); ++t) {
    absl::StatusOr<std::vector<float>> tensor = engine.ParametersOnHost(t);
    values.push_back(tensor.ok() ? *std::move(tensor) : std::vector<float>());
  }
  return values;
}

// 3. Checkpoints through CudaDeviceOps, after engines whose parameters are bitwise equal: the
//    CUDA engine's CopyStateTo staging equals the CPU engine's byte for byte, CopyFragmentTo
//    (in chunks, from an element past a fragment's start) gives the same bytes, and a fresh
//    CUDA engine restored (RestoreState) from the CPU engine's staging takes one more step
//    bitwise equal to the CPU engine's.
void CheckCheckpoint(const std::string& label, const sharding::ShardPlan& plan,
                     const EngineConfig& gpu_config, comm::Communicator* communicator, Engine& cpu,
                     Engine& gpu, absl::FunctionRef<bool(Engine&, Engine&)> next_step) {
  const std::string name = absl::StrCat("checkpoint ", label);
  if (cpu.SavedBytes() != gpu.SavedBytes() ||
      cpu.SavedFragments().size() != gpu.SavedFragments().size()) {
    Report(false, absl::StrCat(name, ": saved layouts differ: cpu ", cpu.SavedBytes(), " bytes in ",
                               cpu.SavedFragments().size(), " fragments, gpu ", gpu.SavedBytes(),
                               " bytes in ", gpu.SavedFragments().size()));
    return;
  }
  std::vector<char> cpu_staging(cpu.SavedBytes());
  std::vector<char> gpu_staging(gpu.SavedBytes());
  absl::StatusOr<Engine::SavedScalars> cpu_scalars = cpu.CopyStateTo(absl::MakeSpan(cpu_staging));
  absl::StatusOr<Engine::SavedScalars> gpu_scalars = gpu.CopyStateTo(absl::MakeSpan(gpu_staging));
  if (!Check(cpu_scalars.status(), name) || !Check(gpu_scalars.status(), name)) return;
  const bool staging_equal =
      cpu_staging == gpu_staging && cpu_scalars->optimizer_step == gpu_scalars->optimizer_step;
  // CopyFragmentTo from element 1 on, 3 elements a chunk (a partial last chunk).
  int64_t chunk_mismatches = 0;
  for (size_t index = 0; index < gpu.SavedFragments().size(); ++index) {
    const Engine::SavedFragment& fragment = gpu.SavedFragments()[index];
    const int64_t element_size = numerics::DTypeSize(fragment.dtype);
    for (int64_t first = 1; first < fragment.end - fragment.begin; first += 3) {
      const int64_t count = std::min<int64_t>(3, fragment.end - fragment.begin - first);
      std::vector<char> chunk(count * element_size);
      if (!Check(gpu.CopyFragmentTo(index, first, absl::MakeSpan(chunk)), name)) return;
      if (std::memcmp(chunk.data(),
                      gpu_staging.data() + fragment.staging_offset + first * element_size,
                      chunk.size()) != 0) {
        ++chunk_mismatches;
      }
    }
  }
  Report(staging_equal && chunk_mismatches == 0,
         absl::StrCat(name, ": CopyStateTo ", gpu.SavedBytes(), " bytes in ",
                      gpu.SavedFragments().size(), " fragments ",
                      staging_equal ? "equal to" : "DIFFER from", " the CPU engine's; ",
                      chunk_mismatches, " CopyFragmentTo chunks differ"));

  absl::StatusOr<std::unique_ptr<Engine>> restored =
      Engine::Create(plan, 0, gpu_config, communicator);
  if (!Check(restored.status(), name)) return;
  // Reads any range from the CPU staging, piece by piece from the saved fragments of that array
  // and tensor that overlap it (ddp restores whole tensors, which may span several fragments).
  auto read = [&](const Engine::SavedFragment& range, absl::Span<char> out) -> absl::Status {
    const int64_t element_size = numerics::DTypeSize(range.dtype);
    int64_t covered = 0;
    for (const Engine::SavedFragment& saved : cpu.SavedFragments()) {
      if (saved.state != range.state || saved.tensor != range.tensor ||
          saved.dtype != range.dtype) {
        continue;
      }
      const int64_t begin = std::max(saved.begin, range.begin);
      const int64_t end = std::min(saved.end, range.end);
      if (begin >= end) continue;
      std::memcpy(out.data() + (begin - range.begin) * element_size,
                  cpu_staging.data() + saved.staging_offset + (begin - saved.begin) * element_size,
                  (end - begin) * element_size);
      covered += end - begin;
    }
    if (covered == range.end - range.begin) return absl::OkStatus();
    return absl::NotFoundError(absl::StrCat("the saved fragments hold ", covered, " of ",
                                            range.state, " of tensor ", range.tensor, " [",
                                            range.begin, ", ", range.end, ")"));
  };
  if (!Check((*restored)->RestoreState(*cpu_scalars, read), name + ": RestoreState")) return;
  if (!next_step(cpu, **restored)) return;
  const Difference after = Compare(HostParametersOf(cpu), HostParametersOf(**restored));
  Report(after.bitwise_equal == after.elements,
         absl::StrCat(name,
                      ": a CUDA engine restored from the CPU engine's checkpoint, one more "
                      "step: ",
                      after.bitwise_equal, "/", after.elements, " parameters bitwise equal"));
}

// 2. Three W=1 steps on synthetic gradients: the CPU engine (single-rank communicator) against
//    the CUDA engine (CudaDeviceOps, NcclCommunicator).
//    With `micro_batches` > 1 (zero2), each step hands its gradients over that many times, with
//    Engine::EndMicroBatch between (the device's AddElements accumulates the reduced pieces).
void CheckEngineSteps(const std::string& label, EngineConfig config, double tolerance,
                      double weight_decay = 0.0, int micro_batches = 1) {
  const std::vector<int64_t> sizes = {10, 64, 10};
  absl::StatusOr<std::vector<sharding::TensorSpec>> tensors = sharding::TensorsForLayerSizes(sizes);
  sharding::ShardPlanOptions plan_options;
  plan_options.bucket_elems = sharding::kMinBucketElems;  // several buckets
  if (!Check(tensors.status(), label)) return;
  for (sharding::TensorSpec& tensor : *tensors) tensor.weight_decay = weight_decay;
  absl::StatusOr<sharding::ShardPlan> plan = sharding::ShardPlan::Create(*tensors, 1, plan_options);
  if (!Check(plan.status(), label)) return;
  TeacherStudentMlpOptions mlp_options;
  mlp_options.layer_sizes = sizes;
  absl::StatusOr<std::unique_ptr<workloads::TeacherStudentMlp>> initial =
      workloads::TeacherStudentMlp::Create(mlp_options);
  if (!Check(initial.status(), label)) return;
  auto init = [&](int64_t tensor, absl::Span<float> out) {
    return (*initial)->InitialParameters(tensor, out);
  };

  absl::StatusOr<std::unique_ptr<CudaDeviceOps>> device = CudaDeviceOps::Create(0);
  if (!Check(device.status(), label)) return;
  comm::InMemoryStore store;
  comm::NcclCommunicatorOptions nccl_options;
  nccl_options.store = &store;
  nccl_options.compute_stream = (*device)->stream();
  absl::StatusOr<std::unique_ptr<comm::NcclCommunicator>> nccl =
      comm::NcclCommunicator::Create(nccl_options);
  if (!Check(nccl.status(), label)) return;
  SingleRankCommunicator single;

  EngineConfig gpu_config = config;
  gpu_config.device = device->get();
  absl::StatusOr<std::unique_ptr<Engine>> cpu = Engine::Create(*plan, 0, config, &single);
  absl::StatusOr<std::unique_ptr<Engine>> gpu = Engine::Create(*plan, 0, gpu_config, nccl->get());
  if (!Check(cpu.status(), label) || !Check(gpu.status(), label)) return;
  if (!Check((*cpu)->InitializeParameters(init), label) ||
      !Check((*gpu)->InitializeParameters(init), label)) {
    return;
  }
  void* device_gradient =
      (*device)->AllocateZeroed(plan->padded_elems() * static_cast<int64_t>(sizeof(float)));
  if (device_gradient == nullptr) {
    Report(false, label + ": no device memory for the gradients");
    return;
  }
  // One iteration on both engines: the same synthetic gradients, then Step. Returns the
  // grad_norm's relative difference (negative after a failure, already reported).
  auto run_step = [&](int64_t step, Engine& cpu_engine, Engine& gpu_engine) -> double {
    for (int micro = 0; micro < micro_batches; ++micro) {
      if (micro > 0 && (!Check(cpu_engine.EndMicroBatch(), label) ||
                        !Check(gpu_engine.EndMicroBatch(), label))) {
        return -1.0;
      }
      for (int64_t t = 0; t < plan->num_tensors(); ++t) {
        std::vector<float> gradient(plan->placement(t).num_elements);
        for (size_t k = 0; k < gradient.size(); ++k) {
          gradient[k] = SyntheticGradient(step * micro_batches + micro, t, k);
        }
        float* on_device = static_cast<float*>(device_gradient) + plan->placement(t).flat_offset;
        if (!Check((*device)->CopyFromHost(on_device, gradient.data(),
                                           gradient.size() * sizeof(float)),
                   label) ||
            !Check(workloads::CopyGradientToSink(cpu_engine, t, gradient), label) ||
            !Check(CopyDeviceGradientToSink(**device, gpu_engine, t,
                                            absl::MakeConstSpan(on_device, gradient.size())),
                   label)) {
          return -1.0;
        }
      }
    }
    absl::StatusOr<engine::StepResult> cpu_step = cpu_engine.Step(0.5);
    absl::StatusOr<engine::StepResult> gpu_step = gpu_engine.Step(0.5);
    if (!Check(cpu_step.status(), label) || !Check(gpu_step.status(), label)) return -1.0;
    return std::fabs(gpu_step->grad_norm - cpu_step->grad_norm) /
           std::max(1e-30, cpu_step->grad_norm);
  };
  double worst_norm_error = 0.0;
  for (int64_t step = 0; step < 3; ++step) {
    const double norm_error = run_step(step, **cpu, **gpu);
    if (norm_error < 0) {
      (*device)->Free(device_gradient);
      return;
    }
    worst_norm_error = std::max(worst_norm_error, norm_error);
  }
  const Difference difference = Compare(HostParametersOf(**cpu), HostParametersOf(**gpu));
  Report(
      difference.worst_relative <= tolerance && worst_norm_error <= 1e-12,
      absl::StrCat("engine ", label, ": 3 steps, parameters worst rel ", difference.worst_relative,
                   " <= ", tolerance, ", grad_norm rel ", worst_norm_error, " <= 1e-12, ",
                   difference.bitwise_equal, "/", difference.elements,
                   " bitwise equal; gpu memory ", (*gpu)->Memory().ToString()));
  if (difference.bitwise_equal == difference.elements) {
    CheckCheckpoint(label, *plan, gpu_config, nccl->get(), **cpu, **gpu,
                    [&](Engine& cpu_engine, Engine& gpu_engine) {
                      return run_step(3, cpu_engine, gpu_engine) >= 0;
                    });
  }
  (*device)->Free(device_gradient);
}

int Main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP no CUDA device\n");
    return 2;
  }
  {
    absl::StatusOr<std::unique_ptr<CudaDeviceOps>> device = CudaDeviceOps::Create(0);
    if (!Check(device.status(), "CudaDeviceOps::Create")) return 1;
    CheckMlpGradients(**device, {10, 64, 10}, DType::kFloat32, 1e-5, GradientCheck::kElementWise,
                      1e-4);
    CheckMlpGradients(**device, {96, 512, 256, 40}, DType::kFloat32, 1e-5,
                      GradientCheck::kElementWise, 1e-4);
    CheckMlpGradients(**device, {96, 512, 256, 40}, DType::kBFloat16, 2e-3,
                      GradientCheck::kNormWise, 0.1);
    CheckMlpGradients(**device, {96, 512, 256, 40}, DType::kFloat16, 5e-4, GradientCheck::kNormWise,
                      0.03);
  }
  // zero3 on the device: gathers on the communicator's stream into the pool's windows, the
  // compute stream ordered after them by events (Work::WaitOnComputeStream), never the host.
  for (EngineMode mode :
       {EngineMode::kDdp, EngineMode::kZero1, EngineMode::kZero2, EngineMode::kZero3}) {
    EngineConfig config;
    config.mode = mode;
    config.optimizer.kind = kernels::OptimizerKind::kAdamW;
    CheckEngineSteps(absl::StrCat(engine::EngineModeName(mode), " fp32 adamw"), config, 1e-6,
                     /*weight_decay=*/0.01);
    config.param_dtype = DType::kBFloat16;
    config.grad_dtype = DType::kBFloat16;
    CheckEngineSteps(absl::StrCat(engine::EngineModeName(mode), " bf16 adamw"), config, 1e-6,
                     /*weight_decay=*/0.01);
  }
  // zero2 with one bucket buffer: the seed model's two buckets take turns in it, so the second
  // bucket's segments are written only after the device was ordered after the first's reduction.
  EngineConfig reused;
  reused.mode = EngineMode::kZero2;
  reused.optimizer.kind = kernels::OptimizerKind::kAdamW;
  reused.bucket_pool_size = 1;
  CheckEngineSteps("zero2 fp32 adamw, one bucket buffer reused", reused, 1e-6,
                   /*weight_decay=*/0.01);
  EngineConfig clipped;
  clipped.mode = EngineMode::kZero2;
  clipped.optimizer.kind = kernels::OptimizerKind::kSgd;
  clipped.optimizer.lr = 0.01;
  clipped.optimizer.momentum = 0.9;
  clipped.clip_grad_norm = 0.05;
  CheckEngineSteps("zero2 fp32 sgd clipped", clipped, 1e-5);
  // Gradient accumulation (attached trainers' no_sync): 3 micro-batches reduced one by one.
  CheckEngineSteps("zero2 fp32 adamw, 3 micro-batches", reused, 1e-6, /*weight_decay=*/0.01,
                   /*micro_batches=*/3);
  EngineConfig bf16_accumulated = reused;
  bf16_accumulated.param_dtype = DType::kBFloat16;
  bf16_accumulated.grad_dtype = DType::kBFloat16;
  CheckEngineSteps("zero2 bf16 adamw, 3 micro-batches", bf16_accumulated, 1e-6,
                   /*weight_decay=*/0.01, /*micro_batches=*/3);
  std::printf("%s: %d failed\n", g_failures == 0 ? "ALL PASSED" : "FAILED", g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace zeroshard::engine

int main() { return zeroshard::engine::Main(); }
