// cuda_support.h for a build without --config=cuda: every CUDA request is UNIMPLEMENTED.
#include "worker/daemon/cuda_support.h"

namespace zeroshard::worker {
namespace {

absl::Status NotBuiltIn() {
  return absl::UnimplementedError("this worker was built without --config=cuda");
}

}  // namespace

bool CudaSupportBuiltIn() { return false; }

absl::StatusOr<CudaDeviceInfo> SelectCudaDevice(int) { return NotBuiltIn(); }

absl::StatusOr<std::unique_ptr<engine::DeviceOps>> CreateCudaDevice(int, engine::MemoryBacking*) {
  return NotBuiltIn();
}

absl::StatusOr<std::unique_ptr<attach::SharedBlocks>> CreateCudaIpcMemory(int) {
  return NotBuiltIn();
}

absl::StatusOr<std::unique_ptr<comm::Communicator>> CreateNcclCommunicator(engine::DeviceOps&,
                                                                           comm::Store*, int, int) {
  return NotBuiltIn();
}

absl::StatusOr<std::unique_ptr<workloads::Workload>> CreateCudaWorkload(
    engine::DeviceOps&, const workloads::TeacherStudentMlpOptions&) {
  return NotBuiltIn();
}

}  // namespace zeroshard::worker
