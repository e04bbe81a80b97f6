// HostDeviceOps: the engine's host path (element_convert.h loops and the CPU kernels).
#include "worker/engine/device_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu_optimizer.h"
#include "worker/engine/element_convert.h"

namespace zeroshard::engine {

absl::Status DeviceOps::AddElements(const void* /*src*/, numerics::DType /*src_dtype*/,
                                    void* /*dst*/, numerics::DType /*dst_dtype*/,
                                    int64_t /*count*/) {
  return absl::UnimplementedError(
      absl::StrCat("AddElements (zero2 gradient accumulation) is not implemented on ", name()));
}

absl::StatusOr<double> DeviceOps::MaxAbs(absl::Span<const kernels::GradPiece> /*pieces*/) {
  return absl::UnimplementedError(
      absl::StrCat("MaxAbs (the infinity norm of clip_grad_norm_) is not implemented on ", name()));
}

HostDeviceOps::HostDeviceOps(int threads, MemoryBacking* memory)
    : memory_(memory != nullptr ? memory : &heap_), thread_pool_(threads) {}

absl::Status HostDeviceOps::CopyFromHost(void* dst, const void* host_src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::CopyToHost(void* host_dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::StoreScaledGradient(const float* grad, float scale, int64_t count,
                                                numerics::DType storage_dtype, void* dst,
                                                numerics::DType dst_dtype) {
  engine::StoreScaledGradient(grad, scale, count, storage_dtype, dst, dst_dtype);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ConvertElements(const void* src, numerics::DType src_dtype, void* dst,
                                            numerics::DType dst_dtype, int64_t count) {
  engine::ConvertElements(src, src_dtype, dst, dst_dtype, count);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::ZeroElements(void* dst, numerics::DType dtype, int64_t count) {
  engine::ZeroElements(dst, dtype, count);
  return absl::OkStatus();
}

absl::Status HostDeviceOps::AddElements(const void* src, numerics::DType src_dtype, void* dst,
                                        numerics::DType dst_dtype, int64_t count) {
  engine::AddElements(src, src_dtype, dst, dst_dtype, count);
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

int64_t HostDeviceOps::GradStatsChunkElements() const { return kernels::kCpuChunkElements; }

absl::Status HostDeviceOps::ConvertWithGradStats(const void* src, numerics::DType src_dtype,
                                                 void* dst, numerics::DType dst_dtype,
                                                 const kernels::GradStatsChunk* chunks,
                                                 int64_t num_chunks, double* partials) {
  if (num_chunks < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_chunks must be >= 0, got ", num_chunks));
  }
  return kernels::ConvertWithGradStatsCpu(src, src_dtype, dst, dst_dtype,
                                          absl::MakeConstSpan(chunks, num_chunks), partials,
                                          &thread_pool_);
}

absl::StatusOr<double> HostDeviceOps::MaxAbs(absl::Span<const kernels::GradPiece> pieces) {
  ZS_RETURN_IF_ERROR(kernels::ValidateGradPieces(pieces));
  float largest = 0.0f;
  std::vector<float> widened;
  for (const kernels::GradPiece& piece : pieces) {
    const float* values = static_cast<const float*>(piece.data);
    if (piece.dtype != numerics::DType::kFloat32) {
      widened.resize(piece.length);
      engine::ConvertElements(piece.data, piece.dtype, widened.data(), numerics::DType::kFloat32,
                              piece.length);
      values = widened.data();
    }
    for (int64_t i = 0; i < piece.length; ++i) {
      const float magnitude = std::fabs(values[i]);
      if (std::isnan(magnitude)) return static_cast<double>(magnitude);
      largest = std::max(largest, magnitude);
    }
  }
  return static_cast<double>(largest);
}

absl::Status HostDeviceOps::CombineGradStats(const double* partials, int64_t count,
                                             double* result) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("count must be >= 0, got ", count));
  const kernels::GradStats stats =
      kernels::CombineGradStatsCpu(absl::MakeConstSpan(partials, count));
  result[0] = stats.sum_squares;
  result[1] = stats.non_finite ? 1.0 : 0.0;
  return absl::OkStatus();
}

}  // namespace zeroshard::engine
