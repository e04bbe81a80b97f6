// cuda_support.h over CUDA: device selection and description, CudaDeviceOps, CudaIpcBacking,
// NcclCommunicator and CudaTeacherStudentMlp. CUDA errors become Status through
// common/cuda_status.h.
#include "worker/daemon/cuda_support.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "worker/attach/cuda_ipc_backing.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/engine/cuda_device_ops.h"
#include "worker/workloads/cuda_teacher_student_mlp.h"

namespace zeroshard::worker {
namespace {

// The CudaDeviceOps behind a DeviceOps from CreateCudaDevice.
absl::StatusOr<engine::CudaDeviceOps*> AsCuda(engine::DeviceOps& device) {
  auto* cuda = dynamic_cast<engine::CudaDeviceOps*>(&device);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("device: ", device.name(), " is not a CUDA device from CreateCudaDevice"));
  }
  return cuda;
}

}  // namespace

bool CudaSupportBuiltIn() { return true; }

absl::StatusOr<CudaDeviceInfo> SelectCudaDevice(int device) {
  ZS_RETURN_IF_ERROR(common::UseCudaDevice(device));
  cudaDeviceProp properties;
  ZS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  ZS_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  CudaDeviceInfo info;
  info.name = properties.name;
  info.memory_bytes = static_cast<int64_t>(total_bytes);
  return info;
}

absl::StatusOr<std::unique_ptr<engine::DeviceOps>> CreateCudaDevice(int device,
                                                                    engine::MemoryBacking* memory) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<engine::CudaDeviceOps> ops,
                      engine::CudaDeviceOps::Create(device, memory));
  return std::unique_ptr<engine::DeviceOps>(std::move(ops));
}

absl::StatusOr<std::unique_ptr<attach::SharedBlocks>> CreateCudaIpcMemory(int device) {
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<attach::CudaIpcBacking> memory,
                      attach::CudaIpcBacking::Create(device));
  return std::unique_ptr<attach::SharedBlocks>(std::move(memory));
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateNcclCommunicator(
    engine::DeviceOps& device, comm::Store* store, int rank, int world_size) {
  ZS_ASSIGN_OR_RETURN(engine::CudaDeviceOps * cuda, AsCuda(device));
  comm::NcclCommunicatorOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.device = cuda->device();
  options.store = store;
  options.compute_stream = cuda->stream();
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<comm::NcclCommunicator> communicator,
                      comm::NcclCommunicator::Create(options));
  return std::unique_ptr<comm::Communicator>(std::move(communicator));
}

absl::StatusOr<std::unique_ptr<workloads::Workload>> CreateCudaWorkload(
    engine::DeviceOps& device, const workloads::TeacherStudentMlpOptions& options) {
  ZS_ASSIGN_OR_RETURN(engine::CudaDeviceOps * cuda, AsCuda(device));
  ZS_ASSIGN_OR_RETURN(std::unique_ptr<workloads::CudaTeacherStudentMlp> workload,
                      workloads::CudaTeacherStudentMlp::Create(options, cuda->stream()));
  return std::unique_ptr<workloads::Workload>(std::move(workload));
}

}  // namespace zeroshard::worker
