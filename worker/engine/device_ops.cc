// HostDeviceOps: the engine's host path (element_convert.h loops and the CPU kernels).
#include "worker/engine/device_ops.h"

#include <cstring>

#include "kernels/cpu_optimizer.h"
#include "worker/engine/element_convert.h"

namespace zeroshard::engine {

HostDeviceOps::HostDeviceOps(int threads) : thread_pool_(threads) {}

absl::Status HostDeviceOps::CopyFromHost(void* dst, const void* host_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::CopyToHost(void* host_dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::StoreScaledGradient(const float* grad, float scale, int64_t count,
                                                kernels::DType storage_dtype, void* dst,
                                                kernels::DType dst_dtype) {
  engine::StoreScaledGradient(grad, scale, count, storage_dtype, dst, dst_dtype);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ConvertElements(const void* src, kernels::DType src_dtype, void* dst,
                                            kernels::DType dst_dtype, int64_t count) {
  engine::ConvertElements(src, src_dtype, dst, dst_dtype, count);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ZeroElements(void* dst, kernels::DType dtype, int64_t count) {
  engine::ZeroElements(dst, dtype, count);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ApplyUpdate(const kernels::OptimizerConfig& config, int64_t step,
                                        float grad_scale,
                                        absl::Span<const kernels::UpdatePiece> pieces) {
  return kernels::ApplyUpdateCpu(config, step, grad_scale, pieces, &thread_pool_);
}

absl::StatusOr<kernels::GradStats> HostDeviceOps::ComputeGradStats(
    absl::Span<const kernels::GradPiece> pieces) {
  return kernels::ComputeGradStatsCpu(pieces, &thread_pool_);
}

}  // namespace zeroshard::engine
