// The one mapping of CUDA runtime errors to absl::Status, and device selection, shared by every
// CUDA library (the kernels, the NCCL communicator, the engine's device ops, the CUDA workload,
// the worker).
#ifndef ZEROSHARD_COMMON_CUDA_STATUS_H_
#define ZEROSHARD_COMMON_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace zeroshard::common {

// OK for cudaSuccess. Otherwise "<what>: CUDA error <name>: <description>" as
// FAILED_PRECONDITION when there is no usable device (no device, old driver, bad ordinal),
// RESOURCE_EXHAUSTED when device memory ran out, and INTERNAL for everything else.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

// Makes `device` the calling thread's current device. FAILED_PRECONDITION naming "cuda:<device>"
// when the machine has no such device.
absl::Status UseCudaDevice(int device);

}  // namespace zeroshard::common

// Returns the CUDA call's error, as CudaStatus maps it, from the enclosing function.
#define ZS_CUDA_RETURN_IF_ERROR(expr) \
  ZS_RETURN_IF_ERROR(::zeroshard::common::CudaStatus((expr), #expr))

#endif  // ZEROSHARD_COMMON_CUDA_STATUS_H_
