// CudaIpcBacking: cudaMalloc, a zero fill and cudaIpcGetMemHandle per block.
#include "worker/attach/cuda_ipc_backing.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace zeroshard::attach {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == 64, "the protocol carries 64-byte IPC handles");

}  // namespace

absl::StatusOr<std::unique_ptr<CudaIpcBacking>> CudaIpcBacking::Create(int device) {
  ZS_RETURN_IF_ERROR(common::UseCudaDevice(device));
  SharedDevice description;
  description.kind = "cuda";
  description.ordinal = device;
  // "dddd:bb:dd.f" plus the terminator; the runtime truncates to the buffer it is given.
  char bus_id[32] = {};
  ZS_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device));
  description.pci_bus_id = bus_id;
  cudaDeviceProp properties;
  ZS_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
  description.uuid.assign(properties.uuid.bytes, sizeof(properties.uuid.bytes));
  return std::unique_ptr<CudaIpcBacking>(new CudaIpcBacking(std::move(description)));
}

CudaIpcBacking::~CudaIpcBacking() {
  const std::vector<SharedBlock> blocks = blocks_.RemoveAll();
  if (blocks.empty()) return;
  absl::Status status = common::CudaStatus(cudaSetDevice(device_.ordinal), "cudaSetDevice");
  if (status.ok()) status = common::CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (const SharedBlock& block : blocks) {
    if (status.ok()) status = common::CudaStatus(cudaFree(block.data), "cudaFree");
  }
  if (!status.ok()) ZS_LOG(WARNING) << "cuda:" << device_.ordinal << ": at destruction: " << status;
}

void* CudaIpcBacking::AllocateZeroed(int64_t bytes) {
  void* data = nullptr;
  cudaIpcMemHandle_t handle;
  absl::Status status = common::CudaStatus(cudaSetDevice(device_.ordinal), "cudaSetDevice");
  if (status.ok()) status = common::CudaStatus(cudaMalloc(&data, bytes), "cudaMalloc");
  if (status.ok()) {
    // The legacy default stream, then a wait: the block is zero before anyone can use it, on
    // whatever stream.
    status = common::CudaStatus(cudaMemset(data, 0, bytes), "cudaMemset");
    if (status.ok()) {
      status = common::CudaStatus(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    }
    if (status.ok()) {
      status = common::CudaStatus(cudaIpcGetMemHandle(&handle, data), "cudaIpcGetMemHandle");
    }
    if (!status.ok()) {
      cudaFree(data);
      data = nullptr;
    }
  }
  if (!status.ok()) {
    ZS_LOG(WARNING) << "cuda:" << device_.ordinal << ": allocating " << bytes
                    << " shared bytes: " << status;
    return nullptr;
  }
  SharedBlock block;
  block.data = static_cast<char*>(data);
  block.bytes = bytes;
  block.cuda_ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
  blocks_.Add(std::move(block));
  return data;
}

void CudaIpcBacking::Free(void* data) {
  if (data == nullptr || !blocks_.Remove(data).has_value()) return;
  absl::Status status = common::CudaStatus(cudaSetDevice(device_.ordinal), "cudaSetDevice");
  if (status.ok()) status = common::CudaStatus(cudaFree(data), "cudaFree");
  if (!status.ok())
    ZS_LOG(WARNING) << "cuda:" << device_.ordinal << ": freeing a block: " << status;
}

}  // namespace zeroshard::attach
