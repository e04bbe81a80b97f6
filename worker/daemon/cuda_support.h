// The worker's CUDA pieces behind a plain C++ interface, so zeroshard-worker links with or
// without --config=cuda: cuda_support.cc implements it over CUDA, NCCL and the CUDA workload;
// cuda_support_stub.cc (the CPU-only build) answers UNIMPLEMENTED.
#ifndef ZEROSHARD_WORKER_DAEMON_CUDA_SUPPORT_H_
#define ZEROSHARD_WORKER_DAEMON_CUDA_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/attach/shared_blocks.h"
#include "worker/comm/communicator.h"
#include "worker/comm/store.h"
#include "worker/engine/device_ops.h"
#include "worker/workloads/teacher_student_mlp.h"
#include "worker/workloads/workload.h"

namespace zeroshard::worker {

// Whether this binary was built with --config=cuda.
bool CudaSupportBuiltIn();

struct CudaDeviceInfo {
  std::string name;          // e.g. "NVIDIA H200"
  int64_t memory_bytes = 0;  // total device memory (cudaMemGetInfo)
};

// Makes CUDA device `device` current on the calling thread and describes it. FailedPrecondition
// when there is no such device; UNIMPLEMENTED in a build without --config=cuda.
absl::StatusOr<CudaDeviceInfo> SelectCudaDevice(int device);

// One generation's pieces on CUDA device `device`, made on the thread that will train (the
// device becomes current on it). Destroy them in reverse order of creation, after the engine:
// workload, communicator, then the device (whose compute stream the others use), then the
// device's `memory` when given (its blocks, e.g. CreateCudaIpcMemory's; else cudaMalloc).
absl::StatusOr<std::unique_ptr<engine::DeviceOps>> CreateCudaDevice(
    int device, engine::MemoryBacking* memory = nullptr);
// Device memory of `device` that an attached trainer opens through CUDA IPC handles
// (attach/cuda_ipc_backing.h), for CreateCudaDevice's `memory`.
absl::StatusOr<std::unique_ptr<attach::SharedBlocks>> CreateCudaIpcMemory(int device);
// An NcclCommunicator on `device` (from CreateCudaDevice), ordered after its compute stream; the
// NCCL unique id travels through `store` (scoped to the generation).
absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateNcclCommunicator(
    engine::DeviceOps& device, comm::Store* store, int rank, int world_size);
// The CUDA teacher-student MLP on `device` (from CreateCudaDevice), on its compute stream.
absl::StatusOr<std::unique_ptr<workloads::Workload>> CreateCudaWorkload(
    engine::DeviceOps& device, const workloads::TeacherStudentMlpOptions& options);

}  // namespace zeroshard::worker

#endif  // ZEROSHARD_WORKER_DAEMON_CUDA_SUPPORT_H_
