// CUDA runtime errors as absl::Status.
#include "common/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace zeroshard::common {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::FailedPreconditionError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status UseCudaDevice(int device) {
  int devices = 0;
  ZS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&devices));
  if (device < 0 || device >= devices) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device, ": this machine has ", devices, " CUDA devices"));
  }
  return CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

}  // namespace zeroshard::common
